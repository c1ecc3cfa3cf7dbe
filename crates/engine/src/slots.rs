//! Several generations at once over one target (continuous batching).
//!
//! Each generation runs the ordinary decoding loop, any strategy, on a
//! thread of its own, against a [`SlotModel`]: a view of one slot (one KV
//! cache) of the shared target. A `SlotModel`'s cache methods run at once
//! on the thread that owns the target; its forward passes wait there in a
//! [`Batch`] until every running generation has one waiting (or has
//! ended), and then go through the target as one pass
//! ([`LanguageModel::forward_slots`]): every weight, a streamed layer
//! included, is read once for all of them. A row's logits do not depend on
//! the other rows of its pass, so each generation gives what it would
//! alone. Drafts are forks of the run's draft (shared weights, a cache per
//! slot) and run on the generation's thread.

use std::sync::mpsc;

use arbor_model::{Config, LanguageModel, Logits, Mask, ModelError, Row, SlotPass};
use arbor_tokenizer::Tokenizer;

use crate::generate::{GenerateOptions, Generation, TextEvent, Watch};
use crate::{Control, Result};

/// An input row that owns its vector.
#[derive(Debug, Clone, PartialEq)]
enum OwnedRow {
    Token(u32),
    Vector(Vec<f32>),
}

/// One slot's forward pass, as it waits for the others'.
#[derive(Debug)]
struct Forward {
    rows: Vec<OwnedRow>,
    positions: Vec<u32>,
    mask: Mask,
    logit_rows: Vec<usize>,
}

#[derive(Debug)]
enum Op {
    Forward(Forward),
    Truncate(usize),
    Keep(Vec<usize>),
}

type Reply = mpsc::Sender<std::result::Result<Option<Logits>, ModelError>>;

/// A slot's request to the thread that owns the target.
#[derive(Debug)]
pub struct Call {
    slot: usize,
    op: Op,
    reply: Reply,
}

/// How a [`SlotModel`] reaches the target's thread (a channel's send, in
/// the caller's message type); `false` when that thread is gone.
pub type Send = Box<dyn Fn(Call) -> bool + std::marker::Send>;

/// One slot of a shared target, as a [`LanguageModel`] a decoding loop can
/// drive from its own thread.
pub struct SlotModel {
    slot: usize,
    send: Send,
    config: Config,
    backend: &'static str,
    /// Cached positions of this slot (this handle makes every change).
    len: usize,
}

impl SlotModel {
    /// Slot `slot` of a target with `config`, on `backend`, reached
    /// through `send`.
    pub fn new(slot: usize, config: Config, backend: &'static str, send: Send) -> Self {
        Self {
            slot,
            send,
            config,
            backend,
            len: 0,
        }
    }

    pub fn slot(&self) -> usize {
        self.slot
    }

    fn call(&self, op: Op) -> arbor_model::Result<Option<Logits>> {
        let (reply, answer) = mpsc::channel();
        let gone = || ModelError::Invalid("the target's thread has stopped".into());
        if !(self.send)(Call {
            slot: self.slot,
            op,
            reply,
        }) {
            return Err(gone());
        }
        answer.recv().map_err(|_| gone())?
    }
}

impl LanguageModel for SlotModel {
    fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        mask: &Mask,
        logit_rows: &[usize],
    ) -> arbor_model::Result<Logits> {
        let rows: Vec<Row<'_>> = tokens.iter().map(|&t| Row::Token(t)).collect();
        self.forward_rows(&rows, positions, mask, logit_rows)
    }

    fn forward_rows(
        &mut self,
        rows: &[Row<'_>],
        positions: &[u32],
        mask: &Mask,
        logit_rows: &[usize],
    ) -> arbor_model::Result<Logits> {
        let rows = (rows.iter())
            .map(|r| match r {
                Row::Token(t) => OwnedRow::Token(*t),
                Row::Vector(v) => OwnedRow::Vector(v.to_vec()),
            })
            .collect();
        let n = positions.len();
        let logits = self.call(Op::Forward(Forward {
            rows,
            positions: positions.to_vec(),
            mask: mask.clone(),
            logit_rows: logit_rows.to_vec(),
        }))?;
        self.len += n;
        logits.ok_or_else(|| ModelError::Invalid("a pass came back without logits".into()))
    }

    fn cache_len(&self) -> usize {
        self.len
    }

    fn truncate_cache(&mut self, len: usize) -> arbor_model::Result<()> {
        self.call(Op::Truncate(len))?;
        self.len = self.len.min(len);
        Ok(())
    }

    fn keep_cache(&mut self, positions: &[usize]) -> arbor_model::Result<()> {
        self.call(Op::Keep(positions.to_vec()))?;
        self.len = positions.len();
        Ok(())
    }

    fn config(&self) -> &Config {
        &self.config
    }

    fn backend_name(&self) -> &'static str {
        self.backend
    }
}

/// Most rows one batched pass carries: what one generation's prompt chunk
/// may carry ([`arbor_speculative::PREFILL_CHUNK`]). Several requests'
/// prompts arriving together would otherwise make one pass of all their
/// rows, and a pass's activations grow with its rows beyond what a memory
/// budget leaves for them.
pub const MAX_PASS_ROWS: usize = arbor_speculative::PREFILL_CHUNK;

/// The target's side: calls from the slots, forward passes held until
/// every running generation has one.
#[derive(Debug, Default)]
pub struct Batch {
    pending: Vec<(usize, Forward, Reply)>,
    running: usize,
    /// Passes run, the sequences and the rows they carried (for the
    /// server's metrics).
    pub passes: u64,
    pub sequences: u64,
    pub rows: u64,
}

impl Batch {
    /// A generation started on a slot.
    pub fn started(&mut self) {
        self.running += 1;
    }

    /// A generation ended: the passes the others wait with may go now.
    pub fn ended(&mut self, target: &mut dyn LanguageModel) {
        self.running = self.running.saturating_sub(1);
        self.flush(target);
    }

    pub fn running(&self) -> usize {
        self.running
    }

    /// Serves a slot's call: cache changes at once, a forward pass when
    /// every running generation has one waiting.
    pub fn call(&mut self, target: &mut dyn LanguageModel, call: Call) {
        let Call { slot, op, reply } = call;
        let r = match op {
            Op::Forward(f) => {
                self.pending.push((slot, f, reply));
                return self.flush(target);
            }
            Op::Truncate(len) => target
                .select_slot(slot)
                .and_then(|_| target.truncate_cache(len)),
            Op::Keep(positions) => target
                .select_slot(slot)
                .and_then(|_| target.keep_cache(&positions)),
        };
        let _ = reply.send(r.map(|_| None));
    }

    /// Runs the waiting passes once every running generation has one: the
    /// longest-waiting first, as many as fit [`MAX_PASS_ROWS`] together
    /// (always at least one). The rest wait for the next pass, which comes
    /// as soon as the ones served call again or end.
    fn flush(&mut self, target: &mut dyn LanguageModel) {
        if self.pending.is_empty() || self.pending.len() < self.running {
            return;
        }
        let mut total = 0;
        let fit = (self.pending.iter())
            .take_while(|(_, f, _)| {
                total += f.rows.len();
                total <= MAX_PASS_ROWS
            })
            .count()
            .max(1);
        let rest = self.pending.split_off(fit);
        let calls = std::mem::replace(&mut self.pending, rest);
        let rows: Vec<Vec<Row<'_>>> = (calls.iter())
            .map(|(_, f, _)| {
                (f.rows.iter())
                    .map(|r| match r {
                        OwnedRow::Token(t) => Row::Token(*t),
                        OwnedRow::Vector(v) => Row::Vector(v),
                    })
                    .collect()
            })
            .collect();
        let passes: Vec<SlotPass<'_>> = (calls.iter().zip(&rows))
            .map(|((slot, f, _), rows)| SlotPass {
                slot: *slot,
                rows,
                positions: &f.positions,
                mask: &f.mask,
                logit_rows: &f.logit_rows,
            })
            .collect();
        self.passes += 1;
        self.sequences += passes.len() as u64;
        self.rows += rows.iter().map(|r| r.len() as u64).sum::<u64>();
        match target.forward_slots(&passes) {
            Ok(out) => {
                for ((_, _, reply), l) in calls.iter().zip(out) {
                    let _ = reply.send(Ok(Some(l)));
                }
            }
            Err(e) => {
                for (_, _, reply) in &calls {
                    let _ = reply.send(Err(ModelError::Invalid(format!(
                        "a batched pass failed: {e}"
                    ))));
                }
            }
        }
    }
}

/// Generates on a slot: the decoding loop of [`crate::Run::generate`]
/// with a slot's target and draft (no layer-streaming statistics: the
/// streamer serves every slot's passes).
pub fn generate_in_slot(
    target: &mut dyn LanguageModel,
    draft: Option<&mut dyn LanguageModel>,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    options: &GenerateOptions,
    control: Control<'_>,
    on: &mut dyn FnMut(TextEvent<'_>),
) -> Result<Generation> {
    let watch = Watch {
        monitor: None,
        control,
    };
    crate::generate::generate(target, draft, tokenizer, prompt, options, watch, on)
}

/// What one slot's generations need beside the target: a fork of the
/// run's draft (when its strategy drafts with a model) and a tokenizer.
pub struct SlotKit {
    pub slot: usize,
    pub draft: Option<Box<dyn LanguageModel>>,
    pub tokenizer: std::sync::Arc<Tokenizer>,
}

impl crate::Run {
    /// Gives the target `n` slots (slot 0 keeps its cache) and returns
    /// each slot's kit. A draft that cannot be forked (its layers are
    /// streamed) is an error: its strategy cannot serve several slots.
    pub fn open_slots(&mut self, n: usize) -> Result<Vec<SlotKit>> {
        self.forget_cached();
        let drafts = self.strategy().needs_draft();
        let engine = self.engine_mut();
        engine.model_mut().set_slots(n)?;
        // The engine's own stays on this thread; the slots share a copy.
        let file = arbor_gguf::GgufFile::open(engine.path())?;
        let tokenizer = std::sync::Arc::new(Tokenizer::from_gguf(file.header())?);
        (0..n)
            .map(|slot| {
                let draft = match (drafts, engine.draft()) {
                    (true, Some(d)) => Some(d.fork()?),
                    _ => None,
                };
                Ok(SlotKit {
                    slot,
                    draft,
                    tokenizer: tokenizer.clone(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor_model::testing::{TinyModel, add_byte_tokenizer, write_temp};

    fn forward(
        batch: &mut Batch,
        target: &mut dyn LanguageModel,
        slot: usize,
        past: usize,
        n: usize,
    ) -> mpsc::Receiver<std::result::Result<Option<Logits>, ModelError>> {
        let (reply, answer) = mpsc::channel();
        let f = Forward {
            rows: (0..n).map(|i| OwnedRow::Token((i % 200) as u32)).collect(),
            positions: (past as u32..(past + n) as u32).collect(),
            mask: Mask::causal(past, n),
            logit_rows: vec![n - 1],
        };
        batch.call(
            target,
            Call {
                slot,
                op: Op::Forward(f),
                reply,
            },
        );
        answer
    }

    fn served(answer: &mpsc::Receiver<std::result::Result<Option<Logits>, ModelError>>) -> bool {
        answer
            .try_recv()
            .is_ok_and(|r| r.is_ok_and(|l| l.is_some()))
    }

    /// Prompts that would make a pass of more than a chunk's rows go one
    /// after another, the longest-waiting first; short passes still go
    /// together.
    #[test]
    fn a_batched_pass_carries_at_most_a_chunk_of_rows() {
        let mut w = TinyModel::default().writer();
        add_byte_tokenizer(&mut w, None);
        let path = write_temp(&w, "batch-rows");
        let mut engine =
            crate::Engine::load(&path, crate::BackendKind::Candle, &mut |_, _| {}).unwrap();
        let target = engine.model_mut();
        target.set_slots(3).unwrap();
        let mut batch = Batch::default();
        let n = MAX_PASS_ROWS / 2 + 1;
        (0..3).for_each(|_| batch.started());
        let answers: Vec<_> = (0..3)
            .map(|s| forward(&mut batch, target, s, 0, n))
            .collect();
        assert_eq!(
            (batch.passes, batch.rows),
            (1, n as u64),
            "two prompts exceed a chunk"
        );
        assert!(served(&answers[0]) && !served(&answers[1]) && !served(&answers[2]));
        // Slot 0 ends: slot 1 goes next, alone.
        batch.ended(target);
        assert_eq!(batch.passes, 2);
        assert!(served(&answers[1]) && !served(&answers[2]));
        // Slot 1 calls again: slot 2's prompt and slot 1's one row fit.
        let again = forward(&mut batch, target, 1, n, 1);
        assert_eq!((batch.passes, batch.sequences), (3, 4));
        assert!(served(&answers[2]) && served(&again));
        assert_eq!(batch.rows, (3 * n + 1) as u64);
    }
}

//! Several sequences in one pass. A decoder keeps one KV cache per slot;
//! [`Decoder::forward_slots`] stacks the rows of several sequences, runs
//! every weight once over all of them (a streamed layer is read once for
//! the whole pass), and lets each sequence's rows attend over its own
//! slot's cache only. The kernels give a row the same bits whatever else
//! is in its pass, and attention is per sequence, so each sequence's
//! logits are those of a pass of its own: a server's requests batched
//! together generate what each would alone.

use std::ops::Range;

use arbor_tensor::{Backend, Heads, Mask};

use crate::blocks::Block;
use crate::check_pass;
use crate::{Decoder, Logits, ModelError, Result, Row, SlotPass};

/// Consecutive rows of a pass that belong to one sequence.
pub(crate) struct Segment<'a> {
    pub slot: usize,
    pub rows: Range<usize>,
    pub mask: &'a Mask,
}

/// One layer's attention for every segment: each appends its keys and
/// values to its slot's cache `layer` and attends over that cache;
/// `qkv` are the rows of the whole pass, already rotated.
pub(crate) fn attend<B: Backend>(
    b: &B,
    slots: &mut [Vec<B::Kv>],
    layer: usize,
    segments: &[Segment<'_>],
    [q, k, v]: [&B::Tensor; 3],
    heads: &Heads,
) -> Result<B::Tensor> {
    fn cache<K>(slots: &mut [Vec<K>], slot: usize, layer: usize) -> Result<&mut K> {
        (slots.get_mut(slot).and_then(|s| s.get_mut(layer)))
            .ok_or_else(|| ModelError::Invalid(format!("slot {slot} has no cache for {layer}")))
    }
    if let [one] = segments {
        // One sequence: the whole tensors, nothing copied.
        let kv = cache(slots, one.slot, layer)?;
        b.kv_append(kv, k, v)?;
        return Ok(b.attention(q, kv, one.mask, heads)?);
    }
    let mut parts = Vec::with_capacity(segments.len());
    for seg in segments {
        let rows: Vec<usize> = seg.rows.clone().collect();
        let kv = cache(slots, seg.slot, layer)?;
        b.kv_append(kv, &b.select_rows(k, &rows)?, &b.select_rows(v, &rows)?)?;
        parts.push(b.attention(&b.select_rows(q, &rows)?, kv, seg.mask, heads)?);
    }
    Ok(b.concat_rows(&parts)?)
}

impl<B: Backend + Clone> Decoder<B> {
    /// The whole pass as one segment of the selected slot.
    pub(crate) fn segment<'m>(&self, rows: Range<usize>, mask: &'m Mask) -> Segment<'m> {
        Segment {
            slot: self.slot,
            rows,
            mask,
        }
    }

    /// Cached positions of slot `slot`.
    pub(crate) fn slot_len(&self, slot: usize) -> usize {
        (self.slots.get(slot))
            .and_then(|s| s.first())
            .map_or(0, |kv| self.backend.kv_len(kv))
    }

    /// See [`crate::LanguageModel::set_slots`].
    pub fn set_slots(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            return Err(ModelError::Input("a model keeps at least one slot".into()));
        }
        let layers = self.slots[0].len();
        while self.slots.len() < n {
            let caches = (0..layers)
                .map(|_| self.backend.kv_new(&self.config.heads))
                .collect::<Result<_, _>>()?;
            self.slots.push(caches);
        }
        self.slots.truncate(n);
        self.slot = self.slot.min(n - 1);
        Ok(())
    }

    /// See [`crate::LanguageModel::select_slot`].
    pub fn select_slot(&mut self, slot: usize) -> Result<()> {
        if slot >= self.slots.len() {
            return Err(ModelError::Input(format!(
                "slot {slot} of a model with {} slots",
                self.slots.len()
            )));
        }
        self.slot = slot;
        Ok(())
    }

    /// See [`crate::LanguageModel::forward_slots`].
    pub fn forward_slots(&mut self, passes: &[SlotPass<'_>]) -> Result<Vec<Logits>> {
        let mut rows: Vec<Row<'_>> = Vec::new();
        let mut positions = Vec::new();
        let mut segments = Vec::with_capacity(passes.len());
        let mut logit_rows = Vec::new();
        for (i, p) in passes.iter().enumerate() {
            if p.slot >= self.slots.len() {
                return Err(ModelError::Input(format!(
                    "slot {} of a model with {} slots",
                    p.slot,
                    self.slots.len()
                )));
            }
            if passes[..i].iter().any(|q| q.slot == p.slot) {
                return Err(ModelError::Input(format!(
                    "slot {} twice in one pass",
                    p.slot
                )));
            }
            check_pass(
                p.rows.len(),
                self.slot_len(p.slot),
                p.positions,
                p.mask,
                p.logit_rows,
            )?;
            let start = rows.len();
            logit_rows.extend(p.logit_rows.iter().map(|r| start + r));
            rows.extend_from_slice(p.rows);
            positions.extend_from_slice(p.positions);
            segments.push(Segment {
                slot: p.slot,
                rows: start..rows.len(),
                mask: p.mask,
            });
        }
        if rows.is_empty() {
            let empty = |_| Logits {
                rows: 0,
                vocab: self.head_rows,
                data: Vec::new(),
            };
            return Ok(passes.iter().map(empty).collect());
        }
        self.check_rows(&rows)?;
        self.kept = None;
        let x = self.embed_rows(&rows)?;
        let x = self.layers(x, &positions, &segments)?;
        let logits = self.head(&x, &logit_rows)?;
        let all = self.host_logits(logits, logit_rows.len())?;
        let vocab = all.vocab;
        let mut at = 0;
        Ok(passes
            .iter()
            .map(|p| {
                let n = p.logit_rows.len();
                let data = all.data[at * vocab..(at + n) * vocab].to_vec();
                at += n;
                Logits {
                    rows: n,
                    vocab,
                    data,
                }
            })
            .collect())
    }

    /// See [`crate::LanguageModel::fork`]: every layer that runs must be held
    /// whole (a streamed or split layer's source cannot be shared).
    pub fn fork(&self) -> Result<Decoder<B>> {
        let shareable =
            (self.blocks.iter()).all(|b| matches!(b, Block::Resident(_) | Block::Skipped));
        if !shareable {
            return Err(ModelError::Input(
                "a model with streamed or split layers cannot be shared by several sequences' \
                 drafts"
                    .into(),
            ));
        }
        let mut fork = self.self_draft_with(&self.running_layers())?;
        fork.resident_bytes = 0;
        Ok(fork)
    }
}

//! A session owns an open run. Each reply is generated on a thread of its
//! own that holds the run while it works and sends the text as it is
//! confirmed, so a reply is a plain iterator; the run comes back to the
//! session when the reply ends or is dropped (dropping cancels it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use arbor_engine::{Generation, Run, TextEvent};

use crate::{Error, Message, Result, StopReason};

/// An open model (and draft) ready to reply, one reply at a time.
pub struct Session {
    /// `None` after a generation panicked.
    run: Option<Run>,
}

/// Stops a reply within one forward pass, from any thread
/// ([`Stream::cancel_handle`]).
#[derive(Debug, Clone)]
pub struct CancelHandle(Arc<AtomicBool>);

impl CancelHandle {
    /// Ends the reply: it stops with [`StopReason::Cancelled`] and keeps
    /// the text generated so far.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What one reply did.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Tokens of the prompt (after the chat template).
    pub prompt_tokens: usize,
    /// Tokens generated (the stop token not counted).
    pub generated_tokens: usize,
    /// Seconds spent reading the prompt, up to the first new token.
    pub prefill_seconds: f64,
    /// Seconds spent generating after that.
    pub decode_seconds: f64,
    /// Generated tokens per second of decoding.
    pub tokens_per_second: f64,
    /// Tokens each target pass after the prefill gave on average (the
    /// prefill gives the first): 1 when decoding plainly, more when drafted
    /// tokens were accepted.
    pub tokens_per_pass: f64,
    /// Bytes of weights streamed from disk (0 when the model fits).
    pub streamed_bytes: u64,
    /// The most memory the process has held so far (its peak resident set;
    /// `None` where the OS does not say).
    pub peak_memory: Option<u64>,
    /// Why the reply ended.
    pub stop: StopReason,
}

/// A finished reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The whole text.
    pub text: String,
    /// The generated token ids.
    pub tokens: Vec<u32>,
    /// What generating it did.
    pub stats: Stats,
}

impl Session {
    pub(crate) fn new(run: Run) -> Self {
        Self { run: Some(run) }
    }

    /// Generates from `prompt` as it is (no chat template); the reply
    /// streams as it is confirmed.
    pub fn generate(&mut self, prompt: &str) -> Result<Stream<'_>> {
        let tokens = self.run()?.prompt_tokens(prompt, false)?;
        self.start(tokens)
    }

    /// Replies to a conversation, written with the model's chat template.
    pub fn chat(&mut self, messages: &[Message]) -> Result<Stream<'_>> {
        // Message text is encoded as the characters it is: only the
        // template writes control tokens.
        let tokenizer = self.run()?.engine().tokenizer();
        let tokens = (tokenizer.encode_chat(messages)).map_err(arbor_engine::EngineError::from)?;
        self.start(tokens)
    }

    /// Generates from token ids (of this model's tokenizer).
    pub fn generate_tokens(&mut self, prompt: &[u32]) -> Result<Stream<'_>> {
        self.start(prompt.to_vec())
    }

    /// Switches an elastic target to the built level nearest at or below
    /// `level` for the next replies; returns that level. A model that is
    /// not elastic refuses.
    pub fn set_level(&mut self, level: f64) -> Result<f64> {
        let model = self.run_mut()?.engine_mut().model_mut();
        Ok(model
            .set_level(level)
            .map_err(arbor_engine::EngineError::from)?)
    }

    /// Sets the most new tokens of the next replies.
    pub fn set_max_tokens(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            return Err(Error::InvalidOption {
                option: "max_tokens",
                reason: "must be at least 1".into(),
            });
        }
        self.run_mut()?.set_max_tokens(n);
        Ok(())
    }

    /// The strategy in use (after `auto`, the one it chose).
    pub fn strategy(&self) -> Result<String> {
        Ok(self.run()?.strategy().name())
    }

    /// The engine's run, for what this crate does not cover (serving it
    /// with `arbor-serve`, changing strategy, traces).
    pub fn into_run(self) -> Result<Run> {
        self.run.ok_or(Error::Closed)
    }

    fn run(&self) -> Result<&Run> {
        self.run.as_ref().ok_or(Error::Closed)
    }

    fn run_mut(&mut self) -> Result<&mut Run> {
        self.run.as_mut().ok_or(Error::Closed)
    }

    fn start(&mut self, prompt: Vec<u32>) -> Result<Stream<'_>> {
        if prompt.is_empty() {
            return Err(Error::InvalidOption {
                option: "prompt",
                reason: "is empty".into(),
            });
        }
        let mut run = self.run.take().ok_or(Error::Closed)?;
        let cancel = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let flag = cancel.clone();
        let worker = std::thread::Builder::new()
            .name("arbor-reply".into())
            .spawn(move || {
                let options = run.options().clone();
                let result = run.generate_with(&prompt, &options, Some(&flag), &mut |e| {
                    if let TextEvent::Confirmed(text) = e {
                        // A receiver gone means the reply was dropped, and
                        // the flag is already set.
                        let _ = tx.send(text.to_string());
                    }
                });
                (run, result)
            });
        let worker = match worker {
            Ok(w) => w,
            Err(e) => {
                return Err(Error::Panicked(format!("starting a thread: {e}")));
            }
        };
        Ok(Stream {
            session: self,
            pieces: rx,
            worker: Some(worker),
            cancel,
            outcome: None,
        })
    }
}

type Worker = JoinHandle<(Run, arbor_engine::Result<Generation>)>;

/// A reply as it is generated: an iterator of text pieces, each confirmed
/// by the target (pieces never change once given). Collecting it blocks
/// until the reply ends; [`Stream::finish`] also gives the statistics.
/// Dropping it cancels the reply and waits (at most one pass) for the
/// session to be free again.
pub struct Stream<'s> {
    session: &'s mut Session,
    pieces: mpsc::Receiver<String>,
    worker: Option<Worker>,
    cancel: Arc<AtomicBool>,
    /// Set once the worker has ended.
    outcome: Option<Result<Generation>>,
}

impl Stream<'_> {
    /// A handle that stops this reply from another thread.
    pub fn cancel_handle(&self) -> CancelHandle {
        CancelHandle(self.cancel.clone())
    }

    /// Waits for the reply to end (discarding pieces not read yet, which
    /// the text repeats) and returns it with its statistics.
    pub fn finish(mut self) -> Result<Reply> {
        while self.pieces.recv().is_ok() {}
        self.join();
        match self.outcome.take() {
            Some(Ok(g)) => Ok(reply(g)),
            Some(Err(e)) => Err(e),
            None => Err(Error::AlreadyFailed),
        }
    }

    /// Takes the run back from the worker (once).
    fn join(&mut self) {
        let Some(worker) = self.worker.take() else {
            return;
        };
        self.outcome = Some(match worker.join() {
            Ok((run, result)) => {
                self.session.run = Some(run);
                result.map_err(Error::from)
            }
            Err(panic) => Err(Error::Panicked(panic_text(&panic))),
        });
    }
}

impl Iterator for Stream<'_> {
    type Item = Result<String>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Ok(piece) = self.pieces.recv() {
            return Some(Ok(piece));
        }
        // The worker dropped its sender: it has ended. An error ends the
        // iteration as its last item.
        self.join();
        match self.outcome.take() {
            Some(Err(e)) => Some(Err(e)),
            kept => {
                self.outcome = kept;
                None
            }
        }
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        if self.worker.is_some() {
            self.cancel.store(true, Ordering::Relaxed);
            self.join();
        }
    }
}

fn reply(g: Generation) -> Reply {
    let s = &g.stats;
    let passes = s.verifications + s.target_steps;
    let stats = Stats {
        prompt_tokens: s.prompt_tokens,
        generated_tokens: s.generated_tokens,
        prefill_seconds: s.prefill_secs,
        decode_seconds: s.decode_secs,
        tokens_per_second: ratio(s.generated_tokens as f64, s.decode_secs),
        // The prefill's pass gives the first token.
        tokens_per_pass: ratio(s.generated_tokens.saturating_sub(1) as f64, passes as f64),
        streamed_bytes: g.stream.bytes,
        peak_memory: arbor_engine::peak_resident(),
        stop: s.stop,
    };
    Reply {
        text: g.text,
        tokens: g.tokens,
        stats,
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    (panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}

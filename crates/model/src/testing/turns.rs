//! Provisional generation without thread timing: a target whose pass
//! waits for weights gives the draft a turn of a set number of passes,
//! and waits until the draft has taken them or has nothing to extend.

use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::{Config, LanguageModel, Logits, Mask, Result, WeightWait};

/// The draft's turns while a target waits for weights. A waiting target
/// calls [`Turns::wait`]: it reports the wait, lets the draft (wrapped in
/// [`Drafting`]) take up to `steps` passes, and reports that it resumed;
/// the turn's last draft pass returns only after that report, so the draft
/// never drafts into a wait that is over. The steps a draft takes in each
/// wait are then the same however the two threads are scheduled.
#[derive(Default)]
pub struct Turns {
    turn: Mutex<Turn>,
    changed: Condvar,
}

#[derive(Default)]
struct Turn {
    /// Counts turns: a draft waiting for its turn to end must not mistake
    /// the target's next wait for the same one.
    id: u64,
    open: bool,
    left: usize,
    idle: bool,
    /// Draft passes taken in turns so far.
    taken: usize,
}

/// A wait that outlasts this is a bug (a turn nobody ends), not slowness:
/// it panics instead of hanging the test.
const STUCK: Duration = Duration::from_secs(60);

impl Turns {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A target's wait for weights: reports it on `tx`, gives the draft a
    /// turn of `steps` passes (ended early when the draft has nothing to
    /// extend), then reports the target resumed.
    pub fn wait(&self, tx: &Sender<WeightWait>, steps: usize) {
        let mut turn = self.turn.lock().unwrap();
        turn.id += 1;
        turn.open = steps > 0;
        turn.left = steps;
        turn.idle = false;
        // A receiver that is gone (the pass ended) wants no reports.
        let _ = tx.send(WeightWait::Waiting);
        let mut turn = self.wait_while(turn, "the draft never took its turn", |t| {
            t.open && t.left > 0 && !t.idle
        });
        let _ = tx.send(WeightWait::Resumed);
        turn.open = false;
        self.changed.notify_all();
    }

    /// Draft passes taken during waits so far.
    pub fn taken(&self) -> usize {
        self.turn.lock().unwrap().taken
    }

    fn wait_while<'a>(
        &self,
        turn: MutexGuard<'a, Turn>,
        what: &str,
        f: impl FnMut(&mut Turn) -> bool,
    ) -> MutexGuard<'a, Turn> {
        let (turn, timeout) = self.changed.wait_timeout_while(turn, STUCK, f).unwrap();
        assert!(!timeout.timed_out(), "stuck: {what}");
        turn
    }
}

/// A draft that takes its [`Turns`]; otherwise the model it wraps.
pub struct Drafting {
    pub inner: Box<dyn LanguageModel>,
    pub turns: Arc<Turns>,
}

impl LanguageModel for Drafting {
    fn forward(&mut self, t: &[u32], p: &[u32], m: &Mask, rows: &[usize]) -> Result<Logits> {
        let out = self.inner.forward(t, p, m, rows);
        let mut turn = self.turns.turn.lock().unwrap();
        if turn.open {
            turn.left -= 1;
            turn.taken += 1;
            if turn.left == 0 {
                self.turns.changed.notify_all();
                let id = turn.id;
                drop(
                    (self.turns)
                        .wait_while(turn, "the target never resumed", |t| t.open && t.id == id),
                );
            }
        }
        out
    }
    fn idle_while_target_waits(&mut self) {
        let mut turn = self.turns.turn.lock().unwrap();
        if turn.open {
            turn.idle = true;
            self.turns.changed.notify_all();
        }
        drop(turn);
        self.inner.idle_while_target_waits();
    }
    fn keep_last_pass(&mut self, on: bool) -> bool {
        self.inner.keep_last_pass(on)
    }
    fn later_logits(&mut self, rows: &[usize]) -> Result<Option<Logits>> {
        self.inner.later_logits(rows)
    }
    fn cache_len(&self) -> usize {
        self.inner.cache_len()
    }
    fn truncate_cache(&mut self, len: usize) -> Result<()> {
        self.inner.truncate_cache(len)
    }
    fn keep_cache(&mut self, positions: &[usize]) -> Result<()> {
        self.inner.keep_cache(positions)
    }
    fn config(&self) -> &Config {
        self.inner.config()
    }
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
}

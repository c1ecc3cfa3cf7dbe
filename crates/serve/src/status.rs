//! What state the server's engine is in, shared by the worker (which loads
//! and, after a panic, reloads it) and the handlers (which answer 503 while
//! there is nothing to serve, and `/health` from it).

use std::sync::{Arc, Condvar, Mutex, OnceLock};

use arbor_engine::Tokenizer;

/// Where the engine stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// The server listens; the model is being loaded.
    Loading,
    Ready,
    /// A generation panicked; the engine is being rebuilt (requests wait in
    /// the queue meanwhile).
    Recovering,
    /// Loading failed: nothing will be served.
    Failed(String),
}

impl Phase {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Loading => "loading",
            Self::Ready => "ok",
            Self::Recovering => "recovering",
            Self::Failed(_) => "failed",
        }
    }
}

/// What the handlers need from a loaded model.
#[derive(Debug)]
pub(crate) struct Facts {
    pub tokenizer: Arc<Tokenizer>,
    pub model_id: String,
    /// Prompt plus new tokens one request may hold.
    pub context: usize,
    /// New tokens when a request does not say; `None`: until the end of
    /// the turn or the context.
    pub default_max_tokens: Option<usize>,
    /// Target weight bytes held under a memory budget.
    pub resident: u64,
    /// Logits per row (the grammar vocabulary's size).
    pub vocab: usize,
    /// The vocabulary for structured output, built on first use.
    pub grammars: OnceLock<Result<Arc<arbor_grammar::Grammars>, String>>,
}

#[derive(Debug)]
pub(crate) struct Status {
    phase: Mutex<Phase>,
    changed: Condvar,
    /// Set by the first load; a reload serves the same model.
    facts: OnceLock<Facts>,
}

impl Default for Status {
    fn default() -> Self {
        Self {
            phase: Mutex::new(Phase::Loading),
            changed: Condvar::new(),
            facts: OnceLock::new(),
        }
    }
}

impl Status {
    pub fn phase(&self) -> Phase {
        self.phase.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set(&self, phase: Phase) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = phase;
        self.changed.notify_all();
    }

    /// Blocks while the model is loading; then the phase it reached.
    pub fn wait_loaded(&self) -> Phase {
        let guard = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        let guard = (self.changed)
            .wait_while(guard, |p| *p == Phase::Loading)
            .unwrap_or_else(|e| e.into_inner());
        guard.clone()
    }

    /// Blocks until a load fails; then why.
    pub fn wait_failed(&self) -> String {
        let guard = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        let guard = (self.changed)
            .wait_while(guard, |p| !matches!(p, Phase::Failed(_)))
            .unwrap_or_else(|e| e.into_inner());
        match &*guard {
            Phase::Failed(why) => why.clone(),
            _ => unreachable!("waited for a failure"),
        }
    }

    pub fn facts(&self) -> Option<&Facts> {
        self.facts.get()
    }

    pub fn publish(&self, facts: Facts) {
        let _ = self.facts.set(facts);
    }
}

//! Options of a session, checked, then handed to the engine as one run
//! configuration.

use arbor_engine::{Engine, RunConfig};

use crate::{Backend, Error, Progress, Result, Session};

type OnProgress = Box<dyn FnMut(Progress<'_>) + Send>;

/// Opens a [`Session`]: which model, which draft and strategy, how much
/// memory, which backend, how to sample. Every option has a default: greedy
/// decoding of the whole model on the first backend compiled in, no memory
/// budget, no draft.
///
/// ```no_run
/// let session = arbor::Builder::new()
///     .model("/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
///     .draft("qwen2.5-coder-0.5b")
///     .strategy("tree")
///     .threads(4)
///     .temperature(0.7)
///     .seed(7)
///     .build()?;
/// # Ok::<(), arbor::Error>(())
/// ```
#[must_use]
pub struct Builder {
    config: RunConfig,
    progress: Option<OnProgress>,
    invalid: Option<Error>,
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl Builder {
    /// Every option at its default.
    pub fn new() -> Self {
        Self::with_config(RunConfig::default())
    }

    /// Starts from an engine run configuration (a device config read with
    /// [`RunConfig::from_toml`](arbor_engine::RunConfig::from_toml), say):
    /// it reaches the options this builder has no method for.
    pub fn with_config(config: RunConfig) -> Self {
        Self {
            config,
            progress: None,
            invalid: None,
        }
    }

    /// The target model: a GGUF file's path, or a registered name
    /// (`qwen2.5-coder-1.5b`, `qwen2.5-coder-0.5b`, `smollm2-135m`), fetched
    /// into `$ARBOR_HOME` (default `~/.cache/arbor`) the first time.
    /// Default: `qwen2.5-coder-1.5b`.
    pub fn model(mut self, path_or_name: impl Into<String>) -> Self {
        self.config.target = Some(path_or_name.into());
        self
    }

    /// A draft model sharing the target's tokenizer (path or registered
    /// name), or `self` (the target's resident layers) or `elastic:0.5` (a
    /// lower level of an elastic target), for the speculative strategies.
    pub fn draft(mut self, path_or_name: impl Into<String>) -> Self {
        self.config.draft = Some(path_or_name.into());
        self
    }

    /// How tokens are produced: `autoregressive`, `chain`, `tree`,
    /// `tree-provisional`, `ppd`, `tree-ppd`, `lookup`, or `auto` (chosen
    /// from the memory budget, the draft and this device's measured
    /// speeds). Default: `tree` with a draft, else `autoregressive`.
    /// Every strategy gives the target's own greedy output.
    pub fn strategy(mut self, name: impl Into<String>) -> Self {
        self.config.strategy = Some(name.into());
        self
    }

    /// Bytes the whole process may hold. The target keeps as many layers
    /// resident as fit and streams the rest from disk on every pass; a
    /// budget too small to run at all fails [`Builder::build`] with the
    /// minimum it needs.
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        if bytes == 0 {
            self.reject("memory_budget", "must be more than 0 bytes".into());
        }
        self.config.memory_budget = Some(bytes.to_string());
        self
    }

    /// The backend that runs the models. Default: the first compiled in
    /// (candle on a default build).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.config.backend = Some(backend.name().into());
        self
    }

    /// Worker threads of the CPU backends. Process-wide: the first session
    /// that sets it decides, and a later one asking for another count fails.
    pub fn threads(mut self, n: usize) -> Self {
        if !(1..=1024).contains(&n) {
            self.reject("threads", format!("must be between 1 and 1024, got {n}"));
        }
        self.config.threads = Some(n);
        self
    }

    /// Most new tokens per reply (default 128).
    pub fn max_tokens(mut self, n: usize) -> Self {
        if n == 0 {
            self.reject("max_tokens", "must be at least 1".into());
        }
        self.config.max_tokens = Some(n);
        self
    }

    /// Longest prompt plus reply one generation may hold; under a memory
    /// budget the caches are planned for it.
    pub fn context(mut self, tokens: usize) -> Self {
        if tokens < 2 {
            self.reject(
                "context",
                format!("must be at least 2 tokens, got {tokens}"),
            );
        }
        self.config.context = Some(tokens);
        self
    }

    /// Sampling temperature; 0 (the default) is greedy decoding.
    pub fn temperature(mut self, t: f32) -> Self {
        if !(t.is_finite() && t >= 0.0) {
            self.reject("temperature", format!("must be 0 or more, got {t}"));
        }
        self.config.sampling.temperature = Some(t);
        self
    }

    /// Samples among the `k` likeliest tokens only (0: all).
    pub fn top_k(mut self, k: usize) -> Self {
        self.config.sampling.top_k = Some(k);
        self
    }

    /// Samples among the likeliest tokens whose probabilities add up to
    /// `p` (in `(0, 1]`; 1: all).
    pub fn top_p(mut self, p: f32) -> Self {
        if !(p > 0.0 && p <= 1.0) {
            self.reject("top_p", format!("must be in (0, 1], got {p}"));
        }
        self.config.sampling.top_p = Some(p);
        self
    }

    /// The sampler's seed: the same seed, prompt and options give the same
    /// reply.
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.sampling.seed = Some(seed);
        self
    }

    /// Runs an elastic target (built by `arbor elastic build`) at the
    /// built level nearest at or below `level`, a fraction in `(0, 1]` of
    /// its units. See also [`Session::set_level`].
    pub fn level(mut self, level: f64) -> Self {
        if !(level > 0.0 && level <= 1.0) {
            self.reject("level", format!("must be in (0, 1], got {level}"));
        }
        self.config.level = Some(level);
        self
    }

    /// Hears what opening the session does (downloads, tensors loaded,
    /// measurements, decisions), for a progress bar or a log.
    pub fn on_progress(mut self, f: impl FnMut(Progress<'_>) + Send + 'static) -> Self {
        self.progress = Some(Box::new(f));
        self
    }

    /// The run configuration this builder hands the engine.
    pub fn config(&self) -> &RunConfig {
        &self.config
    }

    fn reject(&mut self, option: &'static str, reason: String) {
        self.invalid
            .get_or_insert(Error::InvalidOption { option, reason });
    }

    /// Checks the options, then fetches what is missing, plans the memory
    /// budget, loads the models and measures what the strategy needs (once
    /// per device, cached).
    pub fn build(self) -> Result<Session> {
        if let Some(e) = self.invalid {
            return Err(e);
        }
        apply_threads(self.config.threads)?;
        let mut progress = self.progress.unwrap_or_else(|| Box::new(|_| {}));
        let run = Engine::open(&self.config, &mut *progress)?;
        Ok(Session::new(run))
    }
}

/// Sizes the process-wide pool once; a later session asking for the size it
/// already has is fine. A failed sizing leaves it unset.
fn apply_threads(threads: Option<usize>) -> Result<()> {
    static SET: std::sync::Mutex<Option<usize>> = std::sync::Mutex::new(None);
    let Some(n) = threads else { return Ok(()) };
    let mut set = SET.lock().unwrap_or_else(|p| p.into_inner());
    match *set {
        Some(first) if first != n => Err(Error::InvalidOption {
            option: "threads",
            reason: format!("the thread pool was sized to {first} by an earlier session"),
        }),
        Some(_) => Ok(()),
        None => {
            let config = RunConfig {
                threads: Some(n),
                ..RunConfig::default()
            };
            config.apply_threads()?;
            *set = Some(n);
            Ok(())
        }
    }
}

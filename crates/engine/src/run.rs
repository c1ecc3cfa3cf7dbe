//! An open run: generating with the strategy it holds, switching
//! strategies within its memory budget, the prompt cache between
//! generations, and the notes it keeps.

use arbor_planner::{Drift, ProfileStore, Profiles};
use arbor_speculative::{Strategy, Streaming};

use crate::DraftSource;
use crate::config::RunConfig;
use crate::events::{OpenEvent, load_events, loading};
use crate::{
    BackendKind, BackendSpec, Engine, EngineError, GenerateOptions, Generation, Result, TextEvent,
};

/// An open run: the engine with its models, the strategy and generation
/// options, the latency profiles it sized trees with, and what it noticed.
pub struct Run {
    pub(crate) engine: Engine,
    pub(crate) backend: BackendSpec,
    pub(crate) config: RunConfig,
    pub(crate) draft: Option<DraftSource>,
    pub(crate) options: GenerateOptions,
    pub(crate) profiles: Option<Profiles>,
    pub(crate) store: ProfileStore,
    pub(crate) drift: Drift,
    pub(crate) notes: Vec<String>,
    /// With the prompt cache on: the tokens whose keys and values the
    /// target's cache holds from the last generation (`None`: off).
    pub(crate) cached: Option<Vec<u32>>,
}

/// Prompt tokens a cache holding the keys and values of `cached` (its
/// first `cache_len`) can give `prompt`: their common start, leaving the
/// prompt's last token to be fed (its logits start the generation).
pub fn reusable_prefix(cached: &[u32], prompt: &[u32], cache_len: usize) -> usize {
    let same = (cached.iter().zip(prompt))
        .take_while(|(a, b)| a == b)
        .count();
    same.min(prompt.len().saturating_sub(1)).min(cache_len)
}

impl Run {
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    pub fn backend(&self) -> BackendKind {
        self.backend.kind
    }

    /// The backend with its settings (how it stores KV caches).
    pub fn backend_spec(&self) -> BackendSpec {
        self.backend
    }

    pub fn config(&self) -> &RunConfig {
        &self.config
    }

    pub fn strategy(&self) -> &Strategy {
        &self.options.strategy
    }

    pub fn options(&self) -> &GenerateOptions {
        &self.options
    }

    /// The latency curves in use, once a strategy needed them.
    pub fn profiles(&self) -> Option<&Profiles> {
        self.profiles.as_ref()
    }

    /// Switches to the strategy `name` (with this run's tuning), loading the
    /// draft and measuring profiles if it needs them and they are missing.
    /// Under a memory budget the draft and the streaming mode were fixed
    /// when the run opened: a strategy that needs others is refused.
    pub fn use_strategy(
        &mut self,
        name: &str,
        progress: &mut dyn FnMut(OpenEvent<'_>),
    ) -> Result<()> {
        let strategy = self.config.tuning.apply(name.parse()?);
        self.check_budget_allows(&strategy)?;
        if strategy.needs_draft() && self.engine.draft().is_none() {
            let name = self.config.draft.clone().ok_or_else(|| {
                EngineError::Invalid(format!("strategy `{strategy}` needs a draft model"))
            })?;
            let source = DraftSource::resolve(&name, progress)?;
            attach(&mut self.engine, &source, self.backend, progress)?;
            self.draft = Some(source);
        }
        self.options.strategy = self.prepare(strategy, progress)?;
        self.config.strategy = Some(self.options.strategy.name());
        Ok(())
    }

    /// Switches to an already-built strategy (from [`Run::strategy`] after
    /// [`Run::use_strategy`]); trees get this run's current profiles.
    pub fn set_strategy(&mut self, strategy: Strategy) -> Result<()> {
        self.check_budget_allows(&strategy)?;
        if strategy.needs_draft() && self.engine.draft().is_none() {
            return Err(EngineError::Invalid(format!(
                "strategy `{strategy}` needs a draft model, and none is loaded"
            )));
        }
        self.options.strategy = self.prepare(strategy, &mut |_| {})?;
        self.config.strategy = Some(self.options.strategy.name());
        Ok(())
    }

    /// Under a memory budget, the draft and the streaming mode were
    /// planned when the run opened.
    fn check_budget_allows(&self, strategy: &Strategy) -> Result<()> {
        let Some(m) = self.engine.memory() else {
            return Ok(());
        };
        let pipelined = matches!(m.mode, crate::StreamMode::Pipelined { .. });
        let mode_differs = (strategy.streaming == Streaming::Pipelined) != pipelined;
        let draft_missing = strategy.needs_draft() && self.engine.draft().is_none();
        if mode_differs || draft_missing {
            return Err(EngineError::Invalid(format!(
                "strategy `{strategy}` needs {} than this run's memory budget was planned with: \
                 open a run with it",
                if draft_missing {
                    "a draft"
                } else {
                    "another streaming mode"
                }
            )));
        }
        Ok(())
    }

    /// Sets the most new tokens per generation.
    pub fn set_max_tokens(&mut self, n: usize) {
        self.options.max_tokens = n;
    }

    /// Token ids of `text` (raw, or as one user turn of the chat template).
    pub fn prompt_tokens(&self, text: &str, chat: bool) -> Result<Vec<u32>> {
        self.engine.prompt_tokens(text, chat)
    }

    /// Generates from `prompt` with this run's strategy and options,
    /// streaming text events to `on`; afterwards checks the pass times
    /// against the latency profile (see [`Drift`]).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        on: &mut dyn FnMut(TextEvent<'_>),
    ) -> Result<Generation> {
        let options = self.options.clone();
        self.generate_with(prompt, &options, None, on)
    }

    /// Turns the prompt cache on or off. On, a prompt that extends the
    /// last generation's prompt and output (the next turn of a
    /// conversation) prefills only its new tokens: the target's cache keeps
    /// the rest, as llama-server's prompt cache does.
    pub fn set_prompt_cache(&mut self, on: bool) {
        self.cached = on.then(Vec::new);
    }

    /// The target's cache no longer holds what the prompt cache says (a
    /// measurement or a strategy change ran the model).
    pub(crate) fn forget_cached(&mut self) {
        if let Some(c) = &mut self.cached {
            c.clear();
        }
    }

    /// Prompt tokens the next generation of `prompt` would take from the
    /// cache (0 with the prompt cache off).
    pub fn cached_prefix(&self, prompt: &[u32]) -> usize {
        let Some(cached) = &self.cached else { return 0 };
        reusable_prefix(cached, prompt, self.engine.model().cache_len())
    }

    /// [`Run::generate`] with one request's options (a copy of
    /// [`Run::options`] with its own sampling, token limit, stop tokens)
    /// and a flag that, once set, ends it within one pass.
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        cancel: Option<&std::sync::atomic::AtomicBool>,
        on: &mut dyn FnMut(TextEvent<'_>),
    ) -> Result<Generation> {
        let control = crate::Control {
            cancel,
            ..Default::default()
        };
        self.generate_controlled(prompt, options, control, on)
    }

    /// [`Run::generate_with`] under a [`Control`](crate::Control): a
    /// cancel flag, a rule on what may be generated (a grammar, penalties:
    /// every token the target chooses is chosen under it, with any
    /// strategy, so the output equals the constrained target-only output)
    /// and token scores. Its `reuse` is the run's to set (from the prompt
    /// cache): the caller's is ignored.
    pub fn generate_controlled(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        control: crate::Control<'_>,
        on: &mut dyn FnMut(TextEvent<'_>),
    ) -> Result<Generation> {
        self.check_budget_allows(&options.strategy)?;
        if let Some(m) = self.engine.memory() {
            let needed = prompt.len() + options.max_tokens;
            if needed > m.context {
                return Err(EngineError::Invalid(format!(
                    "this request needs {needed} tokens of context ({} prompt + {} new); the \
                     memory budget was planned for {} (set `context` in the run config, \
                     --context)",
                    prompt.len(),
                    options.max_tokens,
                    m.context
                )));
            }
        }
        let control = crate::Control {
            reuse: self.cached_prefix(prompt),
            ..control
        };
        // Until it succeeds, the cache holds nothing known.
        self.forget_cached();
        let g = self
            .engine
            .generate_controlled(prompt, options, control, on)?;
        if let Some(cached) = &mut self.cached {
            *cached = [prompt, &g.tokens].concat();
            cached.truncate(self.engine.model().cache_len());
        }
        // What streaming achieved is what the next plan should expect; a
        // cache that cannot be written costs nothing here. Under a GPU's
        // budget layers come from host memory (the page cache or the host
        // tier) as far as it holds them: that rate and those passes are
        // not the disk's to learn, but their uploads are the GPU's.
        let read = self.engine.memory().map_or(0, |m| m.disk_read_per_pass);
        let _ = self.store.observe_streaming(
            self.engine.path(),
            read,
            g.stream.bytes,
            g.stream.io_secs,
        );
        if self.config.gpu_memory_budget.is_some() {
            let _ = self.store.observe_upload(
                self.backend.kernels(),
                g.stream.bytes + g.stream.host_bytes,
                g.stream.build_secs,
            );
        }
        // What the draft's guesses were worth, for `auto`'s next plan.
        if let Some(source) = self.source_key(&options.strategy) {
            let _ =
                (self.store).observe_acceptance(self.engine.path(), &source, &g.stats.acceptance);
        }
        // The rate its source decoded at, for `auto`'s next plan.
        let _ = self.observe_rate(&options.strategy, &g);
        // How its passes computed while layers streamed, for the next plan.
        if read > 0 {
            let _ = self.observe_stream_compute(&g);
        }
        self.heal(&g)?;
        Ok(g)
    }

    /// The name a strategy's draft source is counted under
    /// ([`arbor_planner::source_key`]): the draft's, or `ppd` for the
    /// target's own prompt tokens; `None` without one.
    fn source_key(&self, strategy: &Strategy) -> Option<String> {
        if matches!(strategy.decoding, arbor_speculative::Decoding::Ppd(_)) {
            return Some(crate::ppd::SOURCE.into());
        }
        self.draft.as_ref().map(DraftSource::key)
    }

    /// Folds the generation's decoding rate into the store under the run's
    /// budget, by source (`none` without one) and strategy: `auto` plans
    /// with what a source measured here ([`arbor_planner::rates`]). A
    /// server's slots share passes: their rates are not one source's.
    fn observe_rate(&self, strategy: &Strategy, g: &Generation) -> Result<()> {
        if self.config.slots.unwrap_or(1) > 1 {
            return Ok(());
        }
        let key = self.config.budget_key(self.engine.path())?;
        let source =
            (self.source_key(strategy)).unwrap_or_else(|| arbor_planner::rates::NO_SOURCE.into());
        Ok(self.store.observe_rate(
            self.engine.path(),
            self.backend.kernels(),
            rayon::current_num_threads(),
            &key,
            &source,
            &arbor_planner::strategy_key(&strategy.name(), self.config.tuning.branch_threshold),
            // Tokens after the first over the time after the prefill, as
            // `bench spec` counts its rows.
            g.stats.generated_tokens.saturating_sub(1),
            g.stats.decode_secs,
        )?)
    }

    /// What the run noticed since the last call (profile drift and what
    /// was done about it).
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }
}

/// Attaches `source` as the draft of an engine loaded without a budget.
pub(crate) fn attach(
    engine: &mut Engine,
    source: &DraftSource,
    backend: crate::BackendSpec,
    progress: &mut dyn FnMut(OpenEvent<'_>),
) -> Result<()> {
    match source {
        DraftSource::Model(path) => engine
            .load_draft(path, backend, &mut load_events(path, progress))
            .map_err(loading(path)),
        DraftSource::Lookup => engine.attach_lookup(),
        DraftSource::Elastic(level) => engine.attach_elastic(*level),
        DraftSource::SelfLayers => Err(EngineError::Invalid(
            "a self draft runs the target's resident layers: it needs a memory budget under \
             which some layers stream (--memory-budget), opened with it"
                .into(),
        )),
    }
}

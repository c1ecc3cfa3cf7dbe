//! Opening a run: the one engine call that turns a [`RunConfig`] into a
//! run ready to generate — resolve (fetching registered models) → plan the
//! memory budget → load target and draft → latency profiles → strategy.
//! Every command of `arbor` that runs a model (generate, bench spec and its
//! budgeted child processes, bench decode, perplexity, profile) opens its
//! run here.

use std::path::{Path, PathBuf};

use arbor_speculative::{Decoding, DraftPrompts, LatencyProfile, Strategy, Streaming};

use crate::config::{DEFAULT_TARGET, RunConfig};
use crate::drafts::DraftSource;
use crate::profiles::{Drift, ProfileStore};
use crate::{BackendKind, Engine, EngineError, GenerateOptions, Generation, Result, TextEvent};

/// What opening a run reports as it goes.
#[derive(Debug)]
pub enum OpenEvent<'a> {
    /// A model download (only when a registered model is missing).
    Fetch(arbor_fetch::Progress),
    /// Tensors of `path` loaded so far.
    Load {
        path: &'a Path,
        done: usize,
        total: usize,
    },
    /// A measurement (latency curve sizes, disk reads) under way.
    Measure {
        what: &'a str,
        done: usize,
        total: usize,
    },
    /// A decision or fact worth a line on stderr.
    Note(&'a str),
    /// Why a decision was taken (the `auto` planner's estimates): shown
    /// when asked for (`--explain`).
    Explain(&'a str),
}

/// The latency curves trees are sized with, as the run sees them.
#[derive(Debug, Clone)]
pub struct Profiles {
    /// The target's curve: with every layer resident, or (when no cached
    /// one existed and the run streams) as measured while streaming.
    pub target: LatencyProfile,
    pub draft: Option<LatencyProfile>,
    /// Seconds each target pass spends reading streamed layers (the plan's
    /// bytes per pass at the measured disk bandwidth; 0 without a budget).
    pub io_per_pass: f64,
    /// Seconds of those reads no compute can hide: with pipelined
    /// streaming the first streamed layer's read (the others overlap the
    /// layers computed before them); without, all of them.
    pub io_exposed: f64,
}

impl Profiles {
    /// The target's curve as a pass under this run's budget costs it: the
    /// compute of `n` tokens and the reads overlap except for the exposed
    /// part, so a pass costs its reads until the tokens' compute outgrows
    /// them — the flat stretch where large trees are nearly free.
    pub fn target_under_budget(&self) -> LatencyProfile {
        let (io, exposed) = (self.io_per_pass, self.io_exposed);
        LatencyProfile {
            points: (self.target.points.iter())
                .map(|&(n, s)| (n, s.max(io - exposed) + exposed))
                .collect(),
        }
    }
}

/// An open run: the engine with its models, the strategy and generation
/// options, the latency profiles it sized trees with, and what it noticed.
pub struct Run {
    engine: Engine,
    backend: BackendKind,
    config: RunConfig,
    draft: Option<DraftSource>,
    options: GenerateOptions,
    profiles: Option<Profiles>,
    pub(crate) store: ProfileStore,
    drift: Drift,
    notes: Vec<String>,
    /// With the prompt cache on: the tokens whose keys and values the
    /// target's cache holds from the last generation (`None`: off).
    cached: Option<Vec<u32>>,
}

/// A model path, or a registered short name (fetched when missing).
pub fn resolve_or_fetch(name: &str, progress: &mut dyn FnMut(OpenEvent<'_>)) -> Result<PathBuf> {
    let fetched = match arbor_fetch::model_entry(name) {
        Some(entry) => arbor_fetch::fetch_model(entry, &mut |p| progress(OpenEvent::Fetch(p))),
        None => arbor_fetch::resolve_model(name),
    };
    fetched.map_err(|e| EngineError::Invalid(e.to_string()))
}

/// The backend named, or the first compiled in.
pub fn pick_backend(name: Option<&str>) -> Result<BackendKind> {
    let kind = match name {
        Some(n) => n.parse()?,
        None => *BackendKind::compiled()
            .first()
            .ok_or_else(|| EngineError::Invalid("this build has no backend compiled in".into()))?,
    };
    if !kind.is_compiled() {
        return Err(EngineError::BackendNotCompiled(kind));
    }
    Ok(kind)
}

impl Engine {
    /// Opens a run from `config`, reporting downloads, loading and
    /// measurements to `progress`; measured facts live in the default
    /// [`ProfileStore`].
    pub fn open(config: &RunConfig, progress: &mut dyn FnMut(OpenEvent<'_>)) -> Result<Run> {
        Self::open_with_store(config, ProfileStore::default(), progress)
    }

    /// [`Engine::open`] with measured facts read from and written to `store`.
    pub fn open_with_store(
        config: &RunConfig,
        store: ProfileStore,
        progress: &mut dyn FnMut(OpenEvent<'_>),
    ) -> Result<Run> {
        // Everything that can be checked without files first.
        let backend = pick_backend(config.backend.as_deref())?;
        let auto = is_auto(config);
        let named: Option<Strategy> = match auto {
            true => None,
            false => config.strategy.as_deref().map(str::parse).transpose()?,
        };
        let budget = config.budget_bytes()?;
        if budget.is_some() {
            // Before anything allocates on other threads (the planner's
            // tokenizer, the thread pool): with more malloc arenas than
            // the two this allows, freed streamed layers linger in each
            // and the process outgrows its plan (measured: a run planned
            // after the tokenizer had spread arenas thrashed at the cgroup
            // limit, 2.0 against 5.5 tok/s at 800 MiB).
            crate::limit_allocator_caching();
        }
        let verification = config.tuning.verification()?;
        let target_name = config.target.as_deref().unwrap_or(DEFAULT_TARGET);
        let target = resolve_or_fetch(target_name, progress)?;
        // What to try, best first: the planner's ranking under `auto` (a
        // source whose memory estimate was short falls through to the
        // next), else the configured draft and strategy.
        type Attempt = (Option<String>, Option<Strategy>, Option<f32>);
        let mut attempts: Vec<Attempt> = if auto {
            crate::choose::choose(config, &target, budget, backend, &store, progress)?
                .into_iter()
                .map(|c| {
                    let strategy = c.strategy.parse::<Strategy>()?;
                    Ok((c.draft, Some(strategy), c.branch_threshold))
                })
                .collect::<Result<_>>()?
        } else {
            vec![(config.draft.clone(), named, None)]
        };
        // Nothing fits by the planner's estimates: plain decoding is tried
        // anyway, and a budget too small for it says the minimum.
        if attempts.is_empty() {
            attempts.push((None, None, None));
        }
        crate::release_freed_memory();
        let last = attempts.len() - 1;
        let mut opened = None;
        for (i, (draft_name, named, branch)) in attempts.into_iter().enumerate() {
            let mut config = RunConfig {
                draft: draft_name,
                ..config.clone()
            };
            // The planner's branch threshold, unless the config sets one.
            config.tuning.branch_threshold = config.tuning.branch_threshold.or(branch);
            match load_for(&config, named, &target, budget, backend, progress) {
                Ok(loaded) => {
                    opened = Some((config, loaded));
                    break;
                }
                Err(e) if i < last && too_small(&e) => {
                    progress(OpenEvent::Note(&format!(
                        "auto: {} does not fit after all ({e}); trying the next choice",
                        config
                            .draft
                            .as_deref()
                            .unwrap_or("decoding without a draft")
                    )));
                }
                Err(e) => return Err(e),
            }
        }
        let (config, (mut engine, strategy, draft)) = opened.expect("at least one attempt");
        let config = &config;
        if let Some(level) = config.level {
            let at = engine.model_mut().set_level(level)?;
            progress(OpenEvent::Note(&format!(
                "elastic: the target runs at level {at}"
            )));
        }
        if let Some(path) = &config.lora {
            let at = crate::lora::attach(engine.model_mut(), Path::new(path), config.level)?;
            progress(OpenEvent::Note(&format!(
                "elastic: LoRA adapters of {path} attached at level {at}"
            )));
        }
        let mut run = Run {
            engine,
            backend,
            config: RunConfig {
                strategy: Some(strategy.name()),
                ..config.clone()
            },
            draft,
            options: GenerateOptions {
                max_tokens: (config.max_tokens).unwrap_or(GenerateOptions::default().max_tokens),
                sampling: config.sampling.params(),
                stop_tokens: None,
                strategy: Strategy::default(),
                verification,
            },
            profiles: None,
            store,
            drift: Drift::default(),
            notes: Vec::new(),
            cached: None,
        };
        run.options.strategy = run.prepare(strategy, progress)?;
        Ok(run)
    }
}

/// Resolves the strategy and draft of `config` (`named`, else the
/// default) and loads the engine for them.
fn load_for(
    config: &RunConfig,
    named: Option<Strategy>,
    target: &Path,
    budget: Option<u64>,
    backend: BackendKind,
    progress: &mut dyn FnMut(OpenEvent<'_>),
) -> Result<(Engine, Strategy, Option<DraftSource>)> {
    let strategy = match named {
        Some(s) => s,
        None => default_strategy(target, config, budget, backend, progress)?,
    };
    let strategy = config.tuning.apply(strategy);
    if strategy.needs_draft() && config.draft.is_none() {
        return Err(EngineError::Invalid(format!(
            "strategy `{strategy}` needs a draft model or source (--draft: a model such as \
             qwen2.5-coder-0.5b, `lookup` or `self`)"
        )));
    }
    let draft = match &config.draft {
        Some(d) if strategy.needs_draft() => Some(DraftSource::resolve(d, progress)?),
        _ => None,
    };
    let engine = match budget {
        Some(bytes) => {
            let mut options = config.memory_options(bytes, &strategy);
            // On a GPU budget a draft model's weights share the GPU.
            if let (Some(_), Some(DraftSource::Model(path))) = (options.base, &draft) {
                let file = arbor_gguf::GgufFile::open(path).map_err(|e| loading(path)(e.into()))?;
                options.base = Some(crate::backends::model_bytes(backend, &file)?);
            }
            let engine = Engine::load_budgeted(
                target,
                draft.as_ref(),
                backend,
                &options,
                &mut load_events(target, progress),
            )
            .map_err(loading(target))?;
            if let Some(m) = engine.memory() {
                progress(OpenEvent::Note(&m.summary()));
            }
            engine
        }
        None => {
            let mut engine = Engine::load(target, backend, &mut load_events(target, progress))
                .map_err(loading(target))?;
            if let Some(d) = &draft {
                attach(&mut engine, d, backend, progress)?;
            }
            engine
        }
    };
    Ok((engine, strategy, draft))
}

/// Whether `e` says a memory budget cannot hold what was asked.
fn too_small(e: &EngineError) -> bool {
    let paging = |m: &arbor_model::ModelError| {
        matches!(
            m.source_as(),
            Some(arbor_paging::PagingError::TooSmall { .. })
        )
    };
    match e {
        EngineError::Load { inner, .. } => too_small(inner),
        EngineError::Model(m) => paging(m),
        _ => false,
    }
}

/// The strategy name that lets the planner choose ([`crate::choose`]).
pub const AUTO: &str = "auto";

/// Whether `config` asks the planner to choose: `strategy = "auto"`, or no
/// strategy under a memory budget.
fn is_auto(config: &RunConfig) -> bool {
    match config.strategy.as_deref() {
        Some(s) => s == AUTO,
        None => config.memory_budget.is_some(),
    }
}

/// Attaches `source` as the draft of an engine loaded without a budget.
fn attach(
    engine: &mut Engine,
    source: &DraftSource,
    backend: BackendKind,
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

/// An error while loading `path`, saying which file it was.
fn loading(path: &Path) -> impl FnOnce(EngineError) -> EngineError + use<> {
    let path = path.to_path_buf();
    move |e| EngineError::Load {
        path,
        inner: Box::new(e),
    }
}

/// Loading progress of `path` as open events.
fn load_events<'a>(
    path: &'a Path,
    progress: &'a mut dyn FnMut(OpenEvent<'_>),
) -> impl FnMut(usize, usize) + 'a {
    move |done, total| progress(OpenEvent::Load { path, done, total })
}

/// `tree` with a draft, `autoregressive` without, and `autoregressive` too
/// when a memory budget holds the whole target by itself: speculative
/// decoding would have to make room for the draft by streaming target
/// layers from disk on every pass, which costs far more than it saves.
fn default_strategy(
    target: &Path,
    config: &RunConfig,
    budget: Option<u64>,
    backend: BackendKind,
    progress: &mut dyn FnMut(OpenEvent<'_>),
) -> Result<Strategy> {
    if config.draft.is_none() {
        return Ok(Strategy::new(Decoding::Autoregressive));
    }
    if let Some(b) = budget
        && Engine::target_fits(
            target,
            backend,
            &config.memory_options(b, &Strategy::new(Decoding::Autoregressive)),
        )?
    {
        progress(OpenEvent::Note(
            "the target fits the memory budget by itself: decoding without the draft \
             (--strategy tree to use it anyway)",
        ));
        return Ok(Strategy::new(Decoding::Autoregressive));
    }
    Ok("tree".parse()?)
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
        // cache that cannot be written costs nothing here.
        let read = self.engine.memory().map_or(0, |m| m.plan.read_per_pass);
        let _ = self.store.observe_streaming(
            self.engine.path(),
            read,
            g.stream.bytes,
            g.stream.io_secs,
        );
        self.heal(&g)?;
        Ok(g)
    }

    /// What the run noticed since the last call (profile drift and what
    /// was done about it).
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    /// Fills in the latency profiles of a strategy that sizes its trees
    /// with them.
    fn prepare(
        &mut self,
        mut strategy: Strategy,
        progress: &mut dyn FnMut(OpenEvent<'_>),
    ) -> Result<Strategy> {
        self.forget_cached();
        if let Decoding::Ppd(c) = &mut strategy.decoding
            && c.prompts.is_none()
        {
            let hidden = self.engine.model().config().hidden;
            let (prompts, source) = crate::ppd::prompt_tokens_for(self.engine.path(), hidden)?;
            progress(OpenEvent::Note(&format!(
                "ppd: prompt tokens from {source}"
            )));
            c.prompts = Some(prompts);
        }
        if let Decoding::Tree(c) = &mut strategy.decoding
            && let Some(dp) = &mut c.draft_prompts
            && dp.prompts.is_none()
        {
            let (Some(DraftSource::Model(path)), Some(draft)) = (&self.draft, self.engine.draft())
            else {
                return Err(EngineError::Invalid(
                    "tree-ppd needs a draft model with trained prompt tokens (--draft)".into(),
                ));
            };
            let (prompts, source) = crate::ppd::prompt_tokens_for(path, draft.config().hidden)?;
            progress(OpenEvent::Note(&format!(
                "tree-ppd: the draft's prompt tokens from {source}"
            )));
            dp.prompts = Some(prompts);
        }
        if strategy.sized_by_profile() && self.config.tuning.profiled() {
            let wants_draft = strategy.needs_draft();
            if self
                .profiles
                .as_ref()
                .is_none_or(|p| wants_draft && p.draft.is_none())
            {
                self.profiles = Some(self.measure_profiles(progress)?);
            }
            match (&mut strategy.decoding, &self.profiles) {
                (Decoding::Tree(c), Some(p)) => {
                    c.profile = Some(p.target_under_budget());
                    c.draft_profile = p.draft.clone();
                }
                (Decoding::Ppd(c), Some(p)) => c.profile = Some(p.target_under_budget()),
                _ => {}
            }
        }
        if let Decoding::Tree(c) = &strategy.decoding
            && let Some(DraftPrompts {
                prompts: Some(prompts),
                count: None,
            }) = &c.draft_prompts
        {
            let q = arbor_speculative::draft_guesses(prompts, c.draft_profile.as_ref());
            let why = match &c.draft_profile {
                Some(_) => "sized by its latency curve and accuracy",
                None => "all of them: no latency curve",
            };
            progress(OpenEvent::Note(&format!(
                "tree-ppd: the draft carries {q} prompt tokens per step ({why})"
            )));
        }
        Ok(strategy)
    }

    /// The target's and the draft's curves from the store (measured now
    /// when missing), and the IO a streamed pass adds.
    fn measure_profiles(&mut self, progress: &mut dyn FnMut(OpenEvent<'_>)) -> Result<Profiles> {
        let read = self.engine.memory().map_or(0, |m| m.plan.read_per_pass);
        let target_path = self.engine.path().to_path_buf();
        // A curve measured while layers stream holds their reads: it is
        // used as it is (no IO added) and not cached as the resident one.
        let (target, measured_streaming) = {
            let (record, note) = self.latency(&target_path, false, read == 0, progress)?;
            (record.profile(), note.is_some() && read > 0)
        };
        let running = match &self.draft {
            Some(DraftSource::Elastic(level)) => self.engine.elastic_share(*level)?,
            _ => self.engine.memory().map_or(1.0, |m| {
                1.0 - m.plan.streamed() as f64 / m.plan.resident.len().max(1) as f64
            }),
        };
        let draft = match self.draft.clone() {
            Some(DraftSource::Model(path)) => {
                Some(self.latency(&path, false, true, progress)?.0.profile())
            }
            Some(other) => other.derived_profile(&target, running),
            None => None,
        };
        let io_per_pass = if read == 0 || measured_streaming {
            0.0
        } else {
            let (disk, note) = self.store.disk(&target_path, false)?;
            if let Some(note) = note {
                progress(OpenEvent::Note(&note));
            }
            read as f64 / disk.bandwidth_for(read)
        };
        let pipelined = self
            .engine
            .memory()
            .is_some_and(|m| matches!(m.mode, crate::StreamMode::Pipelined { .. }));
        let streamed = self.engine.memory().map_or(0, |m| m.plan.streamed()).max(1);
        let io_exposed = if pipelined && self.config.tuning.io_aware() {
            io_per_pass / streamed as f64
        } else {
            io_per_pass
        };
        Ok(Profiles {
            target,
            draft,
            io_per_pass,
            io_exposed,
        })
    }

    /// The curve of the model at `path` (the target, or the draft), from
    /// the store or measured now; a measurement is announced.
    fn latency(
        &mut self,
        path: &Path,
        refresh: bool,
        save: bool,
        progress: &mut dyn FnMut(OpenEvent<'_>),
    ) -> Result<(crate::LatencyRecord, Option<String>)> {
        let kernels = self.backend.kernels();
        let threads = rayon::current_num_threads();
        if refresh || self.store.cached_latency(path, kernels, threads).is_none() {
            let note = format!("measuring forward latency L_fp(n) of {}", path.display());
            progress(OpenEvent::Note(&note));
        }
        let model = if path == self.engine.path() {
            self.engine.model_mut()
        } else {
            self.engine
                .draft_mut()
                .ok_or_else(|| EngineError::Invalid("no draft model is loaded".into()))?
        };
        let what = "latency sizes";
        let (record, note) =
            self.store
                .latency(path, kernels, model, refresh, save, &mut |done, total| {
                    progress(OpenEvent::Measure { what, done, total })
                })?;
        if let Some(n) = &note {
            progress(OpenEvent::Note(n));
        }
        Ok((record, note))
    }

    /// Compares this generation's target passes (plain steps and
    /// verifications, each with its token count) with the target's curve;
    /// a sustained disagreement measures the target's and the draft's
    /// curves again and says so. Runs that
    /// stream weights are not watched: their passes are mostly disk time,
    /// which the resident curve does not describe.
    fn heal(&mut self, g: &Generation) -> Result<()> {
        let Some(p) = &self.profiles else {
            return Ok(());
        };
        if p.io_per_pass > 0.0
            || self
                .engine
                .memory()
                .is_some_and(|m| m.plan.read_per_pass > 0)
        {
            return Ok(());
        }
        for s in g.trace.target_passes() {
            self.drift
                .observe(s.end - s.start, p.target.at(s.tokens.max(1)));
        }
        let Some(ratio) = self.drift.stale() else {
            return Ok(());
        };
        self.drift.reset();
        let before = p.target.at(1);
        // Measuring runs the model: its cache no longer holds the prompt.
        self.forget_cached();
        let target_path = self.engine.path().to_path_buf();
        let (fresh, _) = self.latency(&target_path, true, true, &mut |_| {})?;
        let fresh = fresh.profile();
        // Whatever skewed the target's curve (another process on the
        // cores, a clock change) skewed the draft's, measured beside it.
        let draft = match self.draft.clone() {
            Some(DraftSource::Model(path)) if path == target_path => Some(fresh.clone()),
            Some(DraftSource::Model(path)) => {
                Some(self.latency(&path, true, true, &mut |_| {})?.0.profile())
            }
            Some(other) => other.derived_profile(&fresh, 1.0),
            None => None,
        };
        self.notes.push(format!(
            "target passes took {ratio:.2}x the time the cached latency profile predicts \
             (median of the last {}): re-measured the curves, target L_fp(1) {:.1} -> {:.1} ms",
            Drift::STRETCH,
            before * 1e3,
            fresh.at(1) * 1e3
        ));
        if let Some(p) = &mut self.profiles {
            p.target = fresh;
            p.draft = draft.or(p.draft.take());
        }
        let strategy = self.options.strategy.clone();
        self.options.strategy = self.prepare(strategy, &mut |_| {})?;
        Ok(())
    }
}

//! Opening a run: the one engine call that turns a [`RunConfig`] into a
//! run ready to generate — resolve (fetching registered models) → plan the
//! memory budget → load target and draft → latency profiles → strategy.
//! Every command of `arbor` that runs a model (generate, bench spec and its
//! budgeted child processes, bench decode, perplexity, profile) opens its
//! run here.

use std::path::Path;

use arbor_speculative::{Decoding, Strategy};

use arbor_planner::{Drift, ProfileStore};

use crate::DraftSource;
use crate::config::{DEFAULT_TARGET, RunConfig};
use crate::events::{OpenEvent, load_events, loading, resolve_or_fetch};
use crate::run::{Run, attach};
use crate::{BackendSpec, Engine, EngineError, GenerateOptions, Result, pick_backend};

/// The planner's branch threshold and tree size for a choice.
type Tuned = (Option<f32>, Option<usize>);

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
        let backend = BackendSpec {
            kind: pick_backend(config.backend.as_deref())?,
            kv: config.kv_format()?,
        };
        // A format the backend cannot store fails here, before any file.
        backend.kv_format()?;
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
        type Attempt = (Option<String>, Option<Strategy>, Tuned);
        let mut attempts: Vec<Attempt> = if auto {
            arbor_load::choose::choose(config, &target, budget, backend, &store, progress)?
                .into_iter()
                .map(|c| {
                    let strategy = c.strategy.parse::<Strategy>()?;
                    Ok((c.draft, Some(strategy), (c.branch_threshold, c.max_tree)))
                })
                .collect::<Result<_>>()?
        } else {
            vec![(config.draft.clone(), named, (None, None))]
        };
        // Nothing fits by the planner's estimates: plain decoding is tried
        // anyway, and a budget too small for it says the minimum.
        if attempts.is_empty() {
            attempts.push((None, None, (None, None)));
        }
        crate::release_freed_memory();
        let last = attempts.len() - 1;
        let mut opened = None;
        for (i, (draft_name, named, (branch, max_tree))) in attempts.into_iter().enumerate() {
            let mut config = RunConfig {
                draft: draft_name,
                ..config.clone()
            };
            // The planner's branch threshold and tree size, unless the
            // config sets them.
            config.tuning.branch_threshold = config.tuning.branch_threshold.or(branch);
            config.tuning.max_tree = config.tuning.max_tree.or(max_tree);
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
    backend: BackendSpec,
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

/// The strategy name that lets the planner choose ([`arbor_load::choose`]).
pub const AUTO: &str = "auto";

/// Whether `config` asks the planner to choose: `strategy = "auto"`, or no
/// strategy under a memory budget.
fn is_auto(config: &RunConfig) -> bool {
    match config.strategy.as_deref() {
        Some(s) => s == AUTO,
        None => config.memory_budget.is_some(),
    }
}

/// `tree` with a draft, `autoregressive` without, and `autoregressive` too
/// when a memory budget holds the whole target by itself: speculative
/// decoding would have to make room for the draft by streaming target
/// layers from disk on every pass, which costs far more than it saves.
fn default_strategy(
    target: &Path,
    config: &RunConfig,
    budget: Option<u64>,
    backend: BackendSpec,
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

//! What `auto` runs: the draft source, streaming mode and strategy that
//! the planner ([`crate::auto`]) expects to be fastest under the run's
//! memory budget, from a one-shot device profile — the disk's direct-read
//! bandwidth and the target's `L_fp(n)` (both cached by the profile store),
//! the draft's step cost (its cached curve, else its bytes at the target's
//! bytes-per-second) — and the acceptance each source reaches with this
//! target (greedy, per drafted position; measured, see the constants).
//! A draft model is loaded only if it is picked.

use std::path::{Path, PathBuf};

use arbor_gguf::GgufFile;
use arbor_speculative::LatencyProfile;

use crate::auto::{self, Candidate, Device, Estimate};
use crate::drafts::DraftSource;
use crate::profiles::ProfileStore;
use crate::{BackendKind, DEFAULT_DRAFT, DEFAULT_TARGET, OpenEvent, Result, RunConfig, backends};

/// Acceptance per position of a full draft model of the target's family
/// (qwen2.5-coder 0.5B drafting for 1.5B, greedy, MT-Bench first turns):
/// 0.67 on writing and roleplay (2.68 tokens per chain of 5), 0.78 with
/// math and reasoning (3.36); 0.72 for a spread of categories.
const MODEL_ACCEPTANCE: f64 = 0.72;
/// A slim draft with K = 32768 accepted exactly as its source
/// (docs/slim-drafts.md); smaller heads lose a little.
const SLIM_ACCEPTANCE: f64 = 0.72;
/// Prompt lookup on MT-Bench first turns: 0.32 tokens accepted per chain
/// of 4 along the target's answers, but 0.06 per verification in the tree
/// strategy under a budget (second turns, which can copy the first answer,
/// reach 0.49 per chain).
const LOOKUP_ACCEPTANCE: f64 = 0.06;

/// Acceptance per position of a self draft that runs the share `running`
/// of the target's layers, skipping the others spread evenly: measured
/// for the 1.5B (28 layers; chains of 4 along its greedy answers to 8
/// MT-Bench questions): 4 layers skipped ≈ 0.72, 8 ≈ 0.38, 12 ≈ 0.10
/// (`cargo run --release -p arbor-drafts --example measure_drafts`, which
/// measures prompt lookup's acceptance too).
fn self_acceptance(running: f64) -> f64 {
    let points = [
        (0.5, 0.0),
        (0.57, 0.10),
        (0.71, 0.38),
        (0.86, 0.72),
        (1.0, 1.0),
    ];
    interpolate(&points, running)
}

fn interpolate(points: &[(f64, f64)], x: f64) -> f64 {
    if x <= points[0].0 {
        return points[0].1;
    }
    for w in points.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        if x <= x1 {
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
        }
    }
    points[points.len() - 1].1
}

/// What the planner chose, and why.
pub(crate) struct Choice {
    /// `draft` for the run config.
    pub draft: Option<String>,
    /// The strategy name to open with.
    pub strategy: String,
    /// The tree's branch threshold (a model draft under streaming).
    pub branch_threshold: Option<f32>,
}

/// Branch threshold of the trees a model draft grows when layers stream:
/// a pass costs its reads, so extra rows are nearly free and a branch is
/// worth opening at a twentieth of the draft's probability (slim 0.5B at
/// 800 MiB, reads capped at 1 GB/s, 2 prompts × 48 tokens: 3.76 tokens per
/// pass, 3.62 at 0.1, 2.94 at the default 0.3, 3.03 for the best chain;
/// 0.02 kept the same trees as 0.05).
const STREAMING_BRANCH_THRESHOLD: f32 = 0.05;

/// Estimates every draft source under `config`'s budget (unlimited when
/// none) and returns those that fit, fastest first, reporting the
/// comparison as notes.
pub(crate) fn choose(
    config: &RunConfig,
    target: &Path,
    budget: Option<u64>,
    backend: BackendKind,
    store: &ProfileStore,
    progress: &mut dyn FnMut(OpenEvent<'_>),
) -> Result<Vec<Choice>> {
    let file = GgufFile::open(target)?;
    let layout = arbor_model::Layout::from_gguf(file.header())?;
    // Held while plans are estimated, as it is when the run loads: plans
    // count what the process holds as their base.
    let tokenizer = crate::Tokenizer::from_gguf(file.header())?;
    // Drafting sources are planned as a tree's rounds (pipelined, its
    // verification rows); plain decoding's one row is set in `read_for`.
    let tree: arbor_speculative::Strategy = "tree".parse()?;
    let options = config.memory_options(budget.unwrap_or(u64::MAX / 4), &tree);
    let threads = rayon::current_num_threads();
    let kernels = backend.kernels();
    let target_bytes = backends::model_bytes(backend, &file)?;
    let curve = match store.cached_latency(target, kernels, threads) {
        Some(r) => r.profile(),
        None => {
            progress(OpenEvent::Note(
                "auto: no latency profile of the target is cached (`arbor profile`); \
                 assuming one-token passes read its weights at 10 GB/s",
            ));
            let one = target_bytes as f64 / 10e9;
            LatencyProfile {
                points: vec![(1, one), (8, one * 3.5), (64, one * 30.0)],
            }
        }
    };
    let disk = match budget {
        Some(_) => {
            let (d, note) = store.disk(target, false)?;
            if let Some(n) = note {
                progress(OpenEvent::Note(&n));
            }
            Some(d)
        }
        None => None,
    };
    let layer_bytes: u64 = layout
        .layers
        .iter()
        .map(|l| l.iter().map(|t| t.len as u64).sum::<u64>())
        .sum::<u64>()
        / layout.layers.len().max(1) as u64;
    let device = Device {
        target: curve.clone(),
        bandwidth: Box::new(move |read| disk.as_ref().map_or(1e9, |d| d.bandwidth_for(read))),
        mean_layer_bytes: layer_bytes,
        head_share: layout.config.head_share(),
        sequences: config.slots.unwrap_or(1),
    };
    let c = &layout.config;
    let draft_overhead = |d: &arbor_model::Config| {
        arbor_pipeline::kv_bytes(d, options.context)
            + arbor_pipeline::logit_scratch(d, options.draft_logit_rows)
    };
    // What the target reads per pass when `extra` bytes go to a draft.
    let base_plan = backends::plan_with(backend, &file, None, 0, &options)?;
    let streams = base_plan.as_ref().is_some_and(|p| p.streamed() > 0);
    let mut candidates = vec![Candidate {
        draft: None,
        label: "none".into(),
        memory: 0,
        step_secs: 0.0,
        acceptance: 0.0,
        ppd: None,
    }];
    candidates.push(Candidate {
        draft: Some(DraftSource::LOOKUP.into()),
        label: "lookup".into(),
        memory: 0,
        step_secs: 20e-6,
        acceptance: LOOKUP_ACCEPTANCE,
        ppd: None,
    });
    // The target's own guesses, when it has trained prompt tokens.
    if let Ok((prompts, _)) = crate::ppd::prompt_tokens_for(target, c.hidden) {
        candidates.push(Candidate {
            draft: None,
            label: "ppd".into(),
            memory: 0,
            step_secs: 0.0,
            acceptance: 0.0,
            ppd: Some(prompts),
        });
    }
    if streams {
        let memory = draft_overhead(c);
        if let Some(plan) = backends::plan_with(backend, &file, None, memory, &options)? {
            let running = 1.0 - plan.streamed() as f64 / plan.resident.len().max(1) as f64;
            // A step runs the resident layers and the whole head.
            let head = target_bytes.saturating_sub(layer_bytes * layout.layers.len() as u64);
            let share = (plan.resident_bytes as f64 + head as f64) / target_bytes.max(1) as f64;
            candidates.push(Candidate {
                draft: Some(DraftSource::SELF.into()),
                label: "self".into(),
                memory,
                step_secs: curve.at(1) * share.min(1.0),
                acceptance: self_acceptance(running),
                ppd: None,
            });
        }
    }
    if let Some(path) = draft_model(config, target, progress)? {
        let slims = slim_drafts_of(&path);
        if slims.is_empty() {
            progress(OpenEvent::Explain(&format!(
                "  (no slim draft of {} derived yet: `arbor slim --draft {}` makes one in \
                 seconds, holding about half its memory)",
                path.display(),
                path.display()
            )));
        }
        for p in std::iter::once(path).chain(slims) {
            candidates.push(model_candidate(
                &p,
                backend,
                store,
                &curve,
                target_bytes,
                &draft_overhead,
            )?);
        }
    }
    // Plain decoding returns one row of logits, ppd its tree's and one
    // node's prompt rows, drafting rounds up to a verification's worth.
    let mut read_for = |c: &Candidate| -> Option<u64> {
        let mut options = options;
        if c.ppd.is_some() {
            options.logit_rows = arbor_speculative::ppd_logit_rows(arbor_speculative::PPD_ROWS);
        } else if c.draft.is_none() {
            options.logit_rows = 1;
        }
        backends::plan_with(backend, &file, None, c.memory, &options)
            .ok()
            .flatten()
            .map(|p| p.read_per_pass)
    };
    let estimates = auto::estimate(&device, candidates, &mut read_for);
    let best = estimates
        .first()
        .expect("`none` is always a candidate")
        .clone();
    report(&best, &estimates, budget, progress);
    drop(tokenizer);
    Ok(estimates
        .iter()
        .filter(|e| e.read_per_pass.is_some())
        .map(|e| choice_for(e, streams))
        .collect())
}

/// How the estimate `e` is opened.
fn choice_for(e: &Estimate, streams: bool) -> Choice {
    let strategy = strategy_for(e, streams);
    Choice {
        draft: e.candidate.draft.clone(),
        branch_threshold: (strategy == STREAMING_TREE).then_some(STREAMING_BRANCH_THRESHOLD),
        strategy: strategy.into(),
    }
}

/// The draft model `auto` weighs, with the slim drafts derived from it:
/// the one `draft` names, else — for the default target — the default
/// draft if it has been fetched (planning never downloads).
fn draft_model(
    config: &RunConfig,
    target: &Path,
    progress: &mut dyn FnMut(OpenEvent<'_>),
) -> Result<Option<PathBuf>> {
    if let Some(name) = &config.draft {
        return Ok(match DraftSource::resolve(name, progress)? {
            DraftSource::Model(path) => Some(path),
            _ => None,
        });
    }
    let cached = |name| arbor_fetch::model_entry(name).map(arbor_fetch::model_path);
    if cached(DEFAULT_TARGET).as_deref() != Some(target) {
        return Ok(None);
    }
    Ok(cached(DEFAULT_DRAFT).filter(|p| p.exists()))
}

/// Slim drafts derived from the draft at `path` (`arbor slim` writes them
/// to `$ARBOR_HOME/slim/`, naming their source in their metadata).
fn slim_drafts_of(path: &Path) -> Vec<PathBuf> {
    let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Vec::new();
    };
    let dir = arbor_fetch::arbor_home().join("slim");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut found: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .filter(|p| {
            GgufFile::open(p).is_ok_and(|f| {
                f.header()
                    .get_str(arbor_drafts::slim::KEY_SOURCE)
                    .is_ok_and(|s| s == name)
            })
        })
        .collect();
    found.sort();
    found
}

/// A draft model file as a candidate: its held bytes (and caches), its
/// step cost (cached curve, else its bytes at the target's speed).
fn model_candidate(
    path: &Path,
    backend: BackendKind,
    store: &ProfileStore,
    target_curve: &LatencyProfile,
    target_bytes: u64,
    overhead: &dyn Fn(&arbor_model::Config) -> u64,
) -> Result<Candidate> {
    let file = GgufFile::open(path)?;
    let layout = arbor_model::Layout::from_gguf(file.header())?;
    // Loading holds a little more than the weights (allocator, buffers):
    // 5% measured for the 0.5B and its slim drafts.
    let bytes = backends::model_bytes(backend, &file)? * 21 / 20;
    let threads = rayon::current_num_threads();
    let slim = (file.header().metadata).contains_key(arbor_drafts::slim::KEY_TOKEN_IDS);
    // A slim draft steps about as fast as its source (its layers are the
    // source's; its head is smaller).
    let source = (file.header().get_str(arbor_drafts::slim::KEY_SOURCE).ok())
        .map(|name| arbor_fetch::arbor_home().join("models").join(name));
    let cached = |p: &Path| store.cached_latency(p, backend.kernels(), threads);
    let step = match cached(path).or_else(|| source.as_deref().and_then(cached)) {
        Some(r) => r.profile().at(1),
        None => target_curve.at(1) * bytes as f64 / target_bytes.max(1) as f64,
    };
    let stem = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    Ok(Candidate {
        draft: Some(path.display().to_string()),
        label: if slim { format!("slim {stem}") } else { stem },
        memory: bytes + overhead(&layout.config),
        step_secs: step,
        acceptance: if slim {
            SLIM_ACCEPTANCE
        } else {
            MODEL_ACCEPTANCE
        },
        ppd: None,
    })
}

/// The tree a model draft grows under streaming: sized by the IO-aware
/// pass cost alone, without the fallback threshold α (tuned for resident
/// passes, where every row costs; it verified after 2.54 tokens per pass
/// where the tree without it kept 2.94, same run as above).
const STREAMING_TREE: &str = "tree-no-fallback";

/// The strategy that runs the chosen source: `ppd` for the target's own
/// guesses, plain decoding (pipelined when layers stream), a widely branching tree without α when a model
/// drafts under streaming (passes cost their reads, so rows are nearly
/// free), else the tree strategy.
fn strategy_for(best: &Estimate, streams: bool) -> &'static str {
    if best.candidate.ppd.is_some() {
        return "ppd";
    }
    match best.candidate.draft.as_deref() {
        None if streams => "autoregressive-pipelined",
        None => "autoregressive",
        Some(DraftSource::LOOKUP) => "tree",
        Some(_) if streams => STREAMING_TREE,
        Some(_) => "tree",
    }
}

fn report(
    best: &Estimate,
    all: &[Estimate],
    budget: Option<u64>,
    progress: &mut dyn FnMut(OpenEvent<'_>),
) {
    let within = budget.map_or("without a memory budget".to_string(), |b| {
        format!("within {}", arbor_paging::format_bytes(b))
    });
    progress(OpenEvent::Note(&format!(
        "auto: drafting with {} ({:.2} tok/s expected {within}; --explain for the estimates)",
        best.candidate.label, best.tok_s
    )));
    for line in auto::explain(all) {
        progress(OpenEvent::Explain(&line));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(draft: Option<&str>) -> Estimate {
        Estimate {
            candidate: Candidate {
                draft: draft.map(str::to_string),
                label: draft.unwrap_or("none").into(),
                memory: 0,
                step_secs: 0.01,
                acceptance: 0.7,
                ppd: None,
            },
            read_per_pass: Some(1 << 20),
            depth: 4,
            tok_s: 1.0,
        }
    }

    #[test]
    fn each_source_opens_with_its_strategy() {
        let cases = [
            (None, true, "autoregressive-pipelined"),
            (None, false, "autoregressive"),
            (Some(DraftSource::LOOKUP), true, "tree"),
            (Some(DraftSource::SELF), true, STREAMING_TREE),
            (Some("/m/slim.gguf"), true, STREAMING_TREE),
            (Some("/m/draft.gguf"), false, "tree"),
        ];
        for (draft, streams, want) in cases {
            let c = choice_for(&estimate(draft), streams);
            assert_eq!(c.strategy, want, "{draft:?} streams={streams}");
            assert_eq!(c.draft.as_deref(), draft);
            // Only the streaming tree branches wider than the default.
            assert_eq!(
                c.branch_threshold,
                (want == STREAMING_TREE).then_some(STREAMING_BRANCH_THRESHOLD)
            );
            assert!(c.strategy.parse::<arbor_speculative::Strategy>().is_ok());
        }
        // The target's own guesses open as `ppd`, streaming or not.
        let mut e = estimate(None);
        e.candidate.ppd = Some(std::sync::Arc::new(arbor_speculative::PromptTokens {
            hidden: 1,
            epts: 1,
            vectors: vec![0.0],
            accuracy: arbor_ppd::Accuracy::new(vec![vec![0.5]]).unwrap(),
        }));
        for streams in [true, false] {
            let c = choice_for(&e, streams);
            assert_eq!((c.strategy.as_str(), c.draft), ("ppd", None));
        }
    }

    #[test]
    fn self_acceptance_rises_with_the_layers_kept() {
        assert!(self_acceptance(0.3) <= self_acceptance(0.6));
        assert!(self_acceptance(0.6) < self_acceptance(0.9));
        assert_eq!(self_acceptance(1.0), 1.0);
        assert!((interpolate(&[(0.0, 0.0), (1.0, 1.0)], 0.25) - 0.25).abs() < 1e-12);
    }
}

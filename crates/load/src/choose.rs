//! What `auto` runs: the draft source, streaming mode and strategy that
//! the planner ([`arbor_planner::auto`]) expects to be fastest under the run's
//! memory budget, from a one-shot device profile — the disk's direct-read
//! bandwidth (under a GPU's budget, the upload rate and what host memory
//! holds) and the target's `L_fp(n)` (both cached by the profile store),
//! the draft's step cost (its cached curve, else its bytes at the target's
//! bytes-per-second) — and what each source's guesses are worth with this
//! target (top-k acceptance by depth, as runs counted it; a measured prior
//! until then).
//! A draft model is loaded only if it is picked.

use std::path::{Path, PathBuf};

use arbor_gguf::GgufFile;
use arbor_speculative::LatencyProfile;

use arbor_planner::ProfileStore;
use arbor_planner::auto::{self, Candidate, Device, Estimate};
use arbor_planner::sources::{Choice, choice_for, lookup_prior, model_prior, self_prior};

use crate::drafts::DraftSource;
use crate::{BackendSpec, DEFAULT_DRAFT, DEFAULT_TARGET, OpenEvent, Result, RunConfig, backends};

/// Estimates every draft source under `config`'s budget (unlimited when
/// none) and returns those that fit, fastest first, reporting the
/// comparison as notes.
pub fn choose(
    config: &RunConfig,
    target: &Path,
    budget: Option<u64>,
    backend: BackendSpec,
    store: &ProfileStore,
    progress: &mut dyn FnMut(OpenEvent<'_>),
) -> Result<Vec<Choice>> {
    let file = GgufFile::open(target)?;
    let layout = arbor_model::Layout::from_gguf(file.header())?;
    // Held while plans are estimated, as it is when the run loads: plans
    // count what the process holds as their base.
    let tokenizer = arbor_tokenizer::Tokenizer::from_gguf(file.header())?;
    // Drafting sources are planned as a tree's rounds (pipelined, its
    // verification rows); plain decoding's one row is set in `read_for`.
    let tree: arbor_speculative::Strategy = "tree".parse()?;
    let options = config.memory_options(budget.unwrap_or(u64::MAX / 4), &tree);
    let threads = rayon::current_num_threads();
    let kernels = backend.kernels();
    let target_bytes = backends::model_bytes(backend, &file)?;
    let curve = match store.cached_latency(target, kernels, threads) {
        Some(r) => r.profile(),
        None => sampled_curve(
            target,
            &file,
            &layout,
            backend,
            store,
            target_bytes,
            progress,
        )?,
    };
    // Reads of the model's disk as this process's cgroup limits them.
    let read_limit = arbor_planner::storage::read_limit(target);
    // Under a GPU's budget a pass uploads what it streams; host memory
    // serves what it holds (the page cache without a host budget, else what
    // fits that budget: the host tier) and the disk the rest.
    let gpu = config.gpu_memory_budget.is_some();
    let host_room = match config.host_budget_bytes()? {
        Some(budget) => {
            let host = arbor_pipeline::HostBudget { budget, base: None };
            Some(backends::host_room(backend, &host, &layout, options.mode).unwrap_or(0))
        }
        None => None,
    };
    let reads_disk = budget.is_some() && (!gpu || host_room.is_some());
    let upload_bw = match (gpu, budget) {
        (true, Some(_)) => Some(backends::upload_rate(backend, target, store, progress)?),
        _ => None,
    };
    let disk = match reads_disk {
        true => {
            if let Some(limit) = read_limit {
                progress(OpenEvent::Note(&format!(
                    "auto: this process's cgroup limits reads of the model's disk to {:.2} GB/s: \
                     planning with what was measured under that limit",
                    limit as f64 / 1e9
                )));
            }
            let (d, note) = store.disk(target, false)?;
            if let Some(n) = note {
                progress(OpenEvent::Note(&n));
            }
            Some(d)
        }
        false => None,
    };
    if let Some(up) = upload_bw {
        let host = match host_room {
            Some(room) => format!(
                "host memory holds up to {} of them, the disk serves the rest",
                arbor_paging::format_bytes(room)
            ),
            None => "host memory (the page cache) holds them".into(),
        };
        progress(OpenEvent::Note(&format!(
            "auto: under a GPU budget a pass uploads the layers it streams at {:.2} GB/s; {host}",
            up / 1e9
        )));
    }
    // Bytes per second a pass bringing in `read` streamed bytes gets.
    let bandwidth = move |read: u64| -> f64 {
        let disk_read = match (gpu, host_room) {
            (false, _) => read,
            (true, Some(room)) => read.saturating_sub(room),
            (true, None) => 0,
        };
        let disk_bw = disk.as_ref().map_or(1e9, |d| d.bandwidth_for(disk_read));
        let secs = arbor_planner::pass_io_secs(read, upload_bw, disk_read, disk_bw);
        match secs > 0.0 {
            true => read as f64 / secs,
            false => f64::INFINITY,
        }
    };
    let layer_bytes: u64 = layout
        .layers
        .iter()
        .map(|l| l.iter().map(|t| t.len as u64).sum::<u64>())
        .sum::<u64>()
        / layout.layers.len().max(1) as u64;
    // What the target reads per pass when `extra` bytes go to a draft.
    let base_plan = backends::plan_with(backend, &file, None, 0, &options)?;
    let streams = base_plan.as_ref().is_some_and(|p| p.streamed() > 0);
    // Passes compute slower while layers stream than the resident curve
    // says (other kernels, the loader's threads): as streamed runs saw.
    let streamed_curve = match streams.then(|| store.stream_compute(target)).flatten() {
        Some(r) => {
            progress(OpenEvent::Note(&format!(
                "auto: passes computed {:.2}x (1 row) to {:.2}x (64 rows) the resident curve \
                 while layers streamed ({} generations)",
                r.factor(1),
                r.factor(64),
                r.generations
            )));
            r.apply(&curve)
        }
        None => curve.clone(),
    };
    let device = Device {
        target: streamed_curve,
        bandwidth: Box::new(bandwidth),
        mean_layer_bytes: layer_bytes,
        head_share: layout.config.head_share(),
        sequences: config.slots.unwrap_or(1),
    };
    let c = &layout.config;
    let kv_format = backend.kv_format()?;
    let draft_overhead = |d: &arbor_model::Config| {
        arbor_pipeline::kv_bytes(d, options.context, kv_format)
            + arbor_pipeline::logit_scratch(d, options.draft_logit_rows)
    };
    // What runs counted of a source's guesses with this target, over its
    // prior.
    let accuracy =
        |source: &str, prior: &arbor_ppd::Accuracy| store.accuracy(target, source, prior);
    let mut candidates = vec![Candidate {
        draft: None,
        label: "none".into(),
        memory: 0,
        step_secs: 0.0,
        accuracy: lookup_prior(),
        measured: 0.0,
        ppd: None,
    }];
    // With several slots, drafting lost to plain pipelined decoding in every
    // cell measured (the 1.5B under 900 MiB: PPD 6.2 tok/s against 15.9 at
    // four slots on 2026-11-29, 5.3 against 9.8 on 11-27; a tree 6.3 against
    // 10.0 at eight): a slot cannot keep its last pass, each slot drafts on
    // its own, and new requests' prompts fill the passes, none of which the
    // estimates see.
    if device.sequences > 1 {
        progress(OpenEvent::Note(&format!(
            "auto: {} slots decode plainly (drafting was slower with several slots in every \
             cell measured: docs/serve.md)",
            device.sequences
        )));
    } else {
        let (table, measured) = accuracy(DraftSource::LOOKUP, &lookup_prior());
        candidates.push(Candidate {
            draft: Some(DraftSource::LOOKUP.into()),
            label: "lookup".into(),
            memory: 0,
            step_secs: 20e-6,
            accuracy: table,
            measured,
            ppd: None,
        });
        // The target's own guesses, when it has trained prompt tokens.
        if let Ok((prompts, _)) = crate::ppd::prompt_tokens_for(target, c.hidden) {
            let (table, measured) = accuracy(crate::ppd::SOURCE, &prompts.accuracy);
            candidates.push(Candidate {
                draft: None,
                label: "ppd".into(),
                memory: 0,
                step_secs: 0.0,
                accuracy: table,
                measured,
                ppd: Some(prompts),
            });
        }
        if streams {
            let memory = draft_overhead(c);
            // A self draft runs the target's head, which must then be held.
            let held_head = arbor_pipeline::MemoryOptions {
                approx_head: false,
                ..options
            };
            if let Some(plan) = backends::plan_with(backend, &file, None, memory, &held_head)?
                && plan.head_read == 0
            {
                let running = 1.0 - plan.streamed() as f64 / plan.resident.len().max(1) as f64;
                // A step runs the resident layers and the whole head.
                let head = target_bytes.saturating_sub(layer_bytes * layout.layers.len() as u64);
                let share = (plan.resident_bytes as f64 + head as f64) / target_bytes.max(1) as f64;
                let (table, measured) = accuracy(DraftSource::SELF, &self_prior(running));
                candidates.push(Candidate {
                    draft: Some(DraftSource::SELF.into()),
                    label: "self".into(),
                    memory,
                    step_secs: curve.at(1) * share.min(1.0),
                    accuracy: table,
                    measured,
                    ppd: None,
                });
            }
        }
        if let Some(path) = draft_model(config, target, progress)? {
            let mut slims = slim_drafts_of(&path);
            if slims.is_empty() {
                slims.extend(derive_slim(&path, progress));
            }
            for p in std::iter::once(path).chain(slims) {
                candidates.push(model_candidate(
                    &p,
                    target,
                    backend,
                    store,
                    &curve,
                    target_bytes,
                    &draft_overhead,
                )?);
            }
        }
    }
    // What the target reads per pass with `memory` held by a source and
    // passes returning `logit_rows` rows of logits (`None`: no fit).
    let read_with = |memory: u64, logit_rows: usize| -> Option<u64> {
        let options = arbor_pipeline::MemoryOptions {
            logit_rows,
            ..options
        };
        backends::plan_with(backend, &file, None, memory, &options)
            .ok()
            .flatten()
            .map(|p| p.read_per_pass)
    };
    // Plain decoding returns one row of logits, ppd its tree's and one
    // node's prompt rows, drafting rounds up to a verification's worth.
    let mut read_for = |c: &Candidate| -> Option<u64> {
        let rows = if c.ppd.is_some() {
            arbor_speculative::ppd_logit_rows(arbor_speculative::PPD_ROWS)
        } else if c.draft.is_none() {
            1
        } else {
            options.logit_rows
        };
        read_with(c.memory, rows)
    };
    let mut estimates = auto::estimate(&device, candidates, &mut read_for);
    // Where runs measured a source under this budget, its measured rate.
    let key = config.budget_key(target)?;
    let rates = store.rates(target, kernels, threads, &key);
    auto::with_measured(&mut estimates, &mut |e| {
        // The strategy as the run would open it (the config's branch
        // threshold, else the planner's).
        let choice = choice_for(e, streams);
        let strategy = choice
            .strategy
            .parse::<arbor_speculative::Strategy>()
            .ok()?;
        let branch = config.tuning.branch_threshold.or(choice.branch_threshold);
        let strategy = arbor_planner::strategy_key(&strategy.name(), branch);
        let source = match (&e.candidate.ppd, &e.candidate.draft) {
            (Some(_), _) => crate::ppd::SOURCE.to_string(),
            (None, Some(d)) => arbor_planner::source_key(d),
            (None, None) => arbor_planner::rates::NO_SOURCE.to_string(),
        };
        let rate = rates.measured(&source, &strategy)?;
        Some((rate.tok_s(), rate.tokens))
    });
    // Sources whose estimates lie closer than the estimates can tell apart
    // do not take turns: the last choice under this budget stays.
    let previous = store.previous_choice(target, &key).map(|r| r.label);
    if arbor_planner::choice::keep_previous(&mut estimates, previous.as_deref()) {
        progress(OpenEvent::Note(&format!(
            "auto: keeping the last choice under this budget ({}): within {:.0}% of the best estimate",
            estimates[0].candidate.label,
            100.0 * arbor_planner::choice::STICKY_MARGIN
        )));
    }
    let best = estimates
        .first()
        .expect("`none` is always a candidate")
        .clone();
    store.remember_choice(target, &key, &best);
    report(&best, &estimates, budget, progress);
    drop(tokenizer);
    Ok(estimates
        .iter()
        .filter(|e| e.read_per_pass.is_some())
        .map(|e| {
            let mut choice = choice_for(e, streams);
            choice.max_tree = held_to_plan(
                choice.max_tree,
                options.logit_rows,
                &mut |rows| read_with(e.candidate.memory, rows),
                e.read_per_pass,
            );
            choice
        })
        .collect())
}

/// The room a chosen tree may grow to (`max_tree` draft tokens, a pass of
/// one more row) where the memory it was estimated with holds it: drafting
/// sources are estimated with the logits of `planned_rows` rows, and a
/// room beyond them that would push a target layer out (`plan(rows)` reads
/// more than `read` bytes a pass, or does not fit) is held to the planned
/// rows. Why: the slim 0.5B, chosen for the Q8_0 1.5B under 900 MiB with
/// reads capped at 0.5 GB/s, did not fit after all (its load needed 925
/// MiB) and the run fell back to ppd. Slow reads plan big trees (52
/// candidates for the 1.5B under 800 MiB at 0.5 GB/s), and a room of twice
/// that, up to 63 draft tokens, needs logits for 64 rows, not 33.
fn held_to_plan(
    max_tree: Option<usize>,
    planned_rows: usize,
    plan: &mut dyn FnMut(usize) -> Option<u64>,
    read: Option<u64>,
) -> Option<usize> {
    let room = max_tree?;
    if room < planned_rows {
        return Some(room);
    }
    match (plan(room + 1), read) {
        (Some(more), Some(read)) if more <= read => Some(room),
        _ => Some(planned_rows.saturating_sub(1).max(1)),
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

/// The target's `L_fp(n)` when none is cached: sampled from its first two
/// layers (which any budget that runs it holds) and cached; where that
/// cannot be done, a guess (one-token passes reading its weights at
/// 10 GB/s), said so.
fn sampled_curve(
    target: &Path,
    file: &GgufFile,
    layout: &arbor_model::Layout,
    backend: BackendSpec,
    store: &ProfileStore,
    target_bytes: u64,
    progress: &mut dyn FnMut(OpenEvent<'_>),
) -> Result<LatencyProfile> {
    let bytes = |l: &[arbor_model::TensorEntry]| l.iter().map(|t| t.len as u64).sum::<u64>();
    let second = layout.layers.get(1).map_or(0, |l| bytes(l));
    let later: u64 = layout.layers.iter().skip(1).map(|l| bytes(l)).sum();
    if let (Some([mut one, mut two]), true) = (backends::first_layers(backend, file)?, second > 0) {
        progress(OpenEvent::Note(&format!(
            "auto: no latency profile of {} is cached: sampling it from its first two layers",
            target.display()
        )));
        let (record, note) = store.sampled_latency(
            target,
            backend.kernels(),
            &mut *one,
            &mut *two,
            later as f64 / second as f64,
            &mut |_, _| {},
        )?;
        progress(OpenEvent::Note(&note));
        return Ok(record.profile());
    }
    progress(OpenEvent::Note(
        "auto: no latency profile of the target is cached (`arbor profile`); \
         assuming one-token passes read its weights at 10 GB/s",
    ));
    let one = target_bytes as f64 / 10e9;
    Ok(LatencyProfile {
        points: vec![(1, one), (8, one * 3.5), (64, one * 30.0)],
    })
}

/// Derives the slim draft of the draft at `path` from the ranking shipped
/// for its vocabulary, once (`$ARBOR_HOME/slim/`, where later runs find
/// it), saying so; `None` (with a note) when none ships or it fails.
fn derive_slim(path: &Path, progress: &mut dyn FnMut(OpenEvent<'_>)) -> Option<PathBuf> {
    let dir = arbor_fetch::arbor_home().join("slim");
    let out = arbor_drafts::slim::default_path(path, &dir);
    progress(OpenEvent::Note(&format!(
        "auto: deriving a slim draft of {} once (K = {}, the head's most frequent tokens): {}",
        path.display(),
        arbor_drafts::slim::DEFAULT_K,
        out.display()
    )));
    match arbor_drafts::slim::derive_default(path, &dir, &mut |_, _| {}) {
        Ok(Some((out, r))) => {
            progress(OpenEvent::Note(&format!(
                "auto: slim draft derived in {:.1} s ({} MiB → {} MiB)",
                r.secs,
                r.input_bytes >> 20,
                r.output_bytes >> 20
            )));
            Some(out)
        }
        Ok(None) => {
            progress(OpenEvent::Note(
                "auto: no token ranking ships for this draft's vocabulary: \
                 `arbor slim --draft …` derives a slim draft from a corpus",
            ));
            None
        }
        Err(e) => {
            progress(OpenEvent::Note(&format!("auto: no slim draft ({e})")));
            None
        }
    }
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
    target: &Path,
    backend: BackendSpec,
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
    let (accuracy, measured) =
        store.accuracy(target, &path.display().to_string(), &model_prior(slim));
    Ok(Candidate {
        draft: Some(path.display().to_string()),
        label: if slim { format!("slim {stem}") } else { stem },
        memory: bytes + overhead(&layout.config),
        step_secs: step,
        accuracy,
        measured,
        ppd: None,
    })
}

/// Says which source won, and (asked for with `--explain`) every estimate.
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
    use super::held_to_plan;

    #[test]
    fn a_tree_room_beyond_the_planned_rows_is_kept_only_where_it_costs_no_layer() {
        // Plans by logit rows: up to 40 rows the target reads 400 bytes a
        // pass, more push a layer out, beyond 60 nothing fits.
        let mut plan = |rows: usize| match rows {
            0..=40 => Some(400),
            41..=60 => Some(430),
            _ => None,
        };
        // Within the planned rows: kept.
        assert_eq!(held_to_plan(Some(20), 33, &mut plan, Some(400)), Some(20));
        // Beyond them at no cost: kept.
        assert_eq!(held_to_plan(Some(36), 33, &mut plan, Some(400)), Some(36));
        // Beyond them at a layer's cost, or past what fits: held to 32.
        assert_eq!(held_to_plan(Some(50), 33, &mut plan, Some(400)), Some(32));
        assert_eq!(held_to_plan(Some(63), 33, &mut plan, Some(400)), Some(32));
        // No room asked for (ppd, plain decoding): none given.
        assert_eq!(held_to_plan(None, 33, &mut plan, Some(400)), None);
    }
}

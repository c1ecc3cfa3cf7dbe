//! `arbor bench slo`: ELMS §5.2's trace on this machine. Six apps carry
//! the objectives of ELMS Table 3; held-out ShareGPT requests are split
//! among them by a skew α and arrive as a Poisson process. Each policy
//! picks a (model level, prompt level) pair per request from its own
//! device profile and quality table; every request is then served and
//! timed, and its objective is held against the original model's measured
//! latency on the same prompt. Policies: the elastic model with
//! bigram-scored prompt levels; the same pairs with tokens dropped at
//! random; always the full (original) model; whole layers dropped; and
//! prefixes of the unreordered file. Reports the share of objectives met, quality
//! (agreement with the full model's greedy answer), quality where misses
//! count zero, switching overhead and prediction error; a table and a PNG.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use arbor_elastic::Order;
use arbor_engine::slo::{
    self, DeviceProfile, Elastic, Family, OnMiss, Pair, QualityTable, Reference, Scorer, SloPrompt,
    SloTables, Variants,
};
use arbor_engine::{Engine, LanguageModel, ProfileStore, Run, RunConfig};
use arbor_slo::{Slo, TRACE_APPS, draw_trace};
use clap::Args;

use crate::{elastic, progress, report};

#[derive(Args)]
pub struct BenchSloArgs {
    /// The original model; its elastic files are built when missing.
    #[arg(long, default_value = "qwen2.5-coder-0.5b")]
    model: String,
    /// Requests per trace.
    #[arg(long, default_value_t = 60)]
    requests: usize,
    /// Skews α of the app mix (ELMS: −0.25 leans to tight objectives).
    #[arg(
        long,
        value_delimiter = ',',
        allow_hyphen_values = true,
        default_value = "-0.25,0,0.25"
    )]
    skews: Vec<f64>,
    /// Mean arrivals per second of the Poisson process.
    #[arg(long, default_value_t = 0.5)]
    rate: f64,
    /// Distinct held-out prompts the requests ask.
    #[arg(long, default_value_t = 16)]
    pool: usize,
    /// Tokens decoded per request (the time per output token is timed over them).
    #[arg(long, default_value_t = 16)]
    tokens: usize,
    /// Runs per served (prompt, pair) and per reference prompt; the median
    /// TTFT and the median TPOT count (this host is noisy).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Baselines beside the elastic policy: random (its pairs, tokens
    /// dropped at random), full, layers, file.
    #[arg(long, value_delimiter = ',', default_value = "random,full,layers,file")]
    baselines: Vec<String>,
    /// Calibration prompts and answer tokens of the quality tables.
    #[arg(long, default_value_t = 6)]
    calibration: usize,
    #[arg(long, default_value_t = 16)]
    answer_tokens: usize,
    /// Measure tables again even where cached.
    #[arg(long)]
    refresh: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// JSON lines on stdout (the table goes to stderr).
    #[arg(long)]
    json: bool,
    #[arg(long, default_value = "arbor-bench-slo.png")]
    plot: PathBuf,
}

/// One (skew, policy) row.
#[derive(Debug, serde::Serialize)]
struct Row {
    skew: f64,
    policy: String,
    requests: usize,
    /// Share of requests whose measured latency met their objective.
    met: f64,
    /// Mean agreement with the full model's answer.
    quality: f64,
    /// The same, a missed objective counting zero.
    quality_met: f64,
    /// Mean switching time over TTFT, and scoring time over TTFT.
    switch_share: f64,
    score_share: f64,
    /// Mean |measured − predicted| / measured (policies with a profile).
    ttft_error: Option<f64>,
    tpot_error: Option<f64>,
    /// Requests the policy expected to miss (no pair predicted to meet).
    expected_misses: usize,
}

/// A served (prompt, pair) and how close it stayed to the full model.
#[derive(Debug, Clone)]
struct Outcome {
    served: slo::Served,
    quality: f64,
}

struct Policy {
    name: String,
    /// Which family serves it: 0 elastic, 1 layers, 2 file, 3 the original.
    family: usize,
    tables: Option<SloTables>,
    scorer: Scorer,
    /// Serve the pairs another policy (by index) chose.
    pairs_of: Option<usize>,
}

pub fn run(args: &BenchSloArgs, device: &RunConfig) -> Result<()> {
    if args.requests == 0
        || args.pool == 0
        || args.tokens < 2
        || args.skews.is_empty()
        || args.reps == 0
    {
        bail!("--requests, --pool, --reps and --skews must be non-empty, --tokens at least 2");
    }
    for b in &args.baselines {
        if !["random", "full", "layers", "file"].contains(&b.as_str()) {
            bail!("unknown baseline `{b}` (random, full, layers, file)");
        }
    }
    let original = arbor_fetch::resolve_model(&args.model)?;
    let elastic_path = elastic::ensure_built(&original, Order::Importance)?;
    let mut run = open(device, &elastic_path)?;
    // The original model: what objectives are fractions of and answers
    // are compared with.
    let mut orig_run = open(device, &original)?;
    let tables = crate::slo::tables(&mut run, args.calibration, args.answer_tokens, args.refresh)?;
    eprint!("{}", crate::slo::profile_table(&tables));
    let bigram = tables.scorer.clone();
    let texts = crate::slo::held_out(args.pool)?;
    let prompts: Vec<SloPrompt> = (texts.iter())
        .map(|t| run.slo_prompt(t, true))
        .collect::<arbor_engine::Result<_>>()?;
    let stop = run.engine().tokenizer().stop_ids();
    let calibration: Vec<SloPrompt> = (crate::slo::sharegpt_slice(0, args.calibration)?.iter())
        .map(|t| run.slo_prompt(t, true))
        .collect::<arbor_engine::Result<_>>()?;

    // The families: the elastic model, whole layers dropped, file order.
    let want = |b: &str| args.baselines.iter().any(|x| x == b);
    let mut layers_run = None;
    let mut file_run = None;
    if want("layers") {
        layers_run = Some(layer_family(&original, &orig_run, &run)?);
    }
    if want("file") {
        file_run = Some(open(
            device,
            &elastic::ensure_built(&original, Order::File)?,
        )?);
    }
    let store = ProfileStore::default();
    let stem = |p: &Path| {
        p.file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned())
    };
    let mut policies = vec![Policy {
        name: "elastic".into(),
        family: 0,
        tables: Some(tables.clone()),
        scorer: bigram.clone(),
        pairs_of: None,
    }];
    if want("random") {
        policies.push(Policy {
            name: "elastic, random tokens".into(),
            family: 0,
            tables: None,
            scorer: Scorer::Random(args.seed),
            pairs_of: Some(0),
        });
    }
    if want("full") {
        policies.push(Policy {
            name: "full".into(),
            family: 3,
            tables: None,
            scorer: bigram.clone(),
            pairs_of: None,
        });
    }
    // Reference answers: the original model's greedy continuations, to
    // the held-out requests and to the calibration prompts.
    let (answers, calibration_answers) = {
        let mut f = Reference(orig_run.engine_mut().model_mut());
        (
            slo::answers(&mut f, &prompts, args.answer_tokens, &stop)?,
            slo::answers(&mut f, &calibration, args.answer_tokens, &stop)?,
        )
    };
    if let Some(v) = &mut layers_run {
        let name = format!("{}-layers", stem(&original));
        let calibration = (&calibration[..], &calibration_answers[..]);
        let t = family_tables(v, &name, &store, calibration, &bigram, args, device)?;
        policies.push(Policy {
            name: "layers dropped".into(),
            family: 1,
            tables: Some(t),
            scorer: bigram.clone(),
            pairs_of: None,
        });
    }
    if let Some(r) = &mut file_run {
        // Same shapes as the elastic model's levels: its latency profile.
        let name = stem(r.engine().path());
        let mut f = Elastic(r.engine_mut().model_mut());
        let q = cached(
            &store.dir().join(format!("slo-quality-{name}.json")),
            args.refresh,
            || {
                Ok(slo::measure_quality(
                    &mut f,
                    &name,
                    &calibration,
                    &calibration_answers,
                    &bigram,
                    &slo::PROMPT_LEVELS,
                    &mut progress::count_bar("file-order quality"),
                )?)
            },
        )?;
        policies.push(Policy {
            name: "unreordered prefixes".into(),
            family: 2,
            tables: Some(SloTables {
                profile: tables.profile.clone(),
                quality: q,
                scorer: bigram.clone(),
            }),
            scorer: bigram.clone(),
            pairs_of: None,
        });
    }

    // The original model's latency per prompt, measured: what objectives
    // are fractions of.
    let mut done: HashMap<String, Outcome> = HashMap::new();
    let mut full = Vec::new();
    {
        let mut f = Reference(orig_run.engine_mut().model_mut());
        let mut bar = progress::count_bar("full model per prompt");
        for (i, p) in prompts.iter().enumerate() {
            bar(i, prompts.len());
            // A first run warms caches the others find warm.
            slo::serve_pair(&mut f, p, &bigram, 1.0, 1.0, args.tokens)?;
            let served = serve_median(&mut f, p, &bigram, Pair::FULL, args)?;
            // The full pair on this prompt is this run: a policy that picks
            // it is held against itself, not against another run's noise.
            let outcome = Outcome {
                served: served.clone(),
                quality: 1.0,
            };
            done.insert(outcome_key(3, &bigram, i, Pair::FULL), outcome);
            full.push(served);
        }
        bar(prompts.len(), prompts.len());
    }

    let mut rows = Vec::new();
    for &skew in &args.skews {
        let trace = draw_trace(args.requests, skew, args.rate, prompts.len(), args.seed)?;
        let mut chosen: Vec<Vec<Pair>> = Vec::new();
        for policy in &policies {
            let mut bar = progress::count_bar(&format!("α {skew}: {}", policy.name));
            let (mut met, mut q, mut qm, mut sw, mut sc) = (0usize, 0.0, 0.0, 0.0, 0.0);
            let (mut te, mut pe, mut expected_misses) = (0.0, 0.0, 0);
            let mut pairs = Vec::new();
            for (k, req) in trace.iter().enumerate() {
                bar(k, trace.len());
                let slo = TRACE_APPS[req.app].slo;
                let prompt = &prompts[req.prompt];
                let choice = match (&policy.tables, policy.pairs_of) {
                    (_, Some(other)) => {
                        let pair = chosen[other][k];
                        (pair, None)
                    }
                    (Some(t), None) => {
                        let c = arbor_slo::decide(
                            &t.profile,
                            &t.quality,
                            &slo,
                            prompt.tokens.len(),
                            prompt.protected_count(),
                            slo::HEADROOM,
                            OnMiss::Fastest,
                        )?;
                        expected_misses += usize::from(!c.met);
                        (c.pair, Some(c.predicted))
                    }
                    (None, None) => (Pair::FULL, None),
                };
                let (pair, predicted) = choice;
                pairs.push(pair);
                let key = outcome_key(policy.family, &policy.scorer, req.prompt, pair);
                let outcome = match done.get(&key) {
                    Some(o) => o.clone(),
                    None => {
                        let mut fam: Box<dyn Family + '_> = match policy.family {
                            0 => Box::new(Elastic(run.engine_mut().model_mut())),
                            1 => Box::new(Reborrow(layers_run.as_mut().context("layers")?)),
                            2 => Box::new(Elastic(
                                file_run.as_mut().context("file")?.engine_mut().model_mut(),
                            )),
                            _ => Box::new(Reference(orig_run.engine_mut().model_mut())),
                        };
                        let served =
                            serve_median(fam.as_mut(), prompt, &policy.scorer, pair, args)?;
                        let (a, c) = slo::pair_agreement(
                            fam.as_mut(),
                            prompt,
                            &answers[req.prompt],
                            &policy.scorer,
                            pair.model,
                            pair.prompt,
                        )?;
                        let o = Outcome {
                            served,
                            quality: a as f64 / c.max(1) as f64,
                        };
                        done.insert(key, o.clone());
                        o
                    }
                };
                let s = &outcome.served;
                let f = &full[req.prompt];
                let ok = meets(&slo, s, f);
                met += usize::from(ok);
                q += outcome.quality;
                qm += if ok { outcome.quality } else { 0.0 };
                sw += s.switch_secs / s.ttft;
                sc += s.score_secs / s.ttft;
                if let Some(p) = predicted {
                    te += (s.ttft - p.ttft).abs() / s.ttft;
                    pe += (s.tpot - p.tpot).abs() / s.tpot;
                }
            }
            bar(trace.len(), trace.len());
            let n = trace.len() as f64;
            let predicts = policy.tables.is_some() && policy.pairs_of.is_none();
            rows.push(Row {
                skew,
                policy: policy.name.clone(),
                requests: trace.len(),
                met: met as f64 / n,
                quality: q / n,
                quality_met: qm / n,
                switch_share: sw / n,
                score_share: sc / n,
                ttft_error: predicts.then_some(te / n),
                tpot_error: predicts.then_some(pe / n),
                expected_misses,
            });
            chosen.push(pairs);
        }
    }

    let mut table = format!(
        "bench slo: {} requests per trace over {} held-out ShareGPT prompts, Poisson arrivals at {}/s, ELMS Table 3 apps, {} tokens decoded each; objectives held against the original model's measured latency on the same prompt (medians of {} runs), quality against its answer\n",
        args.requests,
        prompts.len(),
        args.rate,
        args.tokens,
        args.reps
    );
    table.push_str("| α | policy | SLOs met | quality | quality (miss = 0) | switching / TTFT | scoring / TTFT | ttft error | tpot error | expected misses |\n|---|---|---|---|---|---|---|---|---|---|\n");
    let pct = |v: Option<f64>| v.map_or("".into(), |v| format!("{:.1}%", v * 100.0));
    for r in &rows {
        table.push_str(&format!(
            "| {} | {} | {:.1}% | {:.3} | {:.3} | {:.4}% | {:.3}% | {} | {} | {} |\n",
            r.skew,
            r.policy,
            r.met * 100.0,
            r.quality,
            r.quality_met,
            r.switch_share * 100.0,
            r.score_share * 100.0,
            pct(r.ttft_error),
            pct(r.tpot_error),
            r.expected_misses
        ));
    }
    report::print_results(&table, &rows, args.json)?;
    plot(&rows, args)?;
    eprintln!("chart: {}", args.plot.display());
    Ok(())
}

/// Which served run a (family, scorer, prompt, pair) reuses.
fn outcome_key(family: usize, scorer: &Scorer, prompt: usize, pair: Pair) -> String {
    format!(
        "{family}|{}|{prompt}|{}|{}",
        scorer.name(),
        pair.model,
        pair.prompt
    )
}

/// `prompt` served at `pair` `args.reps` times: the median TTFT (with that
/// run's switching and scoring times) and the median TPOT.
fn serve_median(
    fam: &mut dyn Family,
    prompt: &SloPrompt,
    scorer: &Scorer,
    pair: Pair,
    args: &BenchSloArgs,
) -> Result<slo::Served> {
    let mut runs = (0..args.reps)
        .map(|_| slo::serve_pair(fam, prompt, scorer, pair.model, pair.prompt, args.tokens))
        .collect::<arbor_engine::Result<Vec<_>>>()?;
    let mid = runs.len() / 2;
    let mut tpot: Vec<f64> = runs.iter().map(|r| r.tpot).collect();
    tpot.sort_by(f64::total_cmp);
    runs.sort_by(|a, b| a.ttft.total_cmp(&b.ttft));
    let mut m = runs.swap_remove(mid);
    m.tpot = tpot[mid];
    Ok(m)
}

/// Whether `s` met `slo` against the full model's `f` on the same prompt.
fn meets(slo: &Slo, s: &slo::Served, f: &slo::Served) -> bool {
    s.ttft <= slo.ttft * f.ttft && s.tpot <= slo.tpot * f.tpot
}

/// A family behind a mutable borrow.
struct Reborrow<'a>(&'a mut Variants);

impl Family for Reborrow<'_> {
    fn levels(&self) -> Vec<f64> {
        self.0.levels()
    }
    fn at(&mut self, level: f64) -> arbor_engine::Result<&mut dyn LanguageModel> {
        self.0.at(level)
    }
}

fn open(device: &RunConfig, path: &Path) -> Result<Run> {
    let config = device.clone().merge(RunConfig {
        target: Some(path.display().to_string()),
        ..RunConfig::default()
    });
    Ok(Engine::open(
        &config.target_only(),
        &mut progress::open_bar(),
    )?)
}

/// The original model (`base`, loaded from `original`) with the cheapest
/// whole non-anchor layers dropped, as many per level as the elastic levels
/// drop of their units.
fn layer_family(original: &Path, base: &Run, elastic_run: &Run) -> Result<Variants> {
    let levels = elastic_run
        .engine()
        .model()
        .levels()
        .context("the elastic model has no levels")?
        .to_vec();
    let masks = super::elastic::layer_masks(original, &levels)?;
    let out = (levels.iter().zip(&masks))
        .map(|(&level, keep)| Ok((level, base.engine().model().without_layers(keep)?)))
        .collect::<Result<_>>()?;
    Ok(Variants(out))
}

/// A baseline family's tables, cached under its name.
fn family_tables(
    v: &mut Variants,
    name: &str,
    store: &ProfileStore,
    (calibration, answers): (&[SloPrompt], &[Vec<u32>]),
    scorer: &Scorer,
    args: &BenchSloArgs,
    device: &RunConfig,
) -> Result<SloTables> {
    let kernels = arbor_engine::pick_backend(device.backend.as_deref())?.kernels();
    let threads = rayon::current_num_threads();
    let text = arbor_engine::Tokenizer::from_gguf(
        arbor_gguf::GgufFile::open(&arbor_fetch::resolve_model(&args.model)?)?.header(),
    )?
    .encode(&elastic::calibration_text("brown")?)?;
    let profile: DeviceProfile = cached(
        &store
            .dir()
            .join(format!("slo-device-{name}-{kernels}-t{threads}.json")),
        args.refresh,
        || {
            let plan = slo::ProfilePlan {
                lengths: slo::PROFILE_LENGTHS.to_vec(),
                decode: slo::PROFILE_DECODE,
                reps: slo::PROFILE_REPS,
            };
            Ok(slo::measure_profile(
                v,
                None,
                (name, kernels),
                &text,
                &plan,
                scorer,
                &mut progress::count_bar(&format!("{name} profile")),
            )?)
        },
    )?;
    let quality: QualityTable = cached(
        &store.dir().join(format!("slo-quality-{name}.json")),
        args.refresh,
        || {
            Ok(slo::measure_quality(
                v,
                name,
                calibration,
                answers,
                scorer,
                &slo::PROMPT_LEVELS,
                &mut progress::count_bar(&format!("{name} quality")),
            )?)
        },
    )?;
    Ok(SloTables {
        profile,
        quality,
        scorer: scorer.clone(),
    })
}

/// `path`'s JSON, or `make()` written there.
fn cached<T: serde::Serialize + serde::de::DeserializeOwned>(
    path: &Path,
    refresh: bool,
    make: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if !refresh
        && let Ok(text) = std::fs::read_to_string(path)
        && let Ok(v) = serde_json::from_str(&text)
    {
        return Ok(v);
    }
    let v = make()?;
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    eprintln!("cached {}", path.display());
    Ok(v)
}

fn plot(rows: &[Row], args: &BenchSloArgs) -> Result<()> {
    let mut policies: Vec<String> = Vec::new();
    for r in rows {
        if !policies.contains(&r.policy) {
            policies.push(r.policy.clone());
        }
    }
    let groups: Vec<String> = (args.skews.iter())
        .flat_map(|s| [format!("skew {s} met"), format!("skew {s} quality")])
        .collect();
    let series = (policies.iter())
        .map(|p| arbor_plot::Series {
            name: p.clone(),
            values: (args.skews.iter())
                .flat_map(|&s| {
                    let r = rows.iter().find(|r| r.policy == *p && r.skew == s);
                    [r.map_or(0.0, |r| r.met), r.map_or(0.0, |r| r.quality_met)]
                })
                .collect(),
        })
        .collect();
    let chart = arbor_plot::BarChart {
        title: format!("{}: SLOs met and quality (miss = 0) per skew", args.model),
        y_label: "share".into(),
        groups,
        series,
        reference: None,
    };
    arbor_plot::bar_chart(&chart, &args.plot).map_err(|e| anyhow::anyhow!("{e}"))
}

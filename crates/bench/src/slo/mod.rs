//! `arbor bench slo`: ELMS §5.2's trace on this machine. Six apps carry
//! the objectives of ELMS Table 3; held-out ShareGPT requests are split
//! among them by a skew α and arrive as a Poisson process. Each policy
//! picks a (model level, prompt level) pair per request from its own
//! device profile and quality table; every chosen pair is then served in
//! rounds beside the original model on the same prompt and its objective
//! is held against the original's latency measured next to it (see
//! `rounds.rs`). Policies: the elastic model with
//! bigram-scored prompt levels; the same pairs with tokens dropped at
//! random; always the full (original) model; whole layers dropped; and
//! prefixes of the unreordered file. Reports the share of objectives met, quality
//! (agreement with the full model's greedy answer), quality where misses
//! count zero, switching overhead and prediction error; a table and a PNG.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use arbor_elastic::Order;
use arbor_engine::slo::{self, Elastic, OnMiss, Pair, Reference, Scorer, SloPrompt, SloTables};
use arbor_engine::{ProfileStore, RunConfig};
use arbor_slo::{TRACE_APPS, draw_trace};

use crate::calibration::{self, ElasticFile};
use crate::elastic::open;
use crate::slo::families::{Families, cached, family_tables, layer_family};
use crate::{progress, report};

mod args;
mod families;
mod rounds;

pub use args::BenchSloArgs;

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

/// A served (prompt, pair): its median run, how close it stayed to the
/// full model's answer, and its latency over the original model's beside
/// it (see `rounds.rs`).
#[derive(Debug, Clone)]
struct Outcome {
    served: slo::Served,
    quality: f64,
    ttft_ratio: f64,
    tpot_ratio: f64,
}

/// What a policy decided for one request.
#[derive(Debug, Clone, Copy)]
struct Decided {
    pair: Pair,
    /// The profile's prediction (policies that decide from tables).
    predicted: Option<arbor_slo::Latency>,
    /// No pair was predicted to meet the objective.
    expected_miss: bool,
}

impl Default for Decided {
    fn default() -> Self {
        Decided {
            pair: Pair::FULL,
            predicted: None,
            expected_miss: false,
        }
    }
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

pub fn run(args: &BenchSloArgs, device: &RunConfig, elastic_file: ElasticFile) -> Result<()> {
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
    let elastic_path = elastic_file(&original, Order::Importance)?;
    let mut run = open(device, &elastic_path)?;
    // The original model: what objectives are fractions of and answers
    // are compared with.
    let mut orig_run = open(device, &original)?;
    let tables = calibration::tables(&mut run, args.calibration, args.answer_tokens, args.refresh)?;
    eprint!("{}", calibration::profile_table(&tables));
    let bigram = tables.scorer.clone();
    let texts = calibration::held_out(args.pool)?;
    let prompts: Vec<SloPrompt> = (texts.iter())
        .map(|t| run.slo_prompt(t, true))
        .collect::<arbor_engine::Result<_>>()?;
    let stop = run.engine().tokenizer().stop_ids();
    let calibration: Vec<SloPrompt> = (calibration::sharegpt_slice(0, args.calibration)?.iter())
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
        file_run = Some(open(device, &elastic_file(&original, Order::File)?)?);
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

    // Every policy decides every request of every trace first (decisions
    // depend on the tables only); then each prompt's chosen pairs are served
    // in rounds beside the original model (see `rounds`).
    let traces = (args.skews.iter())
        .map(|&skew| draw_trace(args.requests, skew, args.rate, prompts.len(), args.seed))
        .collect::<arbor_slo::Result<Vec<_>>>()?;
    let decided = decide_all(&traces, &policies, &prompts)?;
    // Per prompt, the distinct (policy family, scorer, pair) to serve: the
    // full model's own pair is the reference itself.
    let items = to_serve(&traces, &decided, &policies, prompts.len());
    let total: usize = items.iter().map(Vec::len).sum();
    eprintln!(
        "serving {total} (prompt, pair) choices on {} prompts, {} rounds each beside the original model",
        prompts.len(),
        args.reps
    );
    let mut done: HashMap<String, Outcome> = HashMap::new();
    let mut fams = Families {
        elastic: &mut run,
        layers: layers_run.as_mut(),
        file: file_run.as_mut(),
        original: &mut orig_run,
    };
    let mut bar = progress::count_bar("pairs beside the original model");
    let mut finished = 0;
    for (p, list) in items.iter().enumerate() {
        bar(finished, total);
        let prompt = &prompts[p];
        let mut serve = |i: Option<usize>| -> Result<slo::Served> {
            let (family, scorer, pair) = match i {
                None => (3, &bigram, Pair::FULL),
                Some(i) => {
                    let (pi, pair) = list[i];
                    (policies[pi].family, &policies[pi].scorer, pair)
                }
            };
            let mut fam = fams.get(family)?;
            let (m, l) = (pair.model, pair.prompt);
            Ok(slo::serve_pair(
                fam.as_mut(),
                prompt,
                scorer,
                m,
                l,
                args.tokens,
            )?)
        };
        let (reference, measured) = rounds::rounds(list.len(), args.reps, &mut serve)?;
        done.insert(
            outcome_key(3, &bigram, p, Pair::FULL),
            Outcome {
                served: reference,
                quality: 1.0,
                ttft_ratio: 1.0,
                tpot_ratio: 1.0,
            },
        );
        for (&(pi, pair), m) in list.iter().zip(measured) {
            let policy = &policies[pi];
            let mut fam = fams.get(policy.family)?;
            let (a, c) = slo::pair_agreement(
                fam.as_mut(),
                prompt,
                &answers[p],
                &policy.scorer,
                pair.model,
                pair.prompt,
            )?;
            done.insert(
                outcome_key(policy.family, &policy.scorer, p, pair),
                Outcome {
                    served: m.served,
                    quality: a as f64 / c.max(1) as f64,
                    ttft_ratio: m.ttft_ratio,
                    tpot_ratio: m.tpot_ratio,
                },
            );
        }
        finished += list.len();
    }
    bar(total, total);

    let mut rows = Vec::new();
    for ((&skew, trace), per_policy) in args.skews.iter().zip(&traces).zip(&decided) {
        for (policy, ds) in policies.iter().zip(per_policy) {
            let (mut met, mut q, mut qm, mut sw, mut sc) = (0usize, 0.0, 0.0, 0.0, 0.0);
            let (mut te, mut pe) = (0.0, 0.0);
            for (req, d) in trace.iter().zip(ds) {
                let slo = TRACE_APPS[req.app].slo;
                let key = outcome_key(policy.family, &policy.scorer, req.prompt, d.pair);
                let o = done.get(&key).context("a decided pair was not served")?;
                let s = &o.served;
                let ok = o.ttft_ratio <= slo.ttft && o.tpot_ratio <= slo.tpot;
                met += usize::from(ok);
                q += o.quality;
                qm += if ok { o.quality } else { 0.0 };
                sw += s.switch_secs / s.ttft;
                sc += s.score_secs / s.ttft;
                if let Some(p) = d.predicted {
                    te += (s.ttft - p.ttft).abs() / s.ttft;
                    pe += (s.tpot - p.tpot).abs() / s.tpot;
                }
            }
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
                expected_misses: ds.iter().filter(|d| d.expected_miss).count(),
            });
        }
    }

    let mut table = format!(
        "bench slo: {} requests per trace over {} held-out ShareGPT prompts, Poisson arrivals at {}/s, ELMS Table 3 apps, {} tokens decoded each; objectives held against the original model's latency measured beside each pair on the same prompt (median ratio over {} rounds), quality against its answer\n",
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

/// Every policy's decision for every request of every trace (per trace,
/// per policy, per request): a policy with tables decides from them, one
/// that serves another's pairs copies them, the full model takes its own.
fn decide_all(
    traces: &[Vec<arbor_slo::Request>],
    policies: &[Policy],
    prompts: &[SloPrompt],
) -> Result<Vec<Vec<Vec<Decided>>>> {
    let mut decided: Vec<Vec<Vec<Decided>>> = Vec::new();
    for trace in traces {
        let mut per_policy: Vec<Vec<Decided>> = Vec::new();
        for policy in policies {
            let mut ds = Vec::with_capacity(trace.len());
            for (k, req) in trace.iter().enumerate() {
                let prompt = &prompts[req.prompt];
                ds.push(match (&policy.tables, policy.pairs_of) {
                    (_, Some(other)) => Decided {
                        pair: per_policy[other][k].pair,
                        ..Decided::default()
                    },
                    (Some(t), None) => {
                        let c = arbor_slo::decide(
                            &t.profile,
                            &t.quality,
                            &TRACE_APPS[req.app].slo,
                            prompt.tokens.len(),
                            prompt.protected_count(),
                            slo::HEADROOM,
                            OnMiss::Fastest,
                        )?;
                        Decided {
                            pair: c.pair,
                            predicted: Some(c.predicted),
                            expected_miss: !c.met,
                        }
                    }
                    (None, None) => Decided::default(),
                });
            }
            per_policy.push(ds);
        }
        decided.push(per_policy);
    }
    Ok(decided)
}

/// Per prompt, the distinct (policy, pair) to serve — one per family,
/// scorer and pair; the full model's own pair is the reference itself.
fn to_serve(
    traces: &[Vec<arbor_slo::Request>],
    decided: &[Vec<Vec<Decided>>],
    policies: &[Policy],
    prompts: usize,
) -> Vec<Vec<(usize, Pair)>> {
    let mut items: Vec<Vec<(usize, Pair)>> = vec![Vec::new(); prompts];
    let mut seen = std::collections::HashSet::new();
    for (trace, per_policy) in traces.iter().zip(decided) {
        for (pi, ds) in per_policy.iter().enumerate() {
            let policy = &policies[pi];
            for (req, d) in trace.iter().zip(ds) {
                let reference = policy.family == 3 && d.pair == Pair::FULL;
                let key = outcome_key(policy.family, &policy.scorer, req.prompt, d.pair);
                if !reference && seen.insert(key) {
                    items[req.prompt].push((pi, d.pair));
                }
            }
        }
    }
    items
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

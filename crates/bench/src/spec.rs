//! `arbor bench spec` without a memory budget: every strategy on one
//! loaded target and draft, prompt by prompt, against autoregressive
//! decoding (speed and identical output); a table (or JSON lines) and a
//! bar chart. With `--memory-budget` the sweep in [`crate::budget`] runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use arbor_engine::{Engine, LatencyProfile, RunConfig, Sampling};

use crate::prompts::load_prompts;
use crate::report::{print_results, title};
use crate::tuning::TuningArgs;
use crate::{progress, sys};

#[derive(Debug)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct BenchSpecArgs {
    #[cfg_attr(feature = "clap", arg(long, default_value = "qwen2.5-coder-1.5b"))]
    pub target: String,
    #[cfg_attr(feature = "clap", arg(long, default_value = "qwen2.5-coder-0.5b"))]
    pub draft: String,
    /// mt-bench, sharegpt, or a file with one JSON string per line.
    #[cfg_attr(feature = "clap", arg(long, default_value = "mt-bench"))]
    pub prompts: String,
    /// Use at most N prompts (spread over the categories).
    #[cfg_attr(feature = "clap", arg(long))]
    pub limit: Option<usize>,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 128))]
    pub max_tokens: usize,
    /// Strategies to compare, each optionally with its draft after `@`
    /// (`tree@lookup`), or `auto`. The baseline always runs first:
    /// autoregressive (the reference for speed and output), or under
    /// `--memory-budget` autoregressive-pipelined (outputs are then
    /// compared with an unlimited target-only run).
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_delimiter = ',',
            default_value = "autoregressive,chain,tree"
        )
    )]
    pub strategies: Vec<String>,
    /// One JSON object per strategy on stdout (the table goes to stderr).
    #[cfg_attr(feature = "clap", arg(long))]
    pub json: bool,
    /// Where to draw the bar chart.
    #[cfg_attr(feature = "clap", arg(long, default_value = "arbor-bench-spec.png"))]
    pub plot: PathBuf,
    #[cfg_attr(feature = "clap", arg(long))]
    pub backend: Option<String>,
    #[cfg_attr(feature = "clap", command(flatten))]
    pub tuning: TuningArgs,
    /// Memory budgets (e.g. `1.3GiB` or a sweep `0.9GiB,1.3GiB,2GiB`): each
    /// strategy runs in its own process, inside a cgroup memory limit of the
    /// budget without swap (cgroup v2 or v1; needs root). Where no group can
    /// be made the benchmark refuses to run (see `--unconfined`).
    /// Strategies then include `autoregressive-pipelined`.
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    pub memory_budget: Vec<String>,
    /// Run `--memory-budget` rows without a cgroup: nothing but arbor's own
    /// plan holds them (and nothing holds a peer) to the budget; peaks are
    /// each process's own peak RSS, and the rows say so.
    #[cfg_attr(feature = "clap", arg(long))]
    pub unconfined: bool,
    /// Where the cgroup filesystem is: cgroup v2 if DIR/cgroup.controllers
    /// exists, else cgroup v1 (DIR/memory, DIR/blkio).
    #[cfg_attr(feature = "clap", arg(long, default_value = crate::cgroup::SYSTEM_ROOT))]
    pub cgroup_root: PathBuf,
    /// Cap the block device's read bandwidth for every budgeted process
    /// (`1GB/s`; cgroup v2 io.max or v1 blkio): emulates a device's storage
    /// where this machine's disk is faster or cached below the page cache.
    #[cfg_attr(feature = "clap", arg(long))]
    pub read_limit: Option<String>,
    /// Other engines to run beside arbor under each memory budget, in the
    /// same cgroup: `llama.cpp=DIR` (DIR holds `llama-completion` and
    /// `llama-speculative`; `benches/build-llama-cpp.sh` builds them).
    #[cfg_attr(feature = "clap", arg(long))]
    pub peer: Vec<String>,
    /// Prompts (the first ones) and new tokens per prompt the peers run: at
    /// under 1 tok/s a few suffice.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 2))]
    pub peer_prompts: usize,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 32))]
    pub peer_tokens: usize,
    /// Run a budget's rows in N rounds, each over the next share of the
    /// prompts (the peers' too), every row in turn and the order reversed
    /// in every other round: a drift in the machine's speed through the
    /// run (a host's reads slowing over an hour) then falls on every row
    /// alike instead of on the rows that run last. Each row's figures are
    /// summed over its rounds.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64)))]
    pub rounds: u32,
    /// Internal: run one strategy and write a report (used by the budget
    /// benchmark for its child processes).
    #[cfg_attr(feature = "clap", arg(long, hide = true))]
    pub child: bool,
    #[cfg_attr(feature = "clap", arg(long, hide = true))]
    pub report: Option<PathBuf>,
    /// Internal: the child runs this share of the prompts, `K/N` (the K-th
    /// from 0 of N rounds).
    #[cfg_attr(feature = "clap", arg(long, hide = true))]
    pub part: Option<String>,
}

#[derive(Default, Clone)]
struct Totals {
    prompts: usize,
    identical: usize,
    generated: usize,
    produced: usize,
    secs: f64,
    passes: usize,
    verifications: usize,
    accepted: usize,
    draft_tokens: usize,
    per_category: BTreeMap<String, (usize, usize)>,
}

#[derive(serde::Serialize)]
struct Row {
    strategy: String,
    prompts: usize,
    identical: usize,
    tok_s: f64,
    ms_per_token: f64,
    mean_accepted: f64,
    verifications_per_100: f64,
    speedup_vs_autoregressive: f64,
    peak_bytes: u64,
    draft_tokens: usize,
    accepted_draft_tokens: usize,
    mean_accepted_per_category: BTreeMap<String, f64>,
}

impl BenchSpecArgs {
    /// The run every strategy of this benchmark shares (the device config
    /// under these flags); `strategy` names the one it opens with.
    /// Greedy, and inside the memory budget this process runs under (the
    /// first of `--memory-budget` in a child, none in the parent), whatever
    /// the device config says: the benchmark compares greedy outputs.
    /// `strategy` may name its draft source after an `@` (`tree@lookup`,
    /// `tree-provisional@self`, `chain@PATH`); `auto` lets the planner
    /// choose among `--draft`, prompt lookup and the self draft.
    pub fn config(&self, device: &RunConfig, strategy: &str) -> RunConfig {
        let (strategy, draft) = split_entry(strategy, &self.draft);
        let merged = device.clone().merge(RunConfig {
            target: Some(self.target.clone()),
            draft: Some(draft.to_string()),
            backend: self.backend.clone(),
            strategy: Some(strategy.to_string()),
            tuning: self.tuning.tuning(),
            max_tokens: Some(self.max_tokens),
            ..RunConfig::default()
        });
        RunConfig {
            memory_budget: self.memory_budget.first().cloned().filter(|_| self.child),
            sampling: Sampling::default(),
            ..merged
        }
    }

    /// The title line of this benchmark's tables.
    pub fn title(&self, prompts: usize) -> String {
        title(
            prompts,
            &self.prompts,
            self.max_tokens,
            &self.target,
            &self.draft,
        )
    }

    /// Strategy names to run, the baseline first, each checked.
    pub fn names(&self) -> Result<Vec<String>> {
        // Under a budget the baseline is plain decoding with pipelined
        // streaming (outputs are compared with an unlimited run); without
        // one it is autoregressive decoding, which every row is checked
        // against.
        let mut names: Vec<String> = match self.memory_budget.is_empty() {
            true => vec!["autoregressive".into()],
            false => vec!["autoregressive-pipelined".into()],
        };
        for s in &self.strategies {
            let (strategy, _) = split_entry(s, &self.draft);
            if strategy != arbor_engine::AUTO {
                strategy.parse::<arbor_engine::Strategy>()?;
            }
            if !names.contains(s) {
                names.push(s.clone());
            }
        }
        Ok(names)
    }
}

/// A benchmark entry's strategy and draft source (`--draft` unless the
/// entry names one after `@`).
pub fn split_entry<'a>(entry: &'a str, draft: &'a str) -> (&'a str, &'a str) {
    entry.split_once('@').unwrap_or((entry, draft))
}

/// A benchmark entry as tables and file names show it: a draft given as a
/// path by its file stem (`tree@/x/slim-k32768.gguf` → `tree@slim-k32768`);
/// other drafts as written (`tree@elastic:0.5`).
pub fn entry_label(entry: &str) -> String {
    match entry.split_once('@') {
        Some((strategy, draft)) if draft.contains('/') || draft.ends_with(".gguf") => {
            let stem = std::path::Path::new(draft)
                .file_stem()
                .map_or_else(|| draft.to_string(), |s| s.to_string_lossy().into_owned());
            format!("{strategy}@{stem}")
        }
        _ => entry.to_string(),
    }
}

pub fn run(args: &BenchSpecArgs, device: &RunConfig) -> Result<()> {
    if args.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let names = args.names()?;
    let prompts = load_prompts(&args.prompts, args.limit)?;
    let mut events = progress::open_bar();
    // One run per draft source (and one for `auto`, which picks its own);
    // drafts are loaded and profiles measured before the first prompt, so
    // every strategy's timings are of decoding only.
    let mut runs: Vec<(String, arbor_engine::Run)> = Vec::new();
    let mut strategies = Vec::new();
    for name in &names {
        let (strategy, draft) = split_entry(name, &args.draft);
        let key = if strategy == arbor_engine::AUTO {
            strategy
        } else {
            draft
        };
        let at = match runs.iter().position(|(k, _)| k == key) {
            Some(at) => at,
            None => {
                // The entry's own draft (`tree@lookup`), opened plainly;
                // its strategy is set below.
                let opening = if strategy == arbor_engine::AUTO {
                    name.clone()
                } else {
                    format!("autoregressive@{draft}")
                };
                let config = args.config(device, &opening);
                runs.push((key.to_string(), Engine::open(&config, &mut events)?));
                runs.len() - 1
            }
        };
        let run = &mut runs[at].1;
        if strategy != arbor_engine::AUTO {
            run.use_strategy(strategy, &mut events)?;
        }
        strategies.push((at, run.strategy().clone()));
    }
    if let Some(p) = runs[0].1.profiles() {
        let curve = |p: &LatencyProfile| -> String {
            p.points
                .iter()
                .map(|(n, s)| format!("{n}:{:.1}ms", s * 1e3))
                .collect::<Vec<_>>()
                .join(" ")
        };
        eprintln!("target L_fp(n): {}", curve(&p.target));
        if let Some(d) = &p.draft {
            eprintln!("draft  L_fp(n): {}", curve(d));
        }
    }
    let mut totals = vec![Totals::default(); names.len()];
    let mut count = progress::count_bar("runs");
    let total_runs = prompts.len() * names.len();
    let mut done = 0;
    for prompt in &prompts {
        let ids = runs[0].1.prompt_tokens(&prompt.text, true)?;
        let mut reference: Option<Vec<u32>> = None;
        for (i, (at, strategy)) in strategies.iter().enumerate() {
            let run = &mut runs[*at].1;
            run.set_strategy(strategy.clone())?;
            let g = run.generate(&ids, &mut |_| {})?;
            let s = &g.stats;
            let t = &mut totals[i];
            t.prompts += 1;
            match &reference {
                None => {
                    reference = Some(g.tokens.clone());
                    t.identical += 1;
                }
                Some(r) => t.identical += usize::from(*r == g.tokens),
            }
            t.generated += s.generated_tokens.saturating_sub(1);
            t.secs += s.decode_secs;
            t.produced += s.produced_after_prefill();
            t.passes += s.verifications + s.target_steps;
            t.verifications += s.verifications;
            t.accepted += s.accepted_draft_tokens;
            t.draft_tokens += s.draft_tokens;
            let c = t.per_category.entry(prompt.category.clone()).or_default();
            c.0 += s.produced_after_prefill();
            c.1 += s.verifications + s.target_steps;
            done += 1;
            count(done, total_runs);
        }
    }
    for (_, run) in &mut runs {
        for note in run.take_notes() {
            eprintln!("{note}");
        }
    }
    let peak = sys::peak_rss_bytes().unwrap_or(0);
    let ar_tok_s = totals[0].generated as f64 / totals[0].secs.max(1e-9);
    let rows: Vec<Row> = names
        .iter()
        .zip(&totals)
        .map(|(name, t)| {
            let tok_s = t.generated as f64 / t.secs.max(1e-9);
            Row {
                strategy: entry_label(name),
                prompts: t.prompts,
                identical: t.identical,
                tok_s,
                ms_per_token: 1000.0 / tok_s.max(1e-9),
                mean_accepted: t.produced as f64 / t.passes.max(1) as f64,
                verifications_per_100: 100.0 * t.verifications as f64 / t.generated.max(1) as f64,
                speedup_vs_autoregressive: tok_s / ar_tok_s.max(1e-9),
                peak_bytes: peak,
                draft_tokens: t.draft_tokens,
                accepted_draft_tokens: t.accepted,
                mean_accepted_per_category: t
                    .per_category
                    .iter()
                    .map(|(k, (g, p))| (k.clone(), *g as f64 / (*p).max(1) as f64))
                    .collect(),
            }
        })
        .collect();
    let table = render_table(&rows, args);
    print_results(&table, &rows, args.json)?;
    draw(&rows, &args.plot, args)?;
    eprintln!("chart: {}", args.plot.display());
    Ok(())
}

fn render_table(rows: &[Row], args: &BenchSpecArgs) -> String {
    let mut s = args.title(rows.first().map_or(0, |r| r.prompts));
    s += "\n";
    s += "| strategy | tok/s | ms/token | mean accepted | verif./100 tok | speedup vs AR | identical |\n";
    s += "|---|---|---|---|---|---|---|\n";
    for r in rows {
        s += &format!(
            "| {} | {:.2} | {:.1} | {:.2} | {:.1} | {:.2}× | {}/{} |\n",
            r.strategy,
            r.tok_s,
            r.ms_per_token,
            r.mean_accepted,
            r.verifications_per_100,
            r.speedup_vs_autoregressive,
            r.identical,
            r.prompts
        );
    }
    for r in rows.iter().filter(|r| r.strategy != "autoregressive") {
        if r.mean_accepted_per_category.len() > 1 {
            let parts: Vec<String> = r
                .mean_accepted_per_category
                .iter()
                .map(|(k, v)| format!("{k} {v:.2}"))
                .collect();
            s += &format!(
                "\nmean accepted per category ({}): {}",
                r.strategy,
                parts.join(", ")
            );
        }
    }
    s += "\n";
    s
}

fn draw(rows: &[Row], path: &Path, args: &BenchSpecArgs) -> Result<()> {
    let chart = arbor_plot::BarChart {
        title: format!(
            "tok/s, {} {} prompts, {} new tokens",
            rows.first().map_or(0, |r| r.prompts),
            args.prompts,
            args.max_tokens
        ),
        y_label: "tokens / s".into(),
        groups: rows.iter().map(|r| r.strategy.clone()).collect(),
        series: vec![arbor_plot::Series {
            name: "tok/s".into(),
            values: rows.iter().map(|r| r.tok_s).collect(),
        }],
        reference: rows
            .first()
            .map(|r| (r.tok_s, "autoregressive".to_string())),
    };
    arbor_plot::bar_chart(&chart, path).with_context(|| format!("drawing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_keep_their_drafts_and_labels() {
        assert_eq!(
            split_entry("tree@elastic:0.5", "d"),
            ("tree", "elastic:0.5")
        );
        assert_eq!(split_entry("tree", "d"), ("tree", "d"));
        assert_eq!(entry_label("tree@elastic:0.5"), "tree@elastic:0.5");
        assert_eq!(entry_label("chain@lookup"), "chain@lookup");
        assert_eq!(entry_label("tree@/x/slim-k32768.gguf"), "tree@slim-k32768");
        assert_eq!(
            entry_label("tree@qwen2.5-coder-0.5b.gguf"),
            "tree@qwen2.5-coder-0.5b"
        );
        assert_eq!(entry_label("ppd"), "ppd");
    }
}

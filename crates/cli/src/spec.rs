//! Speculative decoding from the command line: strategy flags, the
//! target's latency profile (measured once, cached), prompt sets, and
//! `arbor bench spec`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use arbor_engine::{
    BackendKind, Engine, GenerateOptions, LatencyProfile, SamplingParams, Strategy, TreeConfig,
    Typical, Verification,
};
use clap::Args;

use crate::{profile, progress};

/// Flags shared by `generate` and `bench spec` that shape the strategies.
#[derive(Args, Debug, Clone)]
pub struct StrategyArgs {
    /// Draft tokens per verification for `chain`.
    #[arg(long, default_value_t = 5)]
    pub gamma: usize,
    /// Initial verification threshold α of `tree`.
    #[arg(long, default_value_t = 0.01)]
    pub alpha: f32,
    /// Most draft tokens one `tree` verification may carry.
    #[arg(long, default_value_t = 32)]
    pub max_tree: usize,
    /// Draft probability above which a candidate opens a branch (`tree`).
    #[arg(long, default_value_t = 0.3)]
    pub branch_threshold: f32,
    /// `exact` (lossless) or `typical` (typical acceptance).
    #[arg(long, default_value = "exact")]
    pub verify: String,
    /// Do not size trees with the target's measured latency profile.
    #[arg(long)]
    pub no_profile: bool,
}

impl StrategyArgs {
    /// These settings as command-line flags (for child processes).
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--gamma={}", self.gamma),
            format!("--alpha={}", self.alpha),
            format!("--max-tree={}", self.max_tree),
            format!("--branch-threshold={}", self.branch_threshold),
            format!("--verify={}", self.verify),
        ];
        if self.no_profile {
            a.push("--no-profile".into());
        }
        a
    }

    pub fn verification(&self) -> Result<Verification> {
        Ok(match self.verify.as_str() {
            "exact" => Verification::Exact,
            "typical" => Verification::Typical(Typical::default()),
            other => bail!("unknown verification `{other}` (choose exact or typical)"),
        })
    }

    /// The named strategy with these settings.
    pub fn strategy(
        &self,
        name: &str,
        profiles: Option<&(LatencyProfile, Option<LatencyProfile>)>,
    ) -> Result<Strategy> {
        Ok(match Strategy::parse(name)? {
            Strategy::Chain { .. } => Strategy::Chain { gamma: self.gamma },
            Strategy::Tree(named) => {
                let mut c = TreeConfig {
                    alpha: self.alpha,
                    max_nodes: self.max_tree,
                    profile: profiles.map(|p| p.0.clone()),
                    draft_profile: profiles.and_then(|p| p.1.clone()),
                    ..named
                };
                c.grow.branch_threshold = self.branch_threshold;
                Strategy::Tree(c)
            }
            other => other,
        })
    }
}

/// Direct-read throughput assumed when adjusting latency profiles for
/// streamed layers (this machine's cold disk: about 0.9 GB/s).
const DISK_BYTES_PER_SEC: f64 = 0.9e9;

/// A strategy name as the memory-budget benchmarks spell it: a decoding
/// strategy plus how streamed layers load (`autoregressive-pipelined`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub base: &'static str,
    pub pipelined: bool,
}

impl Variant {
    /// Whether the strategy sizes trees with the measured latency profiles.
    pub fn profiled(&self) -> bool {
        self.base.starts_with("tree")
    }

    pub fn parse(name: &str) -> Result<Self> {
        let (base, pipelined) = match name {
            "autoregressive" | "ar" => ("autoregressive", false),
            "autoregressive-pipelined" => ("autoregressive", true),
            "chain" => ("chain", true),
            "tree" => ("tree", true),
            "tree-provisional" => ("tree-provisional", true),
            "tree-no-fallback" => ("tree-no-fallback", true),
            "static-tree" => ("static-tree", true),
            other => bail!(
                "unknown strategy `{other}` (choose autoregressive, autoregressive-pipelined, chain, \
                 tree, tree-provisional, tree-no-fallback or static-tree)"
            ),
        };
        Ok(Self { base, pipelined })
    }
}

/// Loads target (and draft) under a memory budget, printing the split.
pub fn load_budgeted(
    target: &Path,
    draft: Option<&Path>,
    backend: BackendKind,
    budget: u64,
    pipelined: bool,
) -> Result<Engine> {
    let mut bar = progress::load_bar(target);
    let options = arbor_engine::MemoryOptions::new(budget, pipelined);
    let engine = Engine::load_budgeted(target, draft, backend, &options, &mut bar)
        .with_context(|| format!("loading {} under a memory budget", target.display()))?;
    if let Some(m) = engine.memory() {
        eprintln!("{}", m.summary());
    }
    Ok(engine)
}

/// `L_fp(n)` of the engine's target and of its draft on this machine:
/// read from the cache (`$ARBOR_HOME/profiles/`) or measured now (about a
/// minute for 1.5B).
pub fn latency_profiles(
    engine: &mut Engine,
    draft_path: Option<&Path>,
    backend: BackendKind,
) -> Result<(LatencyProfile, Option<LatencyProfile>)> {
    let target_path = engine.path().to_path_buf();
    let mut target = cached_profile(&target_path, backend, engine.model_mut())?;
    // Profiles are measured with every layer resident. Under a budget each
    // target pass also reads the streamed layers, at about the disk's rate.
    if let Some(m) = engine.memory()
        && m.plan.read_per_pass > 0
    {
        let io = m.plan.read_per_pass as f64 / DISK_BYTES_PER_SEC;
        for p in &mut target.points {
            p.1 += io;
        }
    }
    let draft = match (draft_path, engine.draft_mut()) {
        (Some(p), Some(model)) => Some(cached_profile(p, backend, model)?),
        _ => None,
    };
    Ok((target, draft))
}

fn cached_profile(
    model_path: &Path,
    backend: BackendKind,
    model: &mut dyn arbor_engine::LanguageModel,
) -> Result<LatencyProfile> {
    let stem = model_path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let threads = rayon::current_num_threads();
    // Keyed by the kernels too: a profile measured with other kernels (an
    // older arbor, another CPU) would size trees for the wrong speeds.
    let kernels = backend.kernels();
    let path = arbor_fetch::arbor_home()
        .join("profiles")
        .join(format!("{stem}-{kernels}-t{threads}.json"));
    if let Some(p) = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| LatencyProfile::from_json(&s))
    {
        return Ok(p);
    }
    eprintln!(
        "measuring forward latency L_fp(n) of {stem} once (cached in {})",
        path.display()
    );
    let mut bar = progress::count_bar("sizes");
    let p = LatencyProfile::measure(model, &arbor_engine::PROFILE_SIZES, 128, &mut bar)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    std::fs::write(&path, p.to_json()).ok();
    Ok(p)
}

/// One benchmark prompt.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub text: String,
    pub category: String,
}

/// Prompts from `mt-bench` (first turns), `sharegpt` (first human turns)
/// or a file with one JSON string per line.
pub fn load_prompts(which: &str, limit: Option<usize>) -> Result<Vec<Prompt>> {
    let mut prompts = match which {
        "mt-bench" => {
            let path = arbor_fetch::fetch_dataset("mt-bench", &mut progress::fetch_bar())?;
            let text = std::fs::read_to_string(&path)?;
            let mut out = Vec::new();
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let v: serde_json::Value = serde_json::from_str(line)
                    .with_context(|| format!("bad MT-Bench line in {}", path.display()))?;
                let turn = v["turns"][0]
                    .as_str()
                    .context("MT-Bench question without turns")?;
                out.push(Prompt {
                    text: turn.to_string(),
                    category: v["category"].as_str().unwrap_or("?").to_string(),
                });
            }
            out
        }
        "sharegpt" => {
            let path = arbor_fetch::fetch_dataset("sharegpt", &mut progress::fetch_bar())?;
            let text = std::fs::read_to_string(&path)?;
            sharegpt_prompts(&text, limit.unwrap_or(usize::MAX))
        }
        file => {
            let text = std::fs::read_to_string(file).with_context(|| {
                format!("no prompt set or file `{file}` (mt-bench, sharegpt, or a path)")
            })?;
            let mut out = Vec::new();
            for (i, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                let s: String = serde_json::from_str(line).with_context(|| {
                    format!("{file}:{}: expected one JSON string per line", i + 1)
                })?;
                out.push(Prompt {
                    text: s,
                    category: "file".into(),
                });
            }
            out
        }
    };
    if let Some(n) = limit {
        prompts = spread(prompts, n);
    }
    if prompts.is_empty() {
        bail!("the prompt set `{which}` is empty");
    }
    Ok(prompts)
}

/// At most `n` prompts, taken round-robin over categories so a short run
/// still covers them all.
fn spread(prompts: Vec<Prompt>, n: usize) -> Vec<Prompt> {
    if prompts.len() <= n {
        return prompts;
    }
    let mut by_cat: BTreeMap<String, Vec<Prompt>> = BTreeMap::new();
    let mut order = Vec::new();
    for p in prompts {
        if !by_cat.contains_key(&p.category) {
            order.push(p.category.clone());
        }
        by_cat.entry(p.category.clone()).or_default().push(p);
    }
    let mut out = Vec::new();
    let mut round = 0;
    while out.len() < n {
        let mut any = false;
        for c in &order {
            if let Some(p) = by_cat[c].get(round)
                && out.len() < n
            {
                out.push(p.clone());
                any = true;
            }
        }
        if !any {
            break;
        }
        round += 1;
    }
    out
}

/// First human turns of a ShareGPT dump, read conversation by
/// conversation so a file cut off mid-way still yields everything before
/// the cut.
pub fn sharegpt_prompts(text: &str, limit: usize) -> Vec<Prompt> {
    let mut out = Vec::new();
    let mut rest = text.trim_start().strip_prefix('[').unwrap_or("");
    while out.len() < limit {
        rest = rest.trim_start().trim_start_matches(',').trim_start();
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>();
        let Some(Ok(v)) = it.next() else { break };
        rest = &rest[it.byte_offset()..];
        let first = v["conversations"]
            .as_array()
            .and_then(|c| c.iter().find(|t| t["from"] == "human"))
            .and_then(|t| t["value"].as_str());
        if let Some(s) = first.filter(|s| !s.trim().is_empty()) {
            out.push(Prompt {
                text: s.to_string(),
                category: "sharegpt".into(),
            });
        }
    }
    out
}

#[derive(Args, Debug)]
pub struct BenchSpecArgs {
    #[arg(long, default_value = "qwen2.5-coder-1.5b")]
    pub target: String,
    #[arg(long, default_value = "qwen2.5-coder-0.5b")]
    pub draft: String,
    /// mt-bench, sharegpt, or a file with one JSON string per line.
    #[arg(long, default_value = "mt-bench")]
    pub prompts: String,
    /// Use at most N prompts (spread over the categories).
    #[arg(long)]
    pub limit: Option<usize>,
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Strategies to compare (autoregressive is always run: it is the
    /// reference for speed and output).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "autoregressive,chain,tree"
    )]
    pub strategies: Vec<String>,
    /// One JSON object per strategy on stdout (the table goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Where to draw the bar chart.
    #[arg(long, default_value = "arbor-bench-spec.png")]
    pub plot: PathBuf,
    #[arg(long)]
    pub backend: Option<String>,
    #[command(flatten)]
    pub spec: StrategyArgs,
    /// Memory budgets (e.g. `1.3GiB` or a sweep `0.9GiB,1.3GiB,2GiB`): each
    /// strategy runs in its own process, inside a cgroup v1 limit of the
    /// budget when run as root. Strategies then include
    /// `autoregressive-pipelined`.
    #[arg(long, value_delimiter = ',')]
    pub memory_budget: Vec<String>,
    /// Internal: run one strategy and write a report (used by the budget
    /// benchmark for its child processes).
    #[arg(long, hide = true)]
    pub child: bool,
    #[arg(long, hide = true)]
    pub report: Option<PathBuf>,
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

/// The table on stdout; with `json`, one JSON object per row on stdout and
/// the table on stderr.
pub fn print_results<T: serde::Serialize>(table: &str, rows: &[T], json: bool) -> Result<()> {
    if json {
        eprint!("{table}");
        for r in rows {
            println!("{}", serde_json::to_string(r)?);
        }
    } else {
        print!("{table}");
    }
    Ok(())
}

pub fn bench_spec(args: &BenchSpecArgs, backend: BackendKind) -> Result<()> {
    if args.child || !args.memory_budget.is_empty() {
        return crate::budget::run(args, backend);
    }
    if args.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let verification = args.spec.verification()?;
    let mut names: Vec<String> = vec!["autoregressive".into()];
    for s in &args.strategies {
        Strategy::parse(s)?;
        if !names.contains(s) {
            names.push(s.clone());
        }
    }
    let prompts = load_prompts(&args.prompts, args.limit)?;
    let target = fetch_or_resolve(&args.target)?;
    let draft = fetch_or_resolve(&args.draft)?;
    let mut engine = crate::load(&target, backend)?;
    {
        let mut bar = progress::load_bar(&draft);
        engine
            .load_draft(&draft, backend, &mut bar)
            .with_context(|| format!("loading draft {}", draft.display()))?;
    }
    let profile = if args.spec.no_profile {
        None
    } else {
        Some(latency_profiles(&mut engine, Some(&draft), backend)?)
    };
    if let Some((p, d)) = &profile {
        let curve = |p: &LatencyProfile| -> String {
            p.points
                .iter()
                .map(|(n, s)| format!("{n}:{:.1}ms", s * 1e3))
                .collect::<Vec<_>>()
                .join(" ")
        };
        eprintln!("target L_fp(n): {}", curve(p));
        if let Some(d) = d {
            eprintln!("draft  L_fp(n): {}", curve(d));
        }
    }
    let strategies: Vec<Strategy> = names
        .iter()
        .map(|n| args.spec.strategy(n, profile.as_ref()))
        .collect::<Result<_>>()?;
    let mut totals = vec![Totals::default(); names.len()];
    let mut count = progress::count_bar("runs");
    let total_runs = prompts.len() * names.len();
    let mut done = 0;
    for prompt in &prompts {
        let ids = engine.prompt_tokens(&prompt.text, true)?;
        let mut reference: Option<Vec<u32>> = None;
        for (i, strategy) in strategies.iter().enumerate() {
            let options = GenerateOptions {
                max_tokens: args.max_tokens,
                sampling: SamplingParams::default(),
                stop_tokens: None,
                strategy: strategy.clone(),
                verification,
            };
            let g = engine.generate(&ids, &options, &mut |_| {})?;
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
    let peak = profile::peak_rss_bytes().unwrap_or(0);
    let ar_tok_s = totals[0].generated as f64 / totals[0].secs.max(1e-9);
    let rows: Vec<Row> = names
        .iter()
        .zip(&totals)
        .map(|(name, t)| {
            let tok_s = t.generated as f64 / t.secs.max(1e-9);
            Row {
                strategy: name.clone(),
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

/// The first line of a benchmark table (without the line break): what ran.
pub fn table_title(prompts: usize, args: &BenchSpecArgs) -> String {
    format!(
        "{prompts} prompts from {}, {} new tokens, greedy, target {} / draft {}",
        args.prompts, args.max_tokens, args.target, args.draft
    )
}

fn render_table(rows: &[Row], args: &BenchSpecArgs) -> String {
    let mut s = table_title(rows.first().map_or(0, |r| r.prompts), args);
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

/// A model path, or a registered short name (fetched if missing).
pub fn fetch_or_resolve(name: &str) -> Result<PathBuf> {
    match arbor_fetch::model_spec(name) {
        Some(spec) => Ok(arbor_fetch::fetch_model(spec, &mut progress::fetch_bar())?),
        None => Ok(arbor_fetch::resolve_model(name)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharegpt_survives_a_cut_off_file() {
        let text = r#"[{"id":"a","conversations":[{"from":"human","value":"hi"},{"from":"gpt","value":"yo"}]},
            {"id":"b","conversations":[{"from":"gpt","value":"x"},{"from":"human","value":"second"}]},
            {"id":"c","conversations":[{"from":"human","value":"cut of"#;
        let p = sharegpt_prompts(text, 10);
        let texts: Vec<&str> = p.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(texts, ["hi", "second"]);
        assert_eq!(sharegpt_prompts(text, 1).len(), 1);
        assert!(sharegpt_prompts("garbage", 5).is_empty());
    }

    #[test]
    fn spread_covers_every_category() {
        let p: Vec<Prompt> = (0..9)
            .map(|i| Prompt {
                text: i.to_string(),
                category: ["a", "b", "c"][i / 3].into(),
            })
            .collect();
        let s = spread(p, 4);
        let cats: Vec<&str> = s.iter().map(|p| p.category.as_str()).collect();
        assert_eq!(cats, ["a", "b", "c", "a"]);
    }
}

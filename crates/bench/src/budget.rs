//! `arbor bench spec --memory-budget`: every strategy in its own process,
//! inside a cgroup (v2 or v1) memory limit equal to the budget, so the OS
//! holds every row to the same wall; outputs are compared with an unlimited
//! target-only run. Where no group can be made the benchmark refuses to run,
//! unless `--unconfined` asks for rows held by nothing but arbor's own plan.
//! Each process is this program started again as `bench spec --child`
//! with the same flags ([`run`] with `child` set answers it).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use arbor_engine::{Engine, RunConfig, Trace, format_bytes, parse_bytes};

use crate::budgeted::{BudgetRow, limits, measured_peak, parse_part, settle_storage, share};
use crate::cgroup::{Hierarchy, Limits, Version};
use crate::peer::{self, Peer, PeerRun};
use crate::prompts::load_prompts;
use crate::report::print_results;
use crate::spec::{BenchSpecArgs, entry_label};
use crate::{progress, sys, trace};

/// What a child process reports: its row (without comparison fields) and
/// the tokens of every prompt.
#[derive(serde::Serialize, serde::Deserialize)]
struct ChildReport {
    row: BudgetRow,
    tokens: Vec<Vec<u32>>,
    /// The execution trace of the first prompt.
    #[serde(default)]
    trace: Option<Trace>,
}

/// Runs the strategies of `args` (one process each) under every budget.
pub fn run(args: &BenchSpecArgs, device: &RunConfig) -> Result<()> {
    if args.child {
        return child(args, device);
    }
    let budgets: Vec<u64> = args
        .memory_budget
        .iter()
        .map(|b| parse_bytes(b))
        .collect::<Result<_, _>>()?;
    let names = args.names()?;
    let peers: Vec<Peer> = args
        .peer
        .iter()
        .map(|p| Peer::parse(p))
        .collect::<Result<_>>()?;
    let cgroups = confinement(args, &budgets)?;
    let peer_job = match peers.is_empty() {
        true => None,
        false => Some(PeerJob::new(args, device)?),
    };
    eprintln!("reference: unlimited target-only run");
    let reference = spawn(args, device, "autoregressive", None, None, (0, 1))?;
    let rounds = args.rounds.max(1) as usize;
    let mut rows = Vec::new();
    for (b, &budget) in budgets.iter().enumerate() {
        let first = rows.len();
        let mut reports: Vec<Option<ChildReport>> = names.iter().map(|_| None).collect();
        let mut peer_rows: Vec<BudgetRow> = Vec::new();
        for round in 0..rounds {
            // Every other round runs the rows in reverse (A B, B A, …), so
            // a steady drift through the run weighs on each row alike.
            let mut order: Vec<usize> = (0..names.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let name = &names[i];
                match rounds {
                    1 => eprintln!("{} inside {}", entry_label(name), format_bytes(budget)),
                    _ => eprintln!(
                        "{} inside {}, round {} of {rounds}",
                        entry_label(name),
                        format_bytes(budget),
                        round + 1
                    ),
                }
                let part = (round, rounds);
                let mut report = spawn(
                    args,
                    device,
                    name,
                    Some(budget),
                    Some(cgroups.as_ref()),
                    part,
                )?;
                if rounds > 1 {
                    eprintln!(
                        "  this round: {:.2} tok/s over {} prompts",
                        report.row.tok_s, report.row.prompts
                    );
                }
                // A round that did not finish has no tokens: its prompts
                // count as not identical, and the next rounds' line up.
                let expected = share(&reference.tokens, round, rounds).len();
                report.tokens.resize(expected, Vec::new());
                match &mut reports[i] {
                    None => reports[i] = Some(report),
                    Some(all) => {
                        all.row.absorb(&report.row);
                        all.tokens.extend(report.tokens);
                        all.trace = all.trace.take().or(report.trace);
                    }
                }
            }
            let Some(job) = &peer_job else { continue };
            let run = job.run(cgroups.as_ref(), round, rounds);
            if run.prompts.is_empty() {
                continue;
            }
            let mut at = 0;
            for peer in &peers {
                for row in peer::run(peer, &run, budget)? {
                    match peer_rows.get_mut(at) {
                        Some(all) => all.absorb(&row),
                        None => peer_rows.push(row),
                    }
                    at += 1;
                }
            }
        }
        let mut ar_tok_s = None;
        for (name, report) in names.iter().zip(reports) {
            let report = report.expect("every row runs in every round");
            let mut row = report.row;
            row.strategy = entry_label(name);
            row.identical = report
                .tokens
                .iter()
                .zip(&reference.tokens)
                .filter(|(a, b)| a == b)
                .count();
            // The baseline: plain decoding at its best under this budget
            // (pipelined streaming when it ran, else on demand).
            if row.prompts > 0
                && (name == "autoregressive-pipelined" || ar_tok_s.is_none())
                && name.starts_with("autoregressive")
            {
                ar_tok_s = Some(row.tok_s);
            }
            if let (0, Some(trace)) = (b, &report.trace) {
                let path = trace_path(&args.plot, name);
                let title = format!(
                    "{name} inside {}: first prompt, first 8 target passes",
                    format_bytes(budget)
                );
                match trace::draw(trace, &title, 8, &path) {
                    Ok(()) => eprintln!("  trace: {}", path.display()),
                    Err(e) => eprintln!("  no trace drawn: {e:#}"),
                }
            }
            eprintln!(
                "{} inside {}: {:.2} tok/s, peak {} ({}), identical {}/{}",
                row.strategy,
                format_bytes(budget),
                row.tok_s,
                format_bytes(row.peak_bytes),
                row.peak_source,
                row.identical,
                row.prompts
            );
            rows.push(row);
        }
        rows.extend(peer_rows);
        // Every ratio is against the budget's best plain row.
        for r in &mut rows[first..] {
            r.speedup_vs_autoregressive = ar_tok_s.map_or(0.0, |base| r.tok_s / base.max(1e-9));
        }
        summarize(&rows[first..]);
    }
    let table = table(&rows, args, cgroups.as_ref());
    print_results(&table, &rows, args.json)?;
    let mut lines: Vec<String> = names.iter().map(|n| entry_label(n)).collect();
    for r in rows.iter().filter(|r| r.peer) {
        if !lines.contains(&r.strategy) {
            lines.push(r.strategy.clone());
        }
    }
    draw(&rows, &lines, args)?;
    Ok(())
}

/// The hierarchy every budgeted row runs in, checked by making (and
/// removing) a group with the first budget and the read cap, so a machine
/// without one refuses before the first row; `None` with `--unconfined`.
fn confinement(args: &BenchSpecArgs, budgets: &[u64]) -> Result<Option<Hierarchy>> {
    if args.unconfined {
        if args.read_limit.is_some() {
            bail!("--read-limit caps reads with a cgroup (io.max or blkio): not with --unconfined");
        }
        eprintln!(
            "--unconfined: no cgroup holds the rows (arbor's or a peer's) to their budgets; \
             peaks are each process's own peak RSS"
        );
        return Ok(None);
    }
    const NEEDED: &str = "--memory-budget holds every row to its budget with a cgroup memory \
        limit (run as root with cgroup v2 or cgroup v1 memory control, see --cgroup-root; or \
        pass --unconfined to run without one)";
    let hierarchy = Hierarchy::detect(&args.cgroup_root).context(NEEDED)?;
    let memory = budgets.first().copied();
    let limits = match read_limit_bytes(args)? {
        Some(bps) => {
            let target = arbor_engine::resolve_or_fetch(&args.target, &mut |_| {})?;
            limits(&target, memory, Some(bps))?
        }
        None => Limits {
            memory,
            reads: None,
        },
    };
    hierarchy.group(&limits).context(NEEDED)?;
    eprintln!(
        "every budgeted row runs inside a {} group under {}",
        hierarchy.version(),
        hierarchy.root().display()
    );
    Ok(Some(hierarchy))
}

/// `auto` against the other rows of one budget, on one line.
fn summarize(rows: &[BudgetRow]) {
    let Some(auto) = rows
        .iter()
        .find(|r| r.strategy == arbor_engine::AUTO && r.prompts > 0)
    else {
        return;
    };
    let ratios: Vec<String> = rows
        .iter()
        .filter(|r| r.strategy != auto.strategy && r.tok_s > 0.0)
        .map(|r| format!("{:.2}× {}", auto.tok_s / r.tok_s, r.strategy))
        .collect();
    eprintln!(
        "  auto inside {}: {}",
        format_bytes(auto.budget_bytes),
        ratios.join(", ")
    );
}

/// What the peers run: the benchmark's first prompts, chat-templated, with
/// a context sized to them.
struct PeerJob {
    read_limit: Option<u64>,
    target: PathBuf,
    draft: Option<PathBuf>,
    prompts: Vec<String>,
    tokens: usize,
    context: usize,
}

impl PeerJob {
    fn new(args: &BenchSpecArgs, device: &RunConfig) -> Result<Self> {
        let config = args.config(device, "autoregressive");
        let quiet = &mut |_: arbor_engine::OpenEvent<'_>| {};
        let target = arbor_engine::resolve_or_fetch(
            config
                .target
                .as_deref()
                .unwrap_or(arbor_engine::DEFAULT_TARGET),
            quiet,
        )?;
        // Only a draft model file can be a peer's draft.
        let draft = arbor_engine::resolve_or_fetch(&args.draft, quiet).ok();
        let prompts = load_prompts(&args.prompts, args.limit)?;
        let prompts: Vec<String> = prompts
            .iter()
            .take(args.peer_prompts.max(1))
            .map(|p| Engine::chat_text(&target, &p.text))
            .collect::<Result<_, _>>()?;
        let texts: Vec<&str> = prompts.iter().map(String::as_str).collect();
        let longest = Engine::longest_prompt(&target, &texts, false)?;
        Ok(Self {
            read_limit: read_limit_bytes(args)?,
            target,
            draft,
            prompts,
            tokens: args.peer_tokens,
            context: (longest + args.peer_tokens + 64).next_multiple_of(64),
        })
    }

    /// The peers' run of round `part` of `parts`: its share of the prompts.
    fn run<'a>(&'a self, cgroups: Option<&'a Hierarchy>, part: usize, parts: usize) -> PeerRun<'a> {
        PeerRun {
            cgroups,
            target: &self.target,
            draft: self.draft.as_deref(),
            prompts: share(&self.prompts, part, parts),
            tokens: self.tokens,
            context: self.context,
            read_limit: self.read_limit,
        }
    }
}

/// `chart.png` → `chart-trace-NAME.png`.
fn trace_path(plot: &Path, name: &str) -> PathBuf {
    let stem = plot
        .file_stem()
        .map_or("arbor-bench-spec".into(), |s| s.to_string_lossy());
    let name = entry_label(name).replace(['/', '@'], "-");
    plot.with_file_name(format!("{stem}-trace-{name}.png"))
}

fn table(rows: &[BudgetRow], args: &BenchSpecArgs, cgroups: Option<&Hierarchy>) -> String {
    let mut s = args.title(rows.first().map_or(0, |r| r.prompts));
    match cgroups {
        Some(h) => {
            s += &format!(
                "; every row inside a {} memory limit of its budget",
                h.version()
            )
        }
        None => {
            s += "; UNCONFINED (--unconfined): no cgroup held the rows to their budgets, \
                  peaks are each process's RSS"
        }
    }
    if let (Some(l), Some(h)) = (&args.read_limit, cgroups) {
        let knob = match h.version() {
            Version::V2 => "io.max",
            Version::V1 => "blkio",
        };
        s += &format!("; disk reads capped at {l} ({knob})");
    }
    s += "; identical = same tokens as the unlimited target-only run; vs AR = against the \
          budget's autoregressive-pipelined row (peers: llama.cpp on fewer prompts and tokens, \
          mean accepted = its acceptance rate)\n";
    s += "| budget | strategy | tok/s | vs AR | mean accepted | peak | streamed GiB/100 tok | draft s | target compute s | target IO wait s | provisional s (accepted/made) | identical |\n";
    s += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in rows {
        s += &format!(
            "| {} | {} | {:.2} | {:.2}× | {:.2} | {}{} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} ({}/{}) | {}/{} |\n",
            format_bytes(r.budget_bytes),
            r.strategy,
            r.tok_s,
            r.speedup_vs_autoregressive,
            r.mean_accepted,
            format_bytes(r.peak_bytes),
            match (r.killed, r.prompts) {
                (true, _) => " KILLED",
                (false, 0) => " (did not run: budget below its minimum)",
                _ => "",
            },
            r.streamed_gib_per_100,
            r.draft_secs,
            r.target_compute_secs,
            r.target_io_secs,
            r.provisional_secs,
            r.provisional_accepted,
            r.provisional_tokens,
            if r.peer {
                "—".to_string()
            } else {
                r.identical.to_string()
            },
            r.prompts,
        );
    }
    s
}

fn draw(rows: &[BudgetRow], names: &[String], args: &BenchSpecArgs) -> Result<()> {
    let series: Vec<arbor_plot::LineSeries> = names
        .iter()
        .map(|n| arbor_plot::LineSeries {
            name: n.clone(),
            points: rows
                .iter()
                .filter(|r| &r.strategy == n && !r.killed && r.prompts > 0)
                .map(|r| (r.budget_bytes as f64 / (1u64 << 30) as f64, r.tok_s))
                .collect(),
        })
        .filter(|s: &arbor_plot::LineSeries| !s.points.is_empty())
        .collect();
    let chart = arbor_plot::LineChart {
        title: format!(
            "tok/s under a memory budget, {} {} prompts, {} new tokens",
            rows.first().map_or(0, |r| r.prompts),
            args.prompts,
            args.max_tokens
        ),
        x_label: "memory budget (GiB)".into(),
        y_label: "tokens / s".into(),
        series,
    };
    arbor_plot::line_chart(&chart, &args.plot)
        .with_context(|| format!("drawing {}", args.plot.display()))?;
    eprintln!("chart: {}", args.plot.display());
    Ok(())
}

/// Runs one strategy in a child process and reads its report. `limit`:
/// a budgeted row, after the storage is settled, inside a group of the
/// hierarchy limited to the budget (`Some(None)`: `--unconfined`).
fn spawn(
    args: &BenchSpecArgs,
    device: &RunConfig,
    name: &str,
    budget: Option<u64>,
    limit: Option<Option<&Hierarchy>>,
    (part, parts): (usize, usize),
) -> Result<ChildReport> {
    let stem = format!(
        "arbor-bench-{}-{}-{}",
        std::process::id(),
        entry_label(name).replace(['/', '@'], "-"),
        budget.unwrap_or(0)
    );
    let out = std::env::temp_dir().join(format!("{stem}.json"));
    let _ = std::fs::remove_file(&out);
    // The child runs what this process would: the device config under
    // this command's flags (tuning included), as its own device config.
    let config = std::env::temp_dir().join(format!("{stem}.toml"));
    let settings = toml::to_string(&args.config(device, name)).context("writing the run config")?;
    std::fs::write(&config, settings)?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["bench", "spec", "--child"])
        .arg("--config")
        .arg(&config)
        .args(["--target", &args.target, "--draft", &args.draft])
        .args(["--prompts", &args.prompts])
        .args(["--max-tokens", &args.max_tokens.to_string()])
        .args(["--strategies", name])
        .arg("--report")
        .arg(&out);
    if let Some(n) = args.limit {
        cmd.args(["--limit", &n.to_string()]);
    }
    if parts > 1 {
        cmd.args(["--part", &format!("{part}/{parts}")]);
    }
    if let Some(b) = &args.backend {
        cmd.args(["--backend", b]);
    }
    if let Some(b) = budget {
        cmd.args(["--memory-budget", &b.to_string()]);
    }
    let group = match limit {
        Some(cgroups) => {
            let target = arbor_engine::resolve_or_fetch(&args.target, &mut |_| {})?;
            settle_storage(&target)?;
            match cgroups {
                Some(h) => Some(h.group(&limits(&target, budget, read_limit_bytes(args)?)?)?),
                None => None,
            }
        }
        None => None,
    };
    if let Some(g) = &group {
        g.confine(&mut cmd)?;
    }
    let status = cmd.status().context("starting a benchmark process")?;
    let killed = std::os::unix::process::ExitStatusExt::signal(&status).is_some();
    let report = std::fs::read_to_string(&out).ok();
    let finished = report.is_some();
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&config);
    let mut report: ChildReport = match report {
        Some(text) => serde_json::from_str(&text)?,
        // Killed, or refused (a budget below the strategy's minimum): a row
        // that says so, and the sweep goes on.
        None => ChildReport {
            row: BudgetRow {
                strategy: name.into(),
                budget_bytes: budget.unwrap_or(0),
                peak_source: format!("did not finish ({status})"),
                killed,
                ..BudgetRow::default()
            },
            tokens: Vec::new(),
            trace: None,
        },
    };
    report.row.killed = killed;
    let row = &mut report.row;
    if finished && limit.is_some() {
        (row.peak_bytes, row.peak_source) = measured_peak(group.as_ref(), row.peak_bytes);
    } else if let Some((g, Some(peak))) = group.as_ref().map(|g| (g, g.peak())) {
        row.peak_bytes = peak;
        row.peak_source = format!("{}; {}", g.version(), row.peak_source);
    }
    Ok(report)
}

/// `--read-limit` in bytes per second.
fn read_limit_bytes(args: &BenchSpecArgs) -> Result<Option<u64>> {
    let limit = args.read_limit.as_deref();
    Ok(limit
        .map(|l| parse_bytes(l.trim_end_matches("/s")))
        .transpose()?)
}

/// The child side: one strategy, every prompt of its share (`--part`),
/// report to `--report`.
fn child(args: &BenchSpecArgs, device: &RunConfig) -> Result<()> {
    let name = args
        .strategies
        .first()
        .context("the child runs one strategy")?;
    let all = load_prompts(&args.prompts, args.limit)?;
    let prompts = match &args.part {
        Some(p) => {
            let (part, parts) = parse_part(p)?;
            share(&all, part, parts)
        }
        None => &all[..],
    };
    let mut config = args.config(device, name);
    // The KV caches are planned for this benchmark's longest request.
    if config.context.is_none() {
        let target = arbor_engine::resolve_or_fetch(
            config
                .target
                .as_deref()
                .unwrap_or(arbor_engine::DEFAULT_TARGET),
            &mut |_| {},
        )?;
        // Every round plans for the benchmark's longest prompt, so each
        // holds the same memory plan.
        let texts: Vec<&str> = all.iter().map(|p| p.text.as_str()).collect();
        config.context = Some(Engine::longest_prompt(&target, &texts, true)? + args.max_tokens);
    }
    let budget = config.budget_bytes()?;
    let mut run = Engine::open(&config, &mut progress::open_bar())?;
    let mut row = BudgetRow {
        strategy: name.clone(),
        budget_bytes: budget.unwrap_or(0),
        prompts: prompts.len(),
        speedup_vs_autoregressive: 1.0,
        peak_source: "rss".into(),
        ..BudgetRow::default()
    };
    let (mut produced, mut streamed) = (0usize, 0u64);
    let mut tokens = Vec::new();
    let mut trace = None;
    let mut bar = progress::count_bar("prompts");
    for (i, prompt) in prompts.iter().enumerate() {
        let ids = run.prompt_tokens(&prompt.text, true)?;
        let g = run.generate(&ids, &mut |_| {})?;
        let s = &g.stats;
        row.generated += s.generated_tokens.saturating_sub(1);
        row.decode_secs += s.decode_secs;
        row.draft_secs += s.draft_secs;
        row.provisional_secs += s.provisional_secs;
        row.provisional_tokens += s.provisional_tokens;
        row.provisional_accepted += s.provisional_accepted;
        row.target_io_secs += g.stream.wait_secs;
        row.target_compute_secs += (s.target_secs - g.stream.wait_secs).max(0.0);
        produced += s.produced_after_prefill();
        row.passes += s.verifications + s.target_steps;
        row.draft_tokens += s.draft_tokens;
        streamed += g.stream.bytes;
        if trace.is_none() {
            trace = Some(g.trace.clone());
        }
        tokens.push(g.tokens);
        bar(i + 1, prompts.len());
    }
    for note in run.take_notes() {
        eprintln!("{note}");
    }
    row.tok_s = row.generated as f64 / row.decode_secs.max(1e-9);
    row.mean_accepted = produced as f64 / row.passes.max(1) as f64;
    row.streamed_gib_per_100 =
        streamed as f64 / (1u64 << 30) as f64 * 100.0 / row.generated.max(1) as f64;
    row.peak_bytes = sys::peak_rss_bytes().unwrap_or(0);
    row.rss_peak_bytes = row.peak_bytes;
    let report = ChildReport { row, tokens, trace };
    let path = args
        .report
        .as_ref()
        .context("--report is required with --child")?;
    let mut f = std::fs::File::create(path)?;
    f.write_all(serde_json::to_string(&report)?.as_bytes())?;
    Ok(())
}

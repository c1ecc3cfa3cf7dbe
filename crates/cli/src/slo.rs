//! Latency objectives on the command line: `arbor profile device` (an
//! elastic model's device profile and quality table, measured once and
//! cached, with the profile's predictions checked on held-out requests),
//! and the calibration material that `generate --slo`, `serve` and `bench
//! slo` measure missing tables with.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use arbor_elastic::Order;
use arbor_engine::slo::{self, Calibration, Elastic, SloTables};
use arbor_engine::{Engine, Run, RunConfig};
use clap::Args;

use crate::{elastic, progress, prompts};

/// Calibration prompts for quality tables: ShareGPT first turns of this
/// many characters (long enough that dropping tokens matters, short
/// enough to measure 81 pairs on two cores).
const PROMPT_CHARS: std::ops::Range<usize> = 300..1500;
/// ShareGPT prompts of that size reserved for calibration; held-out
/// requests come after them.
const CALIBRATION_POOL: usize = 40;

#[derive(Args)]
pub struct DeviceArgs {
    /// An elastic model, or a model whose elastic file is used (built
    /// when missing).
    #[arg(long, default_value = "qwen2.5-coder-0.5b")]
    model: String,
    /// Measure again even where cached tables exist.
    #[arg(long)]
    refresh: bool,
    /// Calibration prompts the quality table is measured on.
    #[arg(long, default_value_t = 6)]
    prompts: usize,
    /// Tokens of the full model's answer each pair is compared on.
    #[arg(long, default_value_t = 16)]
    answer_tokens: usize,
    /// Held-out requests served at chosen pairs to check predictions.
    #[arg(long, default_value_t = 8)]
    check: usize,
    #[arg(long)]
    backend: Option<String>,
    /// JSON on stdout (profile, table, check) instead of tables.
    #[arg(long)]
    json: bool,
}

/// Prompts of a useful length from ShareGPT: `skip` of them passed over,
/// then `n`.
pub fn sharegpt_slice(skip: usize, n: usize) -> Result<Vec<String>> {
    let all = prompts::load_prompts("sharegpt", Some(20_000))?;
    let out: Vec<String> = (all.into_iter())
        .map(|p| p.text)
        .filter(|t| PROMPT_CHARS.contains(&t.chars().count()))
        .skip(skip)
        .take(n)
        .collect();
    if out.len() < n {
        bail!(
            "ShareGPT has only {} prompts of {PROMPT_CHARS:?} characters past the first {skip}",
            out.len()
        );
    }
    Ok(out)
}

/// Held-out requests: ShareGPT prompts past the calibration pool.
pub fn held_out(n: usize) -> Result<Vec<String>> {
    sharegpt_slice(CALIBRATION_POOL, n)
}

/// The elastic file of `model`: itself when elastic, else its importance
/// build (made now when missing).
pub fn elastic_file(model: &str) -> Result<PathBuf> {
    let path = arbor_engine::resolve_or_fetch(model, &mut progress::open_bar())?;
    if is_elastic(&path)? {
        return Ok(path);
    }
    elastic::ensure_built(&path, Order::Importance)
}

/// The model an elastic file was built from (`arbor.elastic.source`),
/// beside it or among the fetched models, where it exists.
pub fn original_of(elastic: &Path) -> Option<PathBuf> {
    let file = arbor_gguf::GgufFile::open(elastic).ok()?;
    let name = file
        .header()
        .get_str("arbor.elastic.source")
        .ok()?
        .to_string();
    let beside = elastic.with_file_name(&name);
    [beside, arbor_fetch::arbor_home().join("models").join(&name)]
        .into_iter()
        .find(|p| !name.is_empty() && p.is_file())
}

pub fn is_elastic(path: &Path) -> Result<bool> {
    let file = arbor_gguf::GgufFile::open(path)?;
    Ok(arbor_model::Layout::from_gguf(file.header())?
        .elastic
        .is_some())
}

/// The run's tables: cached, or measured now on `prompts` calibration
/// prompts (and Brown for the scorer).
pub fn tables(
    run: &mut Run,
    prompts: usize,
    answer_tokens: usize,
    refresh: bool,
) -> Result<SloTables> {
    let texts = sharegpt_slice(0, prompts.min(CALIBRATION_POOL))?;
    let text = elastic::calibration_text("brown")?;
    let original = original_of(run.engine().path());
    match &original {
        Some(p) => eprintln!("objectives are fractions of {}'s latency", p.display()),
        None => eprintln!(
            "the original of {} was not found: objectives are fractions of its full level's latency",
            run.engine().path().display()
        ),
    }
    let calibration = Calibration {
        prompts: &texts,
        text: &text,
        answer_tokens,
        reference: original.as_deref(),
    };
    Ok(run.slo_tables(&calibration, refresh, &mut progress::open_bar())?)
}

pub fn device(args: &DeviceArgs, device: RunConfig) -> Result<()> {
    let path = elastic_file(&args.model)?;
    let config = device.merge(RunConfig {
        target: Some(path.display().to_string()),
        backend: args.backend.clone(),
        ..RunConfig::default()
    });
    let mut run = Engine::open(&config.target_only(), &mut progress::open_bar())?;
    let t = tables(&mut run, args.prompts, args.answer_tokens, args.refresh)?;
    let check = check_predictions(&mut run, &t, args.check)?;
    if args.json {
        println!("{}", serde_json::to_string(&t.profile)?);
        println!("{}", serde_json::to_string(&t.quality)?);
        println!("{}", serde_json::to_string(&check)?);
        return Ok(());
    }
    print!("{}", profile_table(&t));
    println!(
        "prediction check on {} held-out ShareGPT requests at random pairs: mean |error| ttft {:.1}%, tpot {:.1}% (max {:.1}% / {:.1}%)",
        check.requests,
        check.ttft_error * 100.0,
        check.tpot_error * 100.0,
        check.ttft_max * 100.0,
        check.tpot_max * 100.0
    );
    Ok(())
}

/// The profile and the quality table as markdown.
pub fn profile_table(t: &SloTables) -> String {
    let p = &t.profile;
    let lengths: Vec<usize> = p.levels[0].prefill.iter().map(|x| x.0).collect();
    let mut s = format!(
        "device profile of {} [{}, {} threads, {}]; scorer {:.2} µs/token; shares of {}\n| level |",
        p.model,
        p.kernels,
        p.threads,
        p.measured,
        p.scorer_per_token * 1e6,
        match p.reference {
            Some(_) => "the original model (last row)",
            None => "the full level",
        }
    );
    for n in &lengths {
        s.push_str(&format!(" prefill {n} (ms, share) |"));
    }
    s.push_str(" tpot ms (share) |\n|---|");
    s.push_str(&"---|".repeat(lengths.len() + 1));
    s.push('\n');
    let rows = (p.levels.iter().map(|l| (format!("{:.1}", l.level), l)))
        .chain(p.reference.iter().map(|l| ("original".to_string(), l)));
    for (name, l) in rows {
        s.push_str(&format!("| {name} |"));
        for &(n, secs) in &l.prefill {
            s.push_str(&format!(
                " {:.0} ({:.2}) |",
                secs * 1e3,
                secs / p.full(n).ttft
            ));
        }
        s.push_str(&format!(
            " {:.1} ({:.2}) |\n",
            l.tpot * 1e3,
            l.tpot / p.full(1).tpot
        ));
    }
    let q = &t.quality;
    s.push_str(&format!(
        "\nquality (greedy agreement with the full model, {} prompts × ≤ {} tokens, {} scorer): rows model level, columns prompt level\n| model \\ prompt |",
        q.prompts, q.answer_tokens, q.scorer
    ));
    for pl in &q.prompt_levels {
        s.push_str(&format!(" {pl:.1} |"));
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(q.prompt_levels.len()));
    s.push('\n');
    for (m, row) in q.model_levels.iter().zip(&q.quality) {
        s.push_str(&format!("| {m:.1} |"));
        for v in row {
            s.push_str(&format!(" {v:.2} |"));
        }
        s.push('\n');
    }
    s
}

/// How far the device profile's predictions were from measured latency.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    pub requests: usize,
    /// Mean and largest |measured − predicted| / measured.
    pub ttft_error: f64,
    pub tpot_error: f64,
    pub ttft_max: f64,
    pub tpot_max: f64,
}

/// Serves `n` held-out requests at pairs spread over the table and
/// compares measured with predicted latency.
pub fn check_predictions(run: &mut Run, t: &SloTables, n: usize) -> Result<Check> {
    let texts = held_out(n)?;
    let (mut te, mut pe, mut tm, mut pm) = (0.0, 0.0, 0.0f64, 0.0f64);
    let levels = &t.quality.model_levels;
    let prompt_levels = &t.quality.prompt_levels;
    let mut bar = progress::count_bar("prediction check");
    for (i, text) in texts.iter().enumerate() {
        bar(i, texts.len());
        let prompt = run.slo_prompt(text, true)?;
        // A spread of pairs: level and prompt level stepping through.
        let (level, pl) = (
            levels[(i * 3) % levels.len()],
            prompt_levels[(i * 5 + 2) % prompt_levels.len()],
        );
        let kept = arbor_slo::kept_len(prompt.tokens.len(), prompt.protected_count(), pl);
        let predicted = t.profile.predict(level, prompt.tokens.len(), kept);
        let mut family = Elastic(run.engine_mut().model_mut());
        let s = slo::serve_pair(
            &mut family,
            &prompt,
            &t.scorer,
            level,
            pl,
            slo::PROFILE_DECODE,
        )?;
        let (a, b) = (
            (s.ttft - predicted.ttft).abs() / s.ttft,
            (s.tpot - predicted.tpot).abs() / s.tpot,
        );
        te += a;
        pe += b;
        tm = tm.max(a);
        pm = pm.max(b);
    }
    bar(texts.len(), texts.len());
    let k = texts.len().max(1) as f64;
    Ok(Check {
        requests: texts.len(),
        ttft_error: te / k,
        tpot_error: pe / k,
        ttft_max: tm,
        tpot_max: pm,
    })
}

//! Latency objectives on the command line: `arbor profile device` (an
//! elastic model's device profile and quality table, measured once and
//! cached, with the profile's predictions checked on held-out requests),
//! and the elastic file `generate --slo` runs. The calibration material
//! and the tables themselves are `arbor_bench::calibration`'s.

use std::path::{Path, PathBuf};

use anyhow::Result;
use arbor_bench::calibration::{held_out, profile_table, tables};
use arbor_bench::progress;
use arbor_engine::slo::{self, Elastic, SloTables};
use arbor_engine::{Engine, Run, RunConfig};
use clap::Args;

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

/// The elastic file of `model`: itself when elastic, else its importance
/// build (made now when missing).
pub fn elastic_file(model: &str) -> Result<PathBuf> {
    let path = arbor_engine::resolve_or_fetch(model, &mut progress::open_bar())?;
    if is_elastic(&path)? {
        return Ok(path);
    }
    #[cfg(feature = "train")]
    return crate::elastic::ensure_built(&path, arbor_elastic::Order::Importance);
    #[cfg(not(feature = "train"))]
    anyhow::bail!(
        "{} is not an elastic model, and this build cannot make one (its importance \
         is trained: the `train` feature); pass an elastic file",
        path.display()
    )
}

pub fn is_elastic(path: &Path) -> Result<bool> {
    let file = arbor_gguf::GgufFile::open(path)?;
    Ok(arbor_model::Layout::from_gguf(file.header())?
        .elastic
        .is_some())
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

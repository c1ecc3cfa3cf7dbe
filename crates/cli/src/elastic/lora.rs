//! `arbor elastic lora`: LoRA recovery of one level of an elastic file
//! (ELMS §3.2), trained on next-token loss of a text, budgeted in minutes
//! or steps, checkpointed every minute and resumed when run again; the
//! held-out perplexity of the level before and after, and a loss curve.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use arbor_bench::calibration::{calibration_text, in_home};
use arbor_bench::progress;
use arbor_elastic::{LoraFile, Order};
use arbor_engine::{LanguageModel, Tokenizer};
use arbor_model::Proj;
use arbor_plot::{LineChart, LineSeries, line_chart};
use arbor_train::{AdamState, AdamW, attach_lora, cosine_at, lora_step, mean_loss};
use clap::Args;

#[derive(Args)]
pub struct LoraArgs {
    /// The original model (path or short name); its elastic file is built
    /// when missing.
    #[arg(long)]
    model: String,
    /// The elastic file (default: `arbor elastic build`'s output for the model).
    #[arg(long)]
    elastic: Option<PathBuf>,
    /// The level to recover (a built level, e.g. 0.5).
    #[arg(long)]
    level: f64,
    #[arg(long, default_value_t = 8)]
    rank: usize,
    /// Projections that get adapters.
    #[arg(long, value_delimiter = ',', default_value = "q,k,v,o,gate,up,down")]
    projs: Vec<String>,
    /// Budget in minutes of training (default 10 when no --steps).
    #[arg(long)]
    minutes: Option<f64>,
    /// Budget in steps (one chunk of text each).
    #[arg(long)]
    steps: Option<u64>,
    /// Peak learning rate (AdamW, cosine to 0, no warm-up).
    #[arg(long, default_value_t = 1e-3)]
    lr: f32,
    /// Training and held-out text: a file or a dataset name.
    #[arg(long, default_value = "brown")]
    text: String,
    /// Tokens per step.
    #[arg(long, default_value_t = 256)]
    chunk: usize,
    /// Held-out tokens: skipped first, then evaluated (as `bench elastic`).
    #[arg(long, default_value_t = 8192)]
    skip: usize,
    #[arg(long, default_value_t = 2048)]
    tokens: usize,
    /// Training starts this far into the text (past the importance
    /// calibration and the held-out tokens).
    #[arg(long, default_value_t = 16384)]
    train_from: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output (default $ARBOR_HOME/elastic/<elastic file>.lora-<level>.safetensors);
    /// the loss curve goes beside it.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Start afresh even when the output holds a checkpoint.
    #[arg(long)]
    restart: bool,
}

pub(super) fn lora(args: &LoraArgs) -> Result<()> {
    if args.minutes.is_some_and(|m| m.is_nan() || m <= 0.0) || args.steps == Some(0) {
        bail!("--minutes and --steps must be positive");
    }
    if args.chunk < 2 || args.tokens < args.chunk || args.lr.is_nan() || args.lr <= 0.0 {
        bail!("need --chunk ≥ 2, --tokens ≥ --chunk and a positive --lr");
    }
    let projs = (args.projs.iter())
        .map(|p| {
            Proj::parse(p)
                .with_context(|| format!("unknown projection `{p}` (q,k,v,o,gate,up,down)"))
        })
        .collect::<Result<Vec<_>>>()?;
    let seconds = match (args.minutes, args.steps) {
        (None, None) => Some(600.0),
        (m, _) => m.map(|m| m * 60.0),
    };
    let original = arbor_fetch::resolve_model(&args.model)?;
    let path = match &args.elastic {
        Some(p) => p.clone(),
        None => super::build::ensure_built(&original, Order::Importance)?,
    };
    let file = arbor_gguf::GgufFile::open(&path)?;
    let tokenizer = Tokenizer::from_gguf(file.header())?;
    let tokens = tokenizer.encode(&calibration_text(&args.text)?)?;
    if tokens.len() < args.train_from + args.chunk || tokens.len() < args.skip + args.tokens {
        bail!(
            "the text has {} tokens: too few for --train-from and --skip + --tokens",
            tokens.len()
        );
    }
    let chunks = |t: &[u32]| -> Vec<Vec<u32>> {
        t.chunks(args.chunk)
            .filter(|c| c.len() >= 2)
            .map(<[u32]>::to_vec)
            .collect()
    };
    let held = chunks(&tokens[args.skip..args.skip + args.tokens]);
    let train = chunks(&tokens[args.train_from..]);
    let mut model = arbor_train::load_model(&file, &mut progress::load_bar(&path))?;
    let at = model.set_level(args.level)?;
    if at != args.level {
        bail!(
            "level {} is not built in {} (nearest below: {at})",
            args.level,
            path.display()
        );
    }
    let out = args.out.clone().unwrap_or_else(|| default_out(&path, at));
    let mut lora = match std::fs::read(&out) {
        Ok(bytes) if !args.restart => {
            let f = LoraFile::from_bytes(&bytes)?;
            if f.level != at || f.rank != args.rank {
                bail!(
                    "{} holds level {} rank {} (--restart to start afresh)",
                    out.display(),
                    f.level,
                    f.rank
                );
            }
            eprintln!(
                "going on from {} (step {})",
                out.display(),
                meta_num(&f.meta, "step")
            );
            f
        }
        _ => LoraFile::new(
            model.config(),
            model.elastic(),
            at,
            args.rank,
            &projs,
            args.seed,
        )?,
    };
    let mut state = AdamState::default();
    if let Some((m, v)) = lora.adam.take() {
        state = AdamState {
            m,
            v,
            step: meta_num(&lora.meta, "step") as u64,
        };
    }
    let mut step = state.step;
    let mut spent = meta_num(&lora.meta, "seconds");
    let mut losses = parse_losses(lora.meta.get("losses"));
    if !lora.meta.contains_key("perplexity_before") {
        let t = Instant::now();
        let ppl = mean_loss(&mut model, &held)?.exp();
        eprintln!(
            "level {at} without adapters: perplexity {ppl:.2} on {} held-out tokens ({:.0} s)",
            args.tokens,
            t.elapsed().as_secs_f64()
        );
        lora.meta
            .insert("perplexity_before".into(), format!("{ppl:.4}"));
    }
    let cmd: Vec<String> = std::env::args().skip(1).collect();
    lora.meta
        .insert("command".into(), format!("arbor {}", cmd.join(" ")));
    lora.meta
        .insert("elastic".into(), path.display().to_string());
    lora.meta.insert(
        "text".into(),
        format!(
            "{} from token {}, chunks of {}",
            args.text, args.train_from, args.chunk
        ),
    );
    eprintln!(
        "{} adapter parameters ({:.1} MB f32) at rank {}",
        lora.len(),
        lora.len() as f64 * 4e-6,
        args.rank
    );

    let opt = AdamW::default();
    let fraction = |step: u64, spent: f64| -> f64 {
        let by_steps = args.steps.map_or(0.0, |s| step as f64 / s as f64);
        let by_time = seconds.map_or(0.0, |s| spent / s);
        by_steps.max(by_time)
    };
    let mut bar = progress::count_bar("LoRA steps (‰ of the budget)");
    let mut saved = Instant::now();
    let save = |lora: &mut LoraFile,
                state: &AdamState,
                step: u64,
                spent: f64,
                losses: &[(f64, f64)]|
     -> Result<()> {
        lora.adam = Some((state.m.clone(), state.v.clone()));
        lora.meta.insert("step".into(), step.to_string());
        lora.meta.insert("seconds".into(), format!("{spent:.1}"));
        lora.meta.insert(
            "tokens_trained".into(),
            (step as usize * args.chunk).to_string(),
        );
        lora.meta.insert(
            "losses".into(),
            losses
                .iter()
                .map(|(s, l)| format!("{s:.1}:{l:.4}"))
                .collect::<Vec<_>>()
                .join(","),
        );
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&out, lora.to_bytes()?)
            .with_context(|| format!("writing {}", out.display()))?;
        lora.adam = None;
        Ok(())
    };
    let session = Instant::now();
    while fraction(step, spent) < 1.0 {
        let t = Instant::now();
        let lr = cosine_at(args.lr, fraction(step, spent));
        let loss = lora_step(
            &mut model,
            &mut lora,
            &train[step as usize % train.len()],
            lr,
            &opt,
            &mut state,
        )?;
        step += 1;
        spent += t.elapsed().as_secs_f64();
        losses.push((spent, loss));
        bar((fraction(step, spent).min(1.0) * 1000.0) as usize, 1000);
        if saved.elapsed().as_secs() >= 60 {
            save(&mut lora, &state, step, spent, &losses)?;
            saved = Instant::now();
        }
    }
    bar(1000, 1000);
    attach_lora(&mut model, &lora)?;
    let ppl = mean_loss(&mut model, &held)?.exp();
    lora.meta
        .insert("perplexity_after".into(), format!("{ppl:.4}"));
    save(&mut lora, &state, step, spent, &losses)?;
    plot(&losses, at, &out)?;
    eprintln!(
        "level {at}: perplexity {} → {ppl:.2} with rank-{} adapters; {step} steps × {} tokens in {:.1} min of training ({:.2} s/step; this session {:.1} min)",
        lora.meta["perplexity_before"],
        args.rank,
        args.chunk,
        spent / 60.0,
        spent / step.max(1) as f64,
        session.elapsed().as_secs_f64() / 60.0
    );
    println!("{}", out.display());
    Ok(())
}

/// Where a level's adapters of `elastic` go by default.
fn default_out(elastic: &Path, level: f64) -> PathBuf {
    in_home(elastic, &format!(".lora-{level}.safetensors"))
}

fn meta_num(meta: &BTreeMap<String, String>, key: &str) -> f64 {
    meta.get(key).and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

fn parse_losses(v: Option<&String>) -> Vec<(f64, f64)> {
    v.map_or_else(Vec::new, |v| {
        v.split(',')
            .filter_map(|p| p.split_once(':'))
            .filter_map(|(s, l)| Some((s.parse().ok()?, l.parse().ok()?)))
            .collect()
    })
}

/// `<out>.loss.png`: each step's loss and a running mean against minutes.
fn plot(losses: &[(f64, f64)], level: f64, out: &Path) -> Result<()> {
    let raw: Vec<(f64, f64)> = losses.iter().map(|&(s, l)| (s / 60.0, l)).collect();
    let w = 10;
    let mean = crate::train::running_mean(&raw, w);
    line_chart(
        &LineChart {
            title: format!("LoRA recovery of level {level}: next-token loss"),
            x_label: "minutes of training".into(),
            y_label: "loss (nats per token)".into(),
            series: vec![
                LineSeries {
                    name: "step".into(),
                    points: raw,
                },
                LineSeries {
                    name: format!("mean of {w}"),
                    points: mean,
                },
            ],
        },
        &out.with_extension("loss.png"),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

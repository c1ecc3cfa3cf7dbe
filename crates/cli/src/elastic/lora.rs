//! `arbor elastic lora`: LoRA recovery of one level of an elastic file
//! (ELMS §3.2), trained on next-token loss of a text, budgeted in minutes
//! or steps, checkpointed every minute and resumed when run again; the
//! held-out perplexity of the level before and after, and a loss curve.
//! The loop and the file are `arbor_train`'s ([`arbor_train::LoraJob`]);
//! this command reads the flags, prepares the text and prints.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use arbor_bench::calibration::{calibration_text, in_home};
use arbor_bench::progress;
use arbor_elastic::Order;
use arbor_engine::Tokenizer;
use arbor_model::Proj;
use arbor_train::{Adapters, Budget, Cadence, Event, LoraJob, LoraSettings};
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
    let adapters = Adapters {
        level: at,
        rank: args.rank,
        projs,
        seed: args.seed,
    };
    let settings = LoraSettings {
        budget: Budget::from_flags(args.minutes, args.steps, 10.0),
        lr: args.lr,
        chunk: args.chunk,
    };
    let mut job = LoraJob::open(
        model,
        &adapters,
        out.clone(),
        args.restart,
        settings,
        train,
        held,
    )?;
    if let Some(step) = job.resumed_at() {
        eprintln!("going on from {} (step {step})", out.display());
    }
    let cmd: Vec<String> = std::env::args().skip(1).collect();
    let meta = &mut job.file.meta;
    meta.insert("command".into(), format!("arbor {}", cmd.join(" ")));
    meta.insert("elastic".into(), path.display().to_string());
    meta.insert(
        "text".into(),
        format!(
            "{} from token {}, chunks of {}",
            args.text, args.train_from, args.chunk
        ),
    );
    eprintln!(
        "{} adapter parameters ({:.1} MB f32) at rank {}",
        job.file.len(),
        job.file.len() as f64 * 4e-6,
        args.rank
    );

    let mut bar = progress::count_bar("LoRA steps (‰ of the budget)");
    let cadence = Cadence {
        validate_every: None,
        save_every: 60.0,
    };
    let mut now = arbor_train::wall_clock();
    let session = arbor_train::train(&mut job, &cadence, &mut now, &mut |event| match event {
        Event::Validated {
            validation,
            seconds,
            ..
        } => eprintln!(
            "level {at} without adapters: perplexity {validation:.2} on {} held-out tokens ({seconds:.0} s)",
            args.tokens
        ),
        Event::Stepped { fraction, .. } => bar((fraction * 1000.0) as usize, 1000),
        Event::Saved => {}
    })?;
    bar(1000, 1000);
    let t = now();
    let ppl = job.finish()?;
    let clock = job.clock;
    eprintln!(
        "level {at}: perplexity {} → {ppl:.2} with rank-{} adapters; {} steps × {} tokens in {:.1} min of training ({:.2} s/step; this session {:.1} min)",
        job.file.meta["perplexity_before"],
        args.rank,
        clock.step,
        args.chunk,
        clock.seconds / 60.0,
        clock.seconds_per_step(),
        (session.seconds + now() - t) / 60.0
    );
    println!("{}", out.display());
    Ok(())
}

/// Where a level's adapters of `elastic` go by default.
fn default_out(elastic: &Path, level: f64) -> PathBuf {
    in_home(elastic, &format!(".lora-{level}.safetensors"))
}

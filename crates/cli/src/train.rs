//! `arbor train ppd`: train a model's PPD prompt tokens by distillation
//! from the model itself, on ShareGPT exchanges in the model's chat form.
//! A run is budgeted in minutes or steps, checkpoints every minute and
//! goes on from its checkpoint when run again; it ends with the prompt
//! tokens, their accuracy table, a loss plot and an accuracy plot.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use arbor_bench::progress;
use arbor_bench::prompts::sharegpt_exchanges;
use arbor_engine::{ChatMessage, LanguageModel, Role, Tokenizer};
use arbor_plot::{LineChart, LineSeries, line_chart};
use arbor_ppd::PromptFile;
use arbor_train::{Example, Run, Settings, Validation};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Subcommand)]
pub enum TrainCommand {
    /// Train parallel prompt decoding's prompt tokens for a model.
    Ppd(PpdArgs),
}

#[derive(Args)]
pub struct PpdArgs {
    /// Model (path or short name).
    #[arg(long)]
    model: String,
    /// Budget in minutes of training (default 45 when no --steps).
    #[arg(long)]
    minutes: Option<f64>,
    /// Budget in steps (one sequence each).
    #[arg(long)]
    steps: Option<u64>,
    /// The trained prompt tokens (default $ARBOR_HOME/ppd/<model>.ppd.safetensors);
    /// the checkpoint, plots and log go beside it.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Prompt tokens to train.
    #[arg(long, default_value_t = 3)]
    prompt_tokens: usize,
    /// Ensemble prompt tokens (EPTs) per prompt token: each point carries
    /// one chain per EPT, a guess is the mean of their logits.
    #[arg(long, default_value_t = 1)]
    epts: usize,
    /// Insertion points per sequence.
    #[arg(long, default_value_t = 32)]
    points: usize,
    /// Longest sequence in tokens (prompt and reply).
    #[arg(long, default_value_t = 384)]
    max_len: usize,
    /// Held-out sequences for validation.
    #[arg(long, default_value_t = 6)]
    validate: usize,
    /// Minutes of training between validations.
    #[arg(long, default_value_t = 5.0)]
    validate_every: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Start afresh even when a checkpoint exists.
    #[arg(long)]
    restart: bool,
}

pub fn run(which: TrainCommand) -> Result<()> {
    match which {
        TrainCommand::Ppd(args) => ppd(&args),
    }
}

/// Sequences that leave a reply span of at least this many tokens.
const MIN_REPLY: usize = 16;

/// ShareGPT exchanges as chat-formatted token sequences (one user turn and
/// the reply), shuffled by `seed`; replies cut to fit `max_len`.
fn examples(tok: &Tokenizer, max_len: usize, want: usize, seed: u64) -> Result<Vec<Example>> {
    let path = arbor_fetch::fetch_dataset("sharegpt", &mut progress::fetch_bar())?;
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut pairs = sharegpt_exchanges(&text, want * 3);
    arbor_train::shuffle(&mut pairs, seed);
    let mut out = Vec::new();
    let mut bar = progress::count_bar("tokenizing exchanges");
    for (i, (q, a)) in pairs.iter().enumerate() {
        bar(out.len(), want);
        if out.len() == want {
            break;
        }
        let prompt = tok.chat_prompt(&[ChatMessage::new(Role::User, q.as_str())])?;
        let mut tokens = tok.encode(&prompt)?;
        let start = tokens.len();
        if start + MIN_REPLY > max_len {
            continue;
        }
        tokens.extend(tok.encode(a)?);
        tokens.truncate(max_len);
        if tokens.len() >= start + MIN_REPLY {
            let span = start..tokens.len();
            out.push(Example { tokens, span });
        }
        if i + 1 == pairs.len() {
            bar(want, want);
        }
    }
    if out.len() < 2 {
        bail!("only {} usable ShareGPT exchanges", out.len());
    }
    Ok(out)
}

fn ppd(args: &PpdArgs) -> Result<()> {
    if args.minutes.is_some_and(|m| m.is_nan() || m <= 0.0) || args.steps == Some(0) {
        bail!("--minutes and --steps must be positive");
    }
    if args.max_len < MIN_REPLY + 8
        || args.validate == 0
        || args.prompt_tokens == 0
        || args.epts == 0
    {
        bail!(
            "need --max-len ≥ {}, --validate ≥ 1, --prompt-tokens ≥ 1 and --epts ≥ 1",
            MIN_REPLY + 8
        );
    }
    let model_path = arbor_fetch::resolve_model(&args.model)?;
    let out = (args.out.clone()).unwrap_or_else(|| arbor_engine::ppd::trained_path(&model_path));
    let ckpt = out.with_extension("ckpt.safetensors");
    let settings = Settings {
        count: args.prompt_tokens,
        epts: args.epts,
        points: args.points,
        seed: args.seed,
        steps: args.steps,
        seconds: match (args.minutes, args.steps) {
            (None, Some(_)) => None,
            (m, _) => Some(m.unwrap_or(45.0) * 60.0),
        },
        ..Settings::default()
    };
    let file = arbor_gguf::GgufFile::open(&model_path)?;
    let tok = Tokenizer::from_gguf(file.header())?;
    let mut model = arbor_train::load_model(&file, &mut progress::load_bar(&model_path))?;
    let hidden = model.config().hidden;

    let mut run = match PromptFile::load(&ckpt) {
        Ok(f) if !args.restart => {
            let mut run = Run::from_file(&f)?;
            if run.hidden != hidden || run.settings.count != settings.count {
                bail!(
                    "{} holds {} prompt tokens of width {}, not {} of {hidden} (--restart to start afresh)",
                    ckpt.display(),
                    run.settings.count,
                    run.hidden,
                    settings.count
                );
            }
            eprintln!(
                "going on from {} (step {}, {:.1} min)",
                ckpt.display(),
                run.step,
                run.seconds / 60.0
            );
            run.settings.steps = settings.steps;
            run.settings.seconds = settings.seconds;
            run
        }
        _ => {
            // The thesis starts prompt tokens from a short text's embeddings.
            let ids = tok.encode("Next 2 word")?;
            let ids: Vec<u32> = (0..settings.count).map(|i| ids[i % ids.len()]).collect();
            Run::new(settings, hidden, model.embeddings(&ids)?)?
        }
    };
    let data = examples(&tok, args.max_len, 4000, args.seed)?;
    let (held_out, train) = data.split_at(args.validate.min(data.len() / 2));
    let mut meta = BTreeMap::new();
    meta.insert("model".to_string(), model_path.display().to_string());
    meta.insert("command".to_string(), command_line());
    meta.insert(
        "data".to_string(),
        "sharegpt first exchanges, chat template".into(),
    );
    meta.insert("max_len".to_string(), args.max_len.to_string());
    meta.insert(
        "threads".to_string(),
        rayon::current_num_threads().to_string(),
    );

    if run.validations.is_empty() {
        let t = Instant::now();
        let (v, _) = run.validate(&mut model, held_out)?;
        eprintln!(
            "{} ({:.0} s)",
            validation_line(&v),
            t.elapsed().as_secs_f64()
        );
        run.validations.push(v);
    }
    let bar = ProgressBar::new(1000).with_style(
        ProgressStyle::with_template("training [{bar:30}] {percent}% {elapsed} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    // Without a terminal the bar is hidden: a line every 20 steps instead.
    let tty = std::io::stderr().is_terminal();
    let (mut saved, mut validated) = (Instant::now(), run.seconds);
    let session = Instant::now();
    while !run.done() {
        let t = Instant::now();
        let ex = &train[run.step as usize % train.len()];
        let loss = run.step(&mut model, ex)?;
        let secs = t.elapsed().as_secs_f64();
        run.seconds += secs;
        run.step_seconds += secs;
        let status = format!(
            "step {} loss {loss:.3} lr {:.4} {secs:.1} s/step",
            run.step,
            run.lr()
        );
        bar.set_position((run.fraction() * 1000.0) as u64);
        bar.set_message(status.clone());
        if !tty && run.step % 20 == 0 {
            eprintln!("{:.1} min: {status}", run.seconds / 60.0);
        }
        if run.seconds - validated >= args.validate_every * 60.0 {
            let t = Instant::now();
            let (v, _) = run.validate(&mut model, held_out)?;
            run.seconds += t.elapsed().as_secs_f64();
            validated = run.seconds;
            match tty {
                true => bar.println(validation_line(&v)),
                false => eprintln!("{}", validation_line(&v)),
            }
            run.validations.push(v);
        }
        if saved.elapsed().as_secs() >= 60 {
            run.to_file(&meta).save(&ckpt)?;
            saved = Instant::now();
        }
    }
    bar.finish_and_clear();
    let t = Instant::now();
    let (v, table) = run.validate(&mut model, held_out)?;
    if run
        .validations
        .last()
        .is_none_or(|last| last.seconds < run.seconds)
    {
        run.seconds += t.elapsed().as_secs_f64();
        run.validations.push(v.clone());
    }
    run.to_file(&meta).save(&ckpt)?;
    meta.insert(
        "seconds_per_step".to_string(),
        format!("{:.2}", mean_step_seconds(&run)),
    );
    run.to_prompts_file(table, &meta).save(&out)?;
    plots(&run, &out)?;
    eprintln!("{}", validation_line(&v));
    eprintln!(
        "{} steps in {:.1} min of training, {:.2} s/step; this session {:.1} min",
        run.step,
        run.seconds / 60.0,
        mean_step_seconds(&run),
        session.elapsed().as_secs_f64() / 60.0
    );
    println!("{}", out.display());
    Ok(())
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("arbor {}", args.join(" "))
}

/// Mean seconds of a step (validation not counted).
fn mean_step_seconds(run: &Run) -> f64 {
    run.step_seconds / run.step.max(1) as f64
}

fn validation_line(v: &Validation) -> String {
    let f = |xs: &[f64]| {
        xs.iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join("/")
    };
    format!(
        "validation at {:.1} min: loss {:.3}, top-1 by distance {}, top-5 {}",
        v.seconds / 60.0,
        v.loss,
        f(&v.top1),
        f(&v.top5)
    )
}

/// Each point's `y` replaced by the mean of the last `window` points' (the
/// loss curves' smoothed line).
pub(crate) fn running_mean(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    (0..points.len())
        .map(|i| {
            let w = &points[i.saturating_sub(window.max(1) - 1)..=i];
            (
                points[i].0,
                w.iter().map(|p| p.1).sum::<f64>() / w.len() as f64,
            )
        })
        .collect()
}

/// `<out>.loss.png` (each step's loss and a running mean against minutes)
/// and `<out>.accuracy.png` (validation top-1 and top-5 by distance).
fn plots(run: &Run, out: &Path) -> Result<()> {
    let raw: Vec<(f64, f64)> = run
        .losses
        .iter()
        .map(|&(s, l)| (s / 60.0, l as f64))
        .collect();
    let window = 25;
    let smooth = running_mean(&raw, window);
    line_chart(
        &LineChart {
            title: "PPD prompt tokens: training loss (sum over prompt tokens of 0.8^i KL)".into(),
            x_label: "minutes of training".into(),
            y_label: "loss".into(),
            series: vec![
                LineSeries {
                    name: "step".into(),
                    points: raw,
                },
                LineSeries {
                    name: format!("mean of {window}"),
                    points: smooth,
                },
            ],
        },
        &out.with_extension("loss.png"),
    )?;
    let mut series = Vec::new();
    for (k, pick) in [(1, 0usize), (5, 1)] {
        for d in 0..run.settings.count {
            series.push(LineSeries {
                name: format!("top-{k} @{}", d + 1),
                points: run
                    .validations
                    .iter()
                    .map(|v| {
                        let xs = if pick == 0 { &v.top1 } else { &v.top5 };
                        (v.seconds / 60.0, xs[d])
                    })
                    .collect(),
            });
        }
    }
    line_chart(
        &LineChart {
            title: "PPD prompt tokens: held-out accuracy by distance".into(),
            x_label: "minutes of training".into(),
            y_label: "accuracy".into(),
            series,
        },
        &out.with_extension("accuracy.png"),
    )?;
    Ok(())
}

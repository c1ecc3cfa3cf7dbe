//! `arbor train ppd`: train a model's PPD prompt tokens by distillation
//! from the model itself, on ShareGPT exchanges in the model's chat form.
//! A run is budgeted in minutes or steps, checkpoints every minute and
//! goes on from its checkpoint when run again; it ends with the prompt
//! tokens, their accuracy table, a loss plot and an accuracy plot. The
//! loop and those files are `arbor_train`'s ([`arbor_train::PpdJob`]);
//! this command reads the flags, prepares the sequences and prints.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use arbor_bench::progress;
use arbor_bench::prompts::sharegpt_exchanges;
use arbor_engine::{ChatMessage, Role, Tokenizer};
use arbor_train::{Budget, Cadence, Event, Example, PpdJob, Settings, Validation};
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
    let ckpt = arbor_train::checkpoint_path(&out);
    let budget = Budget::from_flags(args.minutes, args.steps, 45.0);
    let settings = Settings {
        count: args.prompt_tokens,
        epts: args.epts,
        points: args.points,
        seed: args.seed,
        steps: budget.steps,
        seconds: budget.seconds,
        ..Settings::default()
    };
    let file = arbor_gguf::GgufFile::open(&model_path)?;
    let tok = Tokenizer::from_gguf(file.header())?;
    let mut model = arbor_train::load_model(&file, &mut progress::load_bar(&model_path))?;
    // The thesis starts prompt tokens from a short text's embeddings.
    let init = tok.encode("Next 2 word")?;
    let (run, resumed) = arbor_train::open_run(&mut model, settings, &ckpt, args.restart, &init)?;
    if resumed {
        eprintln!(
            "going on from {} (step {}, {:.1} min)",
            ckpt.display(),
            run.clock.step,
            run.clock.seconds / 60.0
        );
    }
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
    let mut job = PpdJob::new(run, model, train.to_vec(), held_out.to_vec(), ckpt, meta)?;

    let bar = ProgressBar::new(1000).with_style(
        ProgressStyle::with_template("training [{bar:30}] {percent}% {elapsed} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    // Without a terminal the bar is hidden: a line every 20 steps instead.
    let tty = std::io::stderr().is_terminal();
    let cadence = Cadence {
        validate_every: Some(args.validate_every * 60.0),
        save_every: 60.0,
    };
    let mut now = arbor_train::wall_clock();
    let session = arbor_train::train(&mut job, &cadence, &mut now, &mut |event| match event {
        Event::Validated {
            validation,
            seconds,
            first: true,
        } => eprintln!("{} ({seconds:.0} s)", validation_line(validation)),
        Event::Validated { validation, .. } => match tty {
            true => bar.println(validation_line(validation)),
            false => eprintln!("{}", validation_line(validation)),
        },
        Event::Stepped {
            loss,
            seconds,
            clock,
            fraction,
            lr,
        } => {
            let status = format!(
                "step {} loss {loss:.3} lr {lr:.4} {seconds:.1} s/step",
                clock.step
            );
            bar.set_position((fraction * 1000.0) as u64);
            bar.set_message(status.clone());
            if !tty && clock.step % 20 == 0 {
                eprintln!("{:.1} min: {status}", clock.seconds / 60.0);
            }
        }
        Event::Saved => {}
    })?;
    bar.finish_and_clear();
    let t = now();
    let v = job.finish(&out, &mut now)?;
    let clock = job.run.clock;
    eprintln!("{}", validation_line(&v));
    eprintln!(
        "{} steps in {:.1} min of training, {:.2} s/step; this session {:.1} min",
        clock.step,
        clock.seconds / 60.0,
        clock.seconds_per_step(),
        (session.seconds + now() - t) / 60.0
    );
    println!("{}", out.display());
    Ok(())
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("arbor {}", args.join(" "))
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

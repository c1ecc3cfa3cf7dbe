//! `arbor`: run GGUF language models on small machines. Every command that
//! runs a model turns its flags (over a device config) into an
//! [`arbor_engine::RunConfig`] and opens it with [`arbor_engine::Engine::open`].

#[cfg(feature = "bench")]
mod bench;
#[cfg(feature = "train")]
mod elastic;
mod generate;
mod live;
mod profile;
mod requant;
#[cfg(feature = "serve")]
mod serve;
mod slim;
mod slo;
#[cfg(feature = "train")]
mod train;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use arbor_bench::progress;
#[cfg(feature = "fetch")]
use arbor_engine::{DEFAULT_DRAFT, DEFAULT_TARGET};
use arbor_engine::{Engine, RunConfig};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "arbor",
    version,
    about = "Run large language models fast under a memory limit"
)]
struct Cli {
    /// Device config (TOML with any run setting, e.g. backend and threads;
    /// see configs/); flags override it.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Worker threads for the CPU backends.
    #[arg(long, global = true)]
    threads: Option<usize>,
    /// How KV caches are stored: f16 (the default on candle: exactly what
    /// attention reads), q8_0 (8-bit blocks: half of f16's bytes, lossy,
    /// llama.cpp's `-ctk q8_0 -ctv q8_0`) or f32.
    #[arg(long, global = true)]
    kv: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Download models (default: the default pair and smollm2-135m) or datasets into the cache.
    #[cfg(feature = "fetch")]
    Fetch {
        /// Short model names.
        names: Vec<String>,
        /// Datasets to fetch too (mt-bench, sharegpt, brown).
        #[arg(long = "dataset")]
        datasets: Vec<String>,
    },
    /// Generate text; the text goes to stdout, statistics to stderr.
    Generate(Box<generate::GenerateArgs>),
    /// Serve an OpenAI-compatible HTTP API (chat and text completions,
    /// streamed or not) until SIGTERM or Ctrl-C.
    #[cfg(feature = "serve")]
    Serve(Box<serve::ServeArgs>),
    /// Print the token ids of a text as a JSON array.
    Tokenize {
        #[arg(long)]
        model: String,
        #[arg(long)]
        text: String,
    },
    /// Perplexity of a model on a text file (or a dataset name, e.g. `brown`).
    Perplexity {
        #[arg(long)]
        model: String,
        #[arg(long)]
        file: String,
        /// Window length in tokens.
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        /// Use only the first N tokens of the text.
        #[arg(long)]
        max_tokens: Option<usize>,
        #[arg(long)]
        backend: Option<String>,
        /// Level of an elastic model: a fraction in (0, 1], rounded down to
        /// the nearest built level.
        #[arg(long)]
        level: Option<f64>,
        /// LoRA adapters of an elastic level (`arbor elastic lora`).
        #[arg(long)]
        lora: Option<String>,
    },
    /// Measure this machine's facts (latency curves, disk bandwidth) and
    /// cache them; runs measure what is missing by themselves.
    Profile(profile::ProfileArgs),
    /// Rewrite a whole model in another storage (every matrix as q8_0,
    /// q5_0 or f16): larger files of the same model and tokenizer.
    Requant(requant::RequantArgs),
    /// Derive a slim draft from a draft model: its output head restricted
    /// to the K most frequent tokens of a corpus, layers requantized.
    Slim(slim::SlimArgs),
    /// Elastic sub-models (ELMS): unit importance, masked levels, and the
    /// elastic file whose weight prefixes are smaller models.
    #[cfg(feature = "train")]
    Elastic {
        #[command(subcommand)]
        which: elastic::ElasticCommand,
    },
    /// Train what a model's decoding learns (PPD prompt tokens).
    #[cfg(feature = "train")]
    Train {
        #[command(subcommand)]
        which: train::TrainCommand,
    },
    /// Benchmarks.
    #[cfg(feature = "bench")]
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
    },
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    let device = match &cli.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            RunConfig::from_toml(&text).with_context(|| format!("in {}", path.display()))?
        }
        None => RunConfig::default(),
    };
    let device = device.merge(RunConfig {
        threads: cli.threads,
        kv: cli.kv,
        ..RunConfig::default()
    });
    device.apply_threads()?;
    match cli.command {
        #[cfg(feature = "fetch")]
        Command::Fetch { names, datasets } => fetch(names, datasets),
        Command::Generate(args) => generate::run(&args, device),
        #[cfg(feature = "serve")]
        Command::Serve(args) => serve::run(&args, device),
        Command::Tokenize { model, text } => {
            let path = arbor_fetch::resolve_model(&model)?;
            let file = arbor_gguf::GgufFile::open(&path)?;
            let tok = arbor_engine::Tokenizer::from_gguf(file.header())?;
            println!("{}", serde_json::to_string(&tok.encode(&text)?)?);
            Ok(())
        }
        Command::Perplexity {
            model,
            file,
            ctx,
            max_tokens,
            backend,
            level,
            lora,
        } => {
            let config = device.merge(RunConfig {
                target: Some(model),
                backend,
                level,
                lora,
                ..RunConfig::default()
            });
            perplexity(&config.target_only(), &file, ctx, max_tokens)
        }
        Command::Profile(args) => profile::run(&args, device),
        Command::Slim(args) => slim::run(&args),
        Command::Requant(args) => requant::run(&args),
        #[cfg(feature = "train")]
        Command::Elastic { which } => elastic::run(which),
        #[cfg(feature = "train")]
        Command::Train { which } => train::run(which),
        #[cfg(feature = "bench")]
        Command::Bench { which } => bench::run(which, device),
    }
}

#[cfg(feature = "fetch")]
fn fetch(names: Vec<String>, datasets: Vec<String>) -> Result<()> {
    let names = if names.is_empty() && datasets.is_empty() {
        vec![
            DEFAULT_TARGET.into(),
            DEFAULT_DRAFT.into(),
            "smollm2-135m".into(),
        ]
    } else {
        names
    };
    for name in &names {
        let entry = arbor_fetch::model_entry(name).with_context(|| {
            let known: Vec<_> = arbor_fetch::MODELS.iter().map(|m| m.name).collect();
            format!("unknown model `{name}` (known: {})", known.join(", "))
        })?;
        let path = arbor_fetch::fetch_model(entry, &mut progress::fetch_bar())?;
        println!("{name}\t{}", path.display());
    }
    for name in &datasets {
        let path = arbor_fetch::fetch_dataset(name, &mut progress::fetch_bar())?;
        println!("{name}\t{}", path.display());
    }
    Ok(())
}

fn perplexity(config: &RunConfig, file: &str, ctx: usize, max_tokens: Option<usize>) -> Result<()> {
    let text_path = if std::path::Path::new(file).exists() {
        PathBuf::from(file)
    } else if arbor_fetch::dataset_entry(file).is_some() {
        arbor_fetch::fetch_dataset(file, &mut progress::fetch_bar())?
    } else {
        bail!("no file `{file}` (and it is not a dataset name: mt-bench, sharegpt, brown)");
    };
    let text = std::fs::read_to_string(&text_path)
        .with_context(|| format!("reading {}", text_path.display()))?;
    let mut run = Engine::open(config, &mut progress::open_bar())?;
    let backend = run.backend();
    let engine = run.engine_mut();
    let mut tokens = engine.tokenizer().encode(&text)?;
    if let Some(n) = max_tokens {
        tokens.truncate(n);
    }
    let start = std::time::Instant::now();
    let ppl = engine.perplexity(&tokens, ctx, &mut progress::count_bar("windows"))?;
    eprintln!(
        "[{backend}] {} tokens, ctx {ctx}, {:.1} s",
        tokens.len(),
        start.elapsed().as_secs_f64()
    );
    println!("{ppl:.4}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own consistency checks over every command's flags, those
    /// arbor-bench's option structs contribute included.
    #[test]
    fn flags_are_consistent() {
        super::Cli::command().debug_assert();
    }
}

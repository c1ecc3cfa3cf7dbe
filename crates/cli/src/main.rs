//! `arbor`: run GGUF language models on small machines.

mod bench;
mod budget;
mod live;
mod profile;
mod progress;
mod spec;
mod trace;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use arbor_engine::{BackendKind, Engine, GenerateOptions, SamplingParams};
use clap::{Args, Parser, Subcommand};

/// The model `generate` uses when none is named.
pub const DEFAULT_TARGET: &str = "qwen2.5-coder-1.5b";
/// The draft that pairs with the default target.
pub const DEFAULT_DRAFT: &str = "qwen2.5-coder-0.5b";

#[derive(Parser)]
#[command(
    name = "arbor",
    version,
    about = "Run large language models fast under a memory limit"
)]
struct Cli {
    /// Device profile (TOML: backend, threads); flags override it.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Worker threads for the CPU backends.
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Download models (default: the default pair and smollm2-135m) or datasets into the cache.
    Fetch {
        /// Short model names.
        names: Vec<String>,
        /// Datasets to fetch too (mt-bench, sharegpt, brown).
        #[arg(long = "dataset")]
        datasets: Vec<String>,
    },
    /// Generate text; the text goes to stdout, statistics to stderr.
    Generate(GenerateArgs),
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
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
    },
}

#[derive(Args)]
struct GenerateArgs {
    /// Model path or short name (default: qwen2.5-coder-1.5b, fetched if missing).
    #[arg(long)]
    model: Option<String>,
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt in the model's chat template.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// candle, flex, ndarray or wgpu.
    #[arg(long)]
    backend: Option<String>,
    /// Draft model (path or short name) for the speculative strategies.
    #[arg(long)]
    draft: Option<String>,
    /// autoregressive, chain, tree, tree-provisional (the draft keeps
    /// writing, shown dimmed, while the target loads weights; with
    /// --memory-budget), tree-no-fallback or static-tree (default: tree
    /// with a draft, autoregressive without).
    #[arg(long)]
    strategy: Option<String>,
    #[command(flatten)]
    spec: spec::StrategyArgs,
    /// Run inside this many bytes for the whole process (e.g. 1.3GiB):
    /// target layers that do not fit are streamed from disk.
    #[arg(long)]
    memory_budget: Option<String>,
    /// Draw the execution trace of the first target passes (draft growth,
    /// verification, provisional steps, weight reads) to this PNG.
    #[arg(long)]
    trace: Option<PathBuf>,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    let profile = match &cli.config {
        Some(path) => profile::Profile::load(path)?,
        None => profile::Profile::default(),
    };
    profile::set_threads(cli.threads.or(profile.threads))?;
    let pick =
        |flag: &Option<String>| profile::backend(flag.as_deref().or(profile.backend.as_deref()));
    match cli.command {
        Command::Fetch { names, datasets } => fetch(names, datasets),
        Command::Generate(args) => generate(&args, pick(&args.backend)?),
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
        } => perplexity(&model, &file, ctx, max_tokens, pick(&backend)?),
        Command::Bench { which } => bench::run(which, &pick),
    }
}

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
        let spec = arbor_fetch::model_spec(name).with_context(|| {
            let known: Vec<_> = arbor_fetch::MODELS.iter().map(|m| m.name).collect();
            format!("unknown model `{name}` (known: {})", known.join(", "))
        })?;
        let path = arbor_fetch::fetch_model(spec, &mut progress::fetch_bar())?;
        println!("{name}\t{}", path.display());
    }
    for name in &datasets {
        let path = arbor_fetch::fetch_dataset(name, &mut progress::fetch_bar())?;
        println!("{name}\t{}", path.display());
    }
    Ok(())
}

/// A model path or short name; the default target is fetched when missing.
fn model_path(model: Option<&str>) -> Result<PathBuf> {
    match model {
        Some(m) => Ok(arbor_fetch::resolve_model(m)?),
        None => {
            let spec =
                arbor_fetch::model_spec(DEFAULT_TARGET).context("default model is registered")?;
            Ok(arbor_fetch::fetch_model(spec, &mut progress::fetch_bar())?)
        }
    }
}

pub fn load(path: &std::path::Path, backend: BackendKind) -> Result<Engine> {
    let mut bar = progress::load_bar(path);
    let engine = Engine::load(path, backend, &mut bar)
        .with_context(|| format!("loading {} on {backend}", path.display()))?;
    Ok(engine)
}

/// `tree` with a draft, `autoregressive` without, and `autoregressive` too
/// when a memory budget holds the whole target by itself: speculative
/// decoding would have to make room for the draft by streaming target
/// layers from disk on every pass, which costs far more than it saves.
fn default_strategy(
    target: &std::path::Path,
    draft: bool,
    budget: Option<u64>,
    backend: BackendKind,
) -> Result<&'static str> {
    if !draft {
        return Ok("autoregressive");
    }
    if let Some(b) = budget {
        let options = arbor_engine::MemoryOptions::new(b, false);
        if Engine::target_fits(target, backend, &options)? {
            eprintln!(
                "the target fits the memory budget by itself: decoding without the draft \
                 (--strategy tree to use it anyway)"
            );
            return Ok("autoregressive");
        }
    }
    Ok("tree")
}

fn generate(args: &GenerateArgs, backend: BackendKind) -> Result<()> {
    let path = model_path(args.model.as_deref())?;
    let budget = args
        .memory_budget
        .as_deref()
        .map(arbor_engine::parse_bytes)
        .transpose()?;
    let strategy_name = match &args.strategy {
        Some(s) => s.clone(),
        None => default_strategy(&path, args.draft.is_some(), budget, backend)?.into(),
    };
    let variant = spec::Variant::parse(&strategy_name)?;
    let strategy_name = variant.base.to_string();
    let needs_draft = arbor_engine::Strategy::parse(&strategy_name)?.needs_draft();
    if needs_draft && args.draft.is_none() {
        bail!("--strategy {strategy_name} needs a draft model (--draft qwen2.5-coder-0.5b)");
    }
    let draft_path = match &args.draft {
        Some(d) if needs_draft => Some(spec::fetch_or_resolve(d)?),
        _ => None,
    };
    let mut engine = match budget {
        Some(b) => {
            spec::load_budgeted(&path, draft_path.as_deref(), backend, b, variant.pipelined)?
        }
        None => {
            let mut engine = load(&path, backend)?;
            if let Some(draft) = &draft_path {
                let mut bar = progress::load_bar(draft);
                engine
                    .load_draft(draft, backend, &mut bar)
                    .with_context(|| format!("loading draft {}", draft.display()))?;
            }
            engine
        }
    };
    let profile = if variant.profiled() && !args.spec.no_profile {
        Some(spec::latency_profiles(
            &mut engine,
            draft_path.as_deref(),
            backend,
        )?)
    } else {
        None
    };
    let strategy = args.spec.strategy(&strategy_name, profile.as_ref())?;
    let prompt = engine.prompt_tokens(&args.prompt, args.chat)?;
    let options = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            seed: args.seed,
        },
        stop_tokens: None,
        strategy,
        verification: args.spec.verification()?,
    };
    let mut live = live::Live::new();
    let g = engine.generate_events(&prompt, &options, &mut |event| live.event(event))?;
    live.finish();
    if !g.text.ends_with('\n') {
        println!();
    }
    let s = &g.stats;
    eprintln!(
        "[{backend}] prompt {} tok at {:.1} tok/s, generated {} tok at {:.1} tok/s ({:?}), peak RSS {}",
        s.prompt_tokens,
        s.prefill_tok_s(),
        s.generated_tokens,
        s.decode_tok_s(),
        s.stop,
        progress::human_bytes(profile::peak_rss_bytes().unwrap_or(0)),
    );
    if let Some(m) = engine.memory() {
        let st = &g.stream;
        eprintln!(
            "[memory] {}; streamed {} layers, {} ({:.2} GiB per 100 tokens), IO {:.2} s, build {:.2} s, compute waited {:.2} s",
            m.summary(),
            st.layers,
            arbor_engine::format_bytes(st.bytes),
            st.bytes as f64 / (1u64 << 30) as f64 * 100.0 / s.generated_tokens.max(1) as f64,
            st.io_secs,
            st.build_secs,
            st.wait_secs,
        );
    }
    if needs_draft {
        eprintln!(
            "[{strategy_name}] {} verifications, mean accepted {:.2} tokens per target pass, \
             draft tokens {} ({} wasted), {} plain target steps, draft {:.2} s, target {:.2} s",
            s.verifications,
            s.mean_accepted(),
            s.draft_tokens,
            s.wasted_draft_tokens(),
            s.target_steps,
            s.draft_secs,
            s.target_secs,
        );
        if s.provisional_tokens > 0 {
            eprintln!(
                "[provisional] {} draft tokens while the target waited for weights ({:.2} s), {} accepted later",
                s.provisional_tokens, s.provisional_secs, s.provisional_accepted
            );
        }
    }
    if let Some(path) = &args.trace {
        let title = format!("arbor generate: {strategy_name}, first 12 target passes");
        trace::Trace::of(&g).draw(&title, 12, path)?;
        eprintln!("trace drawn to {}", path.display());
    }
    Ok(())
}

fn perplexity(
    model: &str,
    file: &str,
    ctx: usize,
    max_tokens: Option<usize>,
    backend: BackendKind,
) -> Result<()> {
    let text_path = if std::path::Path::new(file).exists() {
        PathBuf::from(file)
    } else if arbor_fetch::dataset_spec(file).is_some() {
        arbor_fetch::fetch_dataset(file, &mut progress::fetch_bar())?
    } else {
        bail!("no file `{file}` (and it is not a dataset name: mt-bench, sharegpt, brown)");
    };
    let text = std::fs::read_to_string(&text_path)
        .with_context(|| format!("reading {}", text_path.display()))?;
    let mut engine = load(&arbor_fetch::resolve_model(model)?, backend)?;
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

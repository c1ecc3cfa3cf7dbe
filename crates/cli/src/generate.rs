//! `arbor generate`: one prompt, text on stdout as it streams, statistics
//! on stderr, optionally the execution trace as a PNG (or JSON).

use std::path::PathBuf;

use anyhow::Result;
#[cfg(feature = "plot")]
use arbor_bench::trace;
use arbor_bench::{TuningArgs, calibration, progress, sys};
use arbor_engine::{Engine, RunConfig, Sampling};
use clap::Args;

use crate::live;

#[derive(Args)]
pub struct GenerateArgs {
    /// Model path or short name (default: qwen2.5-coder-1.5b, fetched if missing).
    #[arg(long)]
    model: Option<String>,
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Most new tokens [default: 128].
    #[arg(long)]
    max_tokens: Option<usize>,
    /// 0 is greedy.
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long)]
    min_p: Option<f32>,
    #[arg(long)]
    seed: Option<u64>,
    /// candle, flex, ndarray or wgpu.
    #[arg(long)]
    backend: Option<String>,
    /// Draft for the speculative strategies: a model (path or short
    /// name), `lookup`, `self`, or `elastic:LEVEL` (a level of an elastic
    /// target, e.g. elastic:0.5).
    #[arg(long)]
    draft: Option<String>,
    /// Run an elastic target (`arbor elastic build`) at this level: a
    /// fraction in (0, 1], rounded down to the nearest built level.
    #[arg(long)]
    level: Option<f64>,
    /// LoRA adapters of an elastic level (`arbor elastic lora`): the target
    /// runs at their level with them attached.
    #[arg(long)]
    lora: Option<String>,
    #[arg(long, help = format!(
        "How tokens are produced: {} (default: tree with a draft, autoregressive without \
         or when a memory budget holds the whole target; auto under a memory budget: it picks \
         the draft source and strategy expected to be fastest). tree-provisional shows the draft's \
         guesses dimmed while the target loads weights", arbor_engine::Strategy::help()))]
    strategy: Option<String>,
    #[command(flatten)]
    tuning: TuningArgs,
    /// Run inside this many bytes for the whole process (e.g. 1.3GiB):
    /// target layers that do not fit are streamed from disk. With
    /// --gpu-memory-budget, host memory's budget: streamed layers that fit
    /// it are kept there, the rest are read from disk on every pass.
    #[arg(long)]
    memory_budget: Option<String>,
    /// Give the target this many bytes of GPU memory (e.g. 3GiB; with
    /// --backend wgpu): layers that do not fit stay in host memory (as far
    /// as --memory-budget allows, else on disk) and are copied to the GPU
    /// on every pass.
    #[arg(long)]
    gpu_memory_budget: Option<String>,
    /// Longest prompt + new tokens to plan a memory budget's KV caches for
    /// [default: max tokens + 512].
    #[arg(long)]
    context: Option<usize>,
    /// Say what the `auto` strategy (the default under a memory budget)
    /// estimated for each draft source, and why it chose one.
    #[arg(long)]
    explain: bool,
    /// A latency objective for this request, as fractions of the full
    /// model's time to first token and time per output token on this
    /// device (e.g. ttft=0.5,tpot=0.8): an elastic target (or the elastic
    /// build of the model) runs at the model and prompt level that meet it
    /// with the best quality (device profile and quality table measured on
    /// first use, `arbor profile device`); a stats line says whether it was
    /// met.
    #[arg(long)]
    slo: Option<arbor_slo::Slo>,
    /// With --slo: refuse a request no pair is predicted to meet, instead
    /// of serving it with the fastest pair.
    #[arg(long)]
    slo_refuse: bool,
    /// Draw the execution trace of the first target passes (draft growth,
    /// verification, provisional steps, weight reads) to this PNG; a path
    /// ending in `.json` gets every segment of the generation as JSON.
    #[arg(long)]
    trace: Option<PathBuf>,
}

impl GenerateArgs {
    fn config(&self) -> RunConfig {
        RunConfig {
            target: self.model.clone(),
            draft: self.draft.clone(),
            backend: self.backend.clone(),
            threads: None,
            kv: None,
            memory_budget: self.memory_budget.clone(),
            gpu_memory_budget: self.gpu_memory_budget.clone(),
            strategy: self.strategy.clone(),
            tuning: self.tuning.tuning(),
            sampling: Sampling {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                seed: self.seed,
            },
            max_tokens: self.max_tokens,
            level: self.level,
            lora: self.lora.clone(),
            context: self.context,
            slots: None,
        }
    }
}

pub fn run(args: &GenerateArgs, device: RunConfig) -> Result<()> {
    #[cfg(not(feature = "plot"))]
    if args.trace.as_ref().is_some_and(|p| !is_json(p)) {
        anyhow::bail!("--trace draws a PNG, and this build has no plotting (the `plot` feature)");
    }
    let mut config = device.merge(args.config());
    if args.slo.is_some() {
        let model = config
            .target
            .as_deref()
            .unwrap_or(arbor_engine::DEFAULT_TARGET);
        config.target = Some(crate::slo::elastic_file(model)?.display().to_string());
    }
    let mut run = Engine::open(&config, &mut progress::open_bar_with(args.explain))?;
    let mut live = live::Live::new();
    let (g, report) = match &args.slo {
        Some(slo) => {
            let tables = calibration::tables(&mut run, 6, 16, false)?;
            let prompt = run.slo_prompt(&args.prompt, args.chat)?;
            let on_miss = match args.slo_refuse {
                true => arbor_engine::slo::OnMiss::Refuse,
                false => arbor_engine::slo::OnMiss::Fastest,
            };
            let options = run.options().clone();
            let (g, r) =
                run.generate_slo(&prompt, (slo, on_miss), &tables, &options, None, &mut |e| {
                    live.event(e)
                })?;
            (g, Some(r))
        }
        None => {
            let prompt = run.prompt_tokens(&args.prompt, args.chat)?;
            (run.generate(&prompt, &mut |event| live.event(event))?, None)
        }
    };
    live.finish();
    if !g.text.ends_with('\n') {
        println!();
    }
    for note in run.take_notes() {
        eprintln!("{note}");
    }
    if let Some(r) = &report {
        eprintln!("{}", r.line());
    }
    let (s, backend) = (&g.stats, run.backend());
    eprintln!(
        "[{backend}] prompt {} tok at {:.1} tok/s, generated {} tok at {:.1} tok/s ({:?}), peak RSS {}",
        s.prompt_tokens,
        s.prefill_tok_s(),
        s.generated_tokens,
        s.decode_tok_s(),
        s.stop,
        progress::human_bytes(sys::peak_rss_bytes().unwrap_or(0)),
    );
    if let Some(m) = run.engine().memory() {
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
    let strategy = run.strategy().to_string();
    if run.strategy().needs_draft() {
        eprintln!(
            "[{strategy}] {} verifications, mean accepted {:.2} tokens per target pass, \
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
    if let Some(path) = args.trace.as_ref().filter(|p| is_json(p)) {
        std::fs::write(path, serde_json::to_string(&g.trace)?)?;
        eprintln!("trace written to {}", path.display());
    }
    #[cfg(feature = "plot")]
    if let Some(path) = args.trace.as_ref().filter(|p| !is_json(p)) {
        let title = format!("arbor generate: {strategy}, first 12 target passes");
        trace::draw(&g.trace, &title, 12, path)?;
        eprintln!("trace drawn to {}", path.display());
    }
    Ok(())
}

fn is_json(path: &std::path::Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

//! `arbor serve`: the OpenAI-compatible server (crate `arbor-serve`) over
//! one run opened from the same settings as `generate`.

use std::time::Duration;

use anyhow::Result;
use arbor_engine::{Engine, RunConfig, Sampling};
use arbor_serve::ServeOptions;
use clap::Args;

use crate::args::TuningArgs;
use crate::progress;

#[derive(Args)]
pub struct ServeArgs {
    /// Model path or short name (default: qwen2.5-coder-1.5b, fetched if missing).
    #[arg(long)]
    model: Option<String>,
    /// Draft for the speculative strategies (as for `generate`).
    #[arg(long)]
    draft: Option<String>,
    /// How tokens are produced (as for `generate`); a request may pick
    /// another with `"arbor": {"strategy": ...}`.
    #[arg(long)]
    strategy: Option<String>,
    #[command(flatten)]
    tuning: TuningArgs,
    /// Run inside this many bytes for the whole process (e.g. 1.3GiB).
    #[arg(long)]
    memory_budget: Option<String>,
    /// GPU memory for the target (with --backend wgpu): layers that do
    /// not fit stay in host memory and are copied over on every pass.
    #[arg(long)]
    gpu_memory_budget: Option<String>,
    /// Longest prompt + new tokens one request may hold under a memory
    /// budget [default: max tokens + 512].
    #[arg(long)]
    context: Option<usize>,
    /// New tokens when a request does not say [default: 128].
    #[arg(long)]
    max_tokens: Option<usize>,
    #[arg(long)]
    backend: Option<String>,
    /// Level of an elastic target (as for `generate`).
    #[arg(long)]
    level: Option<f64>,
    /// LoRA adapters of an elastic level.
    #[arg(long)]
    lora: Option<String>,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` (any key is accepted without it).
    #[arg(long)]
    api_key: Option<String>,
    /// Requests that may wait for the engine; more get 429.
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Seconds a request may take, its queue wait included.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Largest request body, bytes.
    #[arg(long, default_value_t = 1 << 20)]
    body_limit: usize,
    /// The model id clients name [default: the model file's stem].
    #[arg(long)]
    name: Option<String>,
}

pub fn run(args: &ServeArgs, device: RunConfig) -> Result<()> {
    let config = device.merge(RunConfig {
        target: args.model.clone(),
        draft: args.draft.clone(),
        backend: args.backend.clone(),
        memory_budget: args.memory_budget.clone(),
        gpu_memory_budget: args.gpu_memory_budget.clone(),
        strategy: args.strategy.clone(),
        tuning: args.tuning.tuning(),
        sampling: Sampling::default(),
        max_tokens: args.max_tokens,
        level: args.level,
        lora: args.lora.clone(),
        context: args.context,
        ..RunConfig::default()
    });
    let mut run = Engine::open(&config, &mut progress::open_bar_with(false))?;
    // An elastic target serves `arbor.slo` objectives: its tables are read
    // (or measured once, minutes) before the server listens.
    let slo = match crate::slo::is_elastic(run.engine().path())? {
        true => Some(crate::slo::tables(&mut run, 6, 16, false)?),
        false => None,
    };
    let options = ServeOptions {
        host: args.host.clone(),
        port: args.port,
        api_key: args.api_key.clone(),
        queue: args.queue,
        timeout: Duration::from_secs(args.timeout),
        body_limit: args.body_limit,
        model_id: args.name.clone(),
        slo,
        clock: arbor_serve::Clock::default(),
    };
    let strategy = run.strategy().name();
    arbor_serve::serve_until_signal(run, options, |addr| {
        eprintln!("arbor serve: http://{addr}/v1 ({strategy}); Ctrl-C or SIGTERM stops");
    })?;
    eprintln!("arbor serve: stopped");
    Ok(())
}

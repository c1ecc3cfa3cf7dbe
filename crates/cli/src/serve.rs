//! `arbor serve`: the OpenAI-compatible server (crate `arbor-serve`) over
//! one run opened from the same settings as `generate`.

use std::time::Duration;

use anyhow::Result;
use arbor_bench::{TuningArgs, calibration, progress};
use arbor_engine::{Engine, RunConfig, Sampling};
use arbor_serve::ServeOptions;
use clap::Args;

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
    /// Run inside this many bytes for the whole process (e.g. 1.3GiB);
    /// with --gpu-memory-budget, host memory's budget.
    #[arg(long)]
    memory_budget: Option<String>,
    /// GPU memory for the target (with --backend wgpu): layers that do
    /// not fit stay in host memory (as far as --memory-budget allows, else
    /// on disk) and are copied over on every pass.
    #[arg(long)]
    gpu_memory_budget: Option<String>,
    /// Longest prompt + new tokens one request may hold under a memory
    /// budget [default: max tokens + 512].
    #[arg(long)]
    context: Option<usize>,
    /// New tokens when a request does not say [default: until the end of
    /// the turn or the context is full].
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
    /// Require `Authorization: Bearer KEY` with the key in this file (its
    /// first line). `ARBOR_API_KEY` in the environment does the same.
    /// Without either any key is accepted.
    #[arg(long)]
    api_key_file: Option<std::path::PathBuf>,
    /// The key itself; other users of the machine can read it in `ps`:
    /// prefer --api-key-file or ARBOR_API_KEY.
    #[arg(long)]
    api_key: Option<String>,
    /// Let a web page from this origin (e.g. http://localhost:3000) call
    /// the server from a browser; without it no other site can.
    #[arg(long)]
    cors: Option<String>,
    /// Read special-token text in chat messages as the special tokens
    /// (lets every user write control tokens such as a system turn); by
    /// default it is plain text.
    #[arg(long)]
    special_tokens_in_content: bool,
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
    /// Requests served at once; their target passes are batched (a
    /// streamed layer is read once for all). Under a memory budget the
    /// context is planned for every slot [default: 4 under a memory
    /// budget, else 1].
    #[arg(long)]
    slots: Option<usize>,
}

/// Slots by default: under a budget a pass reads streamed weights, and
/// several requests share that read.
pub fn default_slots(slots: Option<usize>, budget: bool) -> usize {
    slots.unwrap_or(if budget { 4 } else { 1 }).max(1)
}

/// The key from --api-key-file, ARBOR_API_KEY or --api-key (one of them).
fn api_key(args: &ServeArgs) -> Result<Option<String>> {
    let env = std::env::var("ARBOR_API_KEY").ok();
    if args.api_key.is_some() {
        eprintln!(
            "arbor serve: --api-key is visible to every user of this machine (ps); prefer \
             --api-key-file or ARBOR_API_KEY"
        );
    }
    resolve_key(args.api_key_file.as_deref(), env, args.api_key.as_deref())
}

fn resolve_key(
    file: Option<&std::path::Path>,
    env: Option<String>,
    flag: Option<&str>,
) -> Result<Option<String>> {
    let env = env.filter(|k| !k.is_empty());
    let given = [file.is_some(), env.is_some(), flag.is_some()];
    if given.iter().filter(|&&g| g).count() > 1 {
        anyhow::bail!("give the API key one way: --api-key-file, ARBOR_API_KEY or --api-key");
    }
    let Some(path) = file else {
        return Ok(env.or_else(|| flag.map(String::from)));
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--api-key-file {}: {e}", path.display()))?;
    let key = text.lines().next().unwrap_or("").trim().to_string();
    if key.is_empty() {
        anyhow::bail!("--api-key-file {}: the first line is empty", path.display());
    }
    Ok(Some(key))
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
    let slots = default_slots(args.slots, config.memory_budget.is_some());
    let config = arbor_serve::slots::for_slots(config, slots);
    let options = ServeOptions {
        slots,
        host: args.host.clone(),
        port: args.port,
        api_key: api_key(args)?,
        cors: args.cors.clone(),
        special_tokens_in_content: args.special_tokens_in_content,
        queue: args.queue,
        timeout: Duration::from_secs(args.timeout),
        body_limit: args.body_limit,
        model_id: args.name.clone(),
        ..ServeOptions::default()
    };
    // The server listens first (`/health` says `loading`), then loads; the
    // same loader reloads the run after a generation panics.
    let mut first = true;
    let load: arbor_serve::Loader = Box::new(move || {
        let mut bar = progress::open_bar_with(false);
        let mut run = Engine::open(&config, &mut bar).map_err(|e| format!("{e:#}"))?;
        // An elastic target serves `arbor.slo` objectives: its tables are
        // read (or measured once, minutes) before it serves.
        let elastic = crate::slo::is_elastic(run.engine().path()).map_err(|e| format!("{e:#}"))?;
        let slo = match elastic {
            true => {
                Some(calibration::tables(&mut run, 6, 16, false).map_err(|e| format!("{e:#}"))?)
            }
            false => None,
        };
        let verb = if first { "loaded" } else { "reloaded" };
        first = false;
        eprintln!("arbor serve: {verb} ({})", run.strategy().name());
        Ok(arbor_serve::Served { run, slo })
    });
    arbor_serve::serve_until_signal(
        load,
        options,
        |addr| eprintln!("arbor serve: http://{addr}/v1 (loading); Ctrl-C or SIGTERM stops"),
        || {
            eprintln!("arbor serve: second signal: exiting now");
            std::process::exit(130);
        },
    )?;
    eprintln!("arbor serve: stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::resolve_key;

    #[test]
    fn the_key_comes_from_one_of_file_environment_or_flag() {
        let dir = std::env::temp_dir().join(format!("arbor-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("key");
        std::fs::write(&file, "sesame\nignored\n").unwrap();
        let key = |f, e: Option<&str>, k| resolve_key(f, e.map(String::from), k);
        assert_eq!(
            key(Some(&file), None, None).unwrap().as_deref(),
            Some("sesame")
        );
        assert_eq!(
            key(None, Some("env-key"), None).unwrap().as_deref(),
            Some("env-key")
        );
        assert_eq!(
            key(None, None, Some("flag")).unwrap().as_deref(),
            Some("flag")
        );
        assert_eq!(key(None, Some(""), None).unwrap(), None, "empty: no key");
        assert!(key(Some(&file), Some("env-key"), None).is_err(), "two ways");
        assert!(key(None, Some("env-key"), Some("flag")).is_err());
        std::fs::write(&file, "\n").unwrap();
        let e = key(Some(&file), None, None).unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
        assert!(key(Some(&dir.join("missing")), None, None).is_err());
        std::fs::remove_dir_all(dir).ok();
    }
}

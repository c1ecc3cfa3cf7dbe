//! `arbor profile`: the measured facts of this machine — each model's
//! forward latency `L_fp(n)` for the kernels and threads in use, and the
//! disk's direct-read bandwidth — shown from the cache, or measured when
//! missing or asked to (`--refresh`).

use anyhow::Result;
use arbor_bench::progress;
use arbor_engine::{DEFAULT_DRAFT, DEFAULT_TARGET, Engine, ProfileStore, RunConfig};
use clap::Args;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ProfileArgs {
    #[command(subcommand)]
    what: Option<ProfileWhat>,
    /// Models to profile (paths or short names; default: the default pair).
    #[arg(long, value_delimiter = ',')]
    model: Vec<String>,
    /// Measure again even where a cached figure exists.
    #[arg(long)]
    refresh: bool,
    #[arg(long)]
    backend: Option<String>,
    /// One JSON object per fact on stdout instead of lines of text.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Subcommand)]
pub enum ProfileWhat {
    /// An elastic model's device profile (prefill and time per token of
    /// every level) and quality table (every model level × prompt level
    /// against the full model), which latency objectives (`--slo`) choose
    /// from: measured once and cached, predictions checked on held-out
    /// requests.
    Device(crate::slo::DeviceArgs),
}

pub fn run(args: &ProfileArgs, device: RunConfig) -> Result<()> {
    if let Some(ProfileWhat::Device(d)) = &args.what {
        return crate::slo::device(d, device);
    }
    let models = if args.model.is_empty() {
        vec![DEFAULT_TARGET.to_string(), DEFAULT_DRAFT.to_string()]
    } else {
        args.model.clone()
    };
    let store = ProfileStore::default();
    let threads = rayon::current_num_threads();
    let mut disk_done = false;
    for model in &models {
        let config = device.clone().merge(RunConfig {
            target: Some(model.clone()),
            backend: args.backend.clone(),
            ..RunConfig::default()
        });
        let config = config.target_only();
        let mut events = progress::open_bar();
        let path = arbor_engine::resolve_or_fetch(model, &mut events)?;
        let kernels = arbor_engine::pick_backend(config.backend.as_deref())?.kernels();
        let record = match store.cached_latency(&path, kernels, threads) {
            Some(r) if !args.refresh => r,
            _ => {
                let mut run = Engine::open(&config, &mut events)?;
                eprintln!("measuring L_fp(n) of {model} ({kernels}, {threads} threads)");
                let mut bar = progress::count_bar("latency sizes");
                let model = run.engine_mut().model_mut();
                let (record, note) = store.latency(&path, kernels, model, true, true, &mut bar)?;
                if let Some(note) = note {
                    eprintln!("{note}");
                }
                record
            }
        };
        if args.json {
            println!("{}", serde_json::to_string(&record)?);
        } else {
            let at = |n: usize| record.profile().at(n) * 1e3;
            println!(
                "{model}: L_fp(1) {:.1} ms, (2) {:.1}, (8) {:.1}, (32) {:.1}, (64) {:.1} [{kernels}, {threads} threads, min of {}, {}] {}",
                at(1),
                at(2),
                at(8),
                at(32),
                at(64),
                record.repetitions,
                record.measured,
                store.latency_path(&path, kernels, threads).display()
            );
        }
        if !disk_done {
            disk_done = true;
            let (disk, note) = store.disk(&path, args.refresh)?;
            if let Some(note) = note {
                eprintln!("{note}");
            }
            if args.json {
                println!("{}", serde_json::to_string(&disk)?);
            } else {
                println!(
                    "disk: {:.2} GB/s {} reads of {} ({}) [{}] {}",
                    disk.bytes_per_sec / 1e9,
                    if disk.direct { "direct" } else { "buffered" },
                    arbor_engine::format_bytes(disk.bytes),
                    disk.file,
                    disk.measured,
                    store.disk_path(&path).display()
                );
            }
        }
    }
    Ok(())
}

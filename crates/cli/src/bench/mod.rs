//! `arbor bench`: speed measurements. `decode` times one model's prefill
//! and decode; `spec` compares decoding strategies on a prompt set, on one
//! loaded pair ([`spec`]) or, under memory budgets, one process per
//! strategy inside a cgroup limit ([`budget`]); `ppd` measures prompt
//! tokens ([`ppd`]); `serve` loads an `arbor serve` with clients
//! ([`serve`]).

mod budget;
mod cgroup;
mod decode;
mod elastic;
mod peer;
mod ppd;
mod serve;
mod slo;
mod spec;

use anyhow::{Result, bail};
use arbor_engine::RunConfig;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Prefill and decode speed of one or more models (one JSON object per model).
    Decode {
        /// Model paths or short names (repeat the flag or separate with commas).
        #[arg(long, required = true, value_delimiter = ',')]
        model: Vec<String>,
        /// Tokens to decode.
        #[arg(long, default_value_t = 64)]
        tokens: usize,
        /// Prompt length for the prefill measurement.
        #[arg(long, default_value_t = 128)]
        prompt_tokens: usize,
        #[arg(long)]
        backend: Option<String>,
        /// Level of an elastic model (a fraction in (0, 1]).
        #[arg(long)]
        level: Option<f64>,
    },
    /// Speculative strategies against autoregressive decoding on a prompt
    /// set: a table (or JSON lines) and a bar chart.
    Spec(Box<spec::BenchSpecArgs>),
    /// PPD prompt tokens: top-k accuracy by distance on a model's own
    /// greedy text, then `ppd` decoding's tokens per pass and speed.
    Ppd(ppd::BenchPpdArgs),
    /// Elastic levels against unreordered prefixes, magnitude order and
    /// dropped layers: perplexity, greedy agreement, speed.
    Elastic(Box<elastic::BenchElasticArgs>),
    /// `arbor serve` on loopback under concurrent streaming clients:
    /// requests, errors, TTFT p50/p99, tokens/s, memory and threads over
    /// time; then clients that leave mid-stream.
    Serve(Box<serve::BenchServeArgs>),
    /// ELMS's request trace: per-request latency objectives (six apps,
    /// skews, Poisson arrivals) served by the elastic policy and baselines.
    Slo(Box<slo::BenchSloArgs>),
}

pub fn run(which: BenchCommand, device: RunConfig) -> Result<()> {
    match which {
        BenchCommand::Decode {
            model,
            tokens,
            prompt_tokens,
            backend,
            level,
        } => {
            if tokens == 0 || prompt_tokens == 0 {
                bail!("--tokens and --prompt-tokens must be at least 1");
            }
            let device = device.merge(RunConfig {
                backend,
                level,
                ..RunConfig::default()
            });
            for m in &model {
                let row = decode::decode(m, &device, tokens, prompt_tokens)?;
                println!("{}", serde_json::to_string(&row)?);
            }
            Ok(())
        }
        BenchCommand::Spec(args) if args.child || !args.memory_budget.is_empty() => {
            budget::run(&args, &device)
        }
        BenchCommand::Spec(args) => spec::run(&args, &device),
        BenchCommand::Ppd(args) => ppd::run(&args, &device),
        BenchCommand::Elastic(args) => elastic::run(&args, &device),
        BenchCommand::Serve(args) => serve::run(&args, &device),
        BenchCommand::Slo(args) => slo::run(&args, &device),
    }
}

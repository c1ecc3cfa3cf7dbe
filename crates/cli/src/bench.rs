//! `arbor bench`: the flags of each benchmark and what it prints; the
//! benchmarks themselves are `arbor_bench`'s. `decode` times one model's
//! prefill and decode; `spec` compares decoding strategies on a prompt set,
//! on one loaded pair or, under memory budgets, one process per strategy
//! inside a cgroup limit; `ppd` measures prompt tokens; `serve` loads an
//! `arbor serve` with clients.

use anyhow::Result;
use arbor_bench::{budget, decode, elastic, ppd, random_model, serve, slo, spec};
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
    /// Write a GGUF file of a real model's shape holding random weights in
    /// Q4_K_M's layout and a byte tokenizer: a file of the right size to
    /// time (on a machine that cannot download one), whose text means
    /// nothing.
    RandomModel {
        /// qwen2.5-7b, qwen2.5-1.5b or qwen2.5-0.5b.
        #[arg(long)]
        shape: String,
        #[arg(long)]
        out: std::path::PathBuf,
    },
}

pub fn run(which: BenchCommand, device: RunConfig) -> Result<()> {
    // The benchmarks that need an elastic file build it as `arbor elastic
    // build` would, with its defaults, when it is missing.
    let elastic_file = &crate::elastic::ensure_built;
    match which {
        BenchCommand::Decode {
            model,
            tokens,
            prompt_tokens,
            backend,
            level,
        } => {
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
        BenchCommand::Elastic(args) => elastic::run(&args, &device, elastic_file),
        BenchCommand::Serve(args) => serve::run(&args, &device),
        BenchCommand::Slo(args) => slo::run(&args, &device, elastic_file),
        BenchCommand::RandomModel { shape, out } => random_model::write(&shape, &out),
    }
}

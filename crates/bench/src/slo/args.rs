//! The options of `arbor bench slo` (its flags with the `clap` feature).

use std::path::PathBuf;

/// What the trace benchmark serves and how (see [`crate::slo::run`]).
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct BenchSloArgs {
    /// The original model; its elastic files are built when missing.
    #[cfg_attr(feature = "clap", arg(long, default_value = "qwen2.5-coder-0.5b"))]
    pub model: String,
    /// Requests per trace.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 60))]
    pub requests: usize,
    /// Skews α of the app mix (ELMS: −0.25 leans to tight objectives).
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_delimiter = ',',
            allow_hyphen_values = true,
            default_value = "-0.25,0,0.25"
        )
    )]
    pub skews: Vec<f64>,
    /// Mean arrivals per second of the Poisson process.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0.5))]
    pub rate: f64,
    /// Distinct held-out prompts the requests ask.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 16))]
    pub pool: usize,
    /// Tokens decoded per request (the time per output token is timed over them).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 16))]
    pub tokens: usize,
    /// Rounds per prompt: each round serves the original model and, two at
    /// a time between its runs, every pair a policy chose on the prompt;
    /// the median over rounds of each pair's latency over the original's
    /// beside it counts (this host is noisy).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 3))]
    pub reps: usize,
    /// Baselines beside the elastic policy: random (its pairs, tokens
    /// dropped at random), full, layers, file.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_delimiter = ',', default_value = "random,full,layers,file")
    )]
    pub baselines: Vec<String>,
    /// Calibration prompts and answer tokens of the quality tables.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 6))]
    pub calibration: usize,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 16))]
    pub answer_tokens: usize,
    /// Measure tables again even where cached.
    #[cfg_attr(feature = "clap", arg(long))]
    pub refresh: bool,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// JSON lines on stdout (the table goes to stderr).
    #[cfg_attr(feature = "clap", arg(long))]
    pub json: bool,
    #[cfg_attr(feature = "clap", arg(long, default_value = "arbor-bench-slo.png"))]
    pub plot: PathBuf,
}

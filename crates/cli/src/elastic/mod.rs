//! `arbor elastic`: elastic sub-models (ELMS). So far `importance`: each
//! query head's and MLP neuron's first-order importance on a calibration
//! text, and each layer's removal cost (the anchor layers are the costliest
//! ~20%), written to a file the build will order units by; and `eval`: the
//! perplexity of each level's sub-model by masking units, against file
//! order and against dropping whole layers.

mod build;
mod eval;
mod importance;
mod lora;

pub(crate) use build::ensure_built;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum ElasticCommand {
    /// Importance of every query head and MLP neuron (|Σ ∂L/∂w·w| on a
    /// calibration text) and each layer's removal cost.
    Importance(ImportanceArgs),
    /// Perplexity of the sub-model each level keeps (units masked, no file
    /// rebuilt), by importance order, by file order, and by dropping whole
    /// layers instead.
    Eval(EvalArgs),
    /// Writes the elastic version of a model: units reordered by
    /// importance (measured first if need be), levels in the metadata.
    Build(build::BuildArgs),
    /// Trains rank-r LoRA adapters that recover one level of an elastic
    /// file (next-token loss; resumable), and reports the held-out
    /// perplexity before and after.
    Lora(lora::LoraArgs),
}

#[derive(Args)]
pub struct EvalArgs {
    /// Model (path or short name).
    #[arg(long)]
    model: String,
    /// Importance file (default: `arbor elastic importance`'s output).
    #[arg(long)]
    importance: Option<PathBuf>,
    /// Levels: fractions of each non-anchor layer's units kept.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0"
    )]
    levels: Vec<f64>,
    /// Held-out text: a file or a dataset name.
    #[arg(long, default_value = "brown")]
    text: String,
    /// Tokens of it to skip first (past the calibration tokens).
    #[arg(long, default_value_t = 8192)]
    skip: usize,
    /// Tokens evaluated.
    #[arg(long, default_value_t = 2048)]
    tokens: usize,
    #[arg(long, default_value_t = 256)]
    chunk: usize,
    /// Share of layers kept whole (the costliest to remove).
    #[arg(long, default_value_t = 0.2)]
    anchors: f64,
    /// Where to draw perplexity against level.
    #[arg(long, default_value = "arbor-elastic-eval.png")]
    plot: PathBuf,
}

#[derive(Args)]
pub struct ImportanceArgs {
    /// Model (path or short name).
    #[arg(long)]
    model: String,
    /// Calibration text: a file or a dataset name.
    #[arg(long, default_value = "brown")]
    calibration: String,
    /// Calibration tokens for unit importance.
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// Tokens per pass (each pass holds its logits and their gradients).
    #[arg(long, default_value_t = 256)]
    chunk: usize,
    /// Calibration tokens for the layers' removal costs (a pass per layer
    /// over them).
    #[arg(long, default_value_t = 1024)]
    layer_tokens: usize,
    /// Output (default $ARBOR_HOME/elastic/<model>.importance.safetensors;
    /// a bar chart of the layer costs goes beside it).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(which: ElasticCommand) -> Result<()> {
    match which {
        ElasticCommand::Importance(args) => importance::importance(&args),
        ElasticCommand::Eval(args) => eval::eval(&args),
        ElasticCommand::Build(args) => build::build(&args),
        ElasticCommand::Lora(args) => lora::lora(&args),
    }
}

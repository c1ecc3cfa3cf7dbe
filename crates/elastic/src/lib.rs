//! Elastic model files (ELMS §3.2): a model's query heads and MLP neurons
//! reordered, each layer's most important first, so that the leading part
//! of every weight matrix is itself a smaller model (a *level*, see
//! [`arbor_model::Elastic`]).
//!
//! - [`order`]: how each layer's units are ranked — by importance scores
//!   (the first-order `|Σ ∂L/∂w · w|` of `arbor-train`), by the magnitude
//!   of their weights, or as the file has them (the baselines) — and the
//!   stored head order, interleaved across the KV heads.
//! - [`levels`]: what each layer keeps at each level.
//! - [`build()`]: the new GGUF. Rows move exactly (query, gate and up rows);
//!   output-projection columns move as whole quantization blocks (a head,
//!   or a pair of heads where a head is half a block); the down
//!   projection's neurons sit inside blocks, so it is dequantized,
//!   permuted and quantized again (Q8_0 by default, nearly exact).
//! - [`lora`]: a level's LoRA recovery adapters on the host and their file.

pub mod build;
pub mod levels;
pub mod lora;
pub mod order;
pub mod testing;

pub use build::{BuildOptions, BuildReport, DownType, build};
pub use levels::cuts;
pub use lora::{HostPair, LoraFile};
pub use order::{Order, Scores, magnitude_scores};

#[derive(Debug, thiserror::Error)]
pub enum ElasticError {
    #[error(transparent)]
    Gguf(#[from] arbor_gguf::GgufError),
    #[error(transparent)]
    Model(#[from] arbor_model::ModelError),
    #[error("{0}")]
    Input(String),
    #[error("writing {path}: {source}")]
    Write {
        path: std::path::PathBuf,
        source: arbor_gguf::GgufError,
    },
}

pub type Result<T, E = ElasticError> = std::result::Result<T, E>;

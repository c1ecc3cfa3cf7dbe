//! The CPU backend: activations are plain host `f32` matrices, weights stay
//! in their GGUF quantized blocks and every matmul runs on them. Nothing is
//! dequantized in full.
//!
//! Q5_0, Q8_0, Q4_K and Q6_K matrices run on our own kernels (`qmm`, see
//! `docs/cpu-kernels.md`) wherever the CPU has AVX2, FMA and F16C: a token's
//! results never depend on the other tokens of its batch (speculative
//! decoding verifies many tokens at once and must reproduce one-token
//! decoding bit for bit), and they equal ggml's dot products bit for bit.
//!
//! Float matrices (F32, F16, BF16) run on `float`: one dot product per
//! output, in the same order at every batch size, for the same reason.
//!
//! Other types, other CPUs, and [`CandleBackend::with_candle_kernels`] use
//! candle-core's kernels. For those, Q5_0 matrices are repacked to Q8_0
//! when loaded: the same 32-element blocks and scale, with `q8 = q5 - 16`,
//! so the numbers are identical while candle's Q8_0 path is several times
//! faster than its Q5_0 one (at 34/22 of the bytes). Among candle's paths,
//! Q6_K never takes candle's repacked tile kernels (they round differently
//! with the batch size): we call its plain block matmul at every batch
//! size. Q4_K (and Q8_0 on VNNI CPUs) go through candle's tiles at every
//! batch size; we keep only the tiles and free the GGUF blocks (see
//! `packed`).
//!
//! Small ops (norms, RoPE, SwiGLU, attention) are written in this crate over
//! slices, attention shares out its (query, head) pairs to candle's thread
//! pool where it is big enough to matter.
//!
//! This file holds the backend's types and settings; `backend` implements
//! [`Backend`](arbor_tensor::Backend) for it, `weight` loads and holds the
//! weight matrices, and `attention` holds the KV cache and the f16 rounding
//! and slice arithmetic the attention and norms use.

mod attention;
mod backend;
mod float;
mod kv;
mod packed;
mod qmm;
mod weight;

use arbor_tensor::{Error, KvFormat};

pub use kv::HostKv;
pub use weight::CandleWeight;

const NAME: &str = "candle";

fn err(e: impl std::fmt::Display) -> Error {
    Error::Backend {
        backend: NAME,
        message: e.to_string(),
    }
}

fn shape_err(op: &'static str, detail: String) -> Error {
    Error::Shape { op, detail }
}

/// A row-major `f32` matrix on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub data: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
}

/// The candle CPU backend.
///
/// By default attention follows llama.cpp's CPU numerics: keys and values
/// are cached as f16 (stored so: [`CandleBackend::with_kv`] changes it), and the query and the attention weights are rounded
/// to f16 before their products (accumulation stays f32). Greedy outputs
/// then match llama.cpp's token for token where two candidates are within
/// a few hundredths of a logit, which f32 attention does not.
///
/// Q5_0, Q8_0, Q4_K and Q6_K matrices run on our own kernels
/// (`qmm`) where the CPU has AVX2, FMA and F16C; elsewhere, or with
/// [`CandleBackend::with_candle_kernels`] (or `ARBOR_CANDLE_KERNELS=1` in
/// the environment), on candle's.
#[derive(Debug, Clone)]
pub struct CandleBackend {
    f16_attention: bool,
    candle_kernels: bool,
    kv: KvFormat,
}

impl Default for CandleBackend {
    fn default() -> Self {
        Self {
            f16_attention: true,
            candle_kernels: std::env::var("ARBOR_CANDLE_KERNELS").as_deref() == Ok("1"),
            kv: KvFormat::F16,
        }
    }
}

impl CandleBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// Attention entirely in f32 (slightly more precise, no longer
    /// llama.cpp's numerics).
    pub fn with_f32_attention() -> Self {
        Self {
            f16_attention: false,
            kv: KvFormat::F32,
            ..Self::default()
        }
    }

    /// KV caches stored as `format`. f16 storage holds exactly what
    /// llama.cpp-style attention reads (the default); with f32 attention
    /// ([`CandleBackend::with_f32_attention`]) only f32 storage is exact.
    /// Q8_0 is lossy: a quarter of f32's bytes.
    pub fn with_kv(self, format: KvFormat) -> Self {
        Self { kv: format, ..self }
    }

    /// Every matmul on candle-core's own kernels (the baseline ours are
    /// measured against).
    pub fn with_candle_kernels(self) -> Self {
        Self {
            candle_kernels: true,
            ..self
        }
    }

    /// This backend with the matmul kernels it runs here:
    /// `candle-qmm8-vnni`, `candle-qmm8-avx2` (ours on x86, see `qmm`),
    /// `candle-qmm8-i8mm`, `candle-qmm8-dotprod`, `candle-qmm8-neon` (ours
    /// on aarch64) or
    /// `candle` (candle-core's). Anything measured with one (latency
    /// profiles) is stale for another; the number changes when our kernels'
    /// speeds do.
    pub fn kernels(&self) -> &'static str {
        match qmm::isa() {
            Some(isa) if !self.candle_kernels => isa.kernels(),
            _ => NAME,
        }
    }
}

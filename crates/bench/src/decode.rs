//! `arbor bench decode`: prefill and decode speed of one model, one JSON
//! object per model.

use std::time::Instant;

use anyhow::{Result, bail};
use arbor_engine::{Engine, LanguageModel, RunConfig};

use crate::{progress, sys};

/// A fixed English/code text, repeated to make prompts of any length.
const FILLER: &str = "The quick brown fox jumps over the lazy dog. \
def add(a, b):\n    return a + b\n\nIn 1887 the committee met in the old town hall to discuss the budget. ";

/// One model's measurements.
#[derive(Debug, serde::Serialize)]
pub struct DecodeRow {
    pub model: String,
    pub backend: String,
    pub threads: usize,
    pub prompt_tokens: usize,
    pub decode_tokens: usize,
    pub load_secs: f64,
    /// Weight bytes the backend holds, by its own accounting.
    pub weight_bytes: Option<u64>,
    /// The model file's size.
    pub file_bytes: u64,
    /// What the device's allocator had reserved from its driver after
    /// decoding (a GPU backend's pools; absent elsewhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_reserved_bytes: Option<u64>,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub peak_rss_bytes: u64,
}

/// Opens `model` (a path or short name) alone under `device`, prefills
/// `prompt_tokens` of a fixed text and decodes `tokens` more, timing each.
pub fn decode(
    model: &str,
    device: &RunConfig,
    tokens: usize,
    prompt_tokens: usize,
) -> Result<DecodeRow> {
    if tokens == 0 || prompt_tokens == 0 {
        bail!("--tokens and --prompt-tokens must be at least 1");
    }
    // Resolved (and fetched) before the clock starts: load time is loading.
    let path = arbor_engine::resolve_or_fetch(model, &mut progress::open_bar())?;
    let config = device.clone().merge(RunConfig {
        target: Some(path.display().to_string()),
        ..RunConfig::default()
    });
    let config = config.target_only();
    sys::reset_peak_rss();
    let start = Instant::now();
    let mut run = Engine::open(&config, &mut progress::open_bar())?;
    let load_secs = start.elapsed().as_secs_f64();
    let backend = run.backend();
    let engine = run.engine_mut();
    let filler = engine.tokenizer().encode(FILLER)?;
    let prompt: Vec<u32> = filler.iter().copied().cycle().take(prompt_tokens).collect();
    let m = engine.model_mut();
    let weight_bytes = m.weight_bytes();

    // Warm-up: the first calls pay for one-time weight repacking (batch
    // kernels are picked by batch size, so warm up with the real one).
    m.truncate_cache(0)?;
    m.step(&prompt[..prompt.len().min(512)])?;
    m.step(&prompt[..1])?;

    m.truncate_cache(0)?;
    let start = Instant::now();
    let mut logits = Vec::new();
    for chunk in prompt.chunks(512) {
        logits = m.step(chunk)?;
    }
    let prefill = start.elapsed().as_secs_f64();

    let start = Instant::now();
    for _ in 0..tokens {
        let next = arbor_engine::argmax(&logits).unwrap_or(0);
        logits = step_or_wrap(m, next, &prompt)?;
    }
    let decode = start.elapsed().as_secs_f64();
    let device_reserved_bytes = m.device_reserved_bytes();

    Ok(DecodeRow {
        model: model.to_string(),
        backend: backend.to_string(),
        threads: rayon::current_num_threads(),
        prompt_tokens,
        decode_tokens: tokens,
        load_secs,
        weight_bytes,
        file_bytes: std::fs::metadata(&path)?.len(),
        device_reserved_bytes,
        prefill_tok_s: prompt_tokens as f64 / prefill,
        decode_tok_s: tokens as f64 / decode,
        peak_rss_bytes: sys::peak_rss_bytes().unwrap_or(0),
    })
}

/// One decode step; restarts from the prompt if the context would overflow.
fn step_or_wrap(m: &mut dyn LanguageModel, next: u32, prompt: &[u32]) -> Result<Vec<f32>> {
    if m.cache_len() + 1 >= m.config().context_length {
        m.truncate_cache(0)?;
        return Ok(m.step(prompt)?);
    }
    Ok(m.step(&[next])?)
}

//! Autoregressive generation: prefill the prompt, then one token at a time.

use std::time::Instant;

use arbor_model::LanguageModel;
use arbor_sampling::{Sampler, SamplingParams};
use arbor_tokenizer::Tokenizer;

use crate::{EngineError, Result};

/// Prompts are prefilled in chunks of this many tokens, which bounds the
/// activation memory of long prompts.
pub const PREFILL_CHUNK: usize = 512;

#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Tokens that end generation; `None` uses the tokenizer's end tokens.
    pub stop_tokens: Option<Vec<u32>>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            sampling: SamplingParams::default(),
            stop_tokens: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    MaxTokens,
    StopToken,
    ContextFull,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    pub stop: StopReason,
}

impl GenerationStats {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_secs.max(1e-9)
    }

    /// Decode speed: tokens after the first (which comes from the prefill)
    /// over the time spent producing them.
    pub fn decode_tok_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_secs.max(1e-9)
    }
}

/// The generated tokens (without the prompt and without the stop token),
/// their text and timings.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub stats: GenerationStats,
}

/// Runs the prompt in chunks after an emptied cache; logits of its last
/// token.
pub fn prefill(model: &mut dyn LanguageModel, prompt: &[u32]) -> Result<Vec<f32>> {
    if prompt.is_empty() {
        return Err(EngineError::Invalid("the prompt is empty".into()));
    }
    model.truncate_cache(0)?;
    let mut logits = Vec::new();
    for chunk in prompt.chunks(PREFILL_CHUNK) {
        logits = model.step(chunk)?;
    }
    Ok(logits)
}

pub fn generate(
    model: &mut dyn LanguageModel,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    options: &GenerateOptions,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation> {
    let mut sampler = Sampler::new(options.sampling)?;
    let stop = options
        .stop_tokens
        .clone()
        .unwrap_or_else(|| tokenizer.stop_ids());
    let context = model.config().context_length;
    if prompt.len() >= context {
        return Err(EngineError::Invalid(format!(
            "the prompt has {} tokens; the model's context is {context}",
            prompt.len()
        )));
    }

    let start = Instant::now();
    let mut logits = prefill(model, prompt)?;
    let prefill_secs = start.elapsed().as_secs_f64();

    let start = Instant::now();
    let mut stream = tokenizer.stream();
    let mut tokens = Vec::new();
    let mut text = String::new();
    let reason = loop {
        if tokens.len() >= options.max_tokens {
            break StopReason::MaxTokens;
        }
        let next = sampler.sample(&logits)?;
        if stop.contains(&next) {
            break StopReason::StopToken;
        }
        tokens.push(next);
        let piece = stream.push(next)?;
        if !piece.is_empty() {
            on_text(&piece);
            text.push_str(&piece);
        }
        if tokens.len() >= options.max_tokens {
            break StopReason::MaxTokens;
        }
        if model.cache_len() + 1 >= context {
            break StopReason::ContextFull;
        }
        logits = model.step(&[next])?;
    };
    let rest = stream.finish();
    if !rest.is_empty() {
        on_text(&rest);
        text.push_str(&rest);
    }
    Ok(Generation {
        stats: GenerationStats {
            prompt_tokens: prompt.len(),
            generated_tokens: tokens.len(),
            prefill_secs,
            decode_secs: start.elapsed().as_secs_f64(),
            stop: reason,
        },
        tokens,
        text,
    })
}

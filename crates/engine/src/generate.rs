//! Generation: tokens from [`arbor_speculative::decode`] (any strategy),
//! turned into streamed text.

use arbor_model::LanguageModel;
use arbor_sampling::SamplingParams;
use arbor_speculative::{DecodeOptions, Strategy, Verification};
use arbor_tokenizer::Tokenizer;

use crate::Result;
pub use arbor_speculative::{DecodeStats as GenerationStats, StopReason};

#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Tokens that end generation; `None` uses the tokenizer's end tokens.
    pub stop_tokens: Option<Vec<u32>>,
    /// How tokens are produced; the speculative ones need a draft model.
    pub strategy: Strategy,
    pub verification: Verification,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            sampling: SamplingParams::default(),
            stop_tokens: None,
            strategy: Strategy::Autoregressive,
            verification: Verification::Exact,
        }
    }
}

/// The generated tokens (without the prompt and without the stop token),
/// their text and statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub stats: GenerationStats,
    /// Layer streaming during this generation (zero when nothing streams).
    pub stream: arbor_pipeline::StreamStats,
}

pub fn generate(
    target: &mut dyn LanguageModel,
    draft: Option<&mut dyn LanguageModel>,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    options: &GenerateOptions,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation> {
    let opts = DecodeOptions {
        max_tokens: options.max_tokens,
        sampling: options.sampling,
        stop_tokens: options
            .stop_tokens
            .clone()
            .unwrap_or_else(|| tokenizer.stop_ids()),
        strategy: options.strategy.clone(),
        verification: options.verification,
    };
    let mut stream = tokenizer.stream();
    let mut text = String::new();
    let mut failed = None;
    let decoded = arbor_speculative::decode(target, draft, prompt, &opts, &mut |tokens| {
        for &t in tokens {
            match stream.push(t) {
                Ok(piece) if !piece.is_empty() => {
                    on_text(&piece);
                    text.push_str(&piece);
                }
                Ok(_) => {}
                Err(e) => failed = Some(e),
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    let rest = stream.finish();
    if !rest.is_empty() {
        on_text(&rest);
        text.push_str(&rest);
    }
    Ok(Generation {
        tokens: decoded.tokens,
        text,
        stats: decoded.stats,
        stream: Default::default(),
    })
}

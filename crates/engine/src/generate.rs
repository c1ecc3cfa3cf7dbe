//! Generation: tokens from [`arbor_speculative::decode`] (any strategy),
//! turned into streamed text.

use arbor_model::LanguageModel;
use arbor_sampling::SamplingParams;
use arbor_speculative::{DecodeOptions, Event, Strategy, Verification};
use arbor_tokenizer::{StreamDecoder, Tokenizer};

use crate::Result;
pub use arbor_speculative::{DecodeStats as GenerationStats, Phase, PhaseSpan, StopReason};

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
            strategy: Strategy::default(),
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
    /// When decoding started and what the decoding loop did when.
    pub started: std::time::Instant,
    pub trace: Vec<PhaseSpan>,
    /// What the layer streamer did meanwhile (reads, builds, waits), in
    /// seconds since `started` like `trace` (empty when nothing streams).
    pub weight_spans: Vec<arbor_pipeline::Span>,
}

/// Streamed text. A consumer shows the confirmed text and after it the
/// provisional text (only the `tree-provisional` strategy has any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextEvent<'a> {
    /// Final text, appended to the confirmed text. If provisional text is
    /// shown, its first `min(chars, shown chars)` characters equal the start
    /// of this text and are replaced by it.
    Confirmed(&'a str),
    /// Appended to the provisional text: the draft's guess while the target
    /// is busy.
    Provisional(&'a str),
    /// The last `chars` characters of the provisional text were wrong.
    Rollback { chars: usize },
}

/// Turns the decoding loop's token events into text events.
struct TextStream<'t> {
    confirmed: StreamDecoder<'t>,
    /// Provisional tokens shown, and their text.
    tokens: Vec<u32>,
    shown: String,
    text: String,
    failed: Option<arbor_tokenizer::TokenizerError>,
}

impl<'t> TextStream<'t> {
    fn new(tokenizer: &'t Tokenizer) -> Self {
        Self {
            confirmed: tokenizer.stream(),
            tokens: Vec::new(),
            shown: String::new(),
            text: String::new(),
            failed: None,
        }
    }

    fn push(&mut self, event: Event<'_>, on: &mut dyn FnMut(TextEvent<'_>)) {
        let mut piece = String::new();
        match event {
            Event::Confirm(tokens) => {
                for &t in tokens {
                    match self.confirmed.push(t) {
                        Ok(p) => piece.push_str(&p),
                        Err(e) => self.failed = Some(e),
                    }
                }
                self.tokens.drain(..tokens.len().min(self.tokens.len()));
            }
            Event::Provisional(tokens) => self.tokens.extend_from_slice(tokens),
            Event::Rollback(n) => self.tokens.truncate(self.tokens.len().saturating_sub(n)),
        }
        // Provisional text continues the confirmed stream; an unfinished
        // character at its end is not shown.
        let mut decoder = self.confirmed.clone();
        let mut provisional = String::new();
        for &t in &self.tokens {
            if let Ok(p) = decoder.push(t) {
                provisional.push_str(&p);
            }
        }
        self.emit(&piece, provisional, on);
    }

    /// Moves the consumer from (shown provisional) to (`piece` confirmed,
    /// then `provisional`), rolling back only what differs.
    fn emit(&mut self, piece: &str, provisional: String, on: &mut dyn FnMut(TextEvent<'_>)) {
        let after: String = [piece, provisional.as_str()].concat();
        let same = self
            .shown
            .chars()
            .zip(after.chars())
            .take_while(|(a, b)| a == b)
            .count();
        let shown_chars = self.shown.chars().count();
        if shown_chars > same {
            on(TextEvent::Rollback {
                chars: shown_chars - same,
            });
        }
        if !piece.is_empty() {
            on(TextEvent::Confirmed(piece));
            self.text.push_str(piece);
        }
        let from = same.max(piece.chars().count());
        let fresh: String = after.chars().skip(from).collect();
        if !fresh.is_empty() {
            on(TextEvent::Provisional(&fresh));
        }
        self.shown = provisional;
    }

    fn finish(mut self, on: &mut dyn FnMut(TextEvent<'_>)) -> Result<String> {
        if let Some(e) = self.failed {
            return Err(e.into());
        }
        self.tokens.clear();
        let rest = self.confirmed.finish();
        self.emit(&rest, String::new(), on);
        Ok(self.text)
    }
}

pub fn generate(
    target: &mut dyn LanguageModel,
    draft: Option<&mut dyn LanguageModel>,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    options: &GenerateOptions,
    on: &mut dyn FnMut(TextEvent<'_>),
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
    let mut stream = TextStream::new(tokenizer);
    let decoded = arbor_speculative::decode(target, draft, prompt, &opts, &mut |event| {
        stream.push(event, on)
    })?;
    let text = stream.finish(on)?;
    Ok(Generation {
        tokens: decoded.tokens,
        text,
        stats: decoded.stats,
        stream: Default::default(),
        started: decoded.started,
        trace: decoded.trace,
        weight_spans: Vec::new(),
    })
}

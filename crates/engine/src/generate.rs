//! Generation: tokens from [`arbor_speculative::decode`] (any strategy),
//! turned into streamed text.

use arbor_model::LanguageModel;
use arbor_sampling::SamplingParams;
use arbor_speculative::{DecodeOptions, Event, Strategy, Verification};
use arbor_tokenizer::{StreamDecoder, Tokenizer};

use arbor_pipeline::{Monitor, Span, StreamStats};

use crate::{Result, Trace};
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
            max_tokens: crate::config::DEFAULT_MAX_TOKENS,
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
    pub stream: StreamStats,
    /// When decoding started; the trace's times count from here.
    pub started: std::time::Instant,
    /// What the decoding loop and the layer streamer did when.
    pub trace: Trace,
    /// Each generated token's score, when the control asked for them.
    pub logprobs: Vec<arbor_sampling::Scored>,
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

/// What watches a generation from outside: a layer streamer's monitor,
/// and a flag that stops it.
#[derive(Default, Clone, Copy)]
pub struct Watch<'a> {
    pub monitor: Option<&'a Monitor>,
    /// The cancel flag and the reused prompt prefix.
    pub control: arbor_speculative::Control<'a>,
}

/// Generates with `target` (and `draft`), streaming text to `on`; with the
/// `monitor` of a layer streamer, its work during this generation goes into
/// the statistics and the trace; setting `cancel` stops it within a pass.
pub fn generate(
    target: &mut dyn LanguageModel,
    draft: Option<&mut dyn LanguageModel>,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    options: &GenerateOptions,
    watch: Watch<'_>,
    on: &mut dyn FnMut(TextEvent<'_>),
) -> Result<Generation> {
    let Watch { monitor, control } = watch;
    let before = monitor.map(|m| m.stats()).unwrap_or_default();
    let epoch = std::time::Instant::now();
    if let Some(m) = monitor {
        m.record_from(epoch);
    }
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
    let decoded =
        arbor_speculative::decode_with(target, draft, prompt, &opts, control, &mut |event| {
            stream.push(event, on)
        })?;
    let text = stream.finish(on)?;
    let (mut stream, mut weights) = (StreamStats::default(), Vec::new());
    if let Some(m) = monitor {
        let after = m.stats();
        stream = StreamStats {
            layers: after.layers - before.layers,
            bytes: after.bytes - before.bytes,
            host_bytes: after.host_bytes - before.host_bytes,
            io_secs: after.io_secs - before.io_secs,
            build_secs: after.build_secs - before.build_secs,
            wait_secs: after.wait_secs - before.wait_secs,
        };
        // Both count from the start of decoding.
        let shift = (decoded.started)
            .saturating_duration_since(epoch)
            .as_secs_f64();
        weights = (m.spans().into_iter())
            .map(|s| Span {
                start: s.start - shift,
                end: s.end - shift,
                ..s
            })
            .collect();
    }
    Ok(Generation {
        tokens: decoded.tokens,
        text,
        stats: decoded.stats,
        stream,
        started: decoded.started,
        trace: Trace::new(&decoded.trace, &weights),
        logprobs: decoded.logprobs,
    })
}

//! The engine owns a run: [`Engine::open`] turns a [`RunConfig`] (from a
//! device config, a command line or a request) into a [`Run`] — models
//! resolved and fetched, the memory budget planned, target and draft
//! loaded, latency profiles read or measured, the strategy built — and the
//! run generates text, its statistics and its [`Trace`]. It owns no
//! numerics: models, strategies and weight streaming live in the crates
//! below, and `arbor-load` is the only crate that names the backends.

mod generate;
pub mod lora;
mod memory;
mod open;
mod profiling;
mod run;
pub mod slo;
pub mod slots;

use std::path::{Path, PathBuf};

pub use arbor_load::backends::pick_backend;
pub use arbor_load::{
    BackendKind, BackendSpec, DEFAULT_DRAFT, DEFAULT_TARGET, DraftSource, EngineError, OpenEvent,
    Result, RunConfig, Sampling, Tuning, ppd, resolve_or_fetch,
};
use arbor_load::{backends, config, events, limit_allocator_caching, release_freed_memory};
pub use arbor_model::{Config, LanguageModel, Logits, Mask};
pub use arbor_paging::{format_bytes, parse_bytes};
pub use arbor_pipeline::{Mode as StreamMode, Span, SpanKind, StreamStats};
pub use arbor_planner::{
    Activity, DiskRecord, Drift, LatencyRecord, PlannerError, ProfileStore, Profiles, Segment,
    Trace, greedy_agreement, now_utc, perplexity,
};
pub use arbor_sampling::{Both, Constraint, SamplingParams, Scored, ShapeError, Shaping, argmax};
pub use arbor_speculative::{
    Control, Decoding, LatencyProfile, PROFILE_SIZES, SpecError, Strategy, Streaming, TreeConfig,
    Typical, Verification,
};
pub use arbor_tokenizer::{ChatMessage, Infill, Role, Tokenizer, TokenizerError, ToolCall};
pub use generate::{GenerateOptions, Generation, GenerationStats, StopReason, TextEvent};
pub use memory::{MemoryOptions, MemoryReport, peak_resident, resident_now};
pub use open::AUTO;
pub use run::{Run, reusable_prefix};

/// Loads the model of an open GGUF file onto a backend (no tokenizer).
pub fn load_model(
    kind: impl Into<BackendSpec>,
    file: &arbor_gguf::GgufFile,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<dyn LanguageModel>> {
    backends::load(kind.into(), file, progress)
}

/// A model, its tokenizer, and where they came from; optionally a draft
/// model sharing the tokenizer, for the speculative strategies.
pub struct Engine {
    model: Box<dyn LanguageModel>,
    tokenizer: Tokenizer,
    path: PathBuf,
    draft: Option<Box<dyn LanguageModel>>,
    memory: Option<MemoryReport>,
}

impl Engine {
    /// Opens a GGUF file and loads it onto `backend`;
    /// `progress(done, total)` counts tensors.
    pub fn load(
        path: &Path,
        backend: impl Into<BackendSpec>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let (model, tokenizer) = arbor_load::loaded::load_whole(path, backend.into(), progress)?;
        Ok(Self {
            model,
            tokenizer,
            path: path.to_path_buf(),
            draft: None,
            memory: None,
        })
    }

    /// Loads a target (and optionally a draft) to run inside
    /// `options.budget` bytes for the whole process: the draft is loaded
    /// first and stays resident; the target keeps as many layers resident as
    /// fit and streams the rest from disk. A budget too small to run at all
    /// is an error that says the minimum.
    pub fn load_budgeted(
        path: &Path,
        draft: Option<&DraftSource>,
        backend: impl Into<BackendSpec>,
        options: &MemoryOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let loaded =
            arbor_load::loaded::load_under_budget(path, draft, backend.into(), options, progress)?;
        let (model, tokenizer, report) = (loaded.model, loaded.tokenizer, loaded.memory);
        let mut engine = Self {
            model,
            tokenizer,
            path: path.to_path_buf(),
            draft: None,
            memory: Some(report),
        };
        match (draft, loaded.draft) {
            (_, Some(d)) => engine.set_draft(d)?,
            (Some(DraftSource::Lookup), None) => engine.attach_lookup()?,
            (Some(DraftSource::Elastic(level)), None) => engine.attach_elastic(*level)?,
            _ => {}
        }
        Ok(engine)
    }

    /// Attaches a level of this elastic target as the draft (every layer
    /// must be resident).
    pub fn attach_elastic(&mut self, level: f64) -> Result<()> {
        let draft = self.model.elastic_draft(level)?;
        self.set_draft(draft)
    }

    /// The share of the whole target's layer weights that `level` of this
    /// elastic target multiplies per token.
    pub fn elastic_share(&self, level: f64) -> Result<f64> {
        arbor_load::loaded::elastic_share(&self.path, level)
    }

    /// Attaches prompt lookup as the draft.
    pub fn attach_lookup(&mut self) -> Result<()> {
        let config = self.model.config().clone();
        self.set_draft(Box::new(arbor_drafts::PromptLookup::new(config)))
    }

    /// Whether the model at `path` alone (no draft) keeps every layer
    /// resident under `options`, measured against what this process holds
    /// now. When it does, decoding without a draft is the fastest choice:
    /// a draft's memory would push target layers out to be streamed.
    pub fn target_fits(
        path: &Path,
        backend: impl Into<BackendSpec>,
        options: &MemoryOptions,
    ) -> Result<bool> {
        let file = arbor_gguf::GgufFile::open(path)?;
        backends::target_fits(backend.into(), &file, options)
    }

    /// How the memory budget was split, when the engine was loaded under one.
    pub fn memory(&self) -> Option<&MemoryReport> {
        self.memory.as_ref()
    }

    /// Loads a draft model for the speculative strategies. Its tokenizer
    /// must be the target's (same vocabulary, same token strings). A slim
    /// draft (see `arbor_drafts::slim`) is widened to the vocabulary.
    pub fn load_draft(
        &mut self,
        path: &Path,
        backend: impl Into<BackendSpec>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<()> {
        let model =
            arbor_load::loaded::load_draft(path, backend.into(), &self.tokenizer, progress)?;
        self.set_draft(model)
    }

    /// Attaches an already-loaded draft model (tests, custom backends);
    /// its vocabulary size must be the target's.
    pub fn set_draft(&mut self, draft: Box<dyn LanguageModel>) -> Result<()> {
        let (d, t) = (draft.config().vocab_size, self.model.config().vocab_size);
        if d != t {
            return Err(EngineError::VocabularyMismatch {
                draft: d,
                target: t,
            });
        }
        self.draft = Some(draft);
        Ok(())
    }

    pub fn draft(&self) -> Option<&dyn LanguageModel> {
        self.draft.as_deref()
    }

    pub fn draft_mut(&mut self) -> Option<&mut (dyn LanguageModel + 'static)> {
        self.draft.as_deref_mut()
    }

    /// Wraps an already-loaded model (tests, custom backends).
    pub fn from_parts(model: Box<dyn LanguageModel>, tokenizer: Tokenizer, path: PathBuf) -> Self {
        Self {
            model,
            tokenizer,
            path,
            draft: None,
            memory: None,
        }
    }

    /// Puts `wrap(model)` in the target's place: a wrapper that watches or
    /// paces its passes (tests hold a server's generation at a pass this
    /// way). The wrapper must answer as the model does.
    pub fn wrap_model(
        &mut self,
        wrap: impl FnOnce(Box<dyn LanguageModel>) -> Box<dyn LanguageModel>,
    ) {
        // A model with no weights holds the place while `wrap` runs.
        let stand_in = arbor_drafts::PromptLookup::new(self.model.config().clone());
        let model = std::mem::replace(&mut self.model, Box::new(stand_in));
        self.model = wrap(model);
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn model(&self) -> &dyn LanguageModel {
        self.model.as_ref()
    }

    pub fn model_mut(&mut self) -> &mut dyn LanguageModel {
        self.model.as_mut()
    }

    /// The model and the tokenizer at once, for loops that need both.
    pub fn parts_mut(&mut self) -> (&mut dyn LanguageModel, &Tokenizer) {
        (self.model.as_mut(), &self.tokenizer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Token ids of `text` (raw, or wrapped in the model's chat template as
    /// one user turn).
    pub fn prompt_tokens(&self, text: &str, chat: bool) -> Result<Vec<u32>> {
        encode_prompt(&self.tokenizer, text, chat)
    }

    /// `text` as one user turn of the chat template of the model at `path`
    /// (read from its header): what other engines are given as a raw
    /// prompt to run the same request.
    pub fn chat_text(path: &Path, text: &str) -> Result<String> {
        let file = arbor_gguf::GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(file.header())?;
        Ok(tokenizer.chat_prompt(&[ChatMessage::user(text)])?)
    }

    /// The most tokens any of `texts` takes as a prompt for the model at
    /// `path` (read from its header; no weights are loaded): what a run
    /// that will generate from them plans its context with.
    pub fn longest_prompt(path: &Path, texts: &[&str], chat: bool) -> Result<usize> {
        let file = arbor_gguf::GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(file.header())?;
        texts.iter().try_fold(0, |most, t| {
            Ok(most.max(encode_prompt(&tokenizer, t, chat)?.len()))
        })
    }

    /// Generates from `prompt` (token ids), calling `on_text` with each
    /// newly completed piece of text.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation> {
        self.generate_events(prompt, options, &mut |event| {
            if let TextEvent::Confirmed(text) = event {
                on_text(text);
            }
        })
    }

    /// [`generate`](Self::generate) with provisional text and rollbacks
    /// streamed too (see [`TextEvent`]).
    pub fn generate_events(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on: &mut dyn FnMut(TextEvent<'_>),
    ) -> Result<Generation> {
        self.generate_controlled(prompt, options, Control::default(), on)
    }

    /// [`generate_events`](Self::generate_events) under a [`Control`]: it
    /// ends early, with [`StopReason::Cancelled`], within one pass of the
    /// cancel flag being set, and may reuse a prompt prefix the target's
    /// cache already holds.
    pub fn generate_controlled(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        control: Control<'_>,
        on: &mut dyn FnMut(TextEvent<'_>),
    ) -> Result<Generation> {
        let monitor = self.memory.as_ref().and_then(|m| m.monitor.clone());
        generate::generate(
            self.model.as_mut(),
            self.draft
                .as_mut()
                .map(|d| d.as_mut() as &mut dyn LanguageModel),
            &self.tokenizer,
            prompt,
            options,
            generate::Watch {
                monitor: monitor.as_ref(),
                control,
            },
            on,
        )
    }

    /// Perplexity of `tokens`, in windows of `ctx` tokens.
    pub fn perplexity(
        &mut self,
        tokens: &[u32],
        ctx: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<f64> {
        Ok(arbor_planner::perplexity(
            self.model.as_mut(),
            tokens,
            ctx,
            progress,
        )?)
    }
}

/// Token ids of `text` (raw, or as one user turn of the chat template).
fn encode_prompt(tokenizer: &Tokenizer, text: &str, chat: bool) -> Result<Vec<u32>> {
    let text = if chat {
        tokenizer.chat_prompt(&[ChatMessage::user(text)])?
    } else {
        text.to_string()
    };
    let ids = tokenizer.encode(&text)?;
    if ids.is_empty() {
        return Err(EngineError::Invalid("the prompt is empty".into()));
    }
    Ok(ids)
}

//! The engine owns a run: [`Engine::open`] turns a [`RunConfig`] (from a
//! device config, a command line or a request) into a [`Run`] — models
//! resolved and fetched, the memory budget planned, target and draft
//! loaded, latency profiles read or measured, the strategy built — and the
//! run generates text, its statistics and its [`Trace`]. It owns no
//! numerics: models, strategies and weight streaming live in the crates
//! below, and this is the only crate that names the backends.

mod backends;
mod choose;
mod config;
mod drafts;
mod events;
mod generate;
pub mod lora;
mod memory;
mod open;
pub mod ppd;
mod profiling;
mod run;
pub mod slo;
pub mod slots;
mod trace;

use std::path::{Path, PathBuf};

pub use arbor_model::{Config, LanguageModel, Logits, Mask};
pub use arbor_paging::{format_bytes, parse_bytes};
pub use arbor_pipeline::{Mode as StreamMode, Span, SpanKind, StreamStats};
pub use arbor_planner::{
    DiskRecord, Drift, LatencyRecord, PlannerError, ProfileStore, Profiles, greedy_agreement,
    now_utc, perplexity,
};
pub use arbor_sampling::{Both, Constraint, SamplingParams, Scored, ShapeError, Shaping, argmax};
pub use arbor_speculative::{
    Control, Decoding, LatencyProfile, PROFILE_SIZES, SpecError, Strategy, Streaming, TreeConfig,
    Typical, Verification,
};
pub use arbor_tokenizer::{ChatMessage, Infill, Role, Tokenizer, TokenizerError, ToolCall};
pub use backends::{BackendKind, BackendSpec};
pub use config::{DEFAULT_DRAFT, DEFAULT_TARGET, RunConfig, Sampling, Tuning};
pub use drafts::DraftSource;
pub use events::{OpenEvent, resolve_or_fetch};
pub use generate::{GenerateOptions, Generation, GenerationStats, StopReason, TextEvent};
pub use memory::{MemoryOptions, MemoryReport, peak_resident, resident_now};
pub use open::{AUTO, pick_backend};
pub use run::{Run, reusable_prefix};
pub use trace::{Activity, Segment, Trace};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] arbor_gguf::GgufError),
    #[error(transparent)]
    Model(#[from] arbor_model::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] arbor_tokenizer::TokenizerError),
    #[error(transparent)]
    Sampling(#[from] arbor_sampling::SamplingError),
    #[error(transparent)]
    Draft(#[from] arbor_drafts::DraftError),
    #[error("backend `{0}` is not compiled into this build (enable the cargo feature `{0}`)")]
    BackendNotCompiled(BackendKind),
    #[error("unknown backend `{0}` (choose candle, flex, ndarray or wgpu)")]
    UnknownBackend(String),
    #[error(transparent)]
    Speculative(#[from] arbor_speculative::SpecError),
    #[error(
        "the draft model's vocabulary differs from the target's ({draft} vs {target} tokens, or \
         different token strings): speculative decoding needs one shared tokenizer"
    )]
    VocabularyMismatch { draft: usize, target: usize },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Slo(#[from] arbor_slo::SloError),
    #[error("loading {path}: {inner}")]
    Load {
        path: PathBuf,
        inner: Box<EngineError>,
    },
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// The planner's errors keep the engine's kinds (an unmet objective stays
/// [`EngineError::Slo`], which the server answers with its own status).
impl From<PlannerError> for EngineError {
    fn from(e: PlannerError) -> Self {
        match e {
            PlannerError::Model(e) => Self::Model(e),
            PlannerError::Slo(e) => Self::Slo(e),
            PlannerError::Invalid(s) => Self::Invalid(s),
        }
    }
}

/// Makes glibc's allocator hand large freed blocks back to the OS at once
/// and keep few arenas: streamed layers allocate and free tens of MiB per
/// forward pass, which glibc would otherwise keep cached and count against
/// a memory limit.
pub(crate) fn limit_allocator_caching() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tunables.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Hands the heap's free memory back to the OS (glibc keeps freed small
/// blocks otherwise): after planning, which parses model headers, so the
/// memory a budget's plan measures as held is what the run will hold. A
/// run whose plan counted 21 MiB of such leftovers as held ran at the
/// cgroup limit and thrashed (1.97 against 4.86 tok/s at 800 MiB).
pub(crate) fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the OS.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Once everything resident is loaded, lets glibc keep freed blocks of up
/// to 32 MiB for reuse: a streamed layer's weights are freed after each
/// pass and the next layer allocates the same sizes again, and every
/// forward pass allocates the same activation and logit buffers. Handing
/// them back to the OS and faulting fresh zeroed pages in costs about a
/// quarter of each streamed layer's build time (and a few percent of a
/// resident decode step); keeping them costs only the memory the streaming
/// reserve already accounts for.
fn reuse_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tunables.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

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
        let file = arbor_gguf::GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(file.header())?;
        let model = backends::load(backend.into(), &file, progress)?;
        let model = arbor_drafts::slim::widen_if_slim(file.header(), model)?;
        reuse_freed_memory();
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
        let backend = backend.into();
        limit_allocator_caching();
        let file = arbor_gguf::GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(file.header())?;
        let mut draft_model = None;
        if let Some(DraftSource::Model(dpath)) = draft {
            let dfile = arbor_gguf::GgufFile::open(dpath)?;
            let dtok = Tokenizer::from_gguf(dfile.header())?;
            if !dtok.same_vocabulary(&tokenizer) {
                return Err(EngineError::VocabularyMismatch {
                    draft: dtok.vocab_size(),
                    target: tokenizer.vocab_size(),
                });
            }
            let model = backends::load(backend, &dfile, progress)?;
            draft_model = Some(arbor_drafts::slim::widen_if_slim(dfile.header(), model)?);
        }
        // A self or elastic draft keeps its own KV cache and logits:
        // planned like a draft with the target's shape.
        let self_draft = draft == Some(&DraftSource::SelfLayers);
        let own_cache = self_draft || matches!(draft, Some(DraftSource::Elastic(_)));
        let layout = arbor_model::Layout::from_gguf(file.header())?;
        // An elastic draft runs every layer's prefix at its level: those
        // stay held, and only the rest of a layer can stream.
        let mut options = *options;
        if let Some(DraftSource::Elastic(level)) = draft {
            let e = layout.elastic.as_ref().ok_or_else(|| {
                EngineError::Invalid(format!("{} is not an elastic model", path.display()))
            })?;
            options.split = Some(e.level_index(*level)?);
        }
        let options = &options;
        let target_config = layout.config;
        let draft_config = match (&draft_model, own_cache) {
            (Some(d), _) => Some(d.config().clone()),
            (None, true) => Some(target_config),
            (None, false) => None,
        };
        let (model, report, own_draft) = backends::load_budgeted(
            backend,
            &file,
            path,
            draft_config.as_ref(),
            self_draft,
            options,
            progress,
        )?;
        reuse_freed_memory();
        let mut engine = Self {
            model,
            tokenizer,
            path: path.to_path_buf(),
            draft: None,
            memory: Some(report),
        };
        match (draft, draft_model.or(own_draft)) {
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
        let file = arbor_gguf::GgufFile::open(&self.path)?;
        let layout = arbor_model::Layout::from_gguf(file.header())?;
        let e = layout.elastic.as_ref().ok_or_else(|| {
            EngineError::Invalid(format!("{} is not an elastic model", self.path.display()))
        })?;
        let at = e.level_index(level)?;
        let whole = e.level_bytes(&layout, e.levels.len() - 1).max(1);
        Ok(e.level_bytes(&layout, at) as f64 / whole as f64)
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
        let file = arbor_gguf::GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(file.header())?;
        if !tokenizer.same_vocabulary(&self.tokenizer) {
            return Err(EngineError::VocabularyMismatch {
                draft: tokenizer.vocab_size(),
                target: self.tokenizer.vocab_size(),
            });
        }
        let model = backends::load(backend.into(), &file, progress)?;
        self.set_draft(arbor_drafts::slim::widen_if_slim(file.header(), model)?)
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

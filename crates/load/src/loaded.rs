//! Loading model files: a model whole (a slim draft widened to its
//! vocabulary), a draft checked against its target's tokenizer, and a
//! target under a memory budget with its draft — what the engine wraps.

use std::path::Path;

use arbor_gguf::GgufFile;
use arbor_model::LanguageModel;
use arbor_pipeline::{MemoryOptions, MemoryReport};
use arbor_tokenizer::Tokenizer;

use crate::{
    BackendSpec, DraftSource, EngineError, Result, backends, limit_allocator_caching,
    reuse_freed_memory,
};

/// The model of `path` loaded whole onto `backend`, and its tokenizer;
/// `progress(done, total)` counts tensors. Freed blocks are kept for reuse
/// from then on.
pub fn load_whole(
    path: &Path,
    backend: BackendSpec,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Box<dyn LanguageModel>, Tokenizer)> {
    let file = GgufFile::open(path)?;
    let tokenizer = Tokenizer::from_gguf(file.header())?;
    let model = load_file(&file, backend, progress)?;
    reuse_freed_memory(crate::KEEP_UNBUDGETED);
    Ok((model, tokenizer))
}

/// The draft model of `path`, whose tokenizer must be `target`'s (same
/// vocabulary, same token strings); a slim draft is widened.
pub fn load_draft(
    path: &Path,
    backend: BackendSpec,
    target: &Tokenizer,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<dyn LanguageModel>> {
    let file = GgufFile::open(path)?;
    let tokenizer = Tokenizer::from_gguf(file.header())?;
    if !tokenizer.same_vocabulary(target) {
        return Err(EngineError::VocabularyMismatch {
            draft: tokenizer.vocab_size(),
            target: target.vocab_size(),
        });
    }
    load_file(&file, backend, progress)
}

/// The model of `file` loaded whole, a slim draft widened to its
/// vocabulary.
fn load_file(
    file: &GgufFile,
    backend: BackendSpec,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<dyn LanguageModel>> {
    let model = backends::load(backend, file, progress)?;
    Ok(arbor_drafts::slim::widen_if_slim(file.header(), model)?)
}

/// A target loaded under a budget.
pub struct Loaded {
    pub model: Box<dyn LanguageModel>,
    pub tokenizer: Tokenizer,
    pub memory: MemoryReport,
    /// The draft model, or the self draft, when the source was one; prompt
    /// lookup and elastic levels are attached by the caller.
    pub draft: Option<Box<dyn LanguageModel>>,
}

/// Loads the target of `path` (and a draft model or self draft, as `draft`
/// says) to run inside `options.budget` bytes for the whole process: the
/// draft is loaded first and stays resident; the target keeps as many
/// layers resident as fit and streams the rest from disk. A budget too
/// small to run at all is an error that says the minimum. Freed blocks are
/// kept for reuse once it is loaded.
pub fn load_under_budget(
    path: &Path,
    draft: Option<&DraftSource>,
    backend: BackendSpec,
    options: &MemoryOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Loaded> {
    limit_allocator_caching();
    let file = GgufFile::open(path)?;
    let tokenizer = Tokenizer::from_gguf(file.header())?;
    let draft_model = match draft {
        Some(DraftSource::Model(dpath)) => Some(load_draft(dpath, backend, &tokenizer, progress)?),
        _ => None,
    };
    // A self or elastic draft keeps its own KV cache and logits: planned
    // like a draft with the target's shape.
    let self_draft = draft == Some(&DraftSource::SelfLayers);
    let own_cache = self_draft || matches!(draft, Some(DraftSource::Elastic(_)));
    let layout = arbor_model::Layout::from_gguf(file.header())?;
    // An elastic draft runs every layer's prefix at its level: those stay
    // held, and only the rest of a layer can stream.
    let mut options = *options;
    // A self draft runs the target's head, which must then be held.
    options.approx_head &= !self_draft;
    if let Some(DraftSource::Elastic(level)) = draft {
        let e = layout.elastic.as_ref().ok_or_else(|| not_elastic(path))?;
        options.split = Some(e.level_index(*level)?);
    }
    let draft_config = match (&draft_model, own_cache) {
        (Some(d), _) => Some(d.config().clone()),
        (None, true) => Some(layout.config),
        (None, false) => None,
    };
    let (model, memory, own_draft) = backends::load_budgeted(
        backend,
        &file,
        path,
        draft_config.as_ref(),
        self_draft,
        &options,
        progress,
    )?;
    // Free heap up to the streamer's share stays for the next layer's
    // build (the ledger bounds what is built at once, so the heap never
    // holds more than that share beyond the rest of the plan).
    let reserve = usize::try_from(memory.plan.stream_reserve).unwrap_or(usize::MAX);
    reuse_freed_memory(crate::KEEP_BUDGETED.max(reserve));
    Ok(Loaded {
        model,
        tokenizer,
        memory,
        draft: draft_model.or(own_draft),
    })
}

/// The share of the whole elastic target `path`'s layer weights that
/// `level` multiplies per token.
pub fn elastic_share(path: &Path, level: f64) -> Result<f64> {
    let file = GgufFile::open(path)?;
    let layout = arbor_model::Layout::from_gguf(file.header())?;
    let e = layout.elastic.as_ref().ok_or_else(|| not_elastic(path))?;
    let at = e.level_index(level)?;
    let whole = e.level_bytes(&layout, e.levels.len() - 1).max(1);
    Ok(e.level_bytes(&layout, at) as f64 / whole as f64)
}

fn not_elastic(path: &Path) -> EngineError {
    EngineError::Invalid(format!("{} is not an elastic model", path.display()))
}

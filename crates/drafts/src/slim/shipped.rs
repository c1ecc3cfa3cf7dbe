//! Token rankings shipped with arbor (`assets/slim/`), so that a slim
//! draft can be derived on first use without downloading a corpus: `auto`
//! derives one when it weighs a draft model that has none yet.

use std::path::{Path, PathBuf};

use arbor_gguf::GgufFile;

use super::{Quant, SlimOptions, SlimReport, TokenCounts, derive, vocabulary_fingerprint};
use crate::DraftError;

/// Rankings shipped, each the K most frequent ids of ShareGPT's turns
/// under one vocabulary (how each was made: `assets/slim/README.md`).
const SHIPPED: &[&[u8]] = &[include_bytes!("../../../../assets/slim/qwen2.5.ranking")];

/// Rows the derived slim head keeps.
pub const DEFAULT_K: usize = 32768;

/// The shipped ranking for the vocabulary of `draft`'s header, if any.
pub fn shipped_counts(h: &arbor_gguf::Header) -> Result<Option<TokenCounts>, DraftError> {
    let (vocab, fingerprint) = vocabulary_fingerprint(h)?;
    for bytes in SHIPPED {
        let counts = TokenCounts::from_ranking(bytes)?;
        if counts.vocab_size() == vocab && counts.fingerprint() == fingerprint {
            return Ok(Some(counts));
        }
    }
    Ok(None)
}

/// Where [`derive_default`] writes the slim draft of `draft` in `dir`.
pub fn default_path(draft: &Path, dir: &Path) -> PathBuf {
    let stem = draft
        .file_stem()
        .map_or_else(|| "draft".into(), |s| s.to_string_lossy().into_owned());
    dir.join(format!("{stem}-k{DEFAULT_K}-keep.gguf"))
}

/// Derives the slim draft `auto` uses from `draft` into `dir` (K =
/// [`DEFAULT_K`], layers as they are, the shipped ranking of its
/// vocabulary): its path and report, or `None` when no ranking ships for
/// that vocabulary or the vocabulary is no larger than K.
pub fn derive_default(
    draft: &Path,
    dir: &Path,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Option<(PathBuf, SlimReport)>, DraftError> {
    let file = GgufFile::open(draft)?;
    let Some(counts) = shipped_counts(file.header())? else {
        return Ok(None);
    };
    if counts.vocab_size() <= DEFAULT_K {
        return Ok(None);
    }
    drop(file);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DraftError::Write {
            path: path.clone(),
            source: arbor_gguf::GgufError::Io { path, source },
        }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let out = default_path(draft, dir);
    // Written aside and renamed: a half-written file is never found.
    let partial = out.with_extension("gguf.partial");
    let report = derive(
        draft,
        &partial,
        &SlimOptions::new(DEFAULT_K, Quant::Keep),
        &counts,
        progress,
    )?;
    std::fs::rename(&partial, &out).map_err(io(&out))?;
    Ok(Some((out, report)))
}

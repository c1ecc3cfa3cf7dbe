//! What can go wrong deriving or loading a draft.

use std::path::PathBuf;

/// Errors of the draft sources; none of them panics.
#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    #[error(transparent)]
    Gguf(#[from] arbor_gguf::GgufError),
    #[error(transparent)]
    Model(#[from] arbor_model::ModelError),
    #[error("{path} is not a model arbor runs: {source}")]
    NotAModel {
        path: PathBuf,
        #[source]
        source: arbor_model::ModelError,
    },
    #[error("{0} is already a slim draft (derive from the draft it came from)")]
    AlreadySlim(PathBuf),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: arbor_gguf::GgufError,
    },
    #[error("K = 0: a slim head needs at least one token")]
    ZeroK,
    #[error("K = {k} is larger than the vocabulary of {vocab} tokens")]
    KTooLarge { k: usize, vocab: usize },
    #[error("the {specials} special tokens do not fit in a head of K = {k} rows")]
    TooManySpecials { specials: usize, k: usize },
    #[error(
        "the token counts come from another tokenizer ({counts_vocab} tokens, fingerprint \
         {counts_fingerprint:016x}) than the model's ({model_vocab} tokens, fingerprint \
         {model_fingerprint:016x})"
    )]
    TokenizerMismatch {
        counts_vocab: usize,
        counts_fingerprint: u64,
        model_vocab: usize,
        model_fingerprint: u64,
    },
    #[error("token {id} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("tokenizing the corpus: {0}")]
    Tokenize(String),
    #[error("the model's tokenizer metadata is unusable: {0}")]
    TokenizerMetadata(String),
    #[error("`{tensor}` has rows of {cols} values, not a whole number of {quant} blocks of 32")]
    RowWidth {
        tensor: String,
        cols: usize,
        quant: &'static str,
    },
    #[error("unknown quantization `{0}` (choose keep, q8_0, q5_0 or f16)")]
    UnknownQuant(String),
    #[error("requant needs a storage to write (q8_0, q5_0 or f16): `keep` would copy the file")]
    RequantKeep,
    #[error("bad slim draft: {0}")]
    BadSlim(String),
}

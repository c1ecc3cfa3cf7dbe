//! Slim drafts: a smaller GGUF derived from a draft GGUF.
//!
//! [`derive()`] writes a copy of a draft model whose output head keeps only
//! K rows: every special token (any token type but normal and unused, and
//! the bos / eos / eot ids) and then the most frequent tokens of a corpus
//! ([`TokenCounts`]), ties to the lower id. The rows are written in
//! ascending token id, and the kept ids go into the metadata key
//! [`KEY_TOKEN_IDS`]. Layers may be requantized to Q8_0 or Q5_0 (the types
//! the candle kernels run fast for rows whose width is not a multiple of
//! 256); the token table is kept whole unless asked otherwise, since the
//! engine can read it by rows from disk.
//!
//! A slim GGUF loads as an ordinary decoder whose logits have K columns;
//! [`SlimDraft`] widens them back to the whole vocabulary with
//! `-inf` for the tokens left out, so the draft's distribution is its
//! distribution renormalised over the kept tokens and speculative
//! verification stays exact. [`widen_if_slim`] wraps a loaded model when
//! its GGUF is a slim one.

mod counts;
mod derive;
mod load;
mod quant;
mod select;
mod shipped;
mod widen;

pub use counts::{TokenCounts, vocabulary_fingerprint};
pub use derive::{SlimReport, derive};
pub use load::{slim_token_ids, widen_if_slim};
pub use quant::{Quant, SlimOptions};
pub use select::{kept_ids, ranked_ids, special_ids};
pub use shipped::{DEFAULT_K, default_path, derive_default, shipped_counts};
pub use widen::SlimDraft;

/// Metadata key of the kept token ids (u32 array, ascending; row `i` of the
/// head is token `ids[i]`).
pub const KEY_TOKEN_IDS: &str = "arbor.slim.token_ids";
/// Metadata key of K, the head's rows (u32).
pub const KEY_K: &str = "arbor.slim.k";
/// Metadata key of the corpus the tokens were counted on (string).
pub const KEY_CORPUS: &str = "arbor.slim.corpus";
/// Metadata key of the source file's name (string).
pub const KEY_SOURCE: &str = "arbor.slim.source";
/// Metadata key of the source file's size in bytes (u64).
pub const KEY_SOURCE_BYTES: &str = "arbor.slim.source_bytes";
/// Metadata key of the layers' quantization (string: keep, q8_0, q5_0).
pub const KEY_QUANT: &str = "arbor.slim.quant";

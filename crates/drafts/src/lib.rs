//! Draft sources that cost little memory. Each is an
//! [`arbor_model::LanguageModel`] over the target's vocabulary, so the
//! decoding loop uses any of them as its draft unchanged:
//!
//! - `lookup`: prompt lookup — n-grams copied from the prompt and the text
//!   so far; no weights, no compute.
//! - [`slim`]: a slim draft derived from a draft GGUF — an output head
//!   restricted to the K most frequent tokens of a corpus, the token table
//!   read by rows, layers requantized to types our kernels run fast.
//!
//! [`requant`] rewrites a whole model in another storage (Q8_0, F16): the
//! larger targets `arbor requant` makes from a released file.
//!
//! The third cheap source, the target's own resident layers (self draft),
//! lives with the decoder (`arbor_model::Decoder::self_draft`) since it
//! shares the target's weights.

pub mod lookup;
pub use lookup::PromptLookup;
mod error;
pub mod requant;
pub mod slim;

pub use error::DraftError;

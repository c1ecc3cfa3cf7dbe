//! Text ⇄ token ids for GGUF models, built only from the file's metadata.
//!
//! Supported today: byte-level BPE vocabularies (`tokenizer.ggml.model` =
//! `"gpt2"`), which covers Qwen2/2.5, SmolLM, Llama 3 and most other recent
//! models. The BPE merging itself is done by the `tokenizers` crate; this crate
//! reads the GGUF keys, picks the pre-tokenizer (how text is cut into words
//! before merging) the way llama.cpp does for the `tokenizer.ggml.pre` name,
//! and handles special tokens, decoding, streaming and chat prompts.
//!
//! The goal is to give the same ids as llama.cpp on the same file, so the
//! choices in this crate follow llama.cpp rather than Hugging Face where they
//! differ: no Unicode normalisation of the input, special tokens written in
//! the text are always recognised, BOS is added only when the file asks for it.
//!
//! This file holds the [`Tokenizer`] and its queries; `metadata` builds it
//! from the GGUF keys, `pretokenize` picks the word splitting, `bpe` builds
//! the merge model, `packed` stores the token strings, and `bytelevel`,
//! `stream` and `chat` cover the byte alphabet, streaming and chat prompts,
//! `template` runs the file's Jinja chat template, and `content` encodes a
//! chat whose message text stays text (special-token text included).

mod bpe;
mod bytelevel;
mod chat;
mod content;
mod fim;
mod metadata;
mod packed;
mod pretokenize;
mod stream;
mod template;
pub mod tools;

use arbor_gguf::GgufError;

pub use chat::{ChatMessage, Role};
pub use fim::{FimTokens, Infill};
pub use stream::StreamDecoder;
pub use tools::ToolCall;

use chat::ChatFormat;
use packed::Packed;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata key `{0}` is missing")]
    MissingKey(String),
    #[error("tokenizer metadata key `{key}` is invalid: {reason}")]
    BadMetadata { key: String, reason: String },
    #[error("unsupported tokenizer model `{0}` (arbor supports \"gpt2\" byte-level BPE)")]
    UnsupportedModel(String),
    #[error("unsupported pre-tokenizer `{0}`")]
    UnsupportedPreTokenizer(String),
    #[error("token id {id} is out of range (vocabulary has {vocab_size} tokens)")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    /// The model has no chat format arbor can render.
    #[error("unsupported chat template: {0}")]
    UnsupportedChatTemplate(String),
    /// The model's chat template does not compile, or failed while rendering.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The model's chat template refused the conversation with its own
    /// `raise_exception(message)` (for example, roles that do not alternate);
    /// holds that message. This is a problem with the request, not the model.
    #[error("the chat template rejected the conversation: {0}")]
    ChatTemplateRejected(String),
    /// Message text holds special-token text and the chat template does
    /// not copy message text verbatim, so it cannot be kept as text.
    #[error(
        "message {message} holds the special token `{token}` as text, and this model's chat \
         template rewrites message text, so it cannot be kept as plain text"
    )]
    SpecialTextInContent { message: usize, token: String },
    /// Fill-in-the-middle needs a code model's FIM tokens.
    #[error(
        "this model has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, \
         <|fim_middle|> or <fim_prefix>…): serve a code model trained for infilling"
    )]
    NoInfillTokens,
    #[error("tokenizer backend: {0}")]
    Backend(#[source] tokenizers::Error),
}

impl TokenizerError {
    fn bad(key: &str, reason: impl Into<String>) -> Self {
        Self::BadMetadata {
            key: key.into(),
            reason: reason.into(),
        }
    }

    fn from_gguf(key: &str, e: GgufError) -> Self {
        match e {
            GgufError::MissingKey(k) => Self::MissingKey(k),
            other => Self::bad(key, other.to_string()),
        }
    }
}

type Result<T, E = TokenizerError> = std::result::Result<T, E>;

/// What a vocabulary entry is, from `tokenizer.ggml.token_type` (the numbers
/// are llama.cpp's `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// Ordinary text, stored in byte-level form (`Ġ` for a space, ...).
    Normal,
    Unknown,
    /// Control tokens such as `<|im_start|>`; stored as plain text.
    Control,
    /// Added tokens such as `<tool_call>`; stored as plain text.
    UserDefined,
    /// Padding entries that never occur in text.
    Unused,
    Byte,
    Undefined,
}

impl TokenKind {
    fn from_code(code: i64) -> Self {
        match code {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }

    /// Whether the token is matched as a whole when its text appears in the
    /// input (llama.cpp's special-token partition).
    fn is_matched_in_text(self) -> bool {
        matches!(self, Self::Control | Self::UserDefined | Self::Unknown)
    }
}

/// A GGUF model's tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Token strings as stored in the file, back to back, indexed by id.
    names: Packed<String>,
    kinds: Vec<TokenKind>,
    /// The bytes each token stands for, indexed by id.
    pieces: Packed<Vec<u8>>,
    pre: String,
    add_bos: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    stop: Vec<u32>,
    chat: ChatFormat,
    /// Ids of the tokens matched as a whole when their text appears
    /// (control, user-defined and unknown tokens).
    matched: Vec<u32>,
    /// `inner` with special-token matching off, made on first use
    /// ([`Tokenizer::encode_chat`]).
    plain: std::sync::OnceLock<tokenizers::Tokenizer>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.names.len())
            .field("pre", &self.pre)
            .field("add_bos", &self.add_bos)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("stop", &self.stop)
            .field("chat", &self.chat)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Token ids for `text`. Special tokens written in the text (such as
    /// `<|im_start|>`) become their ids; BOS is prepended only when the file
    /// sets `add_bos_token`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if self.add_bos
            && let Some(bos) = self.bos
        {
            ids.push(bos);
        }
        if text.is_empty() {
            return Ok(ids);
        }
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(TokenizerError::Backend)?;
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// The text for `ids`, special tokens included as their text. Byte
    /// sequences that are not valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.piece(id)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The bytes token `id` stands for.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        self.piece(id)
    }

    fn piece(&self, id: u32) -> Result<&[u8]> {
        self.pieces.get(id).ok_or(TokenizerError::TokenOutOfRange {
            id,
            vocab_size: self.names.len(),
        })
    }

    /// Number of entries in `tokenizer.ggml.tokens` (may be smaller than the
    /// model's embedding rows).
    pub fn vocab_size(&self) -> usize {
        self.names.len()
    }

    /// The token's string as stored in the file (byte-level form for normal
    /// tokens, e.g. `Ġworld`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.names.get(id)
    }

    /// The id of a token given its stored string.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Whether [`encode`](Self::encode) prepends BOS.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// The `tokenizer.ggml.pre` name in use.
    pub fn pre_tokenizer(&self) -> &str {
        &self.pre
    }

    /// Ids that end generation: EOS, EOT/EOM from the metadata, and any
    /// end-of-turn tokens (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, ...)
    /// present in the vocabulary. Sorted, without repeats.
    pub fn stop_ids(&self) -> Vec<u32> {
        self.stop.clone()
    }

    pub fn is_stop(&self, id: u32) -> bool {
        self.stop.binary_search(&id).is_ok()
    }

    /// The prompt for `messages` in the model's chat format, ending with the
    /// assistant's generation prefix: the file's Jinja chat template when it
    /// has one, else ChatML when the vocabulary has its tokens. When
    /// [`encode`](Self::encode) adds BOS itself, a BOS written at the start
    /// by the template is left out, so encoding the prompt gives one BOS.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String> {
        self.chat_prompt_with_tools(messages, &[])
    }

    /// An incremental decoder for generated ids.
    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }

    /// Whether both tokenizers have exactly the same token strings, in the
    /// same order (so ids mean the same thing in both).
    pub fn same_vocabulary(&self, other: &Tokenizer) -> bool {
        self.names == other.names
    }
}

#[cfg(test)]
mod tests;

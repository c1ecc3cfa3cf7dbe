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
//! choices below follow llama.cpp rather than Hugging Face where they differ:
//! no Unicode normalisation of the input, special tokens written in the text
//! are always recognised, BOS is added only when the file asks for it.

mod bytelevel;
mod chat;
mod stream;

use std::collections::HashSet;

use arbor_gguf::{GgufError, Header};
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

pub use chat::{ChatMessage, Role};
pub use stream::StreamDecoder;

use chat::ChatFormat;

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
    #[error("unsupported chat template: {0}")]
    UnsupportedChatTemplate(String),
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

// GGUF metadata keys.
const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
const KEY_EOM: &str = "tokenizer.ggml.eom_token_id";
const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_TEMPLATE: &str = "tokenizer.chat_template";

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

/// Texts of tokens that end a turn or a document. llama.cpp treats these as
/// end-of-generation when they are in the vocabulary, whatever the metadata
/// says.
const END_OF_TURN_TEXTS: &[&str] = &[
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<end_of_utterance>",
];

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

/// How text is cut into words before BPE: a list of regexes applied one after
/// the other (each one splits the pieces left by the previous one, keeping both
/// matches and the text between them), plus llama.cpp's per-family options.
struct PreTokenizerSpec {
    regexes: Vec<String>,
    /// A word that is itself a token is taken whole, without merging.
    ignore_merges: bool,
    /// Whether BOS is added when the file has no `add_bos_token` key.
    add_bos_default: bool,
}

// The classic GPT-2 word pattern, as llama.cpp writes it (without a final
// `\s+`; text no alternative matches still becomes its own piece).
const GPT2_WORDS: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// The Llama 3 / Qwen2 pattern with `digits` as the number alternative. The
/// original is written with `(?i:...)` for the contractions; spelling the
/// cases out avoids Unicode case folding (e.g. `ſ` matching `s`), as llama.cpp
/// does.
fn llama3_style(digits: &str) -> String {
    format!(
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|{digits}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
}

impl PreTokenizerSpec {
    fn for_name(name: &str) -> Result<Self> {
        let spec = |regexes: Vec<String>| Self {
            regexes,
            ignore_merges: false,
            add_bos_default: false,
        };
        Ok(match name {
            "default" => spec(vec![
                r"[\p{P}\$\+<=>\^~\|]+".into(),
                GPT2_WORDS.into(),
                r"\p{N}+".into(),
                "[0-9][0-9][0-9]".into(),
            ]),
            "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "exaone4" => {
                spec(vec![GPT2_WORDS.into()])
            }
            // Every digit on its own, then GPT-2 words.
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" => spec(vec![r"\p{N}".into(), GPT2_WORDS.into()]),
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" | "hunyuan" => {
                spec(vec![llama3_style(r"\p{N}")])
            }
            "dbrx" | "smaug-bpe" | "chatglm-bpe" | "glm4" => {
                spec(vec![llama3_style(r"\p{N}{1,3}")])
            }
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" => Self {
                regexes: vec![llama3_style(r"\p{N}{1,3}")],
                ignore_merges: true,
                add_bos_default: true,
            },
            other => return Err(TokenizerError::UnsupportedPreTokenizer(other.into())),
        })
    }

    fn build(&self) -> Result<PreTokenizerWrapper> {
        let mut steps = Vec::with_capacity(self.regexes.len() + 1);
        for re in &self.regexes {
            let split = Split::new(
                SplitPattern::Regex(re.clone()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(TokenizerError::Backend)?;
            steps.push(PreTokenizerWrapper::Split(split));
        }
        // Map every byte of each piece to its byte-level character; the
        // splitting is already done above.
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        )));
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(steps)))
    }
}

/// An optional token id key; `None` when absent, an error when present but
/// not an id in the vocabulary.
fn optional_id(h: &Header, key: &str, n_tokens: usize) -> Result<Option<u32>> {
    let Some(v) = h.get(key) else {
        return Ok(None);
    };
    let id = v
        .as_u64()
        .ok_or_else(|| TokenizerError::bad(key, format!("expected a token id, found {v:?}")))?;
    if id >= n_tokens as u64 {
        return Err(TokenizerError::bad(
            key,
            format!("token id {id} is outside the vocabulary of {n_tokens} tokens"),
        ));
    }
    Ok(Some(id as u32))
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF header's `tokenizer.*` keys.
    pub fn from_gguf(h: &Header) -> Result<Self> {
        let model = h
            .get_str(KEY_MODEL)
            .map_err(|e| TokenizerError::from_gguf(KEY_MODEL, e))?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.into()));
        }
        // llama.cpp falls back to its "default" pre-tokenizer when the key is
        // absent (old conversions); unknown names are refused here rather than
        // silently tokenizing differently from the model's training.
        let pre = match h.get(KEY_PRE) {
            None => "default",
            Some(v) => v
                .as_str()
                .ok_or_else(|| TokenizerError::bad(KEY_PRE, "expected a string"))?,
        };
        let spec = PreTokenizerSpec::for_name(pre)?;

        let raw_tokens = h
            .get_str_array(KEY_TOKENS)
            .map_err(|e| TokenizerError::from_gguf(KEY_TOKENS, e))?;
        let n = raw_tokens.len();
        if n == 0 {
            return Err(TokenizerError::bad(KEY_TOKENS, "the vocabulary is empty"));
        }
        if n > u32::MAX as usize {
            return Err(TokenizerError::bad(KEY_TOKENS, "too many tokens"));
        }
        // As in llama.cpp, an empty entry gets a placeholder name so it can
        // neither match text nor collide with other entries.
        let mut names = Packed::new(
            String::with_capacity(raw_tokens.iter().map(|t| t.len()).sum()),
            n,
        );
        for (i, t) in raw_tokens.iter().enumerate() {
            if t.is_empty() {
                names.push(&format!("[EMPTY_{i}]"));
            } else {
                names.push(t);
            }
        }
        if names.data.len() > u32::MAX as usize {
            return Err(TokenizerError::bad(KEY_TOKENS, "token texts are too large"));
        }

        let kinds: Vec<TokenKind> = match h.get(KEY_TYPES) {
            None => vec![TokenKind::Normal; n],
            Some(_) => {
                let codes = h
                    .get_i64_array(KEY_TYPES)
                    .map_err(|e| TokenizerError::from_gguf(KEY_TYPES, e))?;
                if codes.len() != n {
                    return Err(TokenizerError::bad(
                        KEY_TYPES,
                        format!("has {} entries for {n} tokens", codes.len()),
                    ));
                }
                codes.into_iter().map(TokenKind::from_code).collect()
            }
        };

        let raw_merges = h
            .get_str_array(KEY_MERGES)
            .map_err(|e| TokenizerError::from_gguf(KEY_MERGES, e))?;
        let bpe = build_bpe(&names, &raw_merges, spec.ignore_merges)?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(spec.build()?));
        let specials: Vec<AddedToken> = names
            .iter()
            .zip(&kinds)
            .filter(|(_, k)| k.is_matched_in_text())
            .map(|(t, _)| AddedToken::from(t, true))
            .collect();
        inner
            .add_special_tokens(specials)
            .map_err(TokenizerError::Backend)?;

        // What each token decodes to. Normal tokens are in byte-level form;
        // control and user-defined tokens are their own text; unused entries
        // decode to nothing (as llama.cpp renders them).
        // (Byte-level decoding never makes a token longer, so the sizes
        // checked for `names` hold here too.)
        let mut pieces = Packed::new(Vec::with_capacity(names.data.len()), n);
        for (t, k) in names.iter().zip(&kinds) {
            match k {
                TokenKind::Normal => bytelevel::decode_into(t, &mut pieces.data),
                TokenKind::Unused => {}
                _ => pieces.data.extend_from_slice(t.as_bytes()),
            }
            pieces.close();
        }

        let bos = optional_id(h, KEY_BOS, n)?;
        let eos = optional_id(h, KEY_EOS, n)?;
        let eot = optional_id(h, KEY_EOT, n)?;
        let eom = optional_id(h, KEY_EOM, n)?;
        // Some conversions write a padding id past the vocabulary; nothing
        // here depends on it, so an odd one is dropped instead of refused.
        let pad = optional_id(h, KEY_PAD, n).ok().flatten();

        let add_bos = match h.get(KEY_ADD_BOS) {
            None => spec.add_bos_default,
            Some(arbor_gguf::Value::Bool(b)) => *b,
            Some(v) => {
                return Err(TokenizerError::bad(
                    KEY_ADD_BOS,
                    format!("expected a bool, found {}", v.type_name()),
                ));
            }
        };
        if add_bos && bos.is_none() {
            return Err(TokenizerError::bad(
                KEY_ADD_BOS,
                "is true but the file has no bos_token_id",
            ));
        }

        let mut stop: Vec<u32> = [eos, eot, eom].into_iter().flatten().collect();
        for text in END_OF_TURN_TEXTS {
            if let Some(id) = inner.token_to_id(text) {
                stop.push(id);
            }
        }
        stop.sort_unstable();
        stop.dedup();

        let template = match h.get(KEY_TEMPLATE) {
            None => None,
            Some(v) => Some(
                v.as_str()
                    .ok_or_else(|| TokenizerError::bad(KEY_TEMPLATE, "expected a string"))?,
            ),
        };
        let has_chatml_tokens = ["<|im_start|>", "<|im_end|>"]
            .iter()
            .all(|t| inner.token_to_id(t).is_some());
        let chat = ChatFormat::detect(template, has_chatml_tokens);

        Ok(Self {
            inner,
            names,
            kinds,
            pieces,
            pre: pre.to_owned(),
            add_bos,
            bos,
            eos,
            pad,
            stop,
            chat,
        })
    }

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
    /// assistant's generation prefix.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String> {
        self.chat.render(messages)
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

/// Strings or byte strings stored back to back: entry `i` is
/// `data[ends[i - 1]..ends[i]]`. One allocation instead of one per token.
#[derive(PartialEq, Eq)]
struct Packed<T> {
    data: T,
    ends: Vec<u32>,
}

impl<T: AsRef<[u8]>> Packed<T> {
    /// An empty store writing into `data`, with room for `n` entries.
    fn new(data: T, n: usize) -> Self {
        Self {
            data,
            ends: Vec::with_capacity(n),
        }
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn span(&self, i: usize) -> Option<std::ops::Range<usize>> {
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        Some(start..end)
    }

    /// Ends the entry being written at the current end of `data`.
    fn close(&mut self) {
        // The total size is checked against u32 by the caller.
        self.ends.push(self.data.as_ref().len() as u32);
    }
}

impl Packed<String> {
    fn push(&mut self, s: &str) {
        self.data.push_str(s);
        self.close();
    }

    fn get(&self, id: u32) -> Option<&str> {
        self.span(id as usize).map(|r| &self.data[r])
    }

    fn iter(&self) -> impl Iterator<Item = &str> {
        (0..self.len()).map(|i| &self.data[self.span(i).expect("in range")])
    }
}

impl Packed<Vec<u8>> {
    fn get(&self, id: u32) -> Option<&[u8]> {
        self.span(id as usize).map(|r| &self.data[r])
    }
}

/// Token → id; a repeated string maps to its last id, like llama.cpp.
fn vocab_map(names: &Packed<String>) -> Vocab {
    let mut vocab = Vocab::with_capacity(names.len());
    for (i, t) in names.iter().enumerate() {
        vocab.insert(t.to_owned(), i as u32);
    }
    vocab
}

/// Splits a `tokenizer.ggml.merges` entry ("left right") at the first space
/// after the first byte, so a left side that is itself a space still parses.
fn split_merge(m: &str) -> Option<(&str, &str)> {
    let pos = m.as_bytes().iter().skip(1).position(|&b| b == b' ')? + 1;
    Some((&m[..pos], &m[pos + 1..]))
}

/// Builds the BPE model from the vocabulary and the merges (highest priority
/// first).
///
/// Like llama.cpp, merges that cannot apply are ignored rather than fatal: a
/// malformed entry, a side or a result missing from the vocabulary, or a pair
/// seen before (the first rank wins). Checking all that costs about as much
/// as building the model, and well-formed files (all of them, in practice)
/// need none of it, so the checks run only when a cheap screen finds a
/// possible repeat or the unchecked build fails.
fn build_bpe(names: &Packed<String>, raw: &[&str], ignore_merges: bool) -> Result<BPE> {
    let build = |vocab: Vocab, merges: Vec<(String, String)>| {
        BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(ignore_merges)
            .build()
    };
    if !may_repeat(raw) {
        let merges = raw
            .iter()
            .filter_map(|m| split_merge(m))
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect();
        if let Ok(bpe) = build(vocab_map(names), merges) {
            return Ok(bpe);
        }
    }
    let vocab = vocab_map(names);
    let mut seen: HashSet<(u32, u32)> = HashSet::with_capacity(raw.len());
    let mut merges = Vec::with_capacity(raw.len());
    let mut joined = String::new();
    for m in raw {
        let Some((a, b)) = split_merge(m) else {
            continue;
        };
        let (Some(&ia), Some(&ib)) = (vocab.get(a), vocab.get(b)) else {
            continue;
        };
        joined.clear();
        joined.push_str(a);
        joined.push_str(b);
        if !vocab.contains_key(joined.as_str()) || !seen.insert((ia, ib)) {
            continue;
        }
        merges.push((a.to_owned(), b.to_owned()));
    }
    build(vocab, merges).map_err(TokenizerError::Backend)
}

/// Whether some merge entry might occur twice: compares 64-bit hashes, so a
/// `false` is certain and a `true` only means "check exactly".
fn may_repeat(raw: &[&str]) -> bool {
    use std::hash::{BuildHasher, RandomState};
    let state = RandomState::new();
    let mut hashes: Vec<u64> = raw.iter().map(|m| state.hash_one(m)).collect();
    hashes.sort_unstable();
    hashes.windows(2).any(|w| w[0] == w[1])
}

#[cfg(test)]
mod tests;

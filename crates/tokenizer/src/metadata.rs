//! Building a [`Tokenizer`] from a GGUF header's `tokenizer.*` keys: the
//! vocabulary, token kinds, merges, special ids, BOS policy, stop tokens and
//! chat format.

use arbor_gguf::Header;
use tokenizers::AddedToken;

use crate::bpe::build_bpe;
use crate::packed::Packed;
use crate::pretokenize::PreTokenizerConfig;
use crate::template::TemplateTokens;
use crate::{ChatFormat, Result, TokenKind, Tokenizer, TokenizerError, bytelevel};

// GGUF metadata keys.
pub(crate) const KEY_MODEL: &str = "tokenizer.ggml.model";
pub(crate) const KEY_PRE: &str = "tokenizer.ggml.pre";
pub(crate) const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub(crate) const KEY_TYPES: &str = "tokenizer.ggml.token_type";
pub(crate) const KEY_MERGES: &str = "tokenizer.ggml.merges";
pub(crate) const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
pub(crate) const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
pub(crate) const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
pub(crate) const KEY_EOM: &str = "tokenizer.ggml.eom_token_id";
pub(crate) const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
pub(crate) const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
pub(crate) const KEY_TEMPLATE: &str = "tokenizer.chat_template";

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
        let config = PreTokenizerConfig::for_name(pre)?;

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
        let bpe = build_bpe(&names, &raw_merges, config.ignore_merges)?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(config.build()?));
        // Tokens matched as a whole in text: given to `tokenizers`, and
        // kept for `encode_chat`, which looks for their text in messages.
        let matched: Vec<u32> = (0..n as u32)
            .filter(|&id| kinds[id as usize].is_matched_in_text())
            .collect();
        let specials: Vec<AddedToken> = (matched.iter())
            .filter_map(|&id| names.get(id))
            .map(|t| AddedToken::from(t, true))
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
            None => config.add_bos_default,
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
        let token_text = |id: Option<u32>| {
            id.and_then(|id| pieces.get(id))
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        };
        let tokens = TemplateTokens {
            bos: token_text(bos),
            eos: token_text(eos),
            add_bos,
        };
        let chat = ChatFormat::detect(template, has_chatml_tokens, tokens);

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
            matched,
            plain: std::sync::OnceLock::new(),
        })
    }
}

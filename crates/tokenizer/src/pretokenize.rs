//! Pre-tokenization: how text is cut into words before BPE merging, chosen
//! from the `tokenizer.ggml.pre` name the way llama.cpp does.

use tokenizers::SplitDelimiterBehavior;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};

use crate::{Result, TokenizerError};

/// How text is cut into words before BPE: a list of regexes applied one after
/// the other (each one splits the pieces left by the previous one, keeping both
/// matches and the text between them), plus llama.cpp's per-family options.
pub(crate) struct PreTokenizerConfig {
    pub(crate) regexes: Vec<String>,
    /// A word that is itself a token is taken whole, without merging.
    pub(crate) ignore_merges: bool,
    /// Whether BOS is added when the file has no `add_bos_token` key.
    pub(crate) add_bos_default: bool,
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

impl PreTokenizerConfig {
    pub(crate) fn for_name(name: &str) -> Result<Self> {
        let config = |regexes: Vec<String>| Self {
            regexes,
            ignore_merges: false,
            add_bos_default: false,
        };
        Ok(match name {
            "default" => config(vec![
                r"[\p{P}\$\+<=>\^~\|]+".into(),
                GPT2_WORDS.into(),
                r"\p{N}+".into(),
                "[0-9][0-9][0-9]".into(),
            ]),
            "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "exaone4" => {
                config(vec![GPT2_WORDS.into()])
            }
            // Every digit on its own, then GPT-2 words.
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" => config(vec![r"\p{N}".into(), GPT2_WORDS.into()]),
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" | "hunyuan" => {
                config(vec![llama3_style(r"\p{N}")])
            }
            "dbrx" | "smaug-bpe" | "chatglm-bpe" | "glm4" => {
                config(vec![llama3_style(r"\p{N}{1,3}")])
            }
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" => Self {
                regexes: vec![llama3_style(r"\p{N}{1,3}")],
                ignore_merges: true,
                add_bos_default: true,
            },
            other => return Err(TokenizerError::UnsupportedPreTokenizer(other.into())),
        })
    }

    pub(crate) fn build(&self) -> Result<PreTokenizerWrapper> {
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

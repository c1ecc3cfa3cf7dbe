//! Fill-in-the-middle prompts for code models trained with FIM tokens
//! (Qwen2.5-Coder's `<|fim_prefix|>`…, StarCoder's and SmolLM2's
//! `<fim_prefix>`…), in prefix-suffix-middle order: the model writes what
//! goes between the prefix and the suffix. Other files of the project go
//! before, each behind a file separator, where the vocabulary has one.
//! The code is encoded as text: special-token text in it stays text.

use crate::{Result, Tokenizer, TokenizerError};

/// A model's FIM tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FimTokens {
    pub prefix: u32,
    pub suffix: u32,
    pub middle: u32,
    /// Padding, the repository name and the file separator, where the
    /// family has them.
    pub pad: Option<u32>,
    pub repo_name: Option<u32>,
    pub file_sep: Option<u32>,
}

/// The token names of each family: prefix, suffix, middle, pad, repo
/// name, file separator.
const FAMILIES: &[[&str; 6]] = &[
    [
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    ],
    [
        "<fim_prefix>",
        "<fim_suffix>",
        "<fim_middle>",
        "<fim_pad>",
        "<repo_name>",
        "<file_sep>",
    ],
];

/// What to fill: the code before and after the gap, the file's name,
/// other files as `(name, text)`, and text the middle starts with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Infill<'a> {
    pub prefix: &'a str,
    pub suffix: &'a str,
    pub filename: Option<&'a str>,
    pub extra: &'a [(String, String)],
    pub middle: &'a str,
}

impl Tokenizer {
    /// The FIM tokens, if the vocabulary has a family's prefix, suffix and
    /// middle tokens.
    pub fn fim_tokens(&self) -> Option<FimTokens> {
        FAMILIES.iter().find_map(|names| {
            let id = |i: usize| self.token_id(names[i]);
            Some(FimTokens {
                prefix: id(0)?,
                suffix: id(1)?,
                middle: id(2)?,
                pad: id(3),
                repo_name: id(4),
                file_sep: id(5),
            })
        })
    }

    /// The prompt for `infill`, ending with the middle token (and the
    /// middle's start). With other files or the file's name, and a file
    /// separator, the prompt is a repository's: its files, then this file
    /// named. Without a file separator, other files go before the prefix
    /// as text.
    pub fn encode_infill(&self, infill: &Infill<'_>) -> Result<Vec<u32>> {
        let fim = self.fim_tokens().ok_or(TokenizerError::NoInfillTokens)?;
        let mut ids = Vec::new();
        if self.add_bos
            && let Some(bos) = self.bos
        {
            ids.push(bos);
        }
        let mut prefix = String::new();
        match fim.file_sep {
            Some(sep) if !infill.extra.is_empty() || infill.filename.is_some() => {
                if let Some(repo) = fim.repo_name {
                    ids.push(repo);
                    ids.extend(self.encode_text("project\n")?);
                }
                for (name, text) in infill.extra {
                    ids.push(sep);
                    ids.extend(self.encode_text(&format!("{name}\n{text}\n"))?);
                }
                ids.push(sep);
                ids.extend(self.encode_text(&format!("{}\n", infill.filename.unwrap_or("file")))?);
            }
            _ => {
                for (name, text) in infill.extra {
                    prefix.push_str(&format!("// {name}\n{text}\n"));
                }
            }
        }
        prefix.push_str(infill.prefix);
        ids.push(fim.prefix);
        ids.extend(self.encode_text(&prefix)?);
        ids.push(fim.suffix);
        ids.extend(self.encode_text(infill.suffix)?);
        ids.push(fim.middle);
        ids.extend(self.encode_text(infill.middle)?);
        Ok(ids)
    }

    /// Tokens that end a middle: the stop tokens and every FIM token (a
    /// model that starts another file or section is done with this one).
    pub fn infill_stop_ids(&self) -> Vec<u32> {
        let mut ids = self.stop_ids();
        if let Some(f) = self.fim_tokens() {
            ids.extend([f.prefix, f.suffix, f.middle]);
            ids.extend([f.pad, f.repo_name, f.file_sep].into_iter().flatten());
        }
        ids.extend(self.eos);
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

//! How often each token of a vocabulary occurs in a corpus, tied to the
//! tokenizer that produced the ids.

use arbor_gguf::Header;

use crate::DraftError;

/// Token frequencies over a corpus, with the size and fingerprint of the
/// vocabulary they were counted in (see [`vocabulary_fingerprint`]), so
/// counts made with another tokenizer are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenCounts {
    counts: Vec<u64>,
    fingerprint: u64,
    corpus: String,
    texts: usize,
}

impl TokenCounts {
    /// No tokens yet, for a vocabulary of `vocab_size` tokens whose
    /// fingerprint is `fingerprint`; `corpus` names the text counted.
    pub fn new(vocab_size: usize, fingerprint: u64, corpus: impl Into<String>) -> Self {
        Self {
            counts: vec![0; vocab_size],
            fingerprint,
            corpus: corpus.into(),
            texts: 0,
        }
    }

    /// Counts the ids of one text.
    pub fn add(&mut self, ids: &[u32]) -> Result<(), DraftError> {
        let vocab = self.counts.len();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(DraftError::TokenOutOfRange { id, vocab });
        }
        for &id in ids {
            self.counts[id as usize] += 1;
        }
        self.texts += 1;
        Ok(())
    }

    /// Counts every text of `texts`, tokenized by `encode`.
    pub fn from_texts<T, E>(
        texts: impl IntoIterator<Item = T>,
        vocab_size: usize,
        fingerprint: u64,
        corpus: impl Into<String>,
        mut encode: impl FnMut(&str) -> Result<Vec<u32>, E>,
    ) -> Result<Self, DraftError>
    where
        T: AsRef<str>,
        E: std::fmt::Display,
    {
        let mut counts = Self::new(vocab_size, fingerprint, corpus);
        for text in texts {
            let ids = encode(text.as_ref()).map_err(|e| DraftError::Tokenize(e.to_string()))?;
            counts.add(&ids)?;
        }
        Ok(counts)
    }

    /// Adds `other`'s counts (same vocabulary) to these.
    pub fn merge(&mut self, other: &TokenCounts) -> Result<(), DraftError> {
        if other.fingerprint != self.fingerprint || other.counts.len() != self.counts.len() {
            return Err(DraftError::TokenizerMismatch {
                counts_vocab: other.counts.len(),
                counts_fingerprint: other.fingerprint,
                model_vocab: self.counts.len(),
                model_fingerprint: self.fingerprint,
            });
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.texts += other.texts;
        Ok(())
    }

    /// Occurrences of each token id.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    pub fn vocab_size(&self) -> usize {
        self.counts.len()
    }

    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    pub fn corpus(&self) -> &str {
        &self.corpus
    }

    /// Texts counted.
    pub fn texts(&self) -> usize {
        self.texts
    }

    /// Tokens counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Fails unless these counts were made with the vocabulary of the GGUF
    /// whose header is `h`.
    pub fn check_matches(&self, h: &Header) -> Result<(), DraftError> {
        let (vocab, fingerprint) = vocabulary_fingerprint(h)?;
        if vocab != self.counts.len() || fingerprint != self.fingerprint {
            return Err(DraftError::TokenizerMismatch {
                counts_vocab: self.counts.len(),
                counts_fingerprint: self.fingerprint,
                model_vocab: vocab,
                model_fingerprint: fingerprint,
            });
        }
        Ok(())
    }
}

/// The number of tokens in a GGUF's `tokenizer.ggml.tokens` and an FNV-1a
/// hash of their strings in order: two vocabularies with the same
/// fingerprint give every id the same text.
pub fn vocabulary_fingerprint(h: &Header) -> Result<(usize, u64), DraftError> {
    let tokens = h
        .get_str_array("tokenizer.ggml.tokens")
        .map_err(|e| DraftError::TokenizerMetadata(e.to_string()))?;
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |b: u8| {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    };
    for t in &tokens {
        t.bytes().for_each(&mut eat);
        // A separator no UTF-8 string contains.
        eat(0xff);
    }
    Ok((tokens.len(), hash))
}

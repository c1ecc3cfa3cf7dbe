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

/// The first bytes of a saved ranking ([`TokenCounts::ranking`]).
const RANKING_MAGIC: &[u8; 8] = b"ARBRANK1";

impl TokenCounts {
    /// The `n` most frequent ids (ties to the lower id) in a small file:
    /// what a slim head of up to `n` rows needs of these counts, shipped
    /// so that a slim draft can be derived without the corpus
    /// ([`TokenCounts::from_ranking`]). Layout, little-endian: the magic,
    /// the fingerprint (u64), the vocabulary size (u32), the corpus name
    /// (u32 length, UTF-8), the ids (u32 count, u32 each) most frequent
    /// first.
    pub fn ranking(&self, n: usize) -> Vec<u8> {
        let mut ids: Vec<u32> = (0..self.counts.len() as u32)
            .filter(|&i| self.counts[i as usize] > 0)
            .collect();
        ids.sort_by_key(|&i| std::cmp::Reverse(self.counts[i as usize]));
        ids.truncate(n);
        let mut out = RANKING_MAGIC.to_vec();
        out.extend(self.fingerprint.to_le_bytes());
        out.extend((self.counts.len() as u32).to_le_bytes());
        out.extend((self.corpus.len() as u32).to_le_bytes());
        out.extend(self.corpus.as_bytes());
        out.extend((ids.len() as u32).to_le_bytes());
        for id in ids {
            out.extend(id.to_le_bytes());
        }
        out
    }

    /// Counts that rank ids as a saved ranking does: the `n` ranked ids
    /// count `n`, `n − 1`, … and every other id 0.
    pub fn from_ranking(bytes: &[u8]) -> Result<Self, DraftError> {
        let bad = |what: &str| DraftError::BadSlim(format!("token ranking: {what}"));
        let mut at = 0;
        let mut take = |n: usize| -> Result<&[u8], DraftError> {
            let part = bytes.get(at..at + n).ok_or_else(|| bad("cut short"))?;
            at += n;
            Ok(part)
        };
        if take(8)? != RANKING_MAGIC {
            return Err(bad("not a ranking file"));
        }
        let u32_at = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let fingerprint = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
        let vocab = u32_at(take(4)?) as usize;
        let len = u32_at(take(4)?) as usize;
        let corpus = std::str::from_utf8(take(len)?).map_err(|_| bad("corpus name"))?;
        let mut counts = Self::new(vocab, fingerprint, corpus);
        let n = u32_at(take(4)?) as usize;
        if n > vocab {
            return Err(bad("more ids than the vocabulary"));
        }
        for rank in 0..n {
            let id = u32_at(take(4)?) as usize;
            let slot = counts
                .counts
                .get_mut(id)
                .ok_or_else(|| bad("id past the vocabulary"))?;
            if *slot != 0 {
                return Err(bad("an id ranked twice"));
            }
            *slot = (n - rank) as u64;
        }
        if take(1).is_ok() {
            return Err(bad("bytes after the ids"));
        }
        counts.texts = 1;
        Ok(counts)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ranking_keeps_the_order_of_the_most_frequent() {
        let mut c = TokenCounts::new(10, 77, "corpus");
        c.add(&[3, 3, 3, 7, 7, 1, 9, 9]).unwrap();
        let bytes = c.ranking(3);
        let r = TokenCounts::from_ranking(&bytes).unwrap();
        assert_eq!(
            (r.vocab_size(), r.fingerprint(), r.corpus()),
            (10, 77, "corpus")
        );
        // 3 (3 times), then 7 and 9 (twice: the lower id first); 1 cut.
        assert_eq!(r.counts(), &[0, 0, 0, 3, 0, 0, 0, 2, 0, 1]);
        // Damaged files are typed errors.
        for cut in [0, 7, 20, bytes.len() - 1] {
            assert!(
                TokenCounts::from_ranking(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut twice = bytes.clone();
        let n = twice.len();
        twice.copy_within(n - 8..n - 4, n - 4);
        assert!(TokenCounts::from_ranking(&twice).is_err());
        let mut longer = bytes;
        longer.push(0);
        assert!(TokenCounts::from_ranking(&longer).is_err());
    }
}

//! A prompt-token scorer cheap enough to sit in front of a prefill: each
//! token's self-information `−ln p(t_i | t_{i−1})` under a count-based
//! bigram model of the target's own tokens (counted once on a calibration
//! text), interpolated with add-one unigram counts by Witten–Bell weights.
//! It reads a table per token — microseconds for a whole prompt — where a
//! neural scorer's full-vocabulary logits at every position would cost
//! more than the prefill they save. Tokens that the text around them
//! predicts well (function words, the rest of a split word) score low.

use std::collections::HashMap;

use crate::{Result, SloError};

const MAGIC: &[u8; 8] = b"ARBIGRM1";

#[derive(Debug, Clone, PartialEq)]
pub struct Bigram {
    vocab: usize,
    /// Occurrences of each token.
    unigram: Vec<u32>,
    total: u64,
    /// `(previous << 32) | next` → occurrences of the pair.
    pairs: HashMap<u64, u32>,
    /// Per token as the previous one: pairs it starts, distinct followers.
    context: Vec<(u32, u32)>,
}

impl Bigram {
    /// Counts `tokens` (ids below `vocab`).
    pub fn train(tokens: &[u32], vocab: usize) -> Result<Self> {
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(SloError::Scorer(format!(
                "token {t} outside a vocabulary of {vocab}"
            )));
        }
        let mut unigram = vec![0u32; vocab];
        for &t in tokens {
            unigram[t as usize] += 1;
        }
        let mut pairs = HashMap::new();
        for w in tokens.windows(2) {
            *pairs.entry(key(w[0], w[1])).or_insert(0u32) += 1;
        }
        Ok(Self::from_counts(vocab, unigram, pairs))
    }

    fn from_counts(vocab: usize, unigram: Vec<u32>, pairs: HashMap<u64, u32>) -> Self {
        let mut context = vec![(0u32, 0u32); vocab];
        for (&k, &c) in &pairs {
            let slot = &mut context[(k >> 32) as usize];
            slot.0 += c;
            slot.1 += 1;
        }
        let total = unigram.iter().map(|&c| c as u64).sum();
        Self {
            vocab,
            unigram,
            total,
            pairs,
            context,
        }
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Tokens counted.
    pub fn total(&self) -> u64 {
        self.total
    }

    fn unigram_p(&self, t: u32) -> f64 {
        let c = self.unigram.get(t as usize).copied().unwrap_or(0) as f64;
        (c + 1.0) / (self.total as f64 + self.vocab as f64)
    }

    /// `p(next | previous)`.
    pub fn probability(&self, previous: u32, next: u32) -> f64 {
        let uni = self.unigram_p(next);
        let (seen, types) = self
            .context
            .get(previous as usize)
            .copied()
            .unwrap_or((0, 0));
        if seen == 0 {
            return uni;
        }
        let pair = self.pairs.get(&key(previous, next)).copied().unwrap_or(0) as f64;
        let lambda = seen as f64 / (seen as f64 + types as f64);
        lambda * pair / seen as f64 + (1.0 - lambda) * uni
    }

    /// Self-information of each token of `tokens` in nats (the first by
    /// its unigram probability).
    pub fn self_information(&self, tokens: &[u32]) -> Vec<f32> {
        (0..tokens.len())
            .map(|i| {
                let p = match i {
                    0 => self.unigram_p(tokens[0]),
                    _ => self.probability(tokens[i - 1], tokens[i]),
                };
                -(p.ln()) as f32
            })
            .collect()
    }

    /// The counts as bytes (little-endian; a few MB for a million tokens).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut pairs: Vec<(u64, u32)> = self.pairs.iter().map(|(&k, &c)| (k, c)).collect();
        pairs.sort_unstable();
        let mut out = Vec::with_capacity(24 + self.vocab * 4 + pairs.len() * 12);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.vocab as u64).to_le_bytes());
        out.extend_from_slice(&(pairs.len() as u64).to_le_bytes());
        for &c in &self.unigram {
            out.extend_from_slice(&c.to_le_bytes());
        }
        for (k, c) in pairs {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&c.to_le_bytes());
        }
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bad = |m: &str| SloError::Scorer(m.to_string());
        let mut r = Reader(bytes);
        if r.take(8).ok_or_else(|| bad("truncated header"))? != MAGIC {
            return Err(bad("not a bigram file (bad magic)"));
        }
        let vocab = r.u64().ok_or_else(|| bad("truncated header"))? as usize;
        let n = r.u64().ok_or_else(|| bad("truncated header"))? as usize;
        let expected =
            (vocab.checked_mul(4)).and_then(|u| n.checked_mul(12).and_then(|p| p.checked_add(u)));
        if expected != Some(r.0.len()) {
            return Err(bad(&format!(
                "{} bytes of counts for a vocabulary of {vocab} and {n} pairs",
                r.0.len()
            )));
        }
        let unigram: Vec<u32> = (0..vocab).filter_map(|_| r.u32()).collect();
        let mut pairs = HashMap::with_capacity(n);
        for _ in 0..n {
            let (k, c) = (r.u64().unwrap_or(0), r.u32().unwrap_or(0));
            if (k >> 32) as usize >= vocab || (k & 0xffff_ffff) as usize >= vocab {
                return Err(bad("a pair names a token outside the vocabulary"));
            }
            pairs.insert(k, c);
        }
        Ok(Self::from_counts(vocab, unigram, pairs))
    }
}

/// What ranks a prompt's tokens for dropping: the bigram's
/// self-information, or (the baseline) seeded random scores.
#[derive(Debug, Clone, PartialEq)]
pub enum Scorer {
    Bigram(Bigram),
    /// Random scores, seeded by this value and the prompt's tokens (the
    /// same prompt always drops the same tokens).
    Random(u64),
}

impl Scorer {
    pub fn name(&self) -> &'static str {
        match self {
            Scorer::Bigram(_) => "bigram",
            Scorer::Random(_) => "random",
        }
    }

    /// A score per token: higher is kept first.
    pub fn scores(&self, tokens: &[u32]) -> Vec<f32> {
        match self {
            Scorer::Bigram(b) => b.self_information(tokens),
            Scorer::Random(seed) => {
                let mix = tokens
                    .iter()
                    .fold(*seed, |h, &t| (h ^ t as u64).wrapping_mul(0x0100_0000_01b3));
                let mut rng = arbor_sampling::Rng::new(mix);
                tokens.iter().map(|_| rng.next_f64() as f32).collect()
            }
        }
    }
}

fn key(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predictable_tokens_carry_less_information() {
        // "1 2" always follows itself; 7 appears once, after 1.
        let text: Vec<u32> = [1, 2].repeat(50).into_iter().chain([1, 7, 3]).collect();
        let b = Bigram::train(&text, 10).unwrap();
        let si = b.self_information(&[1, 2, 1, 7, 5]);
        assert!(
            si[1] < si[3],
            "2 after 1 is likelier than 7 after 1: {si:?}"
        );
        assert!(
            si[3] < si[4],
            "an unseen token is the most surprising: {si:?}"
        );
        let sum: f64 = (0..10).map(|n| b.probability(1, n)).sum();
        assert!((sum - 1.0).abs() < 1e-9, "p(. | 1) sums to {sum}");
        let sum: f64 = (0..10).map(|n| b.probability(9, n)).sum();
        assert!((sum - 1.0).abs() < 1e-9, "unseen context sums to {sum}");
    }

    #[test]
    fn random_scores_are_seeded_by_the_prompt() {
        let r = Scorer::Random(1);
        assert_eq!(r.scores(&[1, 2, 3]), r.scores(&[1, 2, 3]));
        assert_ne!(r.scores(&[1, 2, 3]), r.scores(&[1, 2, 4]));
        assert_ne!(r.scores(&[1, 2, 3]), Scorer::Random(2).scores(&[1, 2, 3]));
        assert_eq!(r.name(), "random");
    }

    #[test]
    fn counts_survive_bytes_and_bad_bytes_are_refused() {
        let b = Bigram::train(&[3, 4, 3, 4, 5, 0], 8).unwrap();
        let bytes = b.to_bytes();
        assert_eq!(Bigram::from_bytes(&bytes).unwrap(), b);
        assert!(Bigram::from_bytes(&bytes[..bytes.len() - 1]).is_err());
        assert!(Bigram::from_bytes(b"NOTABIGR").is_err());
        assert!(Bigram::from_bytes(&[]).is_err());
        let mut bad = bytes.clone();
        let at = bad.len() - 12;
        bad[at..at + 8].copy_from_slice(&key(99, 1).to_le_bytes());
        assert!(Bigram::from_bytes(&bad).is_err());
        assert!(Bigram::train(&[9], 8).is_err());
    }
}

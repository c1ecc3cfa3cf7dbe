//! An n-gram index over a token sequence that only grows or shrinks at its
//! end: for every n-gram length in a range, where each n-gram occurred,
//! counting only occurrences whose next token is in the sequence too.

use std::collections::HashMap;

/// The longest n-gram the index takes.
pub const MAX_NGRAM: usize = 8;

/// An n-gram padded to [`MAX_NGRAM`] tokens (the padding is never a token:
/// token ids are below the vocabulary size).
type Key = [u32; MAX_NGRAM];

fn key(gram: &[u32]) -> Key {
    let mut k = [u32::MAX; MAX_NGRAM];
    k[..gram.len()].copy_from_slice(gram);
    k
}

/// Indexes `tokens[..len]`: for each length `n` in `min..=max` and each
/// n-gram ending at `e` with `e + 1 < len`, the map of `n` lists `e` under
/// the n-gram (ends in increasing order). The indexed tokens themselves
/// stay with the caller, who passes them to every call.
#[derive(Debug, Default)]
pub struct NgramIndex {
    min: usize,
    len: usize,
    maps: Vec<HashMap<Key, Vec<u32>>>,
}

impl NgramIndex {
    /// An empty index of n-grams of `min..=max` tokens (`1 ≤ min ≤ max ≤
    /// MAX_NGRAM`, checked by the caller).
    pub fn new(min: usize, max: usize) -> Self {
        Self {
            min,
            len: 0,
            maps: (min..=max).map(|_| HashMap::new()).collect(),
        }
    }

    /// Tokens indexed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Indexes `tokens[self.len()..]`, `tokens` starting with the tokens
    /// indexed so far.
    pub fn extend(&mut self, tokens: &[u32]) {
        for s in self.len..tokens.len() {
            // Token `s` is the follower of the n-grams ending at `s - 1`.
            for (j, map) in self.maps.iter_mut().enumerate() {
                let n = self.min + j;
                if s >= n {
                    map.entry(key(&tokens[s - n..s]))
                        .or_default()
                        .push((s - 1) as u32);
                }
            }
        }
        self.len = self.len.max(tokens.len());
    }

    /// Forgets tokens from `len` on; `tokens` still holds every token
    /// indexed so far.
    pub fn truncate(&mut self, tokens: &[u32], len: usize) {
        for s in (len..self.len).rev() {
            for (j, map) in self.maps.iter_mut().enumerate() {
                let n = self.min + j;
                if s >= n {
                    let k = key(&tokens[s - n..s]);
                    if let Some(ends) = map.get_mut(&k) {
                        ends.pop();
                        if ends.is_empty() {
                            map.remove(&k);
                        }
                    }
                }
            }
        }
        self.len = self.len.min(len);
    }

    /// The end of the latest indexed occurrence of `gram` (whose length is
    /// in the index's range), if any.
    pub fn last_end(&self, gram: &[u32]) -> Option<usize> {
        let j = gram.len().checked_sub(self.min)?;
        let ends = self.maps.get(j)?.get(&key(gram))?;
        ends.last().map(|&e| e as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occurrences_need_a_follower_and_truncation_restores_older_ones() {
        let t = [5, 6, 7, 5, 6, 8, 5, 6];
        let mut ix = NgramIndex::new(1, 3);
        ix.extend(&t);
        // `5 6` ends at 1 (→ 7), 4 (→ 8) and 7 (no follower yet).
        assert_eq!(ix.last_end(&[5, 6]), Some(4));
        assert_eq!(ix.last_end(&[6]), Some(4));
        assert_eq!(ix.last_end(&[8, 5, 6]), None);
        ix.truncate(&t, 5);
        assert_eq!(ix.len(), 5);
        assert_eq!(ix.last_end(&[5, 6]), Some(1));
        assert_eq!(ix.last_end(&[6, 8]), None);
        ix.extend(&t[..6]);
        assert_eq!(ix.last_end(&[5, 6]), Some(4));
        ix.truncate(&t, 0);
        assert_eq!(ix.last_end(&[5]), None);
        assert!(ix.maps.iter().all(HashMap::is_empty));
    }
}

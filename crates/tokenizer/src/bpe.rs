//! The BPE model, built from the vocabulary and the `tokenizer.ggml.merges`
//! list, tolerating merges that cannot apply as llama.cpp does.

use std::collections::HashSet;

use tokenizers::models::bpe::{BPE, Vocab};

use crate::packed::Packed;
use crate::{Result, TokenizerError};

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
pub(crate) fn build_bpe(names: &Packed<String>, raw: &[&str], ignore_merges: bool) -> Result<BPE> {
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

//! Which tokens a slim head keeps.

use arbor_gguf::Header;

use crate::DraftError;

/// `tokenizer.ggml.token_type` of normal tokens.
const NORMAL: i64 = 1;
/// `tokenizer.ggml.token_type` of unused tokens (vocabulary padding).
const UNUSED: i64 = 5;

/// The ids below `vocab` a slim head must keep whatever the corpus says:
/// every token whose type is neither normal nor unused (control tokens
/// such as `<|im_start|>`, `<|im_end|>`, `<|endoftext|>`, user-defined and
/// byte tokens), and the bos, eos, eot and padding ids of the metadata.
/// Ascending, without repeats.
pub fn special_ids(h: &Header, vocab: usize) -> Result<Vec<u32>, DraftError> {
    let mut ids = Vec::new();
    if h.get("tokenizer.ggml.token_type").is_some() {
        let types = h
            .get_i64_array("tokenizer.ggml.token_type")
            .map_err(|e| DraftError::TokenizerMetadata(e.to_string()))?;
        ids.extend(
            types
                .iter()
                .enumerate()
                .filter(|&(_, &t)| t != NORMAL && t != UNUSED)
                .map(|(i, _)| i as u64),
        );
    }
    for key in ["bos", "eos", "eot", "padding"] {
        if let Some(id) = h
            .get(&format!("tokenizer.ggml.{key}_token_id"))
            .and_then(|v| v.as_u64())
        {
            ids.push(id);
        }
    }
    let mut ids: Vec<u32> = ids
        .into_iter()
        .filter(|&i| i < vocab as u64)
        .map(|i| i as u32)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// The `k` ids a slim head keeps, ascending: all of `specials`, then the
/// other ids by descending count, ties to the lower id. `counts` has one
/// entry per vocabulary id.
pub fn kept_ids(counts: &[u64], k: usize, specials: &[u32]) -> Result<Vec<u32>, DraftError> {
    let vocab = counts.len();
    if k == 0 {
        return Err(DraftError::ZeroK);
    }
    if k > vocab {
        return Err(DraftError::KTooLarge { k, vocab });
    }
    let mut special = vec![false; vocab];
    for &id in specials {
        let slot = special
            .get_mut(id as usize)
            .ok_or(DraftError::TokenOutOfRange { id, vocab })?;
        *slot = true;
    }
    let n_special = special.iter().filter(|&&s| s).count();
    if n_special > k {
        return Err(DraftError::TooManySpecials {
            specials: n_special,
            k,
        });
    }
    let mut kept = ranked(counts, &special);
    kept.truncate(k);
    kept.sort_unstable();
    Ok(kept)
}

/// Every token of the vocabulary ranked for a head whose first rows are
/// a smaller head: the special ones (ascending), then the rest by
/// descending count in `counts`, ties to the lower id.
pub fn ranked_ids(counts: &[u64], specials: &[u32]) -> Result<Vec<u32>, DraftError> {
    let vocab = counts.len();
    let mut special = vec![false; vocab];
    for &id in specials {
        *special
            .get_mut(id as usize)
            .ok_or(DraftError::TokenOutOfRange { id, vocab })? = true;
    }
    Ok(ranked(counts, &special))
}

fn ranked(counts: &[u64], special: &[bool]) -> Vec<u32> {
    let vocab = counts.len() as u32;
    let mut others: Vec<u32> = (0..vocab).filter(|&i| !special[i as usize]).collect();
    // Stable sort on descending count keeps ascending ids among ties.
    others.sort_by_key(|&i| std::cmp::Reverse(counts[i as usize]));
    let mut out: Vec<u32> = (0..vocab).filter(|&i| special[i as usize]).collect();
    out.extend(others);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specials_first_then_by_count_ties_to_the_lower_id() {
        let counts = [5, 0, 9, 5, 1, 5, 0];
        assert_eq!(kept_ids(&counts, 3, &[6]).unwrap(), vec![0, 2, 6]);
        assert_eq!(kept_ids(&counts, 4, &[6]).unwrap(), vec![0, 2, 3, 6]);
        assert_eq!(
            kept_ids(&counts, 7, &[]).unwrap(),
            (0..7).collect::<Vec<_>>()
        );
    }

    #[test]
    fn bad_k_is_an_error() {
        let counts = [1, 2, 3];
        assert!(matches!(kept_ids(&counts, 0, &[]), Err(DraftError::ZeroK)));
        assert!(matches!(
            kept_ids(&counts, 4, &[]),
            Err(DraftError::KTooLarge { k: 4, vocab: 3 })
        ));
        assert!(matches!(
            kept_ids(&counts, 1, &[0, 2]),
            Err(DraftError::TooManySpecials { specials: 2, k: 1 })
        ));
        assert!(matches!(
            kept_ids(&counts, 2, &[7]),
            Err(DraftError::TokenOutOfRange { id: 7, vocab: 3 })
        ));
    }

    #[test]
    fn ranked_ids_put_specials_first_then_every_token_by_count() {
        let counts = [5, 0, 9, 5, 1, 5, 0];
        let r = ranked_ids(&counts, &[6]).unwrap();
        assert_eq!(r, vec![6, 2, 0, 3, 5, 4, 1]);
        // Its prefixes are the slim heads' token sets.
        let mut head = r[..4].to_vec();
        head.sort_unstable();
        assert_eq!(head, kept_ids(&counts, 4, &[6]).unwrap());
        assert!(matches!(
            ranked_ids(&counts, &[9]),
            Err(DraftError::TokenOutOfRange { id: 9, vocab: 7 })
        ));
    }
}

//! Prompt elastification: which prompt tokens a prompt level keeps.
//! Tokens the chat template writes (roles, the system turn, the markers
//! that close the user turn and open the answer) are never dropped; of the
//! rest, the highest-scoring fraction is kept, in their original order.

use crate::{Result, SloError};

/// Prompt levels: the share of scoreable prompt tokens kept.
pub const PROMPT_LEVELS: [f64; 9] = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// Tokens a prompt of `len` tokens keeps at `level` when `protected` of
/// them are never dropped: all protected ones and the ceiling of the level's
/// share of the others (at least one of those where there are any).
pub fn kept_len(len: usize, protected: usize, level: f64) -> usize {
    let free = len.saturating_sub(protected);
    let keep = ((free as f64 * level) - 1e-9).ceil().max(0.0) as usize;
    protected.min(len) + keep.clamp(usize::from(free > 0), free)
}

/// The indices kept at `level`, ascending: every protected token and the
/// highest-scoring others (ties kept in order of position).
pub fn keep(scores: &[f32], protected: &[bool], level: f64) -> Result<Vec<usize>> {
    if scores.len() != protected.len() {
        return Err(SloError::Prompt(format!(
            "{} scores for {} tokens",
            scores.len(),
            protected.len()
        )));
    }
    if !(level > 0.0 && level <= 1.0) {
        return Err(SloError::Prompt(format!(
            "prompt level {level} outside (0, 1]"
        )));
    }
    if let Some(i) = scores.iter().position(|s| s.is_nan()) {
        return Err(SloError::Prompt(format!("score of token {i} is NaN")));
    }
    let fixed = protected.iter().filter(|&&p| p).count();
    let want = kept_len(scores.len(), fixed, level) - fixed;
    let mut free: Vec<usize> = (0..scores.len()).filter(|&i| !protected[i]).collect();
    // Highest score first; equal scores by position.
    free.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut kept = vec![false; scores.len()];
    for &i in &free[..want] {
        kept[i] = true;
    }
    Ok((0..scores.len())
        .filter(|&i| kept[i] || protected[i])
        .collect())
}

/// The tokens of `full` (a prompt rendered with its text) that the
/// template wrote: those in the prefix and suffix it shares with `empty`
/// (the same prompt rendered with empty text). Without a template, pass
/// `empty` as `[]`: then only the first and last token are protected (the
/// start of the text and the token generation continues from).
pub fn protected_mask(full: &[u32], empty: &[u32]) -> Vec<bool> {
    let mut mask = vec![false; full.len()];
    if empty.is_empty() {
        if let Some(m) = mask.first_mut() {
            *m = true;
        }
        if let Some(m) = mask.last_mut() {
            *m = true;
        }
        return mask;
    }
    let prefix = full.iter().zip(empty).take_while(|(a, b)| a == b).count();
    let rest = empty.len() - prefix;
    let suffix = (full[prefix..].iter().rev())
        .zip(empty[prefix..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count()
        .min(rest);
    for m in &mut mask[..prefix] {
        *m = true;
    }
    for m in &mut mask[full.len() - suffix..] {
        *m = true;
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn template_tokens_are_found_from_an_empty_rendering() {
        // [sys, user-open, TEXT..., close, assistant-open]
        let full = [1, 2, 10, 11, 12, 3, 4];
        let empty = [1, 2, 3, 4];
        assert_eq!(
            protected_mask(&full, &empty),
            [true, true, false, false, false, true, true]
        );
        assert_eq!(protected_mask(&[5, 6, 7], &[]), [true, false, true]);
        // Text equal to the template's own tokens is not claimed twice.
        assert_eq!(protected_mask(&[1, 3, 3], &[1, 3]), [true, true, false]);
    }

    #[test]
    fn the_highest_scores_are_kept_in_order() {
        let scores = [9.0, 1.0, 5.0, 3.0, 4.0, 0.0];
        let protected = [true, false, false, false, false, true];
        assert_eq!(keep(&scores, &protected, 0.5).unwrap(), [0, 2, 4, 5]);
        assert_eq!(keep(&scores, &protected, 1.0).unwrap(), [0, 1, 2, 3, 4, 5]);
        assert_eq!(keep(&scores, &protected, 0.2).unwrap(), [0, 2, 5]);
        assert!(keep(&scores, &protected, 0.0).is_err());
        assert!(keep(&scores[..2], &protected, 0.5).is_err());
        assert!(keep(&[f32::NAN, 1.0], &[false, false], 0.5).is_err());
    }

    proptest! {
        #[test]
        fn kept_tokens_hold_the_protected_and_the_level_share(
            scores in prop::collection::vec(-10f32..10.0, 1..80),
            protect in prop::collection::vec(any::<bool>(), 80),
            level in 0.01f64..=1.0,
        ) {
            let protected = &protect[..scores.len()];
            let kept = keep(&scores, protected, level).unwrap();
            let fixed = protected.iter().filter(|&&p| p).count();
            prop_assert_eq!(kept.len(), kept_len(scores.len(), fixed, level));
            prop_assert!(kept.windows(2).all(|w| w[0] < w[1]));
            for (i, &p) in protected.iter().enumerate() {
                if p { prop_assert!(kept.contains(&i)); }
            }
            // No dropped free token outscores a kept free one.
            let lowest_kept = kept.iter().filter(|&&i| !protected[i])
                .map(|&i| scores[i]).fold(f32::INFINITY, f32::min);
            for i in (0..scores.len()).filter(|i| !kept.contains(i)) {
                prop_assert!(scores[i] <= lowest_kept);
            }
            let free = scores.len() - fixed;
            let free_kept = kept.len() - fixed;
            prop_assert!(free_kept as f64 >= level * free as f64 - 1e-6);
            prop_assert!(free_kept <= free);
        }
    }
}

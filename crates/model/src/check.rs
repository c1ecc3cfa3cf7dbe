//! The input checks every `LanguageModel` makes before a pass (the
//! decoder and models without weights, such as prompt lookup, alike).

use arbor_tensor::Mask;

use crate::{ModelError, Result};

/// A pass of `n` rows after `past` cached positions: a position per row,
/// an `n × (past + n)` mask, logit rows below `n`.
pub fn check_pass(
    n: usize,
    past: usize,
    positions: &[u32],
    mask: &Mask,
    logit_rows: &[usize],
) -> Result<()> {
    if n == 0 || positions.len() != n {
        return Err(ModelError::Input(format!(
            "{n} tokens with {} positions",
            positions.len()
        )));
    }
    if mask.rows != n || mask.cols != past + n {
        return Err(ModelError::Input(format!(
            "mask is {}x{}, expected {n}x{}",
            mask.rows,
            mask.cols,
            past + n
        )));
    }
    check_logit_rows(logit_rows, n)
}

/// Every token is in a vocabulary of `vocab`.
pub fn check_tokens(mut tokens: impl Iterator<Item = u32>, vocab: usize) -> Result<()> {
    match tokens.find(|&t| t as usize >= vocab) {
        Some(t) => Err(ModelError::Input(format!(
            "token {t} is outside the vocabulary of {vocab}"
        ))),
        None => Ok(()),
    }
}

/// Logit rows must be rows of the pass.
pub fn check_logit_rows(rows: &[usize], n: usize) -> Result<()> {
    match rows.iter().find(|&&r| r >= n) {
        Some(r) => Err(ModelError::Input(format!("logit row {r} of {n} tokens"))),
        None => Ok(()),
    }
}

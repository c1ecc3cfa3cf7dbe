//! Perplexity over a token stream, in independent windows.

use arbor_model::{LanguageModel, Mask};

use crate::{PlannerError, Result};

/// Tokens per forward pass inside a window; bounds the logits held at once
/// (rows × vocabulary floats).
const CHUNK: usize = 64;

/// `exp(mean negative log-likelihood)` of every token after the first in
/// each window of `ctx` tokens (each window starts from an empty cache).
/// `progress(done, total)` counts windows.
pub fn perplexity(
    model: &mut dyn LanguageModel,
    tokens: &[u32],
    ctx: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<f64> {
    if ctx < 2 || tokens.len() < 2 {
        return Err(PlannerError::Invalid(format!(
            "perplexity needs a window of at least 2 tokens and a text of at least 2 (got ctx {ctx}, {} tokens)",
            tokens.len()
        )));
    }
    let windows: Vec<&[u32]> = tokens.chunks(ctx).filter(|w| w.len() >= 2).collect();
    let (mut nll, mut count) = (0f64, 0usize);
    for (wi, window) in windows.iter().enumerate() {
        model.truncate_cache(0)?;
        for (ci, chunk) in window.chunks(CHUNK).enumerate() {
            let past = ci * CHUNK;
            let positions: Vec<u32> = (past..past + chunk.len()).map(|p| p as u32).collect();
            let rows: Vec<usize> = (0..chunk.len()).collect();
            let logits =
                model.forward(chunk, &positions, &Mask::causal(past, chunk.len()), &rows)?;
            for r in rows {
                let Some(&target) = window.get(past + r + 1) else {
                    break;
                };
                nll -= log_softmax_at(logits.row(r), target as usize);
                count += 1;
            }
        }
        progress(wi + 1, windows.len());
    }
    Ok((nll / count as f64).exp())
}

fn log_softmax_at(row: &[f32], i: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    row[i] as f64 - max - sum.ln()
}

/// How often `model`'s greedy choice is the next token of `text` where
/// that token is at or after `from` (a reference continuation after its
/// prompt), read in one causal pass from an empty cache: `(agreeing,
/// counted)`.
pub fn greedy_agreement(
    model: &mut dyn LanguageModel,
    text: &[u32],
    from: usize,
) -> Result<(usize, usize)> {
    if from == 0 || from >= text.len() {
        return Err(PlannerError::Invalid(format!(
            "agreement over tokens {from}.. of a text of {}",
            text.len()
        )));
    }
    model.truncate_cache(0)?;
    let (mut agree, mut count) = (0, 0);
    for (ci, chunk) in text[..text.len() - 1].chunks(CHUNK).enumerate() {
        let past = ci * CHUNK;
        let positions: Vec<u32> = (past..past + chunk.len()).map(|p| p as u32).collect();
        // Rows whose next token is counted.
        let rows: Vec<usize> = (0..chunk.len()).filter(|r| past + r + 1 >= from).collect();
        let mask = Mask::causal(past, chunk.len());
        if rows.is_empty() {
            model.forward(chunk, &positions, &mask, &[chunk.len() - 1])?;
            continue;
        }
        let logits = model.forward(chunk, &positions, &mask, &rows)?;
        for (k, &r) in rows.iter().enumerate() {
            agree += usize::from(arbor_sampling::argmax(logits.row(k)) == Some(text[past + r + 1]));
            count += 1;
        }
    }
    Ok((agree, count))
}

//! The distillation loss of PPD prompt tokens.
//!
//! A sequence's real tokens run first and stay in the cache as constants.
//! At each insertion point `p` the prompt tokens follow the first `p` real
//! tokens: prompt token `i` (0-based) sits at position `p + i`, sees cache
//! slots `0..p` and the earlier prompt tokens of its own insertion, and
//! should predict the token at `p + i + 1`. Its teacher is the model's own
//! distribution there given the true text (the logits of real token
//! `p + i`). The loss is `Σ_i α^i · KL(teacher ‖ student)`, averaged over
//! the insertion points; every insertion point of a sequence trains in one
//! pass through the mask.

use arbor_backend_burn::{BurnBackend, BurnTensor};
use arbor_mask::insertion_mask;
use arbor_model::{Decoder, LanguageModel, Mask};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

use crate::{Result, TrainError};

/// One sequence's insertion points and the teacher's answers for them.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Real tokens in the model's cache.
    pub len: usize,
    /// Prompt tokens are inserted after the first `p` real tokens, for
    /// each `p` here (`1 ≤ p`, `p + count ≤ len`).
    pub points: Vec<usize>,
    /// Prompt tokens per insertion.
    pub count: usize,
    /// The model's log-probabilities of the token at `p + i + 1`, for each
    /// point and each `i < count`: `[points × count, vocab]`, row-major.
    pub teacher: Vec<f32>,
    pub vocab: usize,
}

/// Runs `tokens` through `model` (its cache reset and left holding them)
/// and keeps the teacher rows for prompt tokens inserted at `points`.
pub fn teacher_log_probs(
    model: &mut Decoder<BurnBackend>,
    tokens: &[u32],
    points: &[usize],
    count: usize,
) -> Result<Batch> {
    let len = tokens.len();
    check_points(points, count, len)?;
    model.truncate_cache(0)?;
    let positions: Vec<u32> = (0..len as u32).collect();
    let rows: Vec<usize> = points
        .iter()
        .flat_map(|&p| (0..count).map(move |i| p + i))
        .collect();
    let logits = model.forward(tokens, &positions, &Mask::causal(0, len), &rows)?;
    let mut teacher = logits.data;
    for row in teacher.chunks_exact_mut(logits.vocab) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|&x| (x - max).exp()).sum();
        let log_z = max + sum.ln();
        row.iter_mut().for_each(|x| *x -= log_z);
    }
    Ok(Batch {
        len,
        points: points.to_vec(),
        count,
        teacher,
        vocab: logits.vocab,
    })
}

/// Insertion points must leave a real token before them and a teacher
/// row for every prompt token after them.
fn check_points(points: &[usize], count: usize, len: usize) -> Result<()> {
    if count == 0 || points.is_empty() {
        return Err(TrainError::Input(
            "no prompt tokens or no insertion points".into(),
        ));
    }
    match points.iter().find(|&&p| p == 0 || p + count > len) {
        Some(p) => Err(TrainError::Input(format!(
            "insertion point {p} with {count} prompt tokens in a sequence of {len}"
        ))),
        None => Ok(()),
    }
}

/// The loss of `prompts` (`[count, hidden]`, a tracked leaf to train it)
/// on `batch`, weighting prompt token `i` by `alpha^i`; `[1, 1]`. The
/// model's cache must hold the batch's real tokens; the pass appends the
/// prompt rows, which the caller truncates after the backward pass.
pub fn ppd_loss(
    model: &mut Decoder<BurnBackend>,
    prompts: &BurnTensor,
    batch: &Batch,
    alpha: f32,
) -> Result<BurnTensor> {
    let logits = student_logits(model, prompts, batch)?;
    distill_loss(&logits, batch, alpha, model.backend().device())
}

/// The prompt rows' logits at every insertion point of `batch`,
/// `[points × count, vocab]` (see [`ppd_loss`] for the cache). `prompts`
/// holds `count × epts` rows, prompt token by prompt token: with several
/// EPTs each point carries one chain per EPT (the ensemble mask) and a
/// prompt token's logits are the mean of its EPTs'.
pub fn student_logits(
    model: &mut Decoder<BurnBackend>,
    prompts: &BurnTensor,
    batch: &Batch,
) -> Result<BurnTensor> {
    let [rows_in, hidden] = prompts.inner().dims();
    let count = batch.count;
    if count == 0
        || rows_in == 0
        || !rows_in.is_multiple_of(count)
        || hidden != model.config().hidden
    {
        return Err(TrainError::Input(format!(
            "prompt tokens [{rows_in}, {hidden}] for batches of {count} and a model of width {}",
            model.config().hidden
        )));
    }
    let epts = rows_in / count;
    if model.cache_len() != batch.len {
        return Err(TrainError::Input(format!(
            "the cache holds {} tokens, the batch {}",
            model.cache_len(),
            batch.len
        )));
    }
    let points = batch.points.len();
    if batch.teacher.len() != points * count * batch.vocab || batch.vocab != model.head_rows() {
        return Err(TrainError::Input(format!(
            "teacher rows of {} tokens for a head of {}",
            batch.vocab,
            model.head_rows()
        )));
    }
    check_points(&batch.points, count, batch.len)?;
    let device = model.backend().device().clone();
    // Chain c = (point, EPT j); its row i is EPT j of prompt token i.
    let rows = points * epts * count;
    let picks: Vec<i64> = (0..rows)
        .map(|r| ((r % count) * epts + (r / count) % epts) as i64)
        .collect();
    let picks = Tensor::<1, Int>::from_data(TensorData::new(picks, [rows]), &device);
    let x = prompts.inner().clone().select(0, picks);
    let starts: Vec<usize> = (batch.points.iter())
        .flat_map(|&p| std::iter::repeat_n(p, epts))
        .collect();
    let (mask, positions) = insertion_mask(batch.len, &starts, count);
    let h = model.forward_hidden(BurnTensor::from_inner(x), &positions, &mask)?;
    let all: Vec<usize> = (0..rows).collect();
    let logits = model.head(&h, &all)?;
    if epts == 1 {
        return Ok(logits);
    }
    let v = batch.vocab;
    let mean = (logits.inner().clone())
        .reshape([points, epts, count, v])
        .mean_dim(1)
        .reshape([points * count, v]);
    Ok(BurnTensor::from_inner(mean))
}

/// `Σ_i alpha^i · KL(teacher ‖ student)` of the prompt rows' `logits`,
/// averaged over the insertion points; `[1, 1]`.
pub(crate) fn distill_loss(
    logits: &BurnTensor,
    batch: &Batch,
    alpha: f32,
    device: &burn::tensor::Device,
) -> Result<BurnTensor> {
    let (rows, count) = (batch.points.len() * batch.count, batch.count);
    let student = log_softmax(logits.inner().clone(), 1);
    let teacher = Tensor::<2>::from_data(
        TensorData::new(batch.teacher.clone(), [rows, batch.vocab]),
        device,
    );
    let kl = (teacher.clone().exp() * (teacher - student)).sum_dim(1);
    let n = batch.points.len() as f32;
    let weights: Vec<f32> = (0..rows)
        .map(|r| alpha.powi((r % count) as i32) / n)
        .collect();
    let weights = Tensor::<2>::from_data(TensorData::new(weights, [rows, 1]), device);
    let loss = (kl * weights).sum().reshape([1, 1]);
    Ok(BurnTensor::from_inner(loss))
}

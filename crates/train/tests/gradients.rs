//! The prompt tokens' gradient from burn's autodiff against finite
//! differences of the loss, on a tiny random model; the loss falls when
//! the prompt tokens step against it; the cache is reusable after a step;
//! ensemble prompt tokens average their chains.

use arbor_backend_burn::BurnBackend;
use arbor_model::{Decoder, LanguageModel};
use arbor_tensor::Backend;
use arbor_train::{Batch, ppd_loss, teacher_log_probs};

use crate::common;
use common::model;

const TOKENS: [u32; 12] = [3, 17, 42, 8, 8, 51, 2, 33, 19, 60, 7, 1];

/// The loss at `p` (untracked) with the cache back to the real tokens.
fn loss_at(m: &mut Decoder<BurnBackend>, p: &[f32], count: usize, batch: &Batch) -> f32 {
    let hidden = m.config().hidden;
    let x = m.backend().tensor(p, count, hidden).unwrap();
    let l = ppd_loss(m, &x, batch, 0.8).unwrap();
    let v = m.backend().to_vec(&l).unwrap()[0];
    m.truncate_cache(batch.len).unwrap();
    v
}

/// `grad` (of the loss at `p`, `rows` prompt rows) against central
/// differences at each of `coords`.
fn matches_differences(
    m: &mut Decoder<BurnBackend>,
    p: &[f32],
    rows: usize,
    batch: &Batch,
    grad: &[f32],
    coords: &[usize],
) {
    let eps = 1e-2f32;
    for &j in coords {
        let (mut up, mut down) = (p.to_vec(), p.to_vec());
        up[j] += eps;
        down[j] -= eps;
        let numeric = (loss_at(m, &up, rows, batch) - loss_at(m, &down, rows, batch)) / (2.0 * eps);
        let tol = 2e-4 + 0.01 * numeric.abs().max(grad[j].abs());
        assert!(
            (numeric - grad[j]).abs() < tol,
            "coordinate {j}: autodiff {} against {numeric}",
            grad[j]
        );
    }
}

#[test]
fn autodiff_matches_finite_differences_and_descent_lowers_the_loss() {
    let mut m = model("train-grad");
    let (count, hidden) = (3, m.config().hidden);
    let batch = teacher_log_probs(&mut m, &TOKENS, &[2, 5, 9], count).unwrap();
    assert_eq!(batch.teacher.len(), 9 * batch.vocab);
    let p: Vec<f32> = (0..count * hidden)
        .map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * 0.8)
        .collect();

    let b = m.backend().clone();
    let leaf = b.leaf(&p, count, hidden).unwrap();
    let loss = ppd_loss(&mut m, &leaf, &batch, 0.8).unwrap();
    let tracked = b.to_vec(&loss).unwrap()[0];
    let grad = b
        .gradient(&loss, &leaf)
        .unwrap()
        .expect("the loss depends on the prompts");
    m.truncate_cache(batch.len).unwrap();
    assert_eq!(grad.len(), count * hidden);
    assert!(tracked > 0.0);
    assert!((loss_at(&mut m, &p, count, &batch) - tracked).abs() < 1e-5);

    // Central differences on a spread of coordinates, every prompt token.
    let coords = [
        0,
        7,
        hidden + 3,
        hidden + 20,
        2 * hidden + 1,
        3 * hidden - 1,
    ];
    matches_differences(&mut m, &p, count, &batch, &grad, &coords);

    // A few plain gradient steps lower the loss (the cache is reused).
    let mut q = p.clone();
    let mut g = grad;
    let mut last = tracked;
    for _ in 0..3 {
        q.iter_mut().zip(&g).for_each(|(x, d)| *x -= 0.5 * d);
        let leaf = b.leaf(&q, count, hidden).unwrap();
        let loss = ppd_loss(&mut m, &leaf, &batch, 0.8).unwrap();
        let now = b.to_vec(&loss).unwrap()[0];
        g = b.gradient(&loss, &leaf).unwrap().unwrap();
        m.truncate_cache(batch.len).unwrap();
        assert!(now < last, "{now} after {last}");
        last = now;
    }
}

#[test]
fn bad_batches_are_refused() {
    let mut m = model("train-bad");
    assert!(teacher_log_probs(&mut m, &TOKENS, &[0], 2).is_err());
    assert!(teacher_log_probs(&mut m, &TOKENS, &[11], 2).is_err());
    assert!(teacher_log_probs(&mut m, &TOKENS, &[], 2).is_err());
    let batch = teacher_log_probs(&mut m, &TOKENS, &[4], 2).unwrap();
    let hidden = m.config().hidden;
    let wrong = m
        .backend()
        .tensor(&vec![0.0; 3 * hidden], 3, hidden)
        .unwrap();
    assert!(ppd_loss(&mut m, &wrong, &batch, 0.8).is_err());
    m.truncate_cache(3).unwrap();
    let right = m
        .backend()
        .tensor(&vec![0.0; 2 * hidden], 2, hidden)
        .unwrap();
    assert!(
        ppd_loss(&mut m, &right, &batch, 0.8).is_err(),
        "cache shorter than the batch"
    );
    // A loss computed from no tracked leaf has no gradient to give.
    let batch = teacher_log_probs(&mut m, &TOKENS, &[4], 2).unwrap();
    let loss = ppd_loss(&mut m, &right, &batch, 0.8).unwrap();
    let leaf = m.backend().leaf(&vec![0.0; 2 * hidden], 2, hidden).unwrap();
    assert!(m.backend().gradient(&loss, &leaf).is_err());
    m.truncate_cache(batch.len).unwrap();
    // Teacher rows of another vocabulary are refused.
    let mut other = batch.clone();
    other.vocab += 1;
    other.teacher.extend(std::iter::repeat_n(0.0, 2));
    assert!(ppd_loss(&mut m, &right, &other, 0.8).is_err());
}

#[test]
fn ensemble_prompt_tokens_average_their_chains() {
    let mut m = model("train-epts");
    let (count, hidden) = (2, m.config().hidden);
    let batch = teacher_log_probs(&mut m, &TOKENS, &[3, 7], count).unwrap();
    let p: Vec<f32> = (0..count * hidden)
        .map(|i| ((i * 53 % 89) as f32 / 89.0 - 0.5) * 0.8)
        .collect();
    // Two identical EPTs per prompt token: the ensemble is the prompt
    // token itself.
    let twice: Vec<f32> = p
        .chunks_exact(hidden)
        .flat_map(|v| v.iter().chain(v).copied())
        .collect();
    let one = loss_at(&mut m, &p, count, &batch);
    let two = loss_at(&mut m, &twice, 2 * count, &batch);
    assert!((one - two).abs() < 1e-4, "{one} against {two}");

    // Distinct EPTs: the gradient reaches each (EPT 1 of prompt token 1
    // is row 3), and matches finite differences there.
    let mut q = twice.clone();
    q.iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x += ((i * 17 % 13) as f32 - 6.0) * 0.02);
    let b = m.backend().clone();
    let leaf = b.leaf(&q, 2 * count, hidden).unwrap();
    let loss = ppd_loss(&mut m, &leaf, &batch, 0.8).unwrap();
    let grad = b.gradient(&loss, &leaf).unwrap().unwrap();
    m.truncate_cache(batch.len).unwrap();
    matches_differences(
        &mut m,
        &q,
        2 * count,
        &batch,
        &grad,
        &[5, hidden + 9, 3 * hidden + 2],
    );
}

//! LoRA training on a tiny random model: the adapters' gradients against
//! finite differences of the loss, steps that lower it, and a run stopped
//! and resumed through the adapter file that ends where an unbroken run does.

use arbor_elastic::LoraFile;
use arbor_model::{LanguageModel, Proj};
use arbor_train::{AdamState, AdamW, attach_lora, lora_step, mean_loss};

use crate::common;

const TEXT: [u32; 14] = [3, 17, 42, 8, 8, 51, 2, 33, 19, 60, 7, 1, 12, 40];

/// Adapters on every projection with small non-zero `b`, so every factor
/// has a gradient.
fn adapters(m: &arbor_model::Decoder<arbor_backend_burn::BurnBackend>, seed: u64) -> LoraFile {
    let mut f = LoraFile::new(m.config(), None, 1.0, 2, &Proj::ALL, seed).unwrap();
    let mut flat = f.flatten();
    for (i, v) in flat.iter_mut().enumerate() {
        if *v == 0.0 {
            *v = ((i * 7919 % 61) as f32 / 61.0 - 0.5) * 0.2;
        }
    }
    f.unflatten(&flat).unwrap();
    f
}

fn loss_with(m: &mut arbor_model::Decoder<arbor_backend_burn::BurnBackend>, f: &LoraFile) -> f64 {
    attach_lora(m, f).unwrap();
    let l = mean_loss(m, &[TEXT.to_vec()]).unwrap();
    m.detach_lora(1.0).unwrap();
    l
}

#[test]
fn gradients_match_finite_differences() {
    let mut m = common::model("lora-grad");
    let f = adapters(&m, 3);
    let base = f.flatten();
    // A step at a tiny learning rate without clipping or moments moves each
    // parameter by -lr·sign-ish; recover the raw gradient instead through
    // plain SGD: AdamW's first step is lr·g/|g|, so compare signs and the
    // finite differences' magnitudes on parameters with clear gradients.
    let opt = AdamW {
        clip_norm: 0.0,
        ..AdamW::default()
    };
    let mut g = f.clone();
    let mut state = AdamState::default();
    let loss = lora_step(&mut m, &mut g, &TEXT, 1e-3, &opt, &mut state).unwrap();
    assert!(
        (loss - loss_with(&mut m, &f)).abs() < 1e-4,
        "step loss {loss}"
    );
    let grad: Vec<f32> = state.m.iter().map(|m| m / 0.1).collect();
    let mut checked = 0;
    let eps = 1e-2f32;
    for i in (0..base.len()).step_by(base.len() / 40 + 1) {
        let mut hi = f.clone();
        let mut p = base.clone();
        p[i] += eps;
        hi.unflatten(&p).unwrap();
        let mut lo = f.clone();
        p[i] -= 2.0 * eps;
        lo.unflatten(&p).unwrap();
        let fd = ((loss_with(&mut m, &hi) - loss_with(&mut m, &lo)) / (2.0 * eps as f64)) as f32;
        if fd.abs() > 1e-3 {
            assert!(
                (grad[i] - fd).abs() <= 0.05 * fd.abs() + 1e-4,
                "parameter {i}: autodiff {} against finite differences {fd}",
                grad[i]
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "only {checked} parameters had a clear gradient"
    );
}

#[test]
fn steps_lower_the_loss_and_a_resumed_run_matches() {
    let mut m = common::model("lora-steps");
    let fresh = LoraFile::new(m.config(), None, 1.0, 4, &Proj::ALL, 9).unwrap();
    let start = loss_with(&mut m, &fresh);
    assert!(
        (start - mean_loss(&mut m, &[TEXT.to_vec()]).unwrap()).abs() < 1e-9,
        "b = 0 adds nothing"
    );
    let opt = AdamW::default();
    let train = |m: &mut _, f: &mut LoraFile, state: &mut AdamState, n: usize| {
        for _ in 0..n {
            lora_step(m, f, &TEXT, 1e-2, &opt, state).unwrap();
        }
    };
    let (mut whole, mut s) = (fresh.clone(), AdamState::default());
    train(&mut m, &mut whole, &mut s, 12);
    let end = loss_with(&mut m, &whole);
    assert!(
        end < start - 0.1,
        "12 steps took the loss from {start} to {end}"
    );

    // Six steps, through the file (with AdamW's moments), six more.
    let (mut half, mut s2) = (fresh, AdamState::default());
    train(&mut m, &mut half, &mut s2, 6);
    half.adam = Some((s2.m.clone(), s2.v.clone()));
    let mut back = LoraFile::from_bytes(&half.to_bytes().unwrap()).unwrap();
    let (m2, v2) = back.adam.take().unwrap();
    let mut s3 = AdamState {
        m: m2,
        v: v2,
        step: 6,
    };
    train(&mut m, &mut back, &mut s3, 6);
    assert_eq!(back.flatten(), whole.flatten());
}

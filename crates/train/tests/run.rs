//! A training run on a tiny random model, with plain and with ensemble
//! prompt tokens: steps lower the held-out loss, validation counts every
//! distance, and a run stopped at its checkpoint goes on exactly as one
//! that never stopped.

use arbor_backend_burn::BurnBackend;
use arbor_model::{Decoder, LanguageModel};
use arbor_ppd::PromptFile;
use arbor_train::{Example, PromptTraining, Settings};

use crate::common;

fn model(tag: &str) -> Decoder<BurnBackend> {
    common::tiny(tag, 9)
}

fn examples(n: usize, salt: u32) -> Vec<Example> {
    (0..n as u32)
        .map(|e| {
            let tokens: Vec<u32> = (0..24u32).map(|i| (i * 7 + e * 13 + salt) % 64).collect();
            Example {
                tokens,
                span: 6..24,
            }
        })
        .collect()
}

fn settings() -> Settings {
    Settings {
        points: 6,
        steps: Some(12),
        seconds: None,
        ..Settings::default()
    }
}

#[test]
fn steps_lower_the_held_out_loss_and_a_resumed_run_matches() {
    // Plain prompt tokens, then two ensemble prompt tokens each.
    for epts in [1, 2] {
        train_and_resume(Settings { epts, ..settings() });
    }
}

fn train_and_resume(settings: Settings) {
    let mut m = model("train-run");
    let hidden = m.config().hidden;
    let init = m.embeddings(&[1, 2, 3]).unwrap();
    let (train, held_out) = (examples(4, 0), examples(2, 5));

    let mut run = PromptTraining::new(settings.clone(), hidden, init.clone()).unwrap();
    assert_eq!(run.prompts.len(), 3 * settings.epts * hidden);
    let (before, table) = run.validate(&mut m, &held_out).unwrap();
    assert_eq!((table.distances(), table.ranks()), (3, 10));
    assert_eq!(before.top1.len(), 3);
    assert!(before.top1.iter().zip(&before.top5).all(|(a, b)| a <= b));
    while !run.done() {
        let ex = &train[run.clock.step as usize % train.len()];
        run.step(&mut m, ex, run.lr()).unwrap();
    }
    assert_eq!(run.clock.step, 12);
    assert_eq!(run.adam.step, 12);
    let (after, _) = run.validate(&mut m, &held_out).unwrap();
    assert!(
        after.loss < before.loss,
        "{} -> {}",
        after.loss,
        before.loss
    );

    // Stop after 5 steps, go through the checkpoint bytes, go on.
    let mut first = PromptTraining::new(settings, hidden, init).unwrap();
    for _ in 0..5 {
        let ex = &train[first.clock.step as usize % train.len()];
        first.step(&mut m, ex, first.lr()).unwrap();
    }
    let bytes = first.to_file(&Default::default()).to_bytes().unwrap();
    let mut resumed = PromptTraining::from_file(&PromptFile::from_bytes(&bytes).unwrap()).unwrap();
    while !resumed.done() {
        let ex = &train[resumed.clock.step as usize % train.len()];
        resumed.step(&mut m, ex, resumed.lr()).unwrap();
    }
    assert_eq!(resumed.prompts, run.prompts);
    assert_eq!(resumed.losses, run.losses);
}

#[test]
fn a_sequence_without_room_is_a_typed_error() {
    let mut m = model("train-run-room");
    let hidden = m.config().hidden;
    let mut run = PromptTraining::new(settings(), hidden, vec![0.0; 3 * hidden]).unwrap();
    let ex = Example {
        tokens: vec![1, 2, 3, 4],
        span: 3..4,
    };
    assert!(run.step(&mut m, &ex, 0.01).is_err());
    assert_eq!(run.clock.step, 0);
}

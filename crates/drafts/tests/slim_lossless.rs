//! A slim draft never changes greedy output: speculative decoding with a
//! slim draft (chain and tree) gives the target's own greedy tokens, token
//! for token; sampled decoding with it runs and stays in the vocabulary.

use crate::slim_common as common;

use arbor_drafts::slim::{Quant, SlimDraft, SlimOptions, derive};
use arbor_gguf::GgmlType;
use arbor_model::LanguageModel;
use arbor_sampling::SamplingParams;
use arbor_speculative::{
    DecodeOptions, Decoding, GrowConfig, Strategy, TreeConfig, Verification, decode,
};
use common::*;

fn opts(strategy: Strategy, sampling: SamplingParams) -> DecodeOptions {
    DecodeOptions {
        max_tokens: 24,
        sampling,
        stop_tokens: vec![],
        strategy,
        verification: Verification::Exact,
    }
}

fn strategies() -> Vec<Strategy> {
    vec![
        Strategy::new(Decoding::Chain { gamma: 4 }),
        Strategy::new(Decoding::StaticTree { width: 2, depth: 3 }),
        Strategy::new(Decoding::Tree(TreeConfig {
            grow: GrowConfig {
                branch_threshold: 0.1,
                max_children: 3,
            },
            alpha: 0.01,
            max_nodes: 16,
            profile: None,
            draft_profile: None,
            provisional: false,
            fallback: false,
            draft_prompts: None,
        })),
    ]
}

/// Slim drafts of the target's own weights (so many tokens are accepted)
/// and of another model, with a small and a large K.
fn slim_drafts() -> Vec<(String, std::path::PathBuf)> {
    let mut out = Vec::new();
    for (seed, k, quant) in [
        (7, 24, Quant::Keep),
        (7, 150, Quant::Q5_0),
        (8, 60, Quant::Q8_0),
    ] {
        let src = write_model(&tiny(seed, false, GgmlType::F32), "t");
        let path = temp("lossless");
        derive(
            &src,
            &path,
            &SlimOptions::new(k, quant),
            &counts_for(&src),
            &mut |_, _| {},
        )
        .unwrap();
        std::fs::remove_file(src).ok();
        out.push((format!("seed {seed}, K {k}, {quant}"), path));
    }
    out
}

#[test]
fn greedy_output_is_the_targets() {
    let target_path = write_model(&tiny(7, false, GgmlType::F32), "t");
    let mut target = load(&target_path);
    let prompts: [&[u32]; 2] = [&[1, 2, 3], &[250, 17, 42, 9, 299]];
    let mut accepted = 0;
    for (name, path) in slim_drafts() {
        let mut draft = load(&path);
        assert_eq!(draft.config().vocab_size, VOCAB);
        for prompt in prompts {
            let plain = decode(
                target.as_mut(),
                None,
                prompt,
                &opts(Strategy::default(), SamplingParams::default()),
                &mut |_| {},
            )
            .unwrap();
            for s in strategies() {
                let spec = decode(
                    target.as_mut(),
                    Some(draft.as_mut()),
                    prompt,
                    &opts(s.clone(), SamplingParams::default()),
                    &mut |_| {},
                )
                .unwrap();
                assert_eq!(
                    spec.tokens, plain.tokens,
                    "{s:?} with the slim draft {name}"
                );
                accepted += spec.stats.accepted_draft_tokens;
            }
        }
        std::fs::remove_file(path).ok();
    }
    // The drafts of the target's own weights are right often enough for
    // the comparison to cover accepted tokens, not only rejections.
    assert!(accepted > 10, "{accepted} draft tokens accepted");
    std::fs::remove_file(target_path).ok();
}

#[test]
fn sampled_decoding_with_a_slim_draft_runs() {
    let target_path = write_model(&tiny(7, false, GgmlType::F32), "t");
    let mut target = load(&target_path);
    let sampling = SamplingParams {
        temperature: 0.8,
        seed: 11,
        ..SamplingParams::default()
    };
    for (name, path) in slim_drafts() {
        let mut draft = load(&path);
        for s in strategies() {
            let spec = decode(
                target.as_mut(),
                Some(draft.as_mut()),
                &[1, 2, 3],
                &opts(s.clone(), sampling),
                &mut |_| {},
            )
            .unwrap();
            assert_eq!(spec.tokens.len(), 24, "{s:?} with {name}");
            assert!(spec.tokens.iter().all(|&t| (t as usize) < VOCAB));
            assert!(spec.stats.accepted_draft_tokens <= spec.stats.draft_tokens);
        }
        std::fs::remove_file(path).ok();
    }
    std::fs::remove_file(target_path).ok();
}

#[test]
fn widening_puts_each_logit_at_its_token() {
    let src = write_model(&tiny(9, false, GgmlType::F32), "t");
    let slim = temp("widen");
    derive(
        &src,
        &slim,
        &SlimOptions::new(32, Quant::Keep),
        &counts_for(&src),
        &mut |_, _| {},
    )
    .unwrap();
    let file = arbor_gguf::GgufFile::open(&slim).unwrap();
    let ids = arbor_drafts::slim::slim_token_ids(file.header())
        .unwrap()
        .unwrap();
    let bare = arbor_model::Decoder::load(
        arbor_backend_candle::CandleBackend::new(),
        &file,
        &mut |_, _| {},
    )
    .unwrap();
    let mut bare_again = arbor_model::Decoder::load(
        arbor_backend_candle::CandleBackend::new(),
        &file,
        &mut |_, _| {},
    )
    .unwrap();
    let mut wide = SlimDraft::new(Box::new(bare), ids.clone()).unwrap();
    let narrow = bare_again.step(&[4, 8, 15]).unwrap();
    let widened = wide.step(&[4, 8, 15]).unwrap();
    assert_eq!(narrow.len(), 32);
    assert_eq!(widened.len(), VOCAB);
    for (t, &v) in widened.iter().enumerate() {
        match ids.iter().position(|&id| id as usize == t) {
            Some(i) => assert_eq!(v, narrow[i]),
            None => assert_eq!(v, f32::NEG_INFINITY),
        }
    }
    // Ids that are not increasing, or outside the vocabulary, are refused.
    let again = || {
        arbor_model::Decoder::load(
            arbor_backend_candle::CandleBackend::new(),
            &file,
            &mut |_, _| {},
        )
        .unwrap()
    };
    assert!(SlimDraft::new(Box::new(again()), vec![3, 2]).is_err());
    assert!(SlimDraft::new(Box::new(again()), vec![1, VOCAB as u32]).is_err());
    // The wrapper refuses a head whose rows are not its ids.
    let mut wrong = SlimDraft::new(Box::new(again()), vec![0, 1]).unwrap();
    assert!(wrong.step(&[1]).is_err());
    std::fs::remove_file(src).ok();
    std::fs::remove_file(slim).ok();
}

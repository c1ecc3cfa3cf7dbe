//! Greedy speculative decoding with a cheap draft (prompt lookup, a self
//! draft of a target with streamed layers) gives the target's own output,
//! token for token, for chain, tree and tree-provisional decoding; and the
//! drafts get tokens accepted.

use crate::common;

use arbor_drafts::PromptLookup;
use arbor_model::LanguageModel;
use arbor_sampling::SamplingParams;
use arbor_speculative::{
    DecodeOptions, Decoded, Decoding, Strategy, TreeConfig, Verification, decode,
};
use std::sync::Arc;

use arbor_model::testing::{Drafting, Turns};
use common::{Model, TempFile, load_streamed_with, tiny};

fn opts(decoding: Decoding, max_tokens: usize) -> DecodeOptions {
    DecodeOptions {
        max_tokens,
        sampling: SamplingParams::default(),
        stop_tokens: vec![],
        strategy: Strategy::new(decoding),
        verification: Verification::Exact,
    }
}

fn strategies() -> Vec<Decoding> {
    vec![
        Decoding::Chain { gamma: 4 },
        Decoding::StaticTree { width: 2, depth: 3 },
        Decoding::Tree(TreeConfig::default()),
        Decoding::Tree(TreeConfig {
            provisional: true,
            ..TreeConfig::default()
        }),
    ]
}

/// Prompts: random, and repetitive (lookup's case).
fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![5, 77, 3, 201, 9],
        vec![10, 11, 12, 13, 10, 11, 12, 13, 10, 11],
        (0..40).map(|i| (i * 37 % 23) as u32).collect(),
    ]
}

/// The target, with its streamed layers' waits giving `turns` to a draft
/// wrapped by [`check`].
fn target_with_streamed_layers(tmp: &TempFile, turns: &Arc<Turns>) -> Model {
    let resident = [true, false, true, true, false, true];
    load_streamed_with(tmp, &resident, Some(turns.clone()))
}

fn check(
    target: &mut Model,
    draft: Box<dyn LanguageModel>,
    turns: &Arc<Turns>,
    name: &str,
) -> (usize, usize) {
    let draft = &mut Drafting {
        inner: draft,
        turns: turns.clone(),
    };
    let (mut accepted, mut provisional) = (0, 0);
    for prompt in prompts() {
        let plain = decode(
            target,
            None,
            &prompt,
            &opts(Decoding::Autoregressive, 40),
            &mut |_| {},
        )
        .unwrap();
        for d in strategies() {
            draft.truncate_cache(0).unwrap();
            let spec: Decoded = decode(
                target,
                Some(draft),
                &prompt,
                &opts(d.clone(), 40),
                &mut |_| {},
            )
            .unwrap();
            assert_eq!(spec.tokens, plain.tokens, "{name} with {d:?} on {prompt:?}");
            assert!(spec.stats.accepted_draft_tokens <= spec.stats.draft_tokens);
            accepted += spec.stats.accepted_draft_tokens;
            provisional += spec.stats.provisional_tokens;
        }
    }
    (accepted, provisional)
}

#[test]
fn prompt_lookup_is_lossless() {
    let tmp = TempFile::write(&tiny(6, false, 21).writer(), "lossless-lookup");
    let turns = Turns::new();
    let mut target = target_with_streamed_layers(&tmp, &turns);
    let lookup = Box::new(PromptLookup::new(target.config().clone()));
    let (accepted, _) = check(&mut target, lookup, &turns, "lookup");
    assert!(accepted > 0, "prompt lookup was never accepted");
}

#[test]
fn a_self_draft_is_lossless() {
    for tied in [false, true] {
        let tmp = TempFile::write(&tiny(6, tied, 22).writer(), "lossless-self");
        let turns = Turns::new();
        let mut target = target_with_streamed_layers(&tmp, &turns);
        let draft = Box::new(target.self_draft().unwrap());
        let (accepted, provisional) = check(&mut target, draft, &turns, "self draft");
        assert!(accepted > 0, "the self draft was never accepted");
        assert!(provisional > 0, "no provisional round ran");
    }
}

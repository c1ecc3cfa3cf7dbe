//! Speculative strategies on random tiny models: greedy outputs equal the
//! target's own, token for token, whatever the draft (perfect, poor,
//! adversarial); sampled outputs follow the target's distribution.

use crate::common;

use std::sync::Arc;

use arbor_model::LanguageModel;
use arbor_model::testing::TinyModel;
use arbor_sampling::SamplingParams;
use arbor_speculative::{
    Control, DecodeOptions, Decoding, DraftPrompts, Event, GrowConfig, LatencyProfile,
    PromptTokens, StopReason, Strategy, TreeConfig, decode, decode_with,
};
use common::models::{DraftKind, Reshaped, draft, model, opts, target, tiny};
use proptest::prelude::*;
use proptest::strategy::Strategy as _;

fn profile() -> LatencyProfile {
    // Verification cost rising with size, as on a CPU.
    LatencyProfile {
        points: vec![(1, 0.040), (4, 0.050), (8, 0.070), (16, 0.120), (64, 0.5)],
    }
}

fn scaled(p: &LatencyProfile, f: f64) -> LatencyProfile {
    LatencyProfile {
        points: p.points.iter().map(|&(n, s)| (n, s * f)).collect(),
    }
}

fn strategies() -> impl proptest::strategy::Strategy<Value = arbor_speculative::Strategy> {
    prop_oneof![
        (1usize..7).prop_map(|gamma| Strategy::new(Decoding::Chain { gamma })),
        (1usize..4, 1usize..4)
            .prop_map(|(width, depth)| Strategy::new(Decoding::StaticTree { width, depth })),
        (
            0.001f32..0.5,
            1usize..40,
            0.05f32..0.6,
            1usize..4,
            0u8..4,
            any::<bool>(),
            any::<bool>(),
            0u8..3,
            any::<u64>()
        )
            .prop_map(
                |(
                    alpha,
                    max_nodes,
                    branch_threshold,
                    max_children,
                    profiles,
                    provisional,
                    fallback,
                    guessing,
                    seed,
                )| {
                    // 0: no profiles; 1: target only; 2: a cheap draft (drafting
                    // pays); 3: a draft as slow as the target (plain decoding).
                    let draft_cost = if profiles == 2 { 0.1 } else { 1.0 };
                    Strategy::new(Decoding::Tree(TreeConfig {
                        grow: GrowConfig {
                            branch_threshold,
                            max_children,
                        },
                        alpha,
                        max_nodes,
                        profile: (profiles > 0).then(profile),
                        draft_profile: (profiles > 1).then(|| scaled(&profile(), draft_cost)),
                        // Without weight waits, provisional rounds still carry
                        // the draft's unsent subtree into the next round.
                        provisional,
                        fallback,
                        // tree-ppd: random prompt tokens for the draft, each
                        // step carrying 1..=3 of them or as many as its
                        // profile makes worth it.
                        draft_prompts: (guessing > 0).then(|| DraftPrompts {
                            prompts: Some(Arc::new(draft_prompt_tokens(seed))),
                            count: (guessing == 1).then_some(1 + seed as usize % 3),
                        }),
                    }))
                },
            ),
    ]
}

/// Three random prompt tokens for the tiny draft, of one or two EPTs, with
/// a made-up accuracy table.
fn draft_prompt_tokens(seed: u64) -> PromptTokens {
    let hidden = TinyModel::default().hidden;
    let epts = 1 + seed as usize % 2;
    let mut rng = arbor_sampling::Rng::new(seed);
    PromptTokens {
        hidden,
        epts,
        vectors: (0..3 * epts * hidden)
            .map(|_| rng.next_f64() as f32 - 0.5)
            .collect(),
        accuracy: arbor_ppd::Accuracy::new(vec![vec![0.6], vec![0.4], vec![0.3]]).unwrap(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: common::cases(48), ..ProptestConfig::default() })]

    #[test]
    fn greedy_speculation_equals_target_only_decoding(
        prompt in prop::collection::vec(0u32..300, 1..24),
        max_tokens in 0usize..48,
        stop in prop::collection::vec(0u32..300, 0..3),
        strategy in strategies(),
        kind in prop_oneof![Just(DraftKind::Perfect), Just(DraftKind::Poor), Just(DraftKind::Adversarial)],
    ) {
        let mut t = target(300);
        let plain = decode(t.as_mut(), None, &prompt, &opts(Strategy::default(), max_tokens, stop.clone()), &mut |_| {}).unwrap();
        let mut d = draft(kind, 300);
        let mut streamed = Vec::new();
        let spec = decode(t.as_mut(), Some(d.as_mut()), &prompt, &opts(strategy.clone(), max_tokens, stop), &mut |e| if let Event::Confirm(tok) = e { streamed.extend_from_slice(tok) }).unwrap();
        prop_assert_eq!(&spec.tokens, &plain.tokens, "{:?} with a {:?} draft", strategy, kind);
        prop_assert_eq!(spec.stats.stop, plain.stats.stop);
        prop_assert_eq!(&streamed, &spec.tokens);
        prop_assert!(spec.stats.accepted_draft_tokens <= spec.stats.draft_tokens);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: common::cases(24), ..ProptestConfig::default() })]

    /// Penalties and biases shape every row a token is chosen from, tree
    /// rows included (with their path's tokens counted): speculation under
    /// them equals one-token decoding under them, and the scores of the
    /// chosen tokens are the same, read from tree rows or single rows.
    #[test]
    fn shaped_speculation_equals_shaped_target_only_decoding_with_the_same_scores(
        prompt in prop::collection::vec(0u32..300, 1..16),
        max_tokens in 1usize..32,
        strategy in strategies(),
        kind in prop_oneof![Just(DraftKind::Perfect), Just(DraftKind::Poor)],
        presence in -2.0f32..2.0,
        frequency in -2.0f32..2.0,
        bias in prop::collection::vec((0u32..300, -100.0f32..100.0), 0..4),
    ) {
        let o = |s: Strategy| opts(s, max_tokens, vec![]);
        let shaped = || arbor_sampling::Shaping::new(presence, frequency, &bias, 300).unwrap();
        let (a, b) = (shaped(), shaped());
        let control = |c| Control { constraint: Some(c), logprobs: Some(3), ..Control::default() };
        let mut t = target(300);
        let plain = decode_with(t.as_mut(), None, &prompt, &o(Strategy::default()), control(&a), &mut |_| {}).unwrap();
        let mut d = draft(kind, 300);
        let spec = decode_with(t.as_mut(), Some(d.as_mut()), &prompt, &o(strategy.clone()), control(&b), &mut |_| {}).unwrap();
        prop_assert_eq!(&spec.tokens, &plain.tokens, "{:?}", strategy);
        prop_assert_eq!(spec.logprobs.len(), spec.tokens.len());
        for (s, p) in spec.logprobs.iter().zip(&plain.logprobs) {
            prop_assert_eq!(s.token, p.token);
            prop_assert!((s.logprob - p.logprob).abs() < 1e-3, "{:?} vs {:?}", s, p);
            prop_assert!(s.logprob <= 0.0 && s.top.len() == 3);
            prop_assert!(s.top[0].1 >= s.top[1].1 && s.top[1].1 >= s.top[2].1);
        }
    }
}

#[test]
fn biases_steer_and_scores_follow_the_choice() {
    let prompt = [1, 2, 3];
    let mut t = target(300);
    let o = opts(Strategy::default(), 12, vec![]);
    let plain = decode(t.as_mut(), None, &prompt, &o, &mut |_| {}).unwrap();
    // Token 5 pushed far above every other: it is chosen every time, with
    // a probability of almost 1.
    let up = arbor_sampling::Shaping::new(0.0, 0.0, &[(5, 100.0)], 300).unwrap();
    let control = Control {
        constraint: Some(&up),
        logprobs: Some(2),
        ..Control::default()
    };
    let steered = decode_with(t.as_mut(), None, &prompt, &o, control, &mut |_| {}).unwrap();
    assert_ne!(steered.tokens, plain.tokens);
    assert!(
        steered.tokens.iter().all(|&t| t == 5),
        "{:?}",
        steered.tokens
    );
    for s in &steered.logprobs {
        assert_eq!((s.token, s.top[0].0), (5, 5));
        assert!(s.logprob > -1e-3, "{s:?}");
    }
    // Just enough bias for 5 to win the first row, and penalties on top:
    // each 5 costs more, until another token wins.
    let all = Control {
        logprobs: Some(300),
        ..Control::default()
    };
    let scored = decode_with(t.as_mut(), None, &prompt, &o, all, &mut |_| {}).unwrap();
    let row = &scored.logprobs[0];
    let of_5 = row.top.iter().find(|s| s.0 == 5).unwrap().1;
    let gap = row.top[0].1 - of_5;
    let tiring = arbor_sampling::Shaping::new(2.0, 2.0, &[(5, gap + 1.0)], 300).unwrap();
    let control = Control {
        constraint: Some(&tiring),
        ..Control::default()
    };
    let tired = decode_with(t.as_mut(), None, &prompt, &o, control, &mut |_| {}).unwrap();
    let fives = tired.tokens.iter().filter(|&&t| t == 5).count();
    assert_eq!(tired.tokens[0], 5);
    assert!(fives < tired.tokens.len(), "{:?}", tired.tokens);
    assert!(tired.logprobs.is_empty(), "no scores unless asked");
}

#[test]
fn a_perfect_draft_is_accepted_and_a_bad_one_is_not() {
    let prompt = [1, 2, 3];
    let tree = Strategy::new(Decoding::Tree(TreeConfig::default()));
    let mut t = target(300);
    let mut good = draft(DraftKind::Perfect, 300);
    let g = decode(
        t.as_mut(),
        Some(good.as_mut()),
        &prompt,
        &opts(tree.clone(), 40, vec![]),
        &mut |_| {},
    )
    .unwrap();
    assert!(
        g.stats.mean_accepted() > 3.0,
        "perfect draft: {:?}",
        g.stats
    );
    let mut bad = draft(DraftKind::Adversarial, 300);
    let b = decode(
        t.as_mut(),
        Some(bad.as_mut()),
        &prompt,
        &opts(tree, 40, vec![]),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(
        b.stats.accepted_draft_tokens, 0,
        "adversarial draft: {:?}",
        b.stats
    );
    assert_eq!(b.tokens, g.tokens);
    assert_eq!(g.stats.stop, StopReason::MaxTokens);
}

#[test]
fn bad_requests_are_errors() {
    let mut t = target(300);
    let chain = opts(Strategy::new(Decoding::Chain { gamma: 3 }), 4, vec![]);
    assert!(
        decode(t.as_mut(), None, &[1], &chain, &mut |_| {}).is_err(),
        "no draft"
    );
    let mut other = tiny(&model(3, 200), "spec-small-vocab");
    let err = decode(t.as_mut(), Some(other.as_mut()), &[1], &chain, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("vocabulary"), "{err}");
    let zero = opts(Strategy::new(Decoding::Chain { gamma: 0 }), 4, vec![]);
    let mut d = draft(DraftKind::Perfect, 300);
    assert!(decode(t.as_mut(), Some(d.as_mut()), &[1], &zero, &mut |_| {}).is_err());
    let ar = opts(Strategy::default(), 4, vec![]);
    assert!(
        decode(t.as_mut(), None, &[], &ar, &mut |_| {}).is_err(),
        "empty prompt"
    );
}

/// Upper 0.1% point of χ² with `k` degrees of freedom (Wilson–Hilferty).
fn chi2_critical(k: f64) -> f64 {
    let z = 3.09;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// At temperature 1 the tree strategy's first three tokens follow the
/// target's distribution: χ² over all 125 sequences of a 5-token
/// vocabulary, 12,000 seeds, with a draft that differs from the target.
#[test]
fn tree_sampling_matches_the_target_distribution() {
    let vocab = 5;
    let mut t: Box<dyn LanguageModel> = Box::new(Reshaped {
        inner: tiny(&model(11, vocab), "chi-target"),
        scale: 2.0,
    });
    // The same network, flatter: close to the target but not equal.
    let mut d: Box<dyn LanguageModel> = Box::new(Reshaped {
        inner: tiny(&model(11, vocab), "chi-draft"),
        scale: 1.2,
    });
    let prompt = [1u32, 3];
    let softmax = |l: &[f32]| arbor_sampling::softmax(l, 1.0);
    // Exact sequence probabilities from the target, step by step.
    let mut expected = vec![0f64; vocab * vocab * vocab];
    let p0 = softmax(&t.step(&prompt).unwrap());
    for a in 0..vocab {
        t.truncate_cache(prompt.len()).unwrap();
        let p1 = softmax(&t.step(&[a as u32]).unwrap());
        for b in 0..vocab {
            t.truncate_cache(prompt.len() + 1).unwrap();
            let p2 = softmax(&t.step(&[b as u32]).unwrap());
            for c in 0..vocab {
                expected[(a * vocab + b) * vocab + c] = (p0[a] * p1[b] * p2[c]) as f64;
            }
        }
    }
    let n = 12_000;
    let mut counts = vec![0u64; expected.len()];
    let mut accepted = 0;
    for seed in 0..n {
        let o = DecodeOptions {
            sampling: SamplingParams {
                temperature: 1.0,
                seed,
                ..SamplingParams::default()
            },
            ..opts(
                Strategy::new(Decoding::Tree(TreeConfig {
                    grow: GrowConfig {
                        branch_threshold: 0.2,
                        max_children: 3,
                    },
                    alpha: 0.001,
                    ..TreeConfig::default()
                })),
                3,
                vec![],
            )
        };
        let out = decode(t.as_mut(), Some(d.as_mut()), &prompt, &o, &mut |_| {}).unwrap();
        let s = &out.tokens;
        counts[(s[0] as usize * vocab + s[1] as usize) * vocab + s[2] as usize] += 1;
        accepted += out.stats.accepted_draft_tokens;
    }
    // Cells expected fewer than 5 times are pooled into one (the usual
    // condition for the χ² approximation to hold).
    let (mut chi2, mut cells, mut pooled_obs, mut pooled_exp) = (0.0, 0, 0.0, 0.0);
    for (&c, &e) in counts.iter().zip(&expected) {
        let e = e * n as f64;
        if e < 5.0 {
            pooled_obs += c as f64;
            pooled_exp += e;
        } else {
            chi2 += (c as f64 - e).powi(2) / e;
            cells += 1;
        }
    }
    if pooled_exp > 0.0 {
        chi2 += (pooled_obs - pooled_exp).powi(2) / pooled_exp;
        cells += 1;
    }
    assert!(cells > 30, "too few cells to test: {cells}");
    let critical = chi2_critical((cells - 1) as f64);
    assert!(
        chi2 < critical,
        "χ² = {chi2:.1} ≥ {critical:.1} over {cells} cells"
    );
    assert!(
        accepted > n as usize / 4,
        "the draft was hardly used: {accepted} accepted"
    );
}

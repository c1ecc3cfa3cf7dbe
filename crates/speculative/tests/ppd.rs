//! Parallel prompt decoding on random tiny models: greedy output equals the
//! target's own token for token, whatever the prompt tokens (random
//! vectors, or embeddings of tokens the target writes, which guess often);
//! candidates do get accepted; sampled ppd equals plain sampling at the
//! same seed; bad prompt tokens are typed errors. `tree-ppd` (the draft
//! guessing with its own prompt tokens) grows several draft tokens per
//! draft pass and keeps the target's output.

use crate::common;

use std::sync::Arc;

use arbor_backend_candle::CandleBackend;
use arbor_gguf::GgufFile;
use arbor_model::testing::{TinyModel, write_temp};
use arbor_model::{Config, Decoder, LanguageModel, Logits, Mask, Result, Row};
use arbor_ppd::Accuracy;
use arbor_sampling::SamplingParams;
use arbor_speculative::{
    DecodeOptions, Decoded, Decoding, DraftPrompts, GrowConfig, LatencyProfile, PpdConfig,
    PromptTokens, SpecError, Strategy, TreeConfig, Verification, decode,
};
use proptest::prelude::*;

/// A random qwen2-shaped model made confident (logits × 12), taking
/// embedding rows; it keeps its last pass for later logits when `keeps`.
struct Confident {
    inner: Decoder<CandleBackend>,
    keeps: bool,
    /// Forward passes run.
    passes: usize,
}

impl LanguageModel for Confident {
    fn forward(&mut self, t: &[u32], p: &[u32], m: &Mask, rows: &[usize]) -> Result<Logits> {
        let rows_in: Vec<Row<'_>> = t.iter().map(|&t| Row::Token(t)).collect();
        self.forward_rows(&rows_in, p, m, rows)
    }
    fn forward_rows(
        &mut self,
        r: &[Row<'_>],
        p: &[u32],
        m: &Mask,
        rows: &[usize],
    ) -> Result<Logits> {
        self.passes += 1;
        Ok(common::scaled(
            self.inner.forward_rows(r, p, m, rows)?,
            12.0,
        ))
    }
    fn keep_last_pass(&mut self, on: bool) -> bool {
        self.keeps && self.inner.keep_last_pass(on)
    }
    fn later_logits(&mut self, rows: &[usize]) -> Result<Option<Logits>> {
        Ok(self
            .inner
            .later_logits(rows)?
            .map(|l| common::scaled(l, 12.0)))
    }
    delegate_to_inner!();
    fn backend_name(&self) -> &'static str {
        "confident"
    }
}

const VOCAB: usize = 300;

fn target() -> Confident {
    static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tiny = TinyModel {
        arch: "qwen2",
        vocab: VOCAB,
        seed: 7,
        ..TinyModel::default()
    };
    let path = write_temp(&tiny.writer(), &format!("ppd-target-{n}"));
    let file = GgufFile::open(&path).unwrap();
    let inner = Decoder::load(CandleBackend::new(), &file, &mut |_, _| {}).unwrap();
    Confident {
        inner,
        keeps: true,
        passes: 0,
    }
}

fn accuracy() -> Accuracy {
    Accuracy::new(vec![
        vec![0.5, 0.6, 0.7],
        vec![0.3, 0.4, 0.45],
        vec![0.2, 0.25, 0.3],
    ])
    .unwrap()
}

fn opts(decoding: Decoding, max_tokens: usize, stop: Vec<u32>) -> DecodeOptions {
    DecodeOptions {
        max_tokens,
        sampling: SamplingParams::default(),
        stop_tokens: stop,
        strategy: Strategy::new(decoding),
        verification: Verification::Exact,
    }
}

fn ppd(prompts: PromptTokens, max_rows: usize, profile: Option<LatencyProfile>) -> Decoding {
    Decoding::Ppd(PpdConfig {
        prompts: Some(Arc::new(prompts)),
        max_rows,
        profile,
    })
}

/// Prompt tokens that are the target's embeddings of `tokens`.
fn embeddings_of(t: &mut Confident, tokens: &[u32]) -> PromptTokens {
    PromptTokens {
        hidden: t.config().hidden,
        epts: 1,
        vectors: t.inner.embeddings(tokens).unwrap(),
        accuracy: accuracy(),
    }
}

fn run(
    t: &mut Confident,
    prompt: &[u32],
    o: &DecodeOptions,
) -> std::result::Result<Decoded, SpecError> {
    decode(t, None, prompt, o, &mut |_| {})
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn greedy_ppd_equals_target_only_decoding(
        prompt in prop::collection::vec(0u32..300, 1..20),
        max_tokens in 0usize..40,
        stop in prop::collection::vec(0u32..300, 0..2),
        count in 1usize..4,
        max_rows in 1usize..=64,
        seed in any::<u64>(),
        from_tokens in any::<bool>(),
        profile in 0u8..3,
        epts in 1usize..3,
    ) {
        let mut t = target();
        let plain = run(&mut t, &prompt, &opts(Decoding::Autoregressive, max_tokens, stop.clone())).unwrap();
        let hidden = t.config().hidden;
        let prompts = if from_tokens && !plain.tokens.is_empty() {
            // Embeddings of the answer's own tokens: some guesses land.
            let toks: Vec<u32> = (0..count).map(|i| plain.tokens[i % plain.tokens.len()]).collect();
            embeddings_of(&mut t, &toks)
        } else {
            let mut rng = arbor_sampling::Rng::new(seed);
            PromptTokens {
                hidden,
                epts,
                vectors: (0..count * epts * hidden).map(|_| rng.next_f64() as f32 - 0.5).collect(),
                accuracy: accuracy(),
            }
        };
        // No profile (every row free), a flat one (a streamed pass), one
        // where rows cost (may fall back to plain passes).
        let profile = match profile {
            0 => None,
            1 => Some(LatencyProfile { points: vec![(1, 1.0), (64, 1.0)] }),
            _ => Some(LatencyProfile { points: vec![(1, 0.03), (8, 0.1), (64, 0.8)] }),
        };
        let o = opts(ppd(prompts, max_rows, profile), max_tokens, stop);
        let got = run(&mut t, &prompt, &o).unwrap();
        prop_assert_eq!(&got.tokens, &plain.tokens);
        prop_assert_eq!(got.stats.stop, plain.stats.stop);
        prop_assert!(got.stats.accepted_draft_tokens <= got.stats.draft_tokens);
        // A target that cannot keep its pass returns every row's logits at
        // once: the same guesses, the same rounds.
        t.keeps = false;
        let all_rows = run(&mut t, &prompt, &o).unwrap();
        prop_assert_eq!(&all_rows.tokens, &got.tokens);
        prop_assert_eq!(all_rows.stats.draft_tokens, got.stats.draft_tokens);
        prop_assert_eq!(all_rows.stats.accepted_draft_tokens, got.stats.accepted_draft_tokens);
    }
}

#[test]
fn prompt_tokens_that_guess_get_candidates_accepted() {
    let mut t = target();
    let mut accepted = 0;
    let mut passes = 0;
    let mut generated = 0;
    for start in [3u32, 50, 111, 222, 290] {
        let prompt = [start, start + 1, start / 2];
        let plain = run(&mut t, &prompt, &opts(Decoding::Autoregressive, 32, vec![])).unwrap();
        // A confident random model settles into short loops: the
        // embeddings of its last tokens guess what follows them.
        let tail: Vec<u32> = plain.tokens[plain.tokens.len() - 3..].to_vec();
        let prompts = embeddings_of(&mut t, &tail);
        let got = run(&mut t, &prompt, &opts(ppd(prompts, 48, None), 32, vec![])).unwrap();
        assert_eq!(got.tokens, plain.tokens);
        accepted += got.stats.accepted_draft_tokens;
        passes += got.stats.verifications;
        generated += got.tokens.len();
    }
    assert!(accepted > 0, "no candidate was ever accepted");
    assert!(passes < generated, "{passes} passes for {generated} tokens");
}

#[test]
fn bad_prompt_tokens_are_refused() {
    let mut t = target();
    let hidden = t.config().hidden;
    let prompt = [1u32, 2, 3];
    let none = Decoding::Ppd(PpdConfig::default());
    let narrow = ppd(
        PromptTokens {
            hidden: hidden - 1,
            epts: 1,
            vectors: vec![0.0; 2 * (hidden - 1)],
            accuracy: accuracy(),
        },
        48,
        None,
    );
    let ok = embeddings_of(&mut t, &[5, 6]);
    let too_many_rows = ppd(ok.clone(), 65, None);
    for d in [none, narrow, too_many_rows] {
        assert!(matches!(
            run(&mut t, &prompt, &opts(d, 8, vec![])),
            Err(SpecError::Invalid(_))
        ));
    }
}

/// Sampled `ppd` draws once per committed token from the target, as plain
/// sampling does: with the same seed the outputs are the same, token for
/// token (and candidates still get accepted).
#[test]
fn sampled_ppd_equals_target_only_sampling_at_the_same_seed() {
    let mut t = target();
    let (mut accepted, mut generated) = (0, 0);
    for (i, start) in [3u32, 50, 111, 222, 290].into_iter().enumerate() {
        let prompt = [start, start + 1, start / 2];
        let sampled = |decoding: Decoding| {
            let mut o = opts(decoding, 32, vec![]);
            o.sampling.temperature = 0.7;
            o.sampling.seed = 40 + i as u64;
            o
        };
        let plain = run(&mut t, &prompt, &sampled(Decoding::Autoregressive)).unwrap();
        let tail: Vec<u32> = plain.tokens[plain.tokens.len() - 3..].to_vec();
        let prompts = embeddings_of(&mut t, &tail);
        let got = run(&mut t, &prompt, &sampled(ppd(prompts, 48, None))).unwrap();
        assert_eq!(got.tokens, plain.tokens, "start {start}");
        accepted += got.stats.accepted_draft_tokens;
        generated += got.tokens.len();
    }
    assert!(
        accepted > 0,
        "no candidate accepted in {generated} sampled tokens"
    );
}

/// `tree-ppd` with a perfect draft (the target itself) whose prompt tokens
/// guess its own loops: the output is the target's, and a draft pass grows
/// the tree by more tokens than one-leaf steps do.
#[test]
fn tree_ppd_grows_several_draft_tokens_per_draft_pass() {
    let mut t = target();
    let mut d = target();
    // (draft tokens, draft passes) with plain steps, then guessing ones.
    let mut seen = [(0usize, 0usize); 2];
    for start in [3u32, 50, 111, 222, 290] {
        let prompt = [start, start + 1, start / 2];
        let plain = run(&mut t, &prompt, &opts(Decoding::Autoregressive, 32, vec![])).unwrap();
        let tail: Vec<u32> = plain.tokens[plain.tokens.len() - 3..].to_vec();
        let prompts = Arc::new(embeddings_of(&mut d, &tail));
        for (i, count) in [0, 3].into_iter().enumerate() {
            let cfg = TreeConfig {
                // One child per node: a plain step grows one token.
                grow: GrowConfig {
                    branch_threshold: 1.0,
                    max_children: 1,
                },
                max_nodes: 16,
                draft_prompts: Some(DraftPrompts {
                    prompts: Some(prompts.clone()),
                    count: Some(count),
                }),
                ..TreeConfig::default()
            };
            d.passes = 0;
            let o = opts(Decoding::Tree(cfg), 32, vec![]);
            let got = decode(&mut t, Some(&mut d), &prompt, &o, &mut |_| {}).unwrap();
            assert_eq!(
                got.tokens, plain.tokens,
                "start {start}, {count} prompt tokens"
            );
            seen[i].0 += got.stats.draft_tokens;
            seen[i].1 += d.passes;
        }
    }
    let per_pass = |(tokens, passes): (usize, usize)| tokens as f64 / passes as f64;
    assert!(
        per_pass(seen[1]) > 1.3 * per_pass(seen[0]),
        "draft tokens per draft pass: {seen:?}"
    );
}

/// Ensemble prompt tokens that are copies of good prompt tokens guess as
/// they do (their mean is the copy): candidates get accepted, and the
/// output is the target's. (The accuracy pass's averaging is checked
/// against one pass per EPT in `engine/tests/ppd_accuracy.rs`.)
#[test]
fn copies_of_prompt_tokens_as_epts_guess_as_they_do() {
    let mut t = target();
    let mut accepted = [0, 0];
    for start in [3u32, 111, 290] {
        let prompt = [start, start + 1, start / 2];
        let plain = run(&mut t, &prompt, &opts(Decoding::Autoregressive, 24, vec![])).unwrap();
        let tail: Vec<u32> = plain.tokens[plain.tokens.len() - 3..].to_vec();
        let one = embeddings_of(&mut t, &tail);
        let hidden = one.hidden;
        let three = PromptTokens {
            epts: 3,
            vectors: (one.vectors.chunks_exact(hidden))
                .flat_map(|v| v.repeat(3))
                .collect(),
            ..one.clone()
        };
        for (i, p) in [one, three].into_iter().enumerate() {
            let got = run(&mut t, &prompt, &opts(ppd(p, 64, None), 24, vec![])).unwrap();
            assert_eq!(got.tokens, plain.tokens);
            accepted[i] += got.stats.accepted_draft_tokens;
        }
    }
    assert!(accepted[0] > 0 && accepted[1] > 0, "{accepted:?}");
}

//! Which draft source runs, and how: the acceptance each source reaches
//! with a target (measured; see the constants), and the strategy and tree
//! shape that open a chosen source. The engine gathers the candidates'
//! facts (file sizes, memory plans, cached curves) and asks [`crate::auto`]
//! for the estimates; this module turns the winner into a choice.

use arbor_ppd::Accuracy;

use crate::auto::Estimate;

/// The draft source named `lookup`: n-grams of the prompt and the text so far.
pub const LOOKUP: &str = "lookup";
/// The draft source named `self`: the target's resident layers.
pub const SELF: &str = "self";

/// How often the target took a draft model's most likely token, its
/// second, third and fourth, where each round's draft runs (the root):
/// Qwen2.5-Coder 0.5B drafting for the 1.5B, greedy, 16 ShareGPT prompts ×
/// 96 tokens (231 rounds; the held-out MT-Bench was not used):
/// 0.836 / 0.106 / 0.030 / 0.014, cumulative below. Command:
/// `arbor bench spec --prompts sharegpt --limit 16 --max-tokens 96
/// --strategies tree-no-fallback,tree@lookup,tree-no-fallback@SLIM` in a
/// fresh `ARBOR_HOME`, then its `profiles/acceptance-*.json`.
pub const MODEL_SHARES: [f64; 4] = [0.836, 0.941, 0.971, 0.985];
/// A slim draft of it (K = 32768, layers kept), same run (263 rounds):
/// its head lacks rare tokens, the rest is its source's.
pub const SLIM_SHARES: [f64; 4] = [0.833, 0.923, 0.950, 0.966];
/// Prompt lookup, same run (537 rounds: every round whose draft ran,
/// those it proposed nothing in included): 0.10, and next to nothing
/// past its one continuation.
pub const LOOKUP_SHARES: [f64; 4] = [0.101, 0.102, 0.102, 0.102];

/// A prior table: the cumulative shares `top` (top-1, top-2, …) at every
/// depth.
pub fn prior_of(top: &[f64]) -> Accuracy {
    let row: Vec<f64> = top
        .iter()
        .take(arbor_speculative::ACCEPTANCE_RANKS)
        .copied()
        .collect();
    Accuracy::new(vec![row; arbor_speculative::ACCEPTANCE_DEPTHS])
        .expect("a prior's shares are cumulative and in [0, 1]")
}

/// A prior table: the target takes the source's top guess with chance
/// `top1` at every depth, its second with `second` more, and so on down
/// `more` (the rank-`r` guess adds `second · more^(r−1)`).
pub fn prior(top1: f64, second: f64, more: f64) -> Accuracy {
    let top: Vec<f64> = (0..arbor_speculative::ACCEPTANCE_RANKS)
        .scan(0.0, |sum, r| {
            *sum += match r {
                0 => top1,
                _ => second * more.powi(r as i32 - 1),
            };
            Some(f64::min(*sum, 1.0))
        })
        .collect();
    prior_of(&top)
}

/// The prior of a draft model of the target's family (slim or not).
pub fn model_prior(slim: bool) -> Accuracy {
    prior_of(if slim { &SLIM_SHARES } else { &MODEL_SHARES })
}

/// The prior of prompt lookup.
pub fn lookup_prior() -> Accuracy {
    prior_of(&LOOKUP_SHARES)
}

/// The prior of a self draft running the share `running` of the layers.
pub fn self_prior(running: f64) -> Accuracy {
    prior(self_acceptance(running), 0.05, 0.4)
}

/// Acceptance per position of a self draft that runs the share `running`
/// of the target's layers, skipping the others spread evenly: measured
/// for the 1.5B (28 layers; chains of 4 along its greedy answers to 8
/// MT-Bench questions): 4 layers skipped ≈ 0.72, 8 ≈ 0.38, 12 ≈ 0.10
/// (`cargo run --release -p arbor-drafts --example measure_drafts`, which
/// measures prompt lookup's acceptance too).
pub fn self_acceptance(running: f64) -> f64 {
    let points = [
        (0.5, 0.0),
        (0.57, 0.10),
        (0.71, 0.38),
        (0.86, 0.72),
        (1.0, 1.0),
    ];
    interpolate(&points, running)
}

fn interpolate(points: &[(f64, f64)], x: f64) -> f64 {
    if x <= points[0].0 {
        return points[0].1;
    }
    for w in points.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        if x <= x1 {
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
        }
    }
    points[points.len() - 1].1
}

/// What the planner chose, and why.
pub struct Choice {
    /// `draft` for the run config.
    pub draft: Option<String>,
    /// The strategy name to open with.
    pub strategy: String,
    /// The tree's branch threshold (a model draft under streaming).
    pub branch_threshold: Option<f32>,
    /// Most draft tokens a tree carries: twice the size the estimate
    /// planned (the memory plan reserves logits for that many rows, not for
    /// the 63 a tree may hold otherwise).
    pub max_tree: Option<usize>,
}

/// The tree size a choice allows for a planned size of `n` candidates.
pub fn tree_room(n: usize) -> usize {
    (2 * n).clamp(8, arbor_speculative::MAX_DRAFT_TOKENS)
}

/// Branch threshold of the trees a model draft grows when layers stream:
/// a pass costs its reads, so extra rows are nearly free and a branch is
/// worth opening at a twentieth of the draft's probability (slim 0.5B at
/// 800 MiB, reads capped at 1 GB/s, 2 prompts × 48 tokens: 3.76 tokens per
/// pass, 3.62 at 0.1, 2.94 at the default 0.3, 3.03 for the best chain;
/// 0.02 kept the same trees as 0.05).
pub const STREAMING_BRANCH_THRESHOLD: f32 = 0.05;

/// How the estimate `e` is opened.
pub fn choice_for(e: &Estimate, streams: bool) -> Choice {
    let strategy = strategy_for(e, streams);
    let tree = strategy == STREAMING_TREE || strategy == "tree";
    Choice {
        draft: e.candidate.draft.clone(),
        branch_threshold: (strategy == STREAMING_TREE).then_some(STREAMING_BRANCH_THRESHOLD),
        max_tree: (tree && e.depth > 0).then(|| tree_room(e.depth)),
        strategy: strategy.into(),
    }
}

/// The tree a model draft grows under streaming: sized by the IO-aware
/// pass cost alone, without the fallback threshold α (tuned for resident
/// passes, where every row costs; it verified after 2.54 tokens per pass
/// where the tree without it kept 2.94, same run as above).
pub const STREAMING_TREE: &str = "tree-no-fallback";

/// The strategy that runs the chosen source: `ppd` for the target's own
/// guesses, plain decoding (pipelined when layers stream), a widely branching tree without α when a model
/// drafts under streaming (passes cost their reads, so rows are nearly
/// free), else the tree strategy.
pub fn strategy_for(best: &Estimate, streams: bool) -> &'static str {
    if best.candidate.ppd.is_some() {
        return "ppd";
    }
    match best.candidate.draft.as_deref() {
        None if streams => "autoregressive-pipelined",
        None => "autoregressive",
        Some(LOOKUP) => "tree",
        Some(_) if streams => STREAMING_TREE,
        Some(_) => "tree",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::Candidate;

    fn estimate(draft: Option<&str>) -> Estimate {
        Estimate {
            candidate: Candidate {
                draft: draft.map(str::to_string),
                label: draft.unwrap_or("none").into(),
                memory: 0,
                step_secs: 0.01,
                accuracy: model_prior(false),
                measured: 0.0,
                ppd: None,
            },
            read_per_pass: Some(1 << 20),
            depth: 4,
            tokens_per_pass: 2.0,
            tok_s: 1.0,
            model_tok_s: 1.0,
            measured: None,
        }
    }

    #[test]
    fn each_source_opens_with_its_strategy() {
        let cases = [
            (None, true, "autoregressive-pipelined"),
            (None, false, "autoregressive"),
            (Some(LOOKUP), true, "tree"),
            (Some(SELF), true, STREAMING_TREE),
            (Some("/m/slim.gguf"), true, STREAMING_TREE),
            (Some("/m/draft.gguf"), false, "tree"),
        ];
        for (draft, streams, want) in cases {
            let c = choice_for(&estimate(draft), streams);
            assert_eq!(c.strategy, want, "{draft:?} streams={streams}");
            assert_eq!(c.draft.as_deref(), draft);
            // Only the streaming tree branches wider than the default.
            assert_eq!(
                c.branch_threshold,
                (want == STREAMING_TREE).then_some(STREAMING_BRANCH_THRESHOLD)
            );
            // Trees are held to twice their planned size (4 candidates).
            let tree = want == STREAMING_TREE || want == "tree";
            assert_eq!(c.max_tree, tree.then_some(8));
            assert!(c.strategy.parse::<arbor_speculative::Strategy>().is_ok());
        }
        // The target's own guesses open as `ppd`, streaming or not.
        let mut e = estimate(None);
        e.candidate.ppd = Some(std::sync::Arc::new(arbor_speculative::PromptTokens {
            hidden: 1,
            epts: 1,
            vectors: vec![0.0],
            accuracy: arbor_ppd::Accuracy::new(vec![vec![0.5]]).unwrap(),
        }));
        for streams in [true, false] {
            let c = choice_for(&e, streams);
            assert_eq!((c.strategy.as_str(), c.draft), ("ppd", None));
        }
    }

    #[test]
    fn priors_are_cumulative_tables() {
        let p = prior(0.7, 0.1, 0.5);
        assert_eq!(p.distances(), arbor_speculative::ACCEPTANCE_DEPTHS);
        assert!((p.top(1, 1) - 0.7).abs() < 1e-12);
        assert!((p.top(3, 2) - 0.8).abs() < 1e-12);
        assert!((p.top(1, 3) - 0.85).abs() < 1e-12);
        assert_eq!(prior(0.9, 0.5, 1.0).top(1, 4), 1.0, "capped at 1");
        assert_eq!(lookup_prior().top(2, 4), LOOKUP_SHARES[3]);
        assert_eq!(model_prior(false).top(8, 1), MODEL_SHARES[0]);
    }

    #[test]
    fn self_acceptance_rises_with_the_layers_kept() {
        assert!(self_acceptance(0.3) <= self_acceptance(0.6));
        assert!(self_acceptance(0.6) < self_acceptance(0.9));
        assert_eq!(self_acceptance(1.0), 1.0);
        assert!((interpolate(&[(0.0, 0.0), (1.0, 1.0)], 0.25) - 0.25).abs() < 1e-12);
    }
}

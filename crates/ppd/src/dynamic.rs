//! The dynamic sparse tree (PPD thesis §5.4–5.6) and its sizing by pass
//! cost.
//!
//! A pass carries the committed token, candidates, and prompt tokens after
//! each of them; the prompt tokens after the deepest accepted node guess the
//! next pass's candidates, as many distances deep as it carried. Giving
//! every node all `m` prompt tokens (the *full* sparse tree) spends most of
//! a pass's rows on nodes that rarely end up deepest; here each node
//! carries 1 to `m`, by its chance of being the deepest accepted. The next
//! pass can then guess only as deep as that node's prompt tokens reach, so
//! a plan holds one pass shape per depth `k = 1..=m` (a *state*), each
//! with candidates at most `k` deep.
//!
//! Each state's shape maximises the thesis' two-pass value under a row
//! limit: the candidates it expects to keep now, plus, over the nodes that
//! may end deepest, that chance times what the next state keeps (a fixed
//! point: the states' values feed each other, a few rounds settle them).
//! The long-run share of each state follows from the transition chances
//! (the stationary distribution), and the row limit is chosen by expected
//! tokens per second under the caller's pass cost.

use crate::{Accuracy, CandidateTree, PpdError, Result, optimal_tree};

/// One state's pass: the candidates and the prompt tokens each row carries.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct State {
    /// Candidates, none deeper than the state's depth.
    pub tree: CandidateTree,
    /// Prompt tokens after the committed token (`[0]`) and after candidate
    /// `i` (`[i + 1]`); each 1..=m.
    pub prompts: Vec<usize>,
    /// Rows per prompt token (its ensemble prompt tokens).
    pub epts: usize,
}

impl State {
    /// Rows of the pass: the committed token, the candidates, their prompt
    /// tokens.
    pub fn rows(&self) -> usize {
        1 + self.tree.len() + self.epts * self.prompts.iter().sum::<usize>()
    }

    /// Rows of logits the pass needs: the committed token's and the
    /// candidates' (verification), and one node's prompt rows.
    pub fn logit_rows(&self) -> usize {
        1 + self.tree.len() + self.epts * self.prompts.iter().copied().max().unwrap_or(0)
    }

    /// For the committed token and each candidate, the chance that it ends
    /// up the deepest accepted (they add up to 1).
    pub fn exit_mass(&self) -> Vec<f64> {
        let first: f64 = (self.tree.nodes().iter())
            .filter(|c| c.parent.is_none())
            .map(|c| c.value)
            .sum();
        std::iter::once((1.0 - first).max(0.0))
            .chain(self.tree.exit_mass())
            .collect()
    }
}

/// What PPD passes should carry, and what they are expected to give.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// `states[k - 1]`: the pass when the last one's guesses reach `k`
    /// deep. Empty for plain decoding.
    pub states: Vec<State>,
    /// Long-run share of passes in each state.
    pub share: Vec<f64>,
    /// Prompt tokens trained (`m`; 0: plain decoding, one row per pass).
    pub prompts: usize,
    /// Most rows of any state's pass.
    pub rows: usize,
    /// Tokens a pass is expected to commit (the target's own included).
    pub tokens_per_pass: f64,
    /// Expected tokens over expected seconds per pass.
    pub tokens_per_sec: f64,
}

impl Plan {
    /// The state for guesses `depth` deep (clamped to `1..=prompts`).
    pub fn state(&self, depth: usize) -> Option<&State> {
        self.states
            .get(depth.clamp(1, self.states.len().max(1)) - 1)
    }

    /// Candidates of the deepest state (what a pass verifies at most).
    pub fn candidates(&self) -> usize {
        self.states.last().map_or(0, |s| s.tree.len())
    }
}

/// The plan with the most expected tokens per second, a pass of `r` rows
/// of which `l` return logits costing `pass_secs(r, l)` seconds, with `m`
/// prompt tokens (at most the table's distances) of `epts` rows each, at
/// most `max_rows` rows and `max_logits` rows of logits (candidates, the
/// committed token and one node's prompt rows); plain decoding (one row,
/// one token) when nothing beats it.
pub fn plan(
    acc: &Accuracy,
    m: usize,
    epts: usize,
    max_rows: usize,
    max_logits: usize,
    pass_secs: impl Fn(usize, usize) -> f64,
) -> Result<Plan> {
    if m == 0 || m > acc.distances() {
        return Err(PpdError::Request(format!(
            "{m} prompt tokens, but the accuracy table covers 1..={} distances",
            acc.distances()
        )));
    }
    if max_rows == 0 || max_logits == 0 || epts == 0 {
        return Err(PpdError::Request(
            "a pass needs at least one row, a prompt token at least one EPT".into(),
        ));
    }
    // Candidates a pass may carry: each with a prompt token, the committed
    // token with one, and logits for them and one node's prompt rows.
    let most = (max_rows / (1 + epts))
        .min(max_logits.saturating_sub(m * epts))
        .saturating_sub(1);
    let secs = |rows: usize, logits: usize| pass_secs(rows, logits).max(f64::MIN_POSITIVE);
    let mut best = Plan {
        states: Vec::new(),
        share: Vec::new(),
        prompts: 0,
        rows: 1,
        tokens_per_pass: 1.0,
        tokens_per_sec: 1.0 / secs(1, 1),
    };
    // Each state's best tree of any size, to take prefixes of.
    let full: Vec<CandidateTree> = (1..=m)
        .map(|k| optimal_tree(acc, k, most))
        .collect::<Result<_>>()?;
    for limit in 1 + epts..=max_rows {
        let states = shapes(&full, m, epts, limit);
        let share = stationary(&states, m);
        let tokens: f64 = (states.iter().zip(&share))
            .map(|(s, p)| p * (1.0 + s.tree.expected_accepted()))
            .sum();
        let time: f64 = (states.iter().zip(&share))
            .map(|(s, p)| p * secs(s.rows(), s.logit_rows()))
            .sum();
        if tokens / time > best.tokens_per_sec {
            best = Plan {
                rows: states.iter().map(State::rows).max().unwrap_or(1),
                states,
                share,
                prompts: m,
                tokens_per_pass: tokens,
                tokens_per_sec: tokens / time,
            };
        }
    }
    Ok(best)
}

/// Each state's shape within `limit` rows, the states' values settled by
/// a few rounds of the fixed point.
fn shapes(full: &[CandidateTree], m: usize, epts: usize, limit: usize) -> Vec<State> {
    // What a pass in state k keeps: start from its tree with one prompt
    // token per node, the most candidates that leaves room for.
    let mut value: Vec<f64> = full
        .iter()
        .map(|t| t.prefix(limit / (1 + epts) - 1).expected_accepted())
        .collect();
    let mut states = Vec::new();
    for _ in 0..4 {
        states = (full.iter())
            .map(|t| best_shape(t, m, epts, limit, &value))
            .collect::<Vec<_>>();
        let next: Vec<f64> = states.iter().map(|s| s.tree.expected_accepted()).collect();
        if next == value {
            break;
        }
        value = next;
    }
    states
}

/// The shape from prefixes of `full` within `limit` rows with the most
/// candidates kept now and, through the prompt tokens, in the next pass
/// (`value[k - 1]`: what a pass in state `k` keeps).
fn best_shape(full: &CandidateTree, m: usize, epts: usize, limit: usize, value: &[f64]) -> State {
    let gain = |q: usize| value[q] - value[q - 1];
    let mut best = (f64::NEG_INFINITY, State::default());
    // Each node carries at least one prompt token.
    for n in 0..=full.len().min(limit / (1 + epts) - 1) {
        let tree = full.prefix(n);
        let mut state = State {
            prompts: vec![1; n + 1],
            tree,
            epts,
        };
        let exit = state.exit_mass();
        // Spare rows go, a prompt token's at a time, where the next pass
        // gains most.
        let mut spare = limit - (1 + epts) * (n + 1);
        while spare >= epts {
            let pick = (0..=n)
                .filter(|&j| state.prompts[j] < m)
                .map(|j| (exit[j] * gain(state.prompts[j]), j))
                .filter(|&(g, _)| g > 0.0)
                .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
            let Some((_, j)) = pick else { break };
            state.prompts[j] += 1;
            spare -= epts;
        }
        let next: f64 = (exit.iter().zip(&state.prompts))
            .map(|(x, &q)| x * value[q - 1])
            .sum();
        let total = state.tree.expected_accepted() + next;
        if total > best.0 + 1e-12 {
            best = (total, state);
        }
    }
    best.1
}

/// Long-run share of passes in each state: the next state is the prompt
/// tokens the deepest accepted node carried.
fn stationary(states: &[State], m: usize) -> Vec<f64> {
    let moves: Vec<Vec<f64>> = states
        .iter()
        .map(|s| {
            let mut to = vec![0.0; m];
            for (x, &q) in s.exit_mass().iter().zip(&s.prompts) {
                to[q - 1] += x;
            }
            to
        })
        .collect();
    let mut share = vec![1.0 / m as f64; m];
    for _ in 0..500 {
        let mut next = vec![0.0; m];
        for (p, to) in share.iter().zip(&moves) {
            for (n, t) in next.iter_mut().zip(to) {
                *n += p * t;
            }
        }
        let sum: f64 = next.iter().sum();
        next.iter_mut()
            .for_each(|n| *n /= sum.max(f64::MIN_POSITIVE));
        let done = next.iter().zip(&share).all(|(a, b)| (a - b).abs() < 1e-12);
        share = next;
        if done {
            break;
        }
    }
    share
}

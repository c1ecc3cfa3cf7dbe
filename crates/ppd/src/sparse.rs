//! Dynamic sparse candidate trees (PPD thesis, chapter 5).
//!
//! A candidate at depth `d` is the rank-`r` guess of prompt token `d`
//! (all from the prompt tokens after the last pass's deepest accepted
//! node); the tree decides which combinations of guesses along a path are
//! verified.
//! With the accuracy table read as independent per-distance chances, the
//! target accepts the candidate (and its whole path) with the product of
//! `Accuracy::at(depth, rank)` along the path: its *value*. The expected
//! number of candidates a pass keeps is the sum of the values, so the best
//! tree of `n` candidates holds the `n` highest values; since a child's
//! value never exceeds its parent's, taking them best first keeps every
//! prefix a tree, and the first `n` taken are the best tree of `n`.
//!
//! A pass carries the last committed token, the candidates, and after each
//! of them (and after the committed token) the prompt tokens that guess
//! the next round's candidates: `(1 + n) · (1 + prompts)` rows. [`plan`]
//! picks `n` by expected tokens per second under the pass cost the caller
//! gives (a latency profile, or a memory budget's IO-aware cost).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::{Accuracy, PpdError, Result};

/// One candidate token of a pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The candidate it follows (`None`: the last committed token).
    pub parent: Option<usize>,
    /// Distance from the last committed token (1-based).
    pub depth: usize,
    /// Which of the prompt token's guesses it is (0: the most likely).
    pub rank: usize,
    /// Chance the target accepts it and its whole path.
    pub value: f64,
}

/// Candidates in the order they were chosen: parents before children,
/// values non-increasing.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CandidateTree {
    nodes: Vec<Candidate>,
}

impl CandidateTree {
    pub fn nodes(&self) -> &[Candidate] {
        &self.nodes
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Deepest candidate's depth (0 when empty).
    pub fn depth(&self) -> usize {
        self.nodes.iter().map(|c| c.depth).max().unwrap_or(0)
    }

    /// Candidates a pass is expected to keep (the target's own token comes
    /// on top).
    pub fn expected_accepted(&self) -> f64 {
        self.nodes.iter().map(|c| c.value).sum()
    }

    /// For each candidate, the chance that it is the deepest one accepted:
    /// its value less its children's.
    pub fn exit_mass(&self) -> Vec<f64> {
        let mut mass: Vec<f64> = self.nodes.iter().map(|c| c.value).collect();
        for c in &self.nodes {
            if let Some(p) = c.parent {
                mass[p] -= c.value;
            }
        }
        mass
    }

    /// Rows of a pass that verifies this tree and carries `prompts` prompt
    /// tokens after the committed token and after every candidate.
    pub fn rows(&self, prompts: usize) -> usize {
        pass_rows(self.len(), prompts)
    }

    /// The first `n` candidates (the best tree of `n`).
    pub fn prefix(&self, n: usize) -> CandidateTree {
        CandidateTree {
            nodes: self.nodes[..n.min(self.len())].to_vec(),
        }
    }
}

/// Rows of a pass verifying `candidates` candidates, with `prompts`
/// prompt tokens after the committed token and after each candidate.
pub fn pass_rows(candidates: usize, prompts: usize) -> usize {
    (1 + candidates) * (1 + prompts)
}

/// A frontier entry: a candidate not yet taken.
struct Open {
    value: f64,
    /// Insertion order, to break ties deterministically (earlier first).
    seq: usize,
    parent: Option<usize>,
    depth: usize,
    rank: usize,
}

impl PartialEq for Open {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Open {}
impl PartialOrd for Open {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Open {
    fn cmp(&self, other: &Self) -> Ordering {
        // Max-heap: higher value first, then the earlier entry.
        self.value
            .total_cmp(&other.value)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// The tree of at most `nodes` candidates, none deeper than `depth`, with
/// the highest expected number of accepted candidates. Candidates that can
/// never be accepted (value 0) are left out, so the tree may be smaller.
pub fn optimal_tree(acc: &Accuracy, depth: usize, nodes: usize) -> Result<CandidateTree> {
    if depth > acc.distances() {
        return Err(PpdError::Request(format!(
            "candidates {depth} deep, but the accuracy table covers {} distances",
            acc.distances()
        )));
    }
    let mut tree = CandidateTree::default();
    if depth == 0 {
        return Ok(tree);
    }
    let mut open = BinaryHeap::new();
    let mut seq = 0;
    let mut push = |open: &mut BinaryHeap<Open>, parent, d, base: f64| {
        for rank in 0..acc.ranks() {
            let value = base * acc.at(d, rank);
            if value > 0.0 {
                open.push(Open {
                    value,
                    seq,
                    parent,
                    depth: d,
                    rank,
                });
                seq += 1;
            }
        }
    };
    push(&mut open, None, 1, 1.0);
    while tree.len() < nodes {
        let Some(o) = open.pop() else { break };
        let id = tree.len();
        tree.nodes.push(Candidate {
            parent: o.parent,
            depth: o.depth,
            rank: o.rank,
            value: o.value,
        });
        if o.depth < depth {
            push(&mut open, Some(id), o.depth + 1, o.value);
        }
    }
    Ok(tree)
}

/// What a PPD pass should carry, and what it is expected to give.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The candidates to verify (empty: decode plainly, one row per pass).
    pub tree: CandidateTree,
    /// Prompt tokens after the committed token and each candidate (0 for
    /// plain decoding).
    pub prompts: usize,
    /// Rows of the pass.
    pub rows: usize,
    /// Tokens a pass is expected to commit (the target's own included).
    pub tokens_per_pass: f64,
    /// `tokens_per_pass / pass_secs(rows)`.
    pub tokens_per_sec: f64,
}

/// The tree size with the most expected tokens per second, passes of `r`
/// rows costing `pass_secs(r)` seconds, with `prompts` prompt tokens (at
/// most the table's distances), at most `max_rows` rows; plain decoding
/// (one row, one token) when nothing beats it.
pub fn plan(
    acc: &Accuracy,
    prompts: usize,
    max_rows: usize,
    pass_secs: impl Fn(usize) -> f64,
) -> Result<Plan> {
    if prompts == 0 || prompts > acc.distances() {
        return Err(PpdError::Request(format!(
            "{prompts} prompt tokens, but the accuracy table covers 1..={} distances",
            acc.distances()
        )));
    }
    if max_rows == 0 {
        return Err(PpdError::Request("a pass needs at least one row".into()));
    }
    let rate = |tokens: f64, rows: usize| tokens / pass_secs(rows).max(f64::MIN_POSITIVE);
    let mut best = Plan {
        tree: CandidateTree::default(),
        prompts: 0,
        rows: 1,
        tokens_per_pass: 1.0,
        tokens_per_sec: rate(1.0, 1),
    };
    let most = (max_rows / (1 + prompts)).saturating_sub(1);
    let all = optimal_tree(acc, prompts, most)?;
    let mut tokens = 1.0;
    for n in 1..=all.len() {
        tokens += all.nodes()[n - 1].value;
        let rows = pass_rows(n, prompts);
        let r = rate(tokens, rows);
        if r > best.tokens_per_sec {
            best = Plan {
                tree: all.prefix(n),
                prompts,
                rows,
                tokens_per_pass: tokens,
                tokens_per_sec: r,
            };
        }
    }
    Ok(best)
}

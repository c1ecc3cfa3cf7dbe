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
//! Which prompt tokens each candidate carries, and how large the trees
//! are, is [`crate::dynamic`]'s business.

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

    /// The first `n` candidates (the best tree of `n`).
    pub fn prefix(&self, n: usize) -> CandidateTree {
        CandidateTree {
            nodes: self.nodes[..n.min(self.len())].to_vec(),
        }
    }
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

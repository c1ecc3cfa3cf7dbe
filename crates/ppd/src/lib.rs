//! Parallel prompt decoding (PPD), the parts that touch no tensors.
//!
//! PPD appends a few trained *prompt tokens* after the text; the model's
//! output at prompt token `d` guesses the token `d + 1` places ahead, in
//! the same pass that verifies the previous guesses. How good those guesses
//! are is measured once per model as an [`Accuracy`] table (top-k accuracy
//! per distance), and the candidates a pass verifies are planned from it as
//! a dynamic sparse tree ([`sparse`]): the candidate paths with the highest
//! chance of acceptance, as many as the device's pass cost makes worth it.
//!
//! The trained embeddings, the pass that carries them and the decoding
//! strategy live with the model and strategy crates; this crate only
//! plans.

pub mod sparse;

pub use sparse::{Candidate, CandidateTree, Plan, optimal_tree, pass_rows, plan};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PpdError {
    #[error("bad accuracy table: {0}")]
    Accuracy(String),
    #[error("bad tree request: {0}")]
    Request(String),
}

pub type Result<T, E = PpdError> = std::result::Result<T, E>;

/// Top-k accuracies of prompt tokens by distance: `topk[d][k]` is the
/// share of positions where prompt token `d` (0-based) has among its
/// `k + 1` most likely tokens the target's token `d + 1` places past the
/// token the target commits itself (the form of the PPD thesis' accuracy
/// tables; distance `d + 1` is a candidate's depth in the tree).
#[derive(Debug, Clone, PartialEq)]
pub struct Accuracy {
    topk: Vec<Vec<f64>>,
}

impl Accuracy {
    /// Checks the table: at least one distance, the same number of ranks
    /// (≥ 1) at every distance, values in `[0, 1]` and non-decreasing in k.
    pub fn new(topk: Vec<Vec<f64>>) -> Result<Self> {
        let bad = |m: String| Err(PpdError::Accuracy(m));
        let Some(ranks) = topk.first().map(Vec::len) else {
            return bad("no distances".into());
        };
        if ranks == 0 {
            return bad("no ranks".into());
        }
        for (d, row) in topk.iter().enumerate() {
            if row.len() != ranks {
                return bad(format!(
                    "distance {} has {} ranks, distance 1 has {ranks}",
                    d + 1,
                    row.len()
                ));
            }
            if let Some(x) = row.iter().find(|x| !(0.0..=1.0).contains(*x)) {
                return bad(format!(
                    "accuracy {x} at distance {} is not in [0, 1]",
                    d + 1
                ));
            }
            if row.windows(2).any(|w| w[1] < w[0]) {
                return bad(format!(
                    "top-k accuracies at distance {} decrease with k",
                    d + 1
                ));
            }
        }
        Ok(Self { topk })
    }

    /// Distances the table covers (prompt tokens measured).
    pub fn distances(&self) -> usize {
        self.topk.len()
    }

    /// Ranks per distance (the k of the widest top-k).
    pub fn ranks(&self) -> usize {
        self.topk[0].len()
    }

    /// Top-`k` accuracy at `distance` (both 1-based).
    pub fn top(&self, distance: usize, k: usize) -> f64 {
        self.topk[distance - 1][k - 1]
    }

    /// Chance that the target's token at `distance` (1-based) is exactly
    /// the prompt token's guess of `rank` (0-based): top-(rank+1) minus
    /// top-rank accuracy.
    pub fn at(&self, distance: usize, rank: usize) -> f64 {
        let row = &self.topk[distance - 1];
        row[rank] - if rank == 0 { 0.0 } else { row[rank - 1] }
    }
}

//! Parallel prompt decoding (PPD), the parts that touch no tensors.
//!
//! PPD appends a few trained *prompt tokens* after the text; the model's
//! output at prompt token `d` guesses the token `d + 1` places ahead, in
//! the same pass that verifies the previous guesses. How good those guesses
//! are is measured once per model as an [`Accuracy`] table (top-k accuracy
//! per distance), and the candidates a pass verifies are planned from it
//! ([`sparse`]: the candidate paths with the highest chance of acceptance)
//! as a dynamic sparse tree ([`dynamic`]: how many prompt tokens each
//! carries, and how large passes are for the device's pass cost).
//!
//! Trained prompt tokens travel as a [`PromptFile`]. The pass that carries
//! them and the decoding strategy live with the model and strategy crates;
//! this crate only plans and stores. [`tensors`] is the safetensors
//! reader and writer that arbor's other files (LoRA adapters, importance)
//! share with it.

pub mod dynamic;
pub mod file;
pub mod sparse;
pub mod tensors;

pub use dynamic::{Plan, State, plan};
pub use file::PromptFile;
pub use sparse::{Candidate, CandidateTree, optimal_tree};
pub use tensors::{TensorFile, TensorFileError, Values};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PpdError {
    #[error("bad accuracy table: {0}")]
    Accuracy(String),
    #[error("bad tree request: {0}")]
    Request(String),
    #[error("bad prompt-token file: {0}")]
    File(String),
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

/// Counts prompt tokens' guesses into an [`Accuracy`] table.
#[derive(Debug, Clone, PartialEq)]
pub struct AccuracyTally {
    /// `hits[d][r]`: guesses at distance `d + 1` whose rank-`r` token was
    /// the target's.
    hits: Vec<Vec<u64>>,
    seen: Vec<u64>,
}

impl AccuracyTally {
    pub fn new(distances: usize, ranks: usize) -> Self {
        Self {
            hits: vec![vec![0; ranks]; distances],
            seen: vec![0; distances],
        }
    }

    /// One guess at `distance` (1-based, at most the tally's distances):
    /// the target's token had `rank` (0-based) among the prompt token's
    /// guesses, or `None` when it was not among the counted ranks.
    pub fn add(&mut self, distance: usize, rank: Option<usize>) {
        let d = distance - 1;
        self.seen[d] += 1;
        if let Some(r) = rank.filter(|&r| r < self.hits[d].len()) {
            self.hits[d][r] += 1;
        }
    }

    pub fn distances(&self) -> usize {
        self.seen.len()
    }

    pub fn ranks(&self) -> usize {
        self.hits.first().map_or(0, Vec::len)
    }

    /// Guesses counted at `distance` (1-based).
    pub fn seen(&self, distance: usize) -> u64 {
        self.seen[distance - 1]
    }

    /// The table so far; an error while some distance has no guesses.
    pub fn accuracy(&self) -> Result<Accuracy> {
        if let Some(d) = self.seen.iter().position(|&n| n == 0) {
            return Err(PpdError::Accuracy(format!(
                "no guesses counted at distance {}",
                d + 1
            )));
        }
        let rows = self
            .hits
            .iter()
            .zip(&self.seen)
            .map(|(hits, &n)| {
                hits.iter()
                    .scan(0u64, |sum, &h| {
                        *sum += h;
                        Some(*sum as f64 / n as f64)
                    })
                    .collect()
            })
            .collect();
        Accuracy::new(rows)
    }
}

/// The rank (0-based) of token `truth` among `logits` in descending order
/// (ties go to the lower id), when it is below `ranks`.
pub fn rank_of(logits: &[f32], truth: u32, ranks: usize) -> Option<usize> {
    let t = truth as usize;
    let x = *logits.get(t)?;
    let above = logits
        .iter()
        .enumerate()
        .filter(|&(i, &y)| y > x || (y == x && i < t))
        .count();
    (above < ranks).then_some(above)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_gives_cumulative_top_k() {
        let mut t = AccuracyTally::new(2, 3);
        assert!(t.accuracy().is_err());
        for r in [Some(0), Some(1), None, Some(0)] {
            t.add(1, r);
        }
        t.add(2, Some(2));
        t.add(2, Some(7));
        let a = t.accuracy().unwrap();
        assert_eq!(a.top(1, 1), 0.5);
        assert_eq!(a.top(1, 2), 0.75);
        assert_eq!(a.top(1, 3), 0.75);
        assert_eq!(a.top(2, 2), 0.0);
        assert_eq!(a.top(2, 3), 0.5);
        assert_eq!(t.seen(2), 2);
    }

    #[test]
    fn ranks_order_by_logit_then_id() {
        let l = [0.5, 2.0, 0.5, -1.0];
        assert_eq!(rank_of(&l, 1, 4), Some(0));
        assert_eq!(rank_of(&l, 0, 4), Some(1));
        assert_eq!(rank_of(&l, 2, 4), Some(2));
        assert_eq!(rank_of(&l, 3, 3), None);
        assert_eq!(rank_of(&l, 9, 3), None);
    }
}

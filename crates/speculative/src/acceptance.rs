//! What a draft's guesses were worth: how often the target chose the
//! draft's most likely token, its second, and so on. A draft model's (or
//! lookup's, or a self draft's) are counted where every round's draft runs,
//! at the root ([`Acceptance::observe_root`]): deeper in a tree the draft
//! only runs where it was confident, which would flatter it; its table
//! takes the root's shares at every depth, as Sequoia's does. PPD's
//! guesses are planned from its accuracy table, not from confidence, and
//! a chain drafts every depth whatever its confidence, so those are
//! counted at every depth along each verified path
//! ([`Acceptance::observe`]). The planner's profile store keeps the counts
//! per draft source and turns them into an [`arbor_ppd::Accuracy`] table
//! from which trees are planned as trees.

use arbor_ppd::Accuracy;
use arbor_tree::TokenTree;

/// Depths counted (deeper candidates count at the last).
pub const ACCEPTANCE_DEPTHS: usize = 8;
/// Candidate ranks counted at each depth.
pub const ACCEPTANCE_RANKS: usize = 4;

/// Counts of the target's choices among a draft's candidates, by depth and
/// rank. Counts are `f64` so that older runs can weigh less
/// ([`Acceptance::merge`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Acceptance {
    /// `hits[d][r]`: nodes at depth `d` (the root is 0) whose child the
    /// target chose was the draft's rank-`r` candidate (0: most likely).
    pub hits: Vec<Vec<f64>>,
    /// `offered[d][r]`: nodes at depth `d` whose choice was seen and that
    /// offered at least `r + 1` candidates.
    pub offered: Vec<Vec<f64>>,
}

impl Default for Acceptance {
    fn default() -> Self {
        let zeros = vec![vec![0.0; ACCEPTANCE_RANKS]; ACCEPTANCE_DEPTHS];
        Self {
            hits: zeros.clone(),
            offered: zeros,
        }
    }
}

impl Acceptance {
    /// Counts one verified tree: along the accepted path (the root, then
    /// `accepted`), each node at depth `from` or deeper with candidates
    /// offered them, and the target chose the next node's token (`next`
    /// after the last).
    pub fn observe(&mut self, tree: &TokenTree, accepted: &[usize], next: u32, from: usize) {
        let mut at = 0;
        for step in 0..=accepted.len() {
            let node = tree.node(at);
            let chosen = match accepted.get(step) {
                Some(&a) => tree.node(a).token,
                None => next,
            };
            if !node.children.is_empty() && node.depth >= from {
                let mut children: Vec<(f32, u32)> = (node.children.iter())
                    .map(|&c| (tree.node(c).prob, tree.node(c).token))
                    .collect();
                children.sort_by(|a, b| b.0.total_cmp(&a.0));
                let d = node.depth.min(ACCEPTANCE_DEPTHS - 1);
                for r in 0..children.len().min(ACCEPTANCE_RANKS) {
                    self.offered[d][r] += 1.0;
                }
                if let Some(r) = children.iter().position(|c| c.1 == chosen)
                    && r < ACCEPTANCE_RANKS
                {
                    self.hits[d][r] += 1.0;
                }
            }
            match accepted.get(step) {
                Some(&a) => at = a,
                None => break,
            }
        }
    }

    /// Counts one round's root: the draft's most likely tokens there, best
    /// first (up to [`ACCEPTANCE_RANKS`]), and the token the target chose.
    pub fn observe_root(&mut self, guesses: &[u32], chosen: u32) {
        for r in 0..guesses.len().min(ACCEPTANCE_RANKS) {
            self.offered[0][r] += 1.0;
        }
        if let Some(r) = guesses.iter().position(|&g| g == chosen)
            && r < ACCEPTANCE_RANKS
        {
            self.hits[0][r] += 1.0;
        }
    }

    /// Verified trees counted (weighed as [`Acceptance::merge`] left them).
    pub fn trees(&self) -> f64 {
        self.offered[0][0]
    }

    /// `self` weighed by `keep` plus `newer`: a running count in which
    /// older runs fade.
    pub fn merge(&mut self, newer: &Acceptance, keep: f64) {
        for (mine, theirs) in [
            (&mut self.hits, &newer.hits),
            (&mut self.offered, &newer.offered),
        ] {
            for (a, b) in mine.iter_mut().zip(theirs) {
                for (x, y) in a.iter_mut().zip(b) {
                    *x = *x * keep + y;
                }
            }
        }
    }

    /// The table these counts give, each depth and rank leaning on `prior`
    /// as if it had been seen `weight` times (depths and ranks the prior
    /// lacks take its deepest depth and count as never chosen). A depth
    /// with no counts takes the estimate of the deepest one above it that
    /// has some, shaped by the prior (scaled by the prior's share there
    /// over its share at that depth): a draft counted at the root alone
    /// keeps its prior's fall with depth, at the level its roots show.
    pub fn accuracy(&self, prior: &Accuracy, weight: f64) -> Accuracy {
        let prior_at = |d: usize, r: usize| match r < prior.ranks() {
            true => prior.at((d + 1).min(prior.distances()), r),
            false => 0.0,
        };
        let estimate = |d: usize, r: usize| {
            (self.hits[d][r] + weight * prior_at(d, r)) / (self.offered[d][r] + weight)
        };
        let mut counted = 0;
        let rows = (0..ACCEPTANCE_DEPTHS)
            .map(|d| {
                if self.offered[d][0] > 0.0 {
                    counted = d;
                }
                let mut sum = 0.0;
                (0..ACCEPTANCE_RANKS)
                    .map(|r| {
                        let exact = match counted == d {
                            true => estimate(d, r),
                            false => match prior_at(counted, r) {
                                p if p > 0.0 => estimate(counted, r) * prior_at(d, r) / p,
                                _ => prior_at(d, r),
                            },
                        };
                        sum = (sum + exact.max(0.0)).min(1.0);
                        sum
                    })
                    .collect()
            })
            .collect();
        Accuracy::new(rows).expect("cumulative shares in [0, 1] never decrease")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Root → a (0.7), b (0.2); a → c (0.6), d (0.3).
    fn tree() -> TokenTree {
        let mut t = TokenTree::new(0);
        let a = t.push(0, 10, 0.7);
        t.push(0, 11, 0.2);
        t.push(a, 12, 0.6);
        t.push(a, 13, 0.3);
        t
    }

    #[test]
    fn the_path_counts_the_rank_the_target_chose() {
        let mut acc = Acceptance::default();
        // The target took `a`, then `d` (rank 1 under a), then 99.
        acc.observe(&tree(), &[1, 4], 99, 0);
        assert_eq!(acc.hits[0], [1.0, 0.0, 0.0, 0.0]);
        assert_eq!(acc.offered[0], [1.0, 1.0, 0.0, 0.0]);
        assert_eq!(acc.hits[1], [0.0, 1.0, 0.0, 0.0]);
        // d has no children: nothing offered at depth 2.
        assert_eq!(acc.offered[2], [0.0; 4]);
        // A miss at the root: offered, not hit.
        acc.observe(&tree(), &[], 42, 0);
        assert_eq!(acc.offered[0], [2.0, 2.0, 0.0, 0.0]);
        assert_eq!(acc.hits[0], [1.0, 0.0, 0.0, 0.0]);
        assert_eq!(acc.trees(), 2.0);
    }

    #[test]
    fn a_root_counts_every_rank_and_a_flat_prior_carries_it_down() {
        let mut acc = Acceptance::default();
        acc.observe_root(&[5, 6, 7, 8, 9], 7);
        acc.observe_root(&[5, 6], 5);
        acc.observe_root(&[5, 6, 7], 1);
        assert_eq!(acc.offered[0], [3.0, 3.0, 2.0, 1.0]);
        assert_eq!(acc.hits[0], [1.0, 0.0, 1.0, 0.0]);
        assert_eq!(acc.trees(), 3.0);
        // A prior that does not fall with depth carries the root's shares
        // to every depth.
        let flat = Accuracy::new(vec![vec![0.5, 0.6, 0.7, 0.8]]).unwrap();
        let table = acc.accuracy(&flat, 0.0);
        for d in 1..=ACCEPTANCE_DEPTHS {
            assert!((table.top(d, 1) - 1.0 / 3.0).abs() < 1e-12);
            assert!((table.top(d, 3) - (1.0 / 3.0 + 0.5)).abs() < 1e-12);
        }
    }

    #[test]
    fn depths_without_counts_keep_the_priors_shape() {
        // The prior halves with every depth; the roots show twice its level.
        let prior = Accuracy::new(vec![vec![0.4], vec![0.2], vec![0.1]]).unwrap();
        let mut acc = Acceptance::default();
        for _ in 0..1000 {
            acc.observe_root(&[1], 1);
        }
        for _ in 0..250 {
            acc.observe_root(&[1], 2);
        }
        let table = acc.accuracy(&prior, 0.0);
        assert!((table.top(1, 1) - 0.8).abs() < 1e-12);
        assert!((table.top(2, 1) - 0.4).abs() < 1e-12);
        assert!((table.top(3, 1) - 0.2).abs() < 1e-12);
        assert!(
            (table.top(8, 1) - 0.2).abs() < 1e-12,
            "past the prior: its last"
        );
    }

    #[test]
    fn counts_lean_on_the_prior_until_they_outweigh_it() {
        let prior = Accuracy::new(vec![vec![0.5, 0.6]]).unwrap();
        let none = Acceptance::default().accuracy(&prior, 10.0);
        assert!((none.top(1, 1) - 0.5).abs() < 1e-12);
        assert!(
            (none.top(3, 2) - 0.6).abs() < 1e-12,
            "deeper depths take the prior's last"
        );
        assert!(
            (none.top(1, 4) - 0.6).abs() < 1e-12,
            "ranks past the prior add nothing"
        );
        let mut seen = Acceptance::default();
        for _ in 0..990 {
            seen.observe(&tree(), &[1], 12, 0);
        }
        let a = seen.accuracy(&prior, 10.0);
        // 990 hits of 990 at depth 0, rank 0, against 10 × 0.5.
        assert!((a.top(1, 1) - 995.0 / 1000.0).abs() < 1e-9);
        // Merging fades the old counts.
        let mut faded = seen.clone();
        faded.merge(&Acceptance::default(), 0.5);
        assert_eq!(faded.trees(), 495.0);
    }
}

//! LLMCad-style draft tree growth with a confidence-based branch pacer.

use crate::TokenTree;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GrowConfig {
    /// A candidate other than the draft's first choice opens a new branch
    /// when its draft probability exceeds this.
    pub branch_threshold: f32,
    /// At most this many children per node (the first choice included).
    pub max_children: usize,
}

impl Default for GrowConfig {
    fn default() -> Self {
        Self {
            branch_threshold: 0.3,
            max_children: 3,
        }
    }
}

/// A branch: a root path that ends in `leaf`, owning `len` tokens (those
/// added since it split off its parent branch).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Branch {
    pub leaf: usize,
    pub len: usize,
    /// False once the branch cannot grow (the draft proposed nothing, or
    /// it ended in a stop token).
    pub open: bool,
}

/// The pacer: which branch to extend next. With `total` tokens in the
/// tree, branch `i` (cumulative confidence `C_i`, `T_i` tokens) deserves
/// `total · C_i / ΣC` of them; extend the one furthest below its share,
/// argmax `total · C_i / ΣC − T_i` (max-min fairness). Closed branches
/// (`None`) are skipped; ties go to the earlier branch.
pub fn pace(branches: &[Option<(f32, usize)>], total: usize) -> Option<usize> {
    let sum: f32 = branches.iter().flatten().map(|b| b.0).sum();
    if sum <= 0.0 {
        return branches.iter().position(Option::is_some);
    }
    let mut best: Option<(usize, f32)> = None;
    for (i, b) in branches.iter().enumerate() {
        if let Some((c, len)) = *b {
            let deficit = total as f32 * c / sum - len as f32;
            if best.is_none_or(|(_, d)| deficit > d) {
                best = Some((i, deficit));
            }
        }
    }
    best.map(|b| b.0)
}

/// How many of `candidates` (most probable first) become children: the
/// first always, the next ones while their probability exceeds `threshold`
/// (all of them without one), at most `max_children` in all.
pub fn admitted(candidates: &[(u32, f32)], max_children: usize, threshold: Option<f32>) -> usize {
    let extra = candidates
        .iter()
        .skip(1)
        .take(max_children.saturating_sub(1))
        .take_while(|c| threshold.is_none_or(|th| c.1 > th))
        .count();
    candidates.len().min(1 + extra)
}

/// Grows a [`TokenTree`] one draft step at a time.
///
/// The caller runs the draft model: [`Grower::next`] names the leaf to feed
/// (the root first), the caller feeds it and hands the draft's candidates
/// for the next token to [`Grower::expand`], most probable (or first
/// drawn) first.
#[derive(Debug, Clone)]
pub struct Grower {
    tree: TokenTree,
    branches: Vec<Branch>,
    config: GrowConfig,
    root_expanded: bool,
}

impl Grower {
    pub fn new(root: u32, config: GrowConfig) -> Self {
        Self {
            tree: TokenTree::new(root),
            branches: Vec::new(),
            config,
            root_expanded: false,
        }
    }

    pub fn tree(&self) -> &TokenTree {
        &self.tree
    }

    pub fn into_tree(self) -> TokenTree {
        self.tree
    }

    pub fn branches(&self) -> &[Branch] {
        &self.branches
    }

    pub fn config(&self) -> &GrowConfig {
        &self.config
    }

    /// Tokens in the tree, the root excluded.
    pub fn total(&self) -> usize {
        self.tree.len() - 1
    }

    /// The tree-cumulative confidence `T_c`: the best open branch's
    /// cumulative confidence (1 before the root is expanded, 0 when no
    /// branch can grow).
    pub fn best_confidence(&self) -> f32 {
        if !self.root_expanded {
            return 1.0;
        }
        self.branches
            .iter()
            .filter(|b| b.open)
            .map(|b| self.tree.node(b.leaf).cum)
            .fold(0.0, f32::max)
    }

    /// The node the draft should read next: the root, then the leaf of the
    /// branch the pacer picks. `None` when nothing can grow.
    pub fn next(&self) -> Option<usize> {
        if !self.root_expanded {
            return Some(0);
        }
        pace(&self.pacer_view(), self.total()).map(|i| self.branches[i].leaf)
    }

    /// What the pacer sees of each branch: its leaf's cumulative
    /// confidence and its length, `None` once closed.
    fn pacer_view(&self) -> Vec<Option<(f32, usize)>> {
        self.branches
            .iter()
            .map(|b| b.open.then(|| (self.tree.node(b.leaf).cum, b.len)))
            .collect()
    }

    /// Up to `most` distinct nodes the draft can read in one pass: the
    /// root alone before it is expanded, else the leaves the pacer would
    /// pick in turn with each picked branch counted one token longer and
    /// left out of later picks (its next leaf is not read yet), stopping
    /// at a leaf whose cumulative confidence is under `ratio` times the
    /// first pick's. `next_batch(1, _)` is [`Grower::next`].
    pub fn next_batch(&self, most: usize, ratio: f32) -> Vec<usize> {
        if !self.root_expanded {
            return vec![0];
        }
        let mut view = self.pacer_view();
        let mut picked = Vec::new();
        let mut total = self.total();
        while picked.len() < most {
            let Some(i) = pace(&view, total) else { break };
            let leaf = self.branches[i].leaf;
            let first = picked.first().map(|&f: &usize| self.tree.node(f).cum);
            if first.is_some_and(|c| self.tree.node(leaf).cum < ratio * c) {
                break;
            }
            picked.push(leaf);
            view[i] = None;
            total += 1;
        }
        picked
    }

    /// Which of the draft's candidates (most probable first) become
    /// children: the first always, the others while above the branch
    /// threshold, at most `max_children`.
    pub fn pick<'a>(&self, candidates: &'a [(u32, f32)]) -> &'a [(u32, f32)] {
        let k = admitted(
            candidates,
            self.config.max_children,
            Some(self.config.branch_threshold),
        );
        &candidates[..k]
    }

    /// Adds `children` (first = continuation of `node`'s branch, the rest
    /// open new branches) under `node`, which must be the root or an open
    /// branch's leaf. No children closes the branch. Returns the new ids.
    pub fn expand(&mut self, node: usize, children: &[(u32, f32)]) -> Vec<usize> {
        let branch = if node == 0 && !self.root_expanded {
            self.root_expanded = true;
            None
        } else {
            let b = self.branches.iter().position(|b| b.open && b.leaf == node);
            if b.is_none() {
                return Vec::new();
            }
            b
        };
        let ids: Vec<usize> = children
            .iter()
            .map(|&(t, p)| self.tree.push(node, t, p))
            .collect();
        match (branch, ids.first()) {
            (Some(b), Some(&first)) => {
                self.branches[b].leaf = first;
                self.branches[b].len += 1;
            }
            (Some(b), None) => self.branches[b].open = false,
            (None, Some(&first)) => self.branches.push(Branch {
                leaf: first,
                len: 1,
                open: true,
            }),
            (None, None) => {}
        }
        for &id in ids.iter().skip(1) {
            self.branches.push(Branch {
                leaf: id,
                len: 1,
                open: true,
            });
        }
        ids
    }

    /// Adds `token` under `node` (any node, a leaf or not) as the start of
    /// a new open branch; `None` when `node` already has that child. For
    /// drafts that extend branches with guesses before reading them: where
    /// the draft disagrees with a guess, its own choice is grafted there.
    pub fn graft(&mut self, node: usize, token: u32, prob: f32) -> Option<usize> {
        if node >= self.tree.len() || self.tree.child_with_token(node, token).is_some() {
            return None;
        }
        let id = self.tree.push(node, token, prob);
        self.branches.push(Branch {
            leaf: id,
            len: 1,
            open: true,
        });
        Some(id)
    }

    /// Stops the branch ending in `leaf` from growing (e.g. at a stop token).
    pub fn close(&mut self, leaf: usize) {
        for b in &mut self.branches {
            if b.leaf == leaf {
                b.open = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_the_pacers_picks_in_turn_without_repeats() {
        let mut g = Grower::new(1, GrowConfig::default());
        assert_eq!(g.next_batch(4, 0.0), vec![0]);
        let ids = g.expand(0, &[(10, 0.5), (11, 0.4), (12, 0.1)]);
        assert_eq!(g.next_batch(1, 0.0), vec![g.next().unwrap()]);
        let all = g.next_batch(8, 0.0);
        assert_eq!(all.len(), 3, "one leaf per open branch");
        assert_eq!(all[0], g.next().unwrap());
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(sorted, ids);
        // The 0.1 branch is under half of the first pick's 0.5.
        assert_eq!(g.next_batch(8, 0.5), vec![ids[0], ids[1]]);
        g.close(ids[1]);
        assert_eq!(g.next_batch(8, 0.0), vec![ids[0], ids[2]]);
    }

    #[test]
    fn pace_picks_the_branch_furthest_below_its_share() {
        // Shares of 10 tokens: 6, 3, 1; lengths 4, 3, 3 → deficits 2, 0, -2.
        assert_eq!(
            pace(&[Some((0.6, 4)), Some((0.3, 3)), Some((0.1, 3))], 10),
            Some(0)
        );
        assert_eq!(
            pace(&[Some((0.6, 7)), Some((0.3, 2)), Some((0.1, 1))], 10),
            Some(1)
        );
        assert_eq!(pace(&[None, Some((0.3, 9))], 10), Some(1));
        assert_eq!(pace(&[None, None], 3), None);
    }

    /// With branches whose confidence stays fixed (every later token has
    /// probability 1), lengths track the confidence shares within one
    /// token at every step.
    #[test]
    fn branch_lengths_track_confidence_shares() {
        let mut g = Grower::new(0, GrowConfig::default());
        let first = [(1, 0.5), (2, 0.35), (3, 0.15)];
        // The 0.15 candidate is under the threshold: two branches.
        let picked = g.pick(&first).to_vec();
        assert_eq!(picked.len(), 2);
        g.expand(0, &picked);
        let shares = [0.5 / 0.85, 0.35 / 0.85];
        for step in 0..200 {
            let leaf = g.next().unwrap();
            g.expand(leaf, &[(10 + step, 1.0)]);
            let m = g.total() as f32;
            for (b, share) in g.branches().iter().zip(shares) {
                assert!(
                    (b.len as f32 - m * share).abs() <= 1.0 + 1e-3,
                    "step {step}: branch of share {share} has {} of {m} tokens",
                    b.len
                );
            }
        }
    }

    #[test]
    fn confidence_and_closing() {
        let mut g = Grower::new(7, GrowConfig::default());
        assert_eq!(g.next(), Some(0));
        assert_eq!(g.best_confidence(), 1.0);
        let ids = g.expand(0, &[(1, 0.6), (2, 0.4)]);
        assert!((g.best_confidence() - 0.6).abs() < 1e-6);
        g.expand(ids[0], &[(3, 0.5)]);
        // Branch 0 now ends at cum .3, branch 1 at .4.
        assert!((g.best_confidence() - 0.4).abs() < 1e-6);
        g.close(ids[1]);
        assert!((g.best_confidence() - 0.3).abs() < 1e-6);
        let leaf = g.next().unwrap();
        g.expand(leaf, &[]);
        assert_eq!(g.next(), None);
        assert_eq!(g.best_confidence(), 0.0);
        // Expanding a node that is not an open leaf changes nothing.
        assert!(g.expand(1, &[(9, 0.9)]).is_empty());
    }

    #[test]
    fn a_graft_opens_a_branch_under_any_node_once() {
        let mut g = Grower::new(7, GrowConfig::default());
        let ids = g.expand(0, &[(1, 0.9)]);
        g.expand(ids[0], &[(3, 0.5)]);
        // Under the interior node 1, beside 3: a new open branch.
        let id = g.graft(ids[0], 4, 0.2).unwrap();
        assert_eq!(g.tree().node(id).parent, Some(ids[0]));
        assert!((g.tree().node(id).cum - 0.18).abs() < 1e-6);
        assert_eq!(g.branches().len(), 2);
        assert!(g.branches()[1].open && g.branches()[1].leaf == id);
        // Once per token, and only under nodes that exist.
        assert!(g.graft(ids[0], 3, 0.1).is_none() && g.graft(ids[0], 4, 0.1).is_none());
        assert!(g.graft(99, 5, 0.1).is_none());
        // The new leaf grows like any other.
        assert_eq!(g.expand(id, &[(6, 1.0)]).len(), 1);
        assert_eq!(g.total(), 4);
    }
}

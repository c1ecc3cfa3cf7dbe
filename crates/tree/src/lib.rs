//! Token trees for speculative decoding.
//!
//! A [`TokenTree`] is rooted at the last committed token; every other node
//! is a draft guess with the draft model's probability for it and its
//! cumulative confidence (the product of probabilities from the root), the
//! draft's own estimate that the target will accept it.
//!
//! [`Grower`] grows a tree the LLMCad way: every candidate above a branch
//! threshold opens a branch, and a pacer picks which branch to extend next
//! so that branch lengths follow their share of the total confidence.
//! [`Fallback`] is the adaptive threshold α that decides when a tree is
//! uncertain enough to be verified.

mod fallback;
mod grow;

pub use fallback::Fallback;
pub use grow::{Branch, GrowConfig, Grower, admitted, pace};

/// One node of a [`TokenTree`].
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub token: u32,
    pub parent: Option<usize>,
    /// Draft probability of this token given its parent (1 at the root).
    pub prob: f32,
    /// Product of `prob` along the path from the root.
    pub cum: f32,
    pub depth: usize,
    pub children: Vec<usize>,
}

/// A tree of draft tokens; node 0 is the root. Parents always come before
/// their children, so node order is a valid feeding order.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenTree {
    nodes: Vec<Node>,
}

impl TokenTree {
    pub fn new(root: u32) -> Self {
        Self {
            nodes: vec![Node {
                token: root,
                parent: None,
                prob: 1.0,
                cum: 1.0,
                depth: 0,
                children: Vec::new(),
            }],
        }
    }

    /// Adds `token` under `parent` with draft probability `prob`; its id.
    ///
    /// # Panics
    /// If `parent` is not a node of this tree.
    pub fn push(&mut self, parent: usize, token: u32, prob: f32) -> usize {
        let id = self.nodes.len();
        let (cum, depth) = {
            let p = &self.nodes[parent];
            (p.cum * prob, p.depth + 1)
        };
        self.nodes.push(Node {
            token,
            parent: Some(parent),
            prob,
            cum,
            depth,
            children: Vec::new(),
        });
        self.nodes[parent].children.push(id);
        id
    }

    /// Number of nodes, the root included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Never true: a tree always has its root.
    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn parents(&self) -> Vec<Option<usize>> {
        self.nodes.iter().map(|n| n.parent).collect()
    }

    pub fn tokens(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.token).collect()
    }

    /// The child of `node` carrying `token`, if any.
    pub fn child_with_token(&self, node: usize, token: u32) -> Option<usize> {
        self.nodes[node]
            .children
            .iter()
            .copied()
            .find(|&c| self.nodes[c].token == token)
    }

    /// Node ids from the root to `node`, both included.
    pub fn path(&self, node: usize) -> Vec<usize> {
        let mut path = vec![node];
        let mut cur = node;
        while let Some(p) = self.nodes[cur].parent {
            path.push(p);
            cur = p;
        }
        path.reverse();
        path
    }

    pub fn leaves(&self) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| self.nodes[i].children.is_empty())
            .collect()
    }

    /// The deepest root path (the most confident one among equally deep).
    pub fn longest_path(&self) -> Vec<usize> {
        let best = (0..self.len())
            .max_by(|&a, &b| {
                let (na, nb) = (&self.nodes[a], &self.nodes[b]);
                na.depth.cmp(&nb.depth).then(na.cum.total_cmp(&nb.cum))
            })
            .unwrap_or(0);
        self.path(best)
    }

    /// Expected number of accepted draft tokens if the whole tree is
    /// verified, by the draft's own estimate: the sum of the non-root
    /// nodes' cumulative confidences.
    pub fn expected_accepted(&self) -> f32 {
        self.nodes[1..].iter().map(|n| n.cum).sum()
    }

    /// The non-root nodes' cumulative confidences, most confident first:
    /// `1 + ` the sum of the first `n` is the expected number of tokens a
    /// verification of the `n` most confident nodes yields.
    pub fn confidences(&self) -> Vec<f32> {
        let mut cums: Vec<f32> = self.nodes[1..].iter().map(|n| n.cum).collect();
        cums.sort_by(|a, b| b.total_cmp(a));
        cums
    }

    /// Depth of the deepest node in the subtree under `node`.
    pub fn deepest_below(&self, node: usize) -> usize {
        let mut best = self.nodes[node].depth;
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            best = best.max(self.nodes[n].depth);
            stack.extend_from_slice(&self.nodes[n].children);
        }
        best
    }

    /// The root and the `n` most confident other nodes, as a new tree
    /// (ancestor-closed, since confidence never grows along a path), with
    /// the old id of every kept node.
    pub fn top(&self, n: usize) -> (TokenTree, Vec<usize>) {
        let mut order: Vec<usize> = (1..self.len()).collect();
        order.sort_by(|&a, &b| {
            let (na, nb) = (&self.nodes[a], &self.nodes[b]);
            nb.cum
                .total_cmp(&na.cum)
                .then(na.depth.cmp(&nb.depth))
                .then(a.cmp(&b))
        });
        let mut keep: Vec<usize> = order.into_iter().take(n).collect();
        keep.sort_unstable();
        let mut new_id = vec![usize::MAX; self.len()];
        new_id[0] = 0;
        let mut tree = TokenTree::new(self.nodes[0].token);
        let mut old = vec![0];
        for &i in &keep {
            let node = &self.nodes[i];
            let parent = new_id[node.parent.expect("non-root")];
            if parent == usize::MAX {
                // A parent less confident than its child cannot happen with
                // probabilities <= 1; skip defensively rather than corrupt.
                continue;
            }
            new_id[i] = tree.push(parent, node.token, node.prob);
            old.push(i);
        }
        (tree, old)
    }

    /// Follows `tokens` from `from`, reusing children that carry them and
    /// adding the rest (probability 1): merges a verified path into the
    /// tree. Returns the node ids along the merged path.
    pub fn merge_path(&mut self, from: usize, tokens: &[u32]) -> Vec<usize> {
        let mut cur = from;
        let mut ids = Vec::with_capacity(tokens.len());
        for &t in tokens {
            cur = match self.child_with_token(cur, t) {
                Some(c) => c,
                None => self.push(cur, t, 1.0),
            };
            ids.push(cur);
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TokenTree {
        // 0(r) ─ 1(a .6) ─ 3(c .5)
        //      └ 2(b .3) ─ 4(d .9) ─ 5(e .9)
        let mut t = TokenTree::new(100);
        let a = t.push(0, 1, 0.6);
        let b = t.push(0, 2, 0.3);
        t.push(a, 3, 0.5);
        let d = t.push(b, 4, 0.9);
        t.push(d, 5, 0.9);
        t
    }

    #[test]
    fn cumulative_confidence_is_the_path_product() {
        let t = sample();
        assert!((t.node(5).cum - 0.3 * 0.9 * 0.9).abs() < 1e-6);
        assert_eq!(t.node(5).depth, 3);
        assert_eq!(t.path(5), [0, 2, 4, 5]);
        assert_eq!(t.longest_path(), [0, 2, 4, 5]);
        assert_eq!(t.leaves(), [3, 5]);
        assert_eq!(t.child_with_token(0, 2), Some(2));
        assert_eq!(t.child_with_token(0, 9), None);
        let e = 0.6 + 0.3 + 0.3 + 0.27 + 0.243;
        assert!((t.expected_accepted() - e).abs() < 1e-5);
        let c = t.confidences();
        assert_eq!(c.len(), 5);
        assert!(c.windows(2).all(|w| w[0] >= w[1]) && (c[0] - 0.6).abs() < 1e-6);
        assert_eq!(t.deepest_below(0), 3);
        assert_eq!(t.deepest_below(1), 2);
        assert_eq!(t.deepest_below(5), 3);
    }

    #[test]
    fn top_keeps_the_most_confident_nodes_and_their_ancestors() {
        let t = sample();
        let (top, old) = t.top(3);
        // cum: a .6, b .3, c .3, d .27, e .243 → a, b, c (b before c: same
        // cum, lower depth first).
        assert_eq!(old, [0, 1, 2, 3]);
        assert_eq!(top.tokens(), [100, 1, 2, 3]);
        assert_eq!(top.parents(), [None, Some(0), Some(0), Some(1)]);
        let (all, _) = t.top(99);
        assert_eq!(all, t);
    }

    #[test]
    fn merging_a_path_reuses_existing_nodes() {
        let mut t = sample();
        let ids = t.merge_path(0, &[2, 4, 7]);
        assert_eq!(&ids[..2], &[2, 4]);
        assert_eq!(t.len(), 7);
        assert_eq!(t.node(ids[2]).parent, Some(4));
    }
}

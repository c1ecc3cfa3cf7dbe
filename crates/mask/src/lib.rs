//! Tree attention masks.
//!
//! A token tree is given as a parent array: node `i`'s parent is
//! `parents[i]` (`None` for a root), and every parent comes before its
//! children. Feeding a tree to a model in one forward pass needs, for every
//! node, the positions it may attend to (the cached prefix, its ancestors,
//! itself) and its rotary position (`prefix_len + depth`), so that each
//! branch computes exactly what it would compute alone.
//!
//! [`append_mask`] is the general case: some tree nodes are already in the
//! KV cache (in any slot order) and new ones are appended. A whole flattened
//! tree ([`tree_mask`]) and a batch of independent branch sequences
//! ([`branches_mask`]) are special cases.

use arbor_tensor::Mask;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaskError {
    #[error("node {node} has parent {parent}, which does not come before it")]
    ParentOrder { node: usize, parent: usize },
    #[error("node {node}: ancestor {ancestor} is neither cached nor fed before it")]
    MissingAncestor { node: usize, ancestor: usize },
    #[error("node {0} is not in the tree")]
    UnknownNode(usize),
    #[error("node {0} is placed twice")]
    Duplicate(usize),
}

pub type Result<T, E = MaskError> = std::result::Result<T, E>;

fn check(parents: &[Option<usize>]) -> Result<()> {
    for (node, p) in parents.iter().enumerate() {
        if let Some(parent) = *p
            && parent >= node
        {
            return Err(MaskError::ParentOrder { node, parent });
        }
    }
    Ok(())
}

/// Depth of every node (roots have depth 0).
pub fn depths(parents: &[Option<usize>]) -> Result<Vec<usize>> {
    check(parents)?;
    let mut depth = vec![0usize; parents.len()];
    for i in 0..parents.len() {
        if let Some(p) = parents[i] {
            depth[i] = depth[p] + 1;
        }
    }
    Ok(depth)
}

/// Rotary positions of the listed nodes: `prefix_len + depth`.
pub fn positions(
    prefix_len: usize,
    parents: &[Option<usize>],
    nodes: &[usize],
) -> Result<Vec<u32>> {
    let depth = depths(parents)?;
    nodes
        .iter()
        .map(|&n| {
            depth
                .get(n)
                .map(|d| (prefix_len + d) as u32)
                .ok_or(MaskError::UnknownNode(n))
        })
        .collect()
}

/// The mask for feeding `new` nodes when the KV cache holds `prefix_len`
/// shared positions followed by the `cached` nodes (node id per slot, in
/// slot order). Row `r` is `new[r]`; columns are the prefix, the cached
/// slots, then the new nodes in order. A node sees the prefix, its
/// ancestors and itself; its ancestors must be cached or come earlier in
/// `new`.
pub fn append_mask(
    prefix_len: usize,
    parents: &[Option<usize>],
    cached: &[usize],
    new: &[usize],
) -> Result<Mask> {
    check(parents)?;
    let cols = prefix_len + cached.len() + new.len();
    let mut slot: Vec<Option<usize>> = vec![None; parents.len()];
    for (i, &n) in cached.iter().chain(new).enumerate() {
        let s = slot.get_mut(n).ok_or(MaskError::UnknownNode(n))?;
        if s.is_some() {
            return Err(MaskError::Duplicate(n));
        }
        *s = Some(prefix_len + i);
    }
    let mut allowed = vec![false; new.len() * cols];
    for (r, &node) in new.iter().enumerate() {
        let row = &mut allowed[r * cols..(r + 1) * cols];
        row[..prefix_len].fill(true);
        let own = prefix_len + cached.len() + r;
        let mut cur = Some(node);
        while let Some(a) = cur {
            match slot[a] {
                Some(s) if s <= own => row[s] = true,
                _ => return Err(MaskError::MissingAncestor { node, ancestor: a }),
            }
            cur = parents[a];
        }
    }
    Ok(Mask {
        rows: new.len(),
        cols,
        allowed,
    })
}

/// The mask for a whole flattened tree (node `i` in slot `prefix_len + i`).
pub fn tree_mask(prefix_len: usize, parents: &[Option<usize>]) -> Result<Mask> {
    let all: Vec<usize> = (0..parents.len()).collect();
    append_mask(prefix_len, parents, &[], &all)
}

/// Parent array of independent branch sequences laid end to end: each
/// token follows the previous token of its own branch.
pub fn branch_parents(lens: &[usize]) -> Vec<Option<usize>> {
    let mut parents = Vec::with_capacity(lens.iter().sum());
    for &len in lens {
        for j in 0..len {
            parents.push(if j == 0 {
                None
            } else {
                Some(parents.len() - 1)
            });
        }
    }
    parents
}

/// The mask and positions for a batch of branch sequences of lengths
/// `lens`, all continuing the same `prefix_len` cached positions: each
/// token sees the prefix and the earlier tokens of its own branch.
pub fn branches_mask(prefix_len: usize, lens: &[usize]) -> (Mask, Vec<u32>) {
    let parents = branch_parents(lens);
    let all: Vec<usize> = (0..parents.len()).collect();
    // Branch parents always precede their children, so neither call fails.
    let mask = tree_mask(prefix_len, &parents).expect("branch parents are ordered");
    let pos = positions(prefix_len, &parents, &all).expect("branch parents are ordered");
    (mask, pos)
}

/// The mask and positions of prompt-token chains inserted into a cached
/// sequence of `len` tokens (parallel prompt decoding's training and
/// accuracy passes): for each insertion point `p` a chain of `count` rows
/// at positions `p, p + 1, …`, each seeing cache slots `0..p` and the
/// earlier rows of its own chain, as if the chain replaced the tokens from
/// `p` on.
pub fn insertion_mask(len: usize, points: &[usize], count: usize) -> (Mask, Vec<u32>) {
    let rows = points.len() * count;
    let cols = len + rows;
    let mut allowed = vec![false; rows * cols];
    for (b, &p) in points.iter().enumerate() {
        for i in 0..count {
            let r = b * count + i;
            let line = &mut allowed[r * cols..(r + 1) * cols];
            line[..p.min(len)].iter_mut().for_each(|a| *a = true);
            line[len + b * count..=len + b * count + i]
                .iter_mut()
                .for_each(|a| *a = true);
        }
    }
    let positions = points
        .iter()
        .flat_map(|&p| (0..count).map(move |i| (p + i) as u32))
        .collect();
    (
        Mask {
            rows,
            cols,
            allowed,
        },
        positions,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rows(m: &Mask) -> Vec<String> {
        (0..m.rows)
            .map(|r| {
                (0..m.cols)
                    .map(|c| if m.get(r, c) { '1' } else { '.' })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn each_inserted_chain_sees_its_prefix_and_itself() {
        let (m, pos) = insertion_mask(4, &[1, 3], 2);
        assert_eq!(rows(&m), ["1...1...", "1...11..", "111...1.", "111...11"]);
        assert_eq!(pos, [1, 2, 3, 4]);
    }

    #[test]
    fn a_small_tree_sees_prefix_ancestors_and_itself() {
        // 0 ─ 1 ─ 3
        //   └ 2
        let parents = [None, Some(0), Some(0), Some(1)];
        let m = tree_mask(2, &parents).unwrap();
        assert_eq!(rows(&m), ["111...", "1111..", "111.1.", "1111.1"]);
        assert_eq!(positions(2, &parents, &[0, 1, 2, 3]).unwrap(), [2, 3, 3, 4]);
    }

    #[test]
    fn appending_uses_the_cache_slots_in_feeding_order() {
        // Node 2 was fed before node 1: slots are prefix, 0, 2, then the
        // new node 3 (child of 1) and 1 itself must be fed first.
        let parents = [None, Some(0), Some(0), Some(1)];
        let m = append_mask(1, &parents, &[0, 2], &[1, 3]).unwrap();
        assert_eq!(rows(&m), ["11.1.", "11.11"]);
        assert_eq!(
            append_mask(1, &parents, &[0, 2], &[3]),
            Err(MaskError::MissingAncestor {
                node: 3,
                ancestor: 1
            })
        );
        assert_eq!(
            append_mask(1, &parents, &[0], &[0]),
            Err(MaskError::Duplicate(0))
        );
    }

    #[test]
    fn branches_are_independent_chains() {
        let (m, pos) = branches_mask(1, &[2, 1]);
        assert_eq!(rows(&m), ["11..", "111.", "1..1"]);
        assert_eq!(pos, [1, 2, 1]);
    }

    #[test]
    fn bad_parent_arrays_are_errors() {
        assert_eq!(
            tree_mask(0, &[None, Some(1)]),
            Err(MaskError::ParentOrder { node: 1, parent: 1 })
        );
        assert_eq!(positions(0, &[None], &[3]), Err(MaskError::UnknownNode(3)));
    }

    fn random_tree() -> impl Strategy<Value = Vec<Option<usize>>> {
        prop::collection::vec(any::<prop::sample::Index>(), 1..40).prop_map(|picks| {
            let mut parents = vec![None];
            for (i, p) in picks.iter().enumerate().skip(1) {
                parents.push(Some(p.index(i)));
            }
            parents
        })
    }

    proptest! {
        /// Every row allows exactly prefix + depth + 1 positions, and a
        /// column of the tree part is allowed iff it is an ancestor-or-self.
        #[test]
        fn rows_allow_exactly_the_ancestor_chain(parents in random_tree(), prefix in 0usize..5) {
            let m = tree_mask(prefix, &parents).unwrap();
            let depth = depths(&parents).unwrap();
            m.validate(parents.len(), prefix + parents.len()).unwrap();
            for (i, d) in depth.iter().enumerate() {
                let count = (0..m.cols).filter(|&c| m.get(i, c)).count();
                prop_assert_eq!(count, prefix + d + 1);
                let mut anc = vec![false; parents.len()];
                let mut cur = Some(i);
                while let Some(a) = cur { anc[a] = true; cur = parents[a]; }
                for (j, &a) in anc.iter().enumerate() {
                    prop_assert_eq!(m.get(i, prefix + j), a);
                }
            }
        }

        /// Feeding a tree in several appends gives the same rows as the
        /// flattened mask, restricted to the columns that exist.
        #[test]
        fn appending_in_order_matches_the_flattened_mask(parents in random_tree(), split in any::<prop::sample::Index>()) {
            let n = parents.len();
            let k = split.index(n);
            let full = tree_mask(3, &parents).unwrap();
            let cached: Vec<usize> = (0..k).collect();
            let new: Vec<usize> = (k..n).collect();
            let part = append_mask(3, &parents, &cached, &new).unwrap();
            for (r, &node) in new.iter().enumerate() {
                for c in 0..part.cols {
                    prop_assert_eq!(part.get(r, c), full.get(node, c));
                }
            }
        }
    }
}

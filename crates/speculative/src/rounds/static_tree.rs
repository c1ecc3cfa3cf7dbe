//! Static trees: every node up to `depth` gets the draft's `width` most
//! likely children (or draws), level by level, within the room left; the
//! target checks the tree in one pass.

use std::time::Instant;

use arbor_tree::TokenTree;

use super::Round;
use crate::run::Run;
use crate::{Event, MAX_DRAFT_TOKENS, Result};

pub(super) struct StaticTree {
    pub(super) width: usize,
    pub(super) depth: usize,
}

impl Round for StaticTree {
    fn round(&mut self, run: &mut Run<'_, '_>, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        let room = run.room(MAX_DRAFT_TOKENS);
        if room == 0 {
            return run.target_step(on);
        }
        let t = Instant::now();
        let (mut fed, root_logits) = run.draft_catch_up()?;
        let mut tree = TokenTree::new(run.root());
        let mut dists: Vec<Option<Vec<f32>>> = vec![None];
        let mut level = vec![0usize];
        let mut rows = root_logits;
        let vocab = run.vocab;
        for d in 0..self.depth {
            let mut next = Vec::new();
            for (i, &node) in level.iter().enumerate() {
                if run.is_stop(tree.node(node).token) && node != 0 {
                    continue;
                }
                let left = room - (tree.len() - 1);
                let row = rows[i * vocab..(i + 1) * vocab].to_vec();
                let p = run.propose(&row, self.width.min(left), None);
                dists[node] = p.q;
                for (tok, prob) in p.children {
                    next.push(tree.push(node, tok, prob));
                    dists.push(None);
                }
            }
            if next.is_empty() || d + 1 == self.depth {
                break;
            }
            rows = run.draft_feed(&tree, &mut fed, &next, true)?;
            level = next;
        }
        run.drafted(t, tree.len() - 1);
        let ids: Vec<usize> = (0..tree.len()).collect();
        run.verify(&tree, &dists, &fed, &ids, on)?;
        Ok(())
    }
}

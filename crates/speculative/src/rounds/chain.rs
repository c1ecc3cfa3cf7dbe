//! Chain speculation: the draft proposes up to `gamma` tokens one after
//! another (its first choice, or a draw in sampling mode), and the target
//! checks the chain in one pass.

use std::time::Instant;

use arbor_tree::TokenTree;

use super::Round;
use crate::run::Run;
use crate::{Event, Result};

pub(super) struct Chain {
    pub(super) gamma: usize,
}

impl Round for Chain {
    fn round(&mut self, run: &mut Run<'_, '_>, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        let room = run.room(self.gamma);
        if room == 0 {
            return run.target_step(on);
        }
        let t = Instant::now();
        let (mut fed, mut logits) = run.draft_catch_up()?;
        let mut tree = TokenTree::new(run.root());
        let mut dists: Vec<Option<Vec<f32>>> = vec![None];
        let mut leaf = 0;
        while tree.len() - 1 < room {
            let p = run.propose(&logits, 1, None);
            dists[leaf] = p.q;
            let Some(&(tok, prob)) = p.children.first() else {
                break;
            };
            leaf = tree.push(leaf, tok, prob);
            dists.push(None);
            if tree.len() > room || run.is_stop(tok) {
                break;
            }
            logits = run.draft_feed(&tree, &mut fed, &[leaf], true)?;
        }
        run.drafted(t, tree.len() - 1);
        let ids: Vec<usize> = (0..tree.len()).collect();
        run.verify(&tree, &dists, &fed, &ids, on)?;
        Ok(())
    }
}

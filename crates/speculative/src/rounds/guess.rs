//! `tree-ppd`: the draft reads each leaf with its own trained prompt tokens
//! after it (PPD on the draft). The leaf's logits give its children as in
//! `tree`; the prompt rows guess the tokens after its first child, and
//! those guesses extend the branch at once, before the draft has read
//! them. When the grower next picks that branch, one draft pass reads the
//! whole unread stretch of it: where the draft's own choice differs from a
//! guess, its choice is grafted there as a new branch and the guessed one
//! stops growing; where it agrees, the branch grew several tokens for one
//! pass. The target verifies whatever the tree holds, so the output is the
//! target's either way (greedy only: guessed nodes are not draws from the
//! draft, so sampled rounds read one leaf at a time as `tree` does).

use arbor_tree::Grower;

use super::tree::Tree;
use crate::run::{Fed, Run, top_probs};
use crate::{Result, SpecError};

impl Tree {
    /// The draft's prompt tokens and how many a step carries (0: plain
    /// steps); sized on the first round.
    pub(super) fn guessing(&mut self, run: &Run<'_, '_>) -> Result<usize> {
        let Some(dp) = &self.cfg.draft_prompts else {
            return Ok(0);
        };
        if run.sampling_mode {
            return Ok(0);
        }
        let prompts = dp.prompts.as_ref().ok_or_else(|| {
            SpecError::Invalid("tree-ppd needs the draft's trained prompt tokens".into())
        })?;
        prompts.check(run.draft.as_deref().map_or(0, |d| d.config().hidden))?;
        if self.guesses.is_none() {
            let q = dp
                .count
                .unwrap_or_else(|| crate::draft_guesses(prompts, self.cfg.draft_profile.as_ref()));
            self.guesses = Some(q.min(prompts.count()));
        }
        Ok(self.guesses.unwrap_or(0))
    }

    /// One draft pass for `leaf` carrying `q` prompt tokens (see the module
    /// doc): grows `g`, keeping `dists` and `prov` one entry per node.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn guess_step(
        &self,
        run: &mut Run<'_, '_>,
        g: &mut Grower,
        fed: &mut Fed,
        dists: &mut Vec<Option<Vec<f32>>>,
        prov: &mut Vec<bool>,
        leaf: usize,
        q: usize,
        room: usize,
    ) -> Result<()> {
        let prompts = (self.cfg.draft_prompts.as_ref())
            .and_then(|d| d.prompts.clone())
            .expect("checked by guessing()");
        let e = prompts.epts;
        let chains: Vec<Vec<&[f32]>> = (0..e)
            .map(|j| (0..q).map(|i| prompts.vector(i, j)).collect())
            .collect();
        // The leaf and the guessed nodes above it the draft has not read.
        let path: Vec<usize> = (g.tree().path(leaf).into_iter())
            .filter(|&n| fed.slot(n).is_none())
            .collect();
        let (logits, guesses) = run.draft_feed_guessing(g.tree(), fed, &path, &chains)?;
        let vocab = run.vocab;
        let grow = |run: &Run<'_, '_>,
                    g: &mut Grower,
                    dists: &mut Vec<_>,
                    prov: &mut Vec<_>,
                    ids: &[usize]| {
            dists.resize(g.tree().len(), None);
            prov.resize(g.tree().len(), false);
            run.close_stops(g, ids);
        };
        // Where the draft's choice after a read node is not the guess that
        // follows it, the guessed branch stops and the choice branches off.
        for (i, pair) in path.windows(2).enumerate() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let (top, p) = top_probs(row, 1)[0];
            if top != g.tree().node(pair[1]).token {
                g.close(leaf);
                if g.total() < room
                    && let Some(id) = g.graft(pair[0], top, p)
                {
                    grow(run, g, dists, prov, &[id]);
                }
                return Ok(());
            }
        }
        let row = &logits[(path.len() - 1) * vocab..];
        let width = g.config().max_children.max(1);
        let left = room.saturating_sub(g.total());
        let threshold = Some(g.config().branch_threshold);
        let p = run.propose(row, width.min(left), threshold);
        let ids = g.expand(leaf, &p.children);
        grow(run, g, dists, prov, &ids);
        // The guesses continue the leaf's first child.
        let Some(mut at) = ids.first().copied() else {
            return Ok(());
        };
        for row in crate::ensemble(&guesses, q, e, |i, j| j * q + i) {
            if g.total() >= room {
                break;
            }
            let (token, p) = top_probs(&row, 1)[0];
            let Some(&id) = g.expand(at, &[(token, p)]).first() else {
                break;
            };
            grow(run, g, dists, prov, &[id]);
            at = id;
        }
        Ok(())
    }
}

//! Parallel prompt decoding (`ppd`): no draft model. Each pass carries the
//! last committed token, the candidate tree planned from the prompt
//! tokens' accuracy table ([`arbor_ppd::plan`], a dynamic sparse tree: one
//! shape per depth the last pass's guesses reach) with its tokens taken
//! from those guesses, and after each of those rows 1 to `m` prompt tokens
//! (embedding rows, each seeing only its own path). The target's rows of
//! the tree are verified as any draft tree's; the prompt rows after the
//! deepest accepted node give the next round's guesses; the cache keeps
//! the accepted path only.

use std::time::Instant;

use arbor_model::Row;
use arbor_ppd::Plan;
use arbor_tree::TokenTree;

use super::Round;
use crate::run::{Run, top_logits};
use crate::{Event, Phase, PpdConfig, PromptTokens, Result, SpecError};

pub(super) struct Ppd {
    cfg: PpdConfig,
    plan: Option<Plan>,
    /// The last pass's guesses, by distance: the tokens of each rank.
    guesses: Option<Vec<Vec<u32>>>,
}

impl Ppd {
    pub(super) fn new(cfg: PpdConfig) -> Self {
        Self {
            cfg,
            plan: None,
            guesses: None,
        }
    }

    fn prompts(&self, run: &mut Run<'_, '_>) -> Result<std::sync::Arc<PromptTokens>> {
        let p = self.cfg.prompts.clone().ok_or_else(|| {
            SpecError::Invalid("ppd needs trained prompt tokens for this target".into())
        })?;
        p.check(run.target().config().hidden)?;
        Ok(p)
    }
}

impl Round for Ppd {
    fn round(&mut self, run: &mut Run<'_, '_>, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        let prompts = self.prompts(run)?;
        let m = prompts.count().min(prompts.accuracy.distances());
        let e = prompts.epts;
        let logit_cap = crate::ppd_logit_rows(self.cfg.max_rows);
        if self.plan.is_none() {
            let profile = self.cfg.profile.clone();
            let share = run.target().config().head_share();
            let cost = |rows: usize, logits: usize| {
                (profile.as_ref()).map_or(1.0, |p| crate::ppd_pass_secs(p, rows, logits, share))
            };
            self.plan = Some(arbor_ppd::plan(
                &prompts.accuracy,
                m,
                e,
                self.cfg.max_rows,
                logit_cap,
                cost,
            )?);
        }
        let plan = self.plan.as_ref().expect("planned above");
        // Rows this pass may append: the context left after the prefix.
        let rows_left = run.context.saturating_sub(run.seq.len() - 1);
        if plan.prompts == 0 || rows_left < 1 + e {
            self.guesses = None;
            return run.target_step(on);
        }
        let t = Instant::now();
        let mut tree = TokenTree::new(run.root());
        // Prompt tokens after each tree row (the committed token first):
        // all of them when there is nothing to verify yet.
        let most = |q: usize| q.min((rows_left - 1) / e).min((logit_cap - 1) / e).max(1);
        let mut carry = vec![most(m)];
        if let Some(guesses) = &self.guesses {
            let state = plan
                .state(guesses.len())
                .expect("a plan with prompts has states");
            carry[0] = most(state.prompts[0]);
            let room = run.room(state.tree.len());
            let mut rows = 1 + carry[0] * e;
            let mut ids: Vec<Option<usize>> = Vec::with_capacity(state.tree.len());
            for (c, &q) in state.tree.nodes().iter().zip(&state.prompts[1..]) {
                let parent = c.parent.map_or(Some(0), |p| ids[p]);
                // (A head narrower than the table's ranks guesses fewer.)
                let token = guesses.get(c.depth - 1).and_then(|g| g.get(c.rank));
                let widest = carry.iter().copied().max().unwrap_or(0).max(q);
                let fits = tree.len() - 1 < room
                    && rows + 1 + q * e <= rows_left
                    && tree.len() + 1 + widest * e <= logit_cap;
                ids.push(match (parent, token) {
                    (Some(p), Some(&token)) if fits => {
                        rows += 1 + q * e;
                        carry.push(q);
                        Some(tree.push(p, token, c.value as f32))
                    }
                    _ => None,
                });
            }
        }
        // The candidates count as drafted tokens (guessed in the last pass).
        let n = tree.len();
        run.stats.draft_tokens += n - 1;
        // The tree's rows, then each row's prompt tokens: one chain per
        // EPT, each seeing its own path (EPT `j` of prompt token `i` after
        // node `k` is row `first[k] + j * carry[k] + i`).
        let mut parents = tree.parents();
        let mut rows: Vec<Row<'_>> = tree.tokens().into_iter().map(Row::Token).collect();
        let mut first = Vec::with_capacity(n);
        for (node, &q) in carry.iter().enumerate() {
            first.push(rows.len());
            for j in 0..e {
                for i in 0..q {
                    let parent = if i == 0 { node } else { parents.len() - 1 };
                    parents.push(Some(parent));
                    rows.push(Row::Vector(prompts.vector(i, j)));
                }
            }
        }
        let prefix = run.target().cache_len();
        let mask = arbor_mask::tree_mask(prefix, &parents)?;
        let all: Vec<usize> = (0..rows.len()).collect();
        let positions = arbor_mask::positions(prefix, &parents, &all)?;
        // Where the model keeps the pass, only the tree's rows come back
        // now and one node's prompt rows after the verdict; otherwise all.
        let later = run.target().keep_last_pass(true);
        let asked = if later { &all[..n] } else { &all[..] };
        let pass = run.target().forward_rows(&rows, &positions, &mask, asked);
        let mut logits = match pass {
            Ok(l) => l,
            Err(e) => {
                run.target().keep_last_pass(false);
                return Err(e.into());
            }
        };
        // The tree's rows come first; the verdict reads (and a constraint
        // masks) no others.
        let verdict = run.judge(&tree, &mut logits, &vec![None; n]);
        // The deepest accepted node's prompt rows guess past the token the
        // target adds after it, as deep as it carried prompt tokens.
        let last = verdict
            .as_ref()
            .map_or(0, |v| v.accepted.last().copied().unwrap_or(0));
        let q = carry[last];
        let wanted: Vec<usize> = (first[last]..first[last] + q * e).collect();
        let guessed = if later {
            let l = run.target().later_logits(&wanted);
            run.target().keep_last_pass(false);
            l?.ok_or_else(|| SpecError::Invalid("the target kept no hidden states".into()))?
        } else {
            logits.select(&wanted)
        };
        let verdict = verdict?;
        run.span(Phase::Verify, t, rows.len());
        run.stats.target_secs += t.elapsed().as_secs_f64();
        let ranks = prompts.accuracy.ranks();
        self.guesses = Some(
            (crate::ensemble(&guessed, q, e, |i, j| j * q + i).iter())
                .map(|row| top_logits(row, ranks).into_iter().map(|(t, _)| t).collect())
                .collect(),
        );
        run.settle(&tree, &verdict, on);
        // PPD's candidates come from its table, not from confidence:
        // counted at every depth.
        (run.stats.acceptance).observe(&tree, &verdict.accepted, verdict.next, 0);
        Ok(())
    }
}

//! Parallel prompt decoding (`ppd`): no draft model. Each pass carries the
//! last committed token, the candidate tree planned from the prompt
//! tokens' accuracy table ([`arbor_ppd::plan`]) with its tokens taken from
//! the last pass's guesses, and after each of those rows the prompt tokens
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
        let hidden = run.target().config().hidden;
        if p.hidden != hidden || p.count() == 0 || p.vectors.len() != p.count() * hidden {
            return Err(SpecError::Invalid(format!(
                "prompt tokens of width {} ({} values) for a target of width {hidden}",
                p.hidden,
                p.vectors.len()
            )));
        }
        Ok(p)
    }
}

impl Round for Ppd {
    fn round(&mut self, run: &mut Run<'_, '_>, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        let prompts = self.prompts(run)?;
        let count = prompts.count().min(prompts.accuracy.distances());
        if self.plan.is_none() {
            let profile = self.cfg.profile.clone();
            let share = run.target().config().head_share();
            let cost = |rows: usize| {
                profile
                    .as_ref()
                    .map_or(1.0, |p| crate::ppd_pass_secs(p, rows, count, share))
            };
            self.plan = Some(arbor_ppd::plan(
                &prompts.accuracy,
                count,
                self.cfg.max_rows,
                cost,
            )?);
        }
        let plan = self.plan.as_ref().expect("planned above");
        // Rows this pass may append: the context left after the prefix.
        let rows_left = run.context.saturating_sub(run.seq.len() - 1);
        if plan.prompts == 0 || rows_left < arbor_ppd::pass_rows(0, count) {
            self.guesses = None;
            return run.target_step(on);
        }
        let t = Instant::now();
        let mut tree = TokenTree::new(run.root());
        if let Some(guesses) = &self.guesses {
            let room = run.room(plan.tree.len());
            let mut ids: Vec<usize> = Vec::new();
            // Rows of logits the memory plan reserved: the tree's and one
            // node's prompt rows.
            let logit_room = crate::ppd_logit_rows(self.cfg.max_rows).saturating_sub(count);
            for c in plan.tree.nodes() {
                if ids.len() >= room
                    || arbor_ppd::pass_rows(ids.len() + 1, count) > rows_left
                    || ids.len() + 2 > logit_room
                {
                    break;
                }
                // (A head narrower than the table's ranks guesses fewer.)
                let Some(&token) = guesses[c.depth - 1].get(c.rank) else {
                    break;
                };
                let parent = c.parent.map_or(0, |p| ids[p]);
                ids.push(tree.push(parent, token, c.value as f32));
            }
        }
        // The candidates count as drafted tokens (guessed in the last pass).
        let n = tree.len();
        run.stats.draft_tokens += n - 1;
        // The tree's rows, then `count` prompt rows after each of them.
        let mut parents = tree.parents();
        let mut rows: Vec<Row<'_>> = tree.tokens().into_iter().map(Row::Token).collect();
        for node in 0..n {
            for i in 0..count {
                let parent = if i == 0 { node } else { parents.len() - 1 };
                parents.push(Some(parent));
                rows.push(Row::Vector(prompts.vector(i)));
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
        let logits = match pass {
            Ok(l) => l,
            Err(e) => {
                run.target().keep_last_pass(false);
                return Err(e.into());
            }
        };
        // The tree's rows come first; the verdict reads no others.
        let verdict = run.judge(&tree, &logits, &vec![None; n]);
        // The deepest accepted node's prompt rows guess past the token the
        // target adds after it.
        let last = verdict
            .as_ref()
            .map_or(0, |v| v.accepted.last().copied().unwrap_or(0));
        let wanted: Vec<usize> = (0..count).map(|i| n + last * count + i).collect();
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
            (0..count)
                .map(|i| {
                    top_logits(guessed.row(i), ranks)
                        .into_iter()
                        .map(|(t, _)| t)
                        .collect()
                })
                .collect(),
        );
        run.settle(&tree, &verdict, on);
        Ok(())
    }
}

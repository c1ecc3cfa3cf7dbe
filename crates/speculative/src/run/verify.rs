//! Verification: one target pass over a draft tree, the verdict on it,
//! committing the outcome and compacting both caches to the accepted path.

use std::time::Instant;

use arbor_sampling::filtered;
use arbor_tree::TokenTree;
use arbor_verify as verify;

use super::{Fed, Run};
use crate::{Event, Phase, Result, Verification};

/// The target's inputs for one verification pass.
pub(super) struct Pass {
    pub(super) tokens: Vec<u32>,
    pub(super) positions: Vec<u32>,
    pub(super) mask: arbor_model::Mask,
    pub(super) rows: Vec<usize>,
}

impl Run<'_, '_> {
    /// Verifies `tree` with one target pass, commits the outcome, and
    /// compacts both caches to the accepted path. `draft_ids[i]` is node
    /// `i`'s id in the tree the draft grew (whose feeding is in `fed`).
    /// Returns the accepted nodes.
    pub(crate) fn verify(
        &mut self,
        tree: &TokenTree,
        dists: &[Option<Vec<f32>>],
        fed: &Fed,
        draft_ids: &[usize],
        on: &mut dyn FnMut(Event<'_>),
    ) -> Result<Vec<usize>> {
        let t = Instant::now();
        let pass = self.pass(tree)?;
        let mut logits =
            self.target()
                .forward(&pass.tokens, &pass.positions, &pass.mask, &pass.rows)?;
        self.span(Phase::Verify, t, pass.tokens.len());
        let verdict = self.judge(tree, &mut logits, dists)?;
        self.stats.target_secs += t.elapsed().as_secs_f64();
        let (keep, _) = draft_keep(fed, draft_ids, &verdict.accepted);
        self.draft().keep_cache(&keep)?;
        self.settle(tree, &verdict, on);
        Ok(verdict.accepted)
    }

    /// The target's inputs for verifying `tree` after the cache.
    pub(super) fn pass(&mut self, tree: &TokenTree) -> Result<Pass> {
        let prefix = self.target().cache_len();
        debug_assert_eq!(prefix + 1, self.seq.len());
        let parents = tree.parents();
        let rows: Vec<usize> = (0..tree.len()).collect();
        Ok(Pass {
            mask: arbor_mask::tree_mask(prefix, &parents)?,
            positions: arbor_mask::positions(prefix, &parents, &rows)?,
            tokens: tree.tokens(),
            rows,
        })
    }

    /// The verdict on `tree` from the target's logits (row `i` for node
    /// `i`; rows past the tree's are not read), which a constraint masks in
    /// place; the target's cache keeps the accepted path.
    pub(crate) fn judge(
        &mut self,
        tree: &TokenTree,
        logits: &mut arbor_model::Logits,
        dists: &[Option<Vec<f32>>],
    ) -> Result<verify::Verdict> {
        self.constrain_rows(tree, logits)?;
        let logits = &*logits;
        let vocab = logits.vocab;
        let verdict = match self.opts.verification {
            Verification::Typical(policy) => {
                let policy = verify::Typical {
                    temperature: self.opts.sampling.temperature,
                    ..policy
                };
                verify::typical(tree, &logits.data, vocab, &policy, &mut self.rng)
            }
            // Candidates without a proposal distribution (ppd's guesses)
            // are point masses: draw from the target, follow the match.
            Verification::Exact if self.sampling_mode && dists.iter().all(Option::is_none) => {
                let sampler = &mut self.sampler;
                let data = &logits.data;
                verify::matching(tree, &mut |i| {
                    sampler.sample(&data[i * vocab..(i + 1) * vocab])
                })?
            }
            Verification::Exact if self.sampling_mode => {
                let params = self.opts.sampling;
                let data = &logits.data;
                let mut target = |i: usize| {
                    let mut p = vec![0f32; vocab];
                    for (t, v) in filtered(&data[i * vocab..(i + 1) * vocab], &params) {
                        p[t as usize] = v;
                    }
                    p
                };
                verify::sampling(tree, &mut target, dists, &mut self.rng)
            }
            Verification::Exact => verify::greedy(tree, &logits.data, vocab),
        };
        if self.logprobs.is_some() {
            // Each committed token was chosen from its parent's row.
            let mut row = 0;
            for &a in &verdict.accepted {
                let data = &logits.data[row * vocab..(row + 1) * vocab];
                self.score(data, tree.node(a).token);
                row = a;
            }
            let data = &logits.data[row * vocab..(row + 1) * vocab];
            self.score(data, verdict.next);
        }
        let prefix = self.seq.len() - 1;
        let keep: Vec<usize> = (0..=prefix)
            .chain(verdict.accepted.iter().map(|&i| prefix + i))
            .collect();
        self.target().keep_cache(&keep)?;
        self.stats.verifications += 1;
        self.stats.accepted_draft_tokens += verdict.accepted.len();
        Ok(verdict)
    }

    /// With a constraint: masks row `i` of `logits` in place to what may
    /// follow the committed tokens and the tree's path to node `i` (a
    /// verification's logits are tens of MiB: the memory plan counts one
    /// copy of them).
    fn constrain_rows(&self, tree: &TokenTree, logits: &mut arbor_model::Logits) -> Result<()> {
        if self.constraint.is_none() {
            return Ok(());
        }
        let vocab = logits.vocab;
        let rows = tree.len().min(logits.data.len() / vocab.max(1));
        let mut path = Vec::new();
        for i in 0..rows {
            path.clear();
            let mut at = i;
            while let Some(parent) = tree.node(at).parent {
                path.push(tree.node(at).token);
                at = parent;
            }
            path.reverse();
            self.constrain(&path, &mut logits.data[i * vocab..(i + 1) * vocab])?;
        }
        Ok(())
    }

    /// Commits a verdict's tokens and updates the acceptance estimate.
    pub(crate) fn settle(
        &mut self,
        tree: &TokenTree,
        verdict: &verify::Verdict,
        on: &mut dyn FnMut(Event<'_>),
    ) {
        let mut tokens: Vec<u32> = verdict
            .accepted
            .iter()
            .map(|&i| tree.node(i).token)
            .collect();
        tokens.push(verdict.next);
        self.commit(&tokens, on);
        if let Some(guesses) = self.root_guesses.take() {
            let chosen = tokens[0];
            self.stats.acceptance.observe_root(&guesses, chosen);
            // A chain drafts every depth, confident or not: its deeper
            // nodes count too.
            if matches!(self.opts.strategy.decoding, crate::Decoding::Chain { .. }) {
                let acceptance = &mut self.stats.acceptance;
                acceptance.observe(tree, &verdict.accepted, verdict.next, 1);
            }
        }
        let drafted_on_path = verdict.accepted.len()
            + usize::from(
                !tree
                    .node(verdict.accepted.last().copied().unwrap_or(0))
                    .children
                    .is_empty(),
            );
        if drafted_on_path > 0 {
            let rate = verdict.accepted.len() as f64 / drafted_on_path as f64;
            self.accept_rate = 0.8 * self.accept_rate + 0.2 * rate;
        }
    }
}

/// Draft cache positions to keep after a verdict: the prefix, the root and
/// the accepted nodes the draft has read; and whether it had read them all.
pub(super) fn draft_keep(fed: &Fed, draft_ids: &[usize], accepted: &[usize]) -> (Vec<usize>, bool) {
    let mut keep: Vec<usize> = (0..=fed.base).collect();
    for &a in accepted {
        match fed.slot(draft_ids[a]) {
            Some(slot) => keep.push(fed.base + slot),
            None => return (keep, false),
        }
    }
    (keep, true)
}

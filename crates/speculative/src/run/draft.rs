//! The draft's side of a round: catching up with the committed tokens,
//! feeding it tree nodes through tree masks, and reading its proposals.

use std::time::Instant;

use arbor_model::Row;
use arbor_sampling::filtered;
use arbor_tree::{Grower, TokenTree};
use arbor_verify as verify;

use super::Run;
use crate::{PREFILL_CHUNK, Phase, Result};

/// The draft tree as fed to the draft model: `fed[i]` is the node in cache
/// slot `base + i` (the root is in slot `base`).
pub(crate) struct Fed {
    pub(crate) base: usize,
    pub(crate) fed: Vec<usize>,
}

impl Fed {
    /// The draft cache slot (after `base`) holding `node`.
    pub(crate) fn slot(&self, node: usize) -> Option<usize> {
        self.fed.iter().position(|&n| n == node)
    }
}

/// What the draft proposes after one node.
pub(crate) struct Proposal {
    /// Children to add, first choice (or first draw) first, with their
    /// draft probabilities.
    pub(crate) children: Vec<(u32, f32)>,
    /// The draft distribution they were drawn from (sampling mode only).
    pub(crate) q: Option<Vec<f32>>,
}

fn ema(old: Option<f64>, new: f64) -> f64 {
    old.map_or(new, |o| 0.7 * o + 0.3 * new)
}

impl Run<'_, '_> {
    /// Feeds the draft every committed token it has not seen (the root
    /// last) and returns its logits after the root.
    pub(crate) fn draft_catch_up(&mut self) -> Result<(Fed, Vec<f32>)> {
        let seq = &self.seq;
        let d = self.draft.as_deref_mut().expect("checked in decode()");
        if d.cache_len() >= seq.len() {
            d.truncate_cache(seq.len() - 1)?;
        }
        let mut logits = Vec::new();
        for chunk in seq[d.cache_len()..].chunks(PREFILL_CHUNK) {
            logits = d.step(chunk)?;
        }
        let base = seq.len() - 1;
        let guesses = top_logits(&logits, crate::ACCEPTANCE_RANKS);
        self.root_guesses = Some(guesses.iter().map(|g| g.0).collect());
        Ok((Fed { base, fed: vec![0] }, logits))
    }

    /// Runs `nodes` of `tree` through the draft; logits row `i` belongs
    /// to `nodes[i]`. One-node steps update the draft's step-time estimate
    /// when `timed` (provisional steps share the CPU and are not).
    pub(crate) fn draft_feed(
        &mut self,
        tree: &TokenTree,
        fed: &mut Fed,
        nodes: &[usize],
        timed: bool,
    ) -> Result<Vec<f32>> {
        let t = Instant::now();
        let parents = tree.parents();
        let mask = arbor_mask::append_mask(fed.base, &parents, &fed.fed, nodes)?;
        let positions = arbor_mask::positions(fed.base, &parents, nodes)?;
        let tokens: Vec<u32> = nodes.iter().map(|&n| tree.node(n).token).collect();
        let rows: Vec<usize> = (0..nodes.len()).collect();
        let logits = self.draft().forward(&tokens, &positions, &mask, &rows)?;
        fed.fed.extend_from_slice(nodes);
        let secs = t.elapsed().as_secs_f64();
        if nodes.len() == 1 && timed {
            self.draft_step = Some(ema(self.draft_step, secs));
        }
        Ok(logits.data)
    }

    /// Runs `nodes` of `tree` (a path, root side first, its first node's
    /// parent already read) through the draft with chains of prompt-token
    /// vectors after the last of them (one chain per EPT), as
    /// [`Run::draft_feed`] does: returns the nodes' logits and the prompt
    /// rows' logits, chain after chain (a chain's row `i` guesses the token
    /// `i + 2` places past the last node). The prompt rows leave no trace
    /// in the draft's cache.
    pub(crate) fn draft_feed_guessing(
        &mut self,
        tree: &TokenTree,
        fed: &mut Fed,
        nodes: &[usize],
        chains: &[Vec<&[f32]>],
    ) -> Result<(Vec<f32>, arbor_model::Logits)> {
        let mut parents = tree.parents();
        let mut new = nodes.to_vec();
        let mut rows: Vec<Row<'_>> = nodes
            .iter()
            .map(|&n| Row::Token(tree.node(n).token))
            .collect();
        for chain in chains {
            for (i, v) in chain.iter().enumerate() {
                let parent = if i == 0 {
                    nodes[nodes.len() - 1]
                } else {
                    parents.len() - 1
                };
                new.push(parents.len());
                parents.push(Some(parent));
                rows.push(Row::Vector(v));
            }
        }
        let extra = rows.len() - nodes.len();
        let mask = arbor_mask::append_mask(fed.base, &parents, &fed.fed, &new)?;
        let positions = arbor_mask::positions(fed.base, &parents, &new)?;
        let all: Vec<usize> = (0..rows.len()).collect();
        let d = self.draft();
        let mut logits = d.forward_rows(&rows, &positions, &mask, &all)?;
        let kept = d.cache_len() - extra;
        d.truncate_cache(kept)?;
        fed.fed.extend_from_slice(nodes);
        let guesses = arbor_model::Logits {
            rows: extra,
            vocab: logits.vocab,
            data: logits.data.split_off(nodes.len() * logits.vocab),
        };
        Ok((logits.data, guesses))
    }

    /// The draft's proposal after a node: `width` is the most children;
    /// `threshold` (if any) admits children after the first only above it.
    pub(crate) fn propose(
        &mut self,
        logits: &[f32],
        width: usize,
        threshold: Option<f32>,
    ) -> Proposal {
        if width == 0 {
            return Proposal {
                children: Vec::new(),
                q: None,
            };
        }
        if self.sampling_mode {
            // How many children is decided from q alone, before drawing:
            // rejection sampling without replacement stays exact only if
            // the candidate count does not depend on the candidates.
            let cand = filtered(logits, &self.opts.sampling);
            let k = arbor_tree::admitted(&cand, width, threshold);
            let mut q = vec![0f32; self.vocab];
            for &(t, p) in &cand {
                q[t as usize] = p;
            }
            let draws = verify::draw_without_replacement(&q, k, &mut self.rng);
            let children = draws.iter().map(|&t| (t, q[t as usize])).collect();
            Proposal {
                children,
                q: Some(q),
            }
        } else {
            let top = top_probs(logits, width);
            let k = arbor_tree::admitted(&top, width, threshold);
            Proposal {
                children: top[..k].to_vec(),
                q: None,
            }
        }
    }

    /// Accounts a drafting phase that began at `t` and proposed `tokens`
    /// new draft tokens.
    pub(crate) fn drafted(&mut self, t: Instant, tokens: usize) {
        self.stats.draft_secs += t.elapsed().as_secs_f64();
        self.span(Phase::Draft, t, tokens);
        self.stats.draft_tokens += tokens;
    }

    /// Closes the grower's new nodes `ids` that are stop tokens: nothing
    /// is drafted after them.
    pub(crate) fn close_stops(&self, g: &mut Grower, ids: &[usize]) {
        for &id in ids {
            if self.is_stop(g.tree().node(id).token) {
                g.close(id);
            }
        }
    }
}

pub(crate) use arbor_sampling::top_logits;

/// The `k` most probable tokens with their softmax probabilities, most
/// probable first (ties: lower id first).
pub(crate) fn top_probs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let top = top_logits(logits, k);
    let Some(&(_, max)) = top.first() else {
        return top;
    };
    let sum: f32 = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| (l - max).exp())
        .sum();
    top.into_iter()
        .map(|(t, l)| (t, (l - max).exp() / sum))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::top_logits;

    #[test]
    fn top_logits_are_best_first_with_ties_to_the_lower_id() {
        let ids = |row: &[f32], k| -> Vec<u32> { top_logits(row, k).iter().map(|t| t.0).collect() };
        let row = [0.1, 3.0, -1.0, 3.0, 2.0];
        assert_eq!(ids(&row, 3), vec![1, 3, 4]);
        assert_eq!(ids(&row, 9), vec![1, 3, 4, 0, 2]);
        assert_eq!(ids(&row, 0), Vec::<u32>::new());
    }
}

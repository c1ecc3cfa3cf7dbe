//! Adaptive token trees (`tree`, `tree-provisional`, `tree-no-fallback`):
//! the draft grows a tree by confidence until the fallback threshold α
//! calls for verification (or the room or a latency profile stops it), the
//! tree is cut to the size worth the target's latency, and α learns from
//! each verdict. With both latency profiles, rounds where drafting cannot
//! beat plain decoding decode one token plainly instead.

use std::time::Instant;

use arbor_tree::{Fallback, Grower};

use super::Round;
use crate::run::{Grown, Run, Start};
use crate::{Event, LatencyProfile, Result, TreeConfig, best_size};

pub(super) struct Tree {
    pub(super) cfg: TreeConfig,
    /// The adaptive verification threshold α.
    fallback: Fallback,
    /// `tree-ppd`: prompt tokens each draft step carries, once sized.
    pub(super) guesses: Option<usize>,
}

impl Tree {
    pub(super) fn new(cfg: TreeConfig) -> Self {
        let fallback = Fallback::new(cfg.alpha);
        Self {
            cfg,
            fallback,
            guesses: None,
        }
    }
}

impl Round for Tree {
    fn round(&mut self, run: &mut Run<'_, '_>, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        if run.seed.is_some() || drafting_pays(run, &self.cfg) {
            self.draft_round(run, on)
        } else {
            run.target_step(on)
        }
    }
}

impl Tree {
    fn draft_round(&mut self, run: &mut Run<'_, '_>, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        let q = self.guessing(run)?;
        let cfg = &self.cfg;
        let room = run.room(cfg.max_nodes);
        if room == 0 {
            run.drop_seed()?;
            return run.target_step(on);
        }
        let t = Instant::now();
        let width = cfg.grow.max_children.max(1);
        let threshold = Some(cfg.grow.branch_threshold);
        let start = match run.take_seed(cfg.grow)? {
            Some(start) => start,
            None => {
                let (fed, logits) = run.draft_catch_up()?;
                let mut g = Grower::new(run.root(), cfg.grow);
                let p = run.propose(&logits, width.min(room), threshold);
                let ids = g.expand(0, &p.children);
                run.close_stops(&mut g, &ids);
                let mut dists = vec![p.q];
                dists.resize(g.tree().len(), None);
                let prov = vec![false; g.tree().len()];
                Start {
                    fed,
                    grower: g,
                    dists,
                    prov,
                    seeded: 0,
                }
            }
        };
        let Start {
            mut fed,
            grower: mut g,
            mut dists,
            mut prov,
            seeded,
        } = start;
        while g.total() < room
            && !(cfg.fallback && self.fallback.should_verify(g.best_confidence()))
        {
            let Some(leaf) = g.next() else { break };
            if let Some(profile) = &cfg.profile
                && !worth_extending(run, &g, leaf, profile, t.elapsed().as_secs_f64(), 1.0)
            {
                break;
            }
            if q > 0 {
                self.guess_step(run, &mut g, &mut fed, &mut dists, &mut prov, leaf, q, room)?;
                continue;
            }
            // Greedy rounds read several branches' leaves in one draft pass
            // (a leaf riding along pays RIDER_COST of a step); sampling
            // keeps one leaf a step, the order its draws were made in.
            let most = match run.sampling_mode {
                true => 1,
                false => BATCH.min(room - g.total()),
            };
            let mut leaves = g.next_batch(most, BATCH_RATIO);
            if let Some(profile) = &cfg.profile {
                let spent = t.elapsed().as_secs_f64();
                leaves.retain(|&l| {
                    l == leaf || worth_extending(run, &g, l, profile, spent, RIDER_COST)
                });
            }
            let logits = run.draft_feed(g.tree(), &mut fed, &leaves, true)?;
            let vocab = logits.len() / leaves.len();
            for (i, &leaf) in leaves.iter().enumerate() {
                let left = room.saturating_sub(g.total());
                let p = run.propose(&logits[i * vocab..][..vocab], width.min(left), threshold);
                dists[leaf] = p.q;
                let ids = g.expand(leaf, &p.children);
                dists.resize(g.tree().len(), None);
                prov.resize(g.tree().len(), false);
                run.close_stops(&mut g, &ids);
            }
        }
        let t_c = g.best_confidence();
        let mut grown = Grown {
            tree: g.into_tree(),
            dists,
            prov,
        };
        run.drafted(t, grown.tree.len() - 1 - seeded);

        // Send the target only the part worth its latency. (Greedy only:
        // pruning children by their drawn values would bias rejection
        // sampling; in sampling mode nothing is seeded, so the tree is
        // within the room.)
        let limit = match &cfg.profile {
            Some(profile) if !run.sampling_mode => {
                best_size(&grown.tree.confidences(), profile).0.min(room)
            }
            _ => room,
        };
        let (tree, old) = if grown.tree.len() - 1 > limit {
            grown.tree.top(limit)
        } else {
            (grown.tree.clone(), (0..grown.tree.len()).collect())
        };
        if tree.len() == 1 {
            // Nothing worth verifying: forget the draft's tree, decode one
            // token plainly.
            let keep: Vec<usize> = (0..=fed.base).collect();
            run.draft().keep_cache(&keep)?;
            return run.target_step(on);
        }
        let tree_dists: Vec<Option<Vec<f32>>> =
            old.iter().map(|&o| grown.dists[o].clone()).collect();
        // α learns from the tree as grown before any provisional steps.
        let before = grown.tree.clone();
        let accepted = if cfg.provisional && !run.sampling_mode {
            run.verify_provisional(&tree, &tree_dists, &old, &mut grown, &mut fed, cfg, on)?
        } else {
            run.verify(&tree, &tree_dists, &fed, &old, on)?
        };
        // α follows the best-matching branch: the deepest grown branch
        // through the last accepted node (the whole tree if none was).
        let from = accepted.last().map_or(0, |&a| old[a]);
        let n_all = before.deepest_below(from).max(1);
        self.fallback
            .update(n_all, accepted.len().min(n_all), t_c.max(1e-6));
        Ok(())
    }
}

/// Most leaves a greedy round's draft reads in one pass.
pub(crate) const BATCH: usize = 4;

/// What a draft pass of [`BATCH`] rows costs, in one-row steps (the
/// 0.5B and its slim form on a 2-core x86 VM: about 1.5).
const BATCH_PASS_STEPS: f64 = 1.5;

/// The share of a one-row step that each leaf after the first adds to a
/// batched draft pass.
const RIDER_COST: f64 = (BATCH_PASS_STEPS - 1.0) / (BATCH - 1) as f64;

/// A leaf joins a draft pass only with at least this share of the first
/// leaf's cumulative confidence (a dominant branch is not made to wait for
/// weak ones).
const BATCH_RATIO: f32 = 0.5;

/// Whether a draft round is expected to produce tokens faster than plain
/// decoding (`1 / L_fp(1)`): the best chain length `k` at the observed
/// acceptance rate `a`, expecting `Σ_{i≤k} a^i` tokens for the draft's
/// catch-up, `k − 1` draft steps and a `k + 1`-token verification. Without
/// both latency profiles it always drafts.
fn drafting_pays(run: &Run<'_, '_>, cfg: &TreeConfig) -> bool {
    let (Some(target), Some(draft)) = (&cfg.profile, &cfg.draft_profile) else {
        return true;
    };
    let plain = 1.0 / target.at(1);
    let behind = run.seq.len() - run.draft.as_deref().map_or(0, |d| d.cache_len());
    let a = run.accept_rate.clamp(0.0, 0.99);
    let mut tokens = 1.0;
    for k in 1..=cfg.max_nodes {
        tokens += a.powi(k as i32);
        // Steady state: the draft re-reads one or two tokens per round (a
        // longer first catch-up is paid once).
        let cost = draft.at(behind.clamp(1, 2)) + (k - 1) as f64 * draft.at(1) + target.at(k + 1);
        if tokens / cost > plain {
            return true;
        }
    }
    false
}

/// Whether drafting `leaf` is expected to raise the round's tokens per
/// second, given the time already spent drafting, when it costs `cost`
/// one-row draft steps (1 alone, [`RIDER_COST`] beside another leaf).
fn worth_extending(
    run: &Run<'_, '_>,
    g: &Grower,
    leaf: usize,
    profile: &LatencyProfile,
    spent: f64,
    cost: f64,
) -> bool {
    let Some(step) = run.draft_step else {
        return true;
    };
    let cums = g.tree().confidences();
    let (n, _) = best_size(&cums, profile);
    let tau: f64 = 1.0 + cums[..n].iter().map(|&c| c as f64).sum::<f64>();
    let gain = g.tree().node(leaf).cum as f64 * run.accept_rate;
    let pass = (profile.at(n + 1), profile.at(n + 2));
    raises_rate(tau, gain, spent, cost * step, pass)
}

/// Whether a round expecting `tau` tokens after `spent` seconds of drafting
/// and a pass of `pass.0` seconds produces tokens faster when `extra` more
/// seconds of drafting add `gain` expected tokens and the pass takes
/// `pass.1`.
fn raises_rate(tau: f64, gain: f64, spent: f64, extra: f64, pass: (f64, f64)) -> bool {
    (tau + gain) / (spent + extra + pass.1) > tau / (spent + pass.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_riding_along_a_batch_pays_its_share_of_the_pass() {
        // A streamed pass of ~2 s, a 30 ms draft step, 5 tokens expected:
        // a leaf worth 0.05 tokens does not pay for a step of its own...
        let (tau, gain, spent, step, pass) = (5.0, 0.05, 0.1, 0.03, (2.0, 2.01));
        assert!(!raises_rate(tau, gain, spent, step, pass));
        // ...but does as one of a batched pass's extra rows.
        const { assert!(RIDER_COST > 0.0 && RIDER_COST < 1.0) };
        assert!(raises_rate(tau, gain, spent, RIDER_COST * step, pass));
        // Nothing to gain is never worth a step, however cheap.
        assert!(!raises_rate(tau, 0.0, spent, RIDER_COST * step, pass));
    }
}

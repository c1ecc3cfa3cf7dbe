//! Provisional generation (`tree-provisional`): while the target's
//! verification pass waits for weights, the draft extends the tree's most
//! confident branch, shown to the caller as provisional tokens; after the
//! verdict, the draft's work under the next committed token is kept as a
//! [`Seed`] that starts the next round's tree.

use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::Instant;

use arbor_model::WeightWait;
use arbor_tree::{Grower, TokenTree};

use super::verify::draft_keep;
use super::{Fed, Run};
use crate::{Event, Phase, Result, TreeConfig};

/// Provisional steps stop where the branch's chance of being accepted
/// whole (acceptance rate ^ depth) falls below this.
const PROVISIONAL_MIN_CHANCE: f64 = 0.25;

/// A grown tree with what the loop knows about each node.
pub(crate) struct Grown {
    pub(crate) tree: TokenTree,
    /// The draft distribution each node's children were drawn from
    /// (sampling mode only).
    pub(crate) dists: Vec<Option<Vec<f32>>>,
    /// Whether the node was drafted while the target waited.
    pub(crate) prov: Vec<bool>,
}

impl Grown {
    fn push(&mut self, parent: usize, token: u32, prob: f32, prov: bool) -> usize {
        self.dists.push(None);
        self.prov.push(prov);
        self.tree.push(parent, token, prob)
    }
}

/// A subtree carried from one round into the next: its root is the last
/// committed token, and `fed` lists the nodes in the draft's cache after
/// the root, in cache order.
pub(crate) struct Seed {
    grown: Grown,
    fed: Vec<usize>,
}

/// A tree round's start: the draft's feeding, the grower, each node's
/// draft distribution and provisional mark, and how many nodes (root
/// excluded) came from a seed rather than this round's drafting.
pub(crate) struct Start {
    pub(crate) fed: Fed,
    pub(crate) grower: Grower,
    pub(crate) dists: Vec<Option<Vec<f32>>>,
    pub(crate) prov: Vec<bool>,
    pub(crate) seeded: usize,
}

impl Run<'_, '_> {
    /// The seed kept by the last round as a grower (with its fed nodes in
    /// the draft cache, node distributions and provisional marks, and its
    /// size), if it still matches the draft's cache.
    pub(crate) fn take_seed(&mut self, grow: arbor_tree::GrowConfig) -> Result<Option<Start>> {
        let Some(seed) = self.seed.take() else {
            return Ok(None);
        };
        let base = self.seq.len() - 1;
        let cached = self.draft().cache_len();
        if seed.grown.tree.node(0).token != self.root()
            || cached != base + 1 + seed.fed.len()
            || seed.grown.tree.node(0).children.is_empty()
        {
            // Out of step (cannot happen after a provisional verification);
            // the caller's catch-up starts over from the committed tokens.
            return Ok(None);
        }
        let src = &seed.grown.tree;
        let mut g = Grower::new(self.root(), grow);
        let mut id = vec![usize::MAX; src.len()];
        id[0] = 0;
        // Parents come before children, so every node is a leaf of an open
        // branch when its turn comes.
        for n in 0..src.len() {
            let children: Vec<(u32, f32)> = src
                .node(n)
                .children
                .iter()
                .map(|&c| (src.node(c).token, src.node(c).prob))
                .collect();
            if children.is_empty() {
                // A node the draft has read but proposed nothing after
                // must not be read again.
                if seed.fed.contains(&n) {
                    g.close(id[n]);
                }
                continue;
            }
            let ids = g.expand(id[n], &children);
            for (&c, &new) in src.node(n).children.iter().zip(&ids) {
                id[c] = new;
            }
            self.close_stops(&mut g, &ids);
        }
        let mut dists = vec![None; g.tree().len()];
        let mut prov = vec![false; g.tree().len()];
        for n in 0..src.len() {
            dists[id[n]] = seed.grown.dists[n].clone();
            prov[id[n]] = seed.grown.prov[n];
        }
        let fed = Fed {
            base,
            fed: std::iter::once(0)
                .chain(seed.fed.iter().map(|&n| id[n]))
                .collect(),
        };
        Ok(Some(Start {
            fed,
            grower: g,
            dists,
            prov,
            seeded: src.len() - 1,
        }))
    }

    /// Forgets a kept seed and its nodes in the draft's cache.
    pub(crate) fn drop_seed(&mut self) -> Result<()> {
        if self.seed.take().is_some() {
            let len = self.seq.len() - 1;
            self.draft().truncate_cache(len)?;
        }
        Ok(())
    }

    /// Verification with provisional generation: the target's pass runs on
    /// another thread; whenever it waits for weights, the draft extends the
    /// most confident branch by one token (shown as provisional). After the
    /// verdict the draft's subtree under the next committed token becomes
    /// the next round's seed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn verify_provisional(
        &mut self,
        tree: &TokenTree,
        dists: &[Option<Vec<f32>>],
        old: &[usize],
        grown: &mut Grown,
        fed: &mut Fed,
        cfg: &TreeConfig,
        on: &mut dyn FnMut(Event<'_>),
    ) -> Result<Vec<usize>> {
        let t = Instant::now();
        let pass = self.pass(tree)?;
        let fed_tokens = pass.tokens.len();
        let mut end = branch_end(&grown.tree, fed);
        self.show_branch(&grown.tree, end, on);
        let target = self
            .target
            .take()
            .expect("the target is here between rounds");
        let (tx, rx) = mpsc::channel();
        let (logits, drafted) = std::thread::scope(|s| {
            let worker = s.spawn(move || {
                target.notify_waits(Some(tx));
                let logits = target.forward(&pass.tokens, &pass.positions, &pass.mask, &pass.rows);
                target.notify_waits(None);
                (logits, target)
            });
            let drafted = self.draft_while_waiting(&rx, grown, fed, &mut end, cfg, on);
            match worker.join() {
                Ok((logits, target)) => {
                    self.target = Some(target);
                    (logits, drafted)
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        });
        drafted?;
        let mut logits = logits?;
        self.span(Phase::Verify, t, fed_tokens);
        let verdict = self.judge(tree, &mut logits, dists)?;
        self.stats.target_secs += t.elapsed().as_secs_f64();
        let accepted: Vec<usize> = verdict.accepted.iter().map(|&a| old[a]).collect();
        self.stats.provisional_accepted += accepted.iter().filter(|&&a| grown.prov[a]).count();
        let (mut keep, on_path) = draft_keep(fed, old, &verdict.accepted);
        // The draft's subtree under the token committed after the accepted
        // path is the next round's head start.
        let last = accepted.last().copied().unwrap_or(0);
        let next = grown
            .tree
            .child_with_token(last, verdict.next)
            .filter(|&c| on_path && fed.slot(c).is_some());
        if let Some(c) = next {
            let (seed, slots) = subtree_seed(grown, fed, c);
            keep.extend(slots.iter().map(|&s| fed.base + s));
            keep.sort_unstable();
            self.seed = Some(seed);
        }
        self.draft().keep_cache(&keep)?;
        self.settle(tree, &verdict, on);
        if self.done.is_some() {
            self.seed = None;
        }
        Ok(verdict.accepted)
    }

    /// Shows the root path to `end` as provisional tokens.
    fn show_branch(&mut self, tree: &TokenTree, end: usize, on: &mut dyn FnMut(Event<'_>)) {
        let tokens: Vec<u32> = tree.path(end)[1..]
            .iter()
            .map(|&n| tree.node(n).token)
            .collect();
        self.show(&tokens, on);
    }

    /// Drafts one token after `end` each time the target is found waiting
    /// for weights, until the target's pass is over (its sender dropped).
    fn draft_while_waiting(
        &mut self,
        rx: &Receiver<WeightWait>,
        grown: &mut Grown,
        fed: &mut Fed,
        end: &mut usize,
        cfg: &TreeConfig,
        on: &mut dyn FnMut(Event<'_>),
    ) -> Result<()> {
        let mut waiting = false;
        let mut open = true;
        let mut steps = 0;
        let width = cfg.grow.max_children.max(1);
        let threshold = Some(cfg.grow.branch_threshold);
        loop {
            loop {
                match rx.try_recv() {
                    Ok(w) => waiting = w == WeightWait::Waiting,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        (open, waiting) = (false, false);
                        break;
                    }
                }
            }
            let node = grown.tree.node(*end);
            // Up to one more tree's worth beyond the current one, within the
            // tokens still wanted and the context, and only while the branch
            // has a fair chance of being accepted whole at the observed
            // acceptance rate (a rejected branch wastes the step, and on a
            // CPU the step is taken from the weight loader).
            let can_extend = steps < cfg.max_nodes
                && self.accept_rate.powi(node.depth as i32) >= PROVISIONAL_MIN_CHANCE
                && node.depth < self.room(2 * cfg.max_nodes)
                && fed.slot(*end).is_none()
                && !self.is_stop(node.token);
            if waiting && can_extend {
                let t = Instant::now();
                let logits = self.draft_feed(&grown.tree, fed, &[*end], false)?;
                let p = self.propose(&logits, width, threshold);
                let ids: Vec<usize> = p
                    .children
                    .iter()
                    .map(|&(tok, prob)| grown.push(*end, tok, prob, true))
                    .collect();
                self.stats.draft_tokens += ids.len();
                self.stats.provisional_tokens += ids.len();
                self.stats.provisional_secs += t.elapsed().as_secs_f64();
                self.span(Phase::Provisional, t, 1);
                steps += 1;
                if let Some(&first) = ids.first() {
                    *end = first;
                }
                self.show_branch(&grown.tree, *end, on);
                continue;
            }
            if !open {
                return Ok(());
            }
            if waiting {
                self.draft().idle_while_target_waits();
            }
            match rx.recv() {
                Ok(w) => waiting = w == WeightWait::Waiting,
                Err(_) => (open, waiting) = (false, false),
            }
        }
    }
}

/// Where the most confident branch ends: from the root, the most probable
/// child each time, down to a node the draft has not read.
fn branch_end(tree: &TokenTree, fed: &Fed) -> usize {
    let mut node = 0;
    while fed.slot(node).is_some() {
        let best = tree.node(node).children.iter().copied().max_by(|&a, &b| {
            tree.node(a)
                .prob
                .total_cmp(&tree.node(b).prob)
                .then(b.cmp(&a))
        });
        match best {
            Some(c) => node = c,
            None => break,
        }
    }
    node
}

/// The subtree of `grown` under `root` as a seed rooted there, and the
/// draft cache slots (after `fed.base`) of its nodes, root included.
fn subtree_seed(grown: &Grown, fed: &Fed, root: usize) -> (Seed, Vec<usize>) {
    let src = &grown.tree;
    let mut id = vec![usize::MAX; src.len()];
    id[root] = 0;
    let mut seed = Grown {
        tree: TokenTree::new(src.node(root).token),
        dists: vec![grown.dists[root].clone()],
        prov: vec![grown.prov[root]],
    };
    // Ids grow from parents to children, so one pass in id order finds
    // every descendant after its parent.
    for n in root + 1..src.len() {
        let parent = src.node(n).parent.expect("non-root");
        if id[parent] != usize::MAX {
            let node = src.node(n);
            id[n] = seed.push(id[parent], node.token, node.prob, grown.prov[n]);
            seed.dists[id[n]] = grown.dists[n].clone();
        }
    }
    let mut slots = Vec::new();
    let mut order = Vec::new();
    for (slot, &n) in fed.fed.iter().enumerate() {
        if id[n] != usize::MAX {
            slots.push(slot);
            if n != root {
                order.push(id[n]);
            }
        }
    }
    (
        Seed {
            grown: seed,
            fed: order,
        },
        slots,
    )
}

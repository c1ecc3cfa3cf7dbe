//! The decoding loop shared by every strategy.

use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::Instant;

use arbor_model::{LanguageModel, WeightWait};
use arbor_sampling::{Rng, Sampler, filtered};
use arbor_tree::{Fallback, Grower, TokenTree};
use arbor_verify as verify;

use crate::{
    DecodeOptions, DecodeStats, Decoded, Event, LatencyProfile, PREFILL_CHUNK, Phase, PhaseSpan,
    Result, SpecError, StopReason, Strategy, TreeConfig, Verification, best_size,
};

/// Generates from `prompt` with `target` (and `draft` for the speculative
/// strategies); `on` receives every batch of newly confirmed tokens, and
/// with `tree-provisional` the provisional tokens and their rollbacks.
pub fn decode(
    target: &mut dyn LanguageModel,
    draft: Option<&mut dyn LanguageModel>,
    prompt: &[u32],
    opts: &DecodeOptions,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<Decoded> {
    opts.strategy.validate()?;
    let sampler = Sampler::new(opts.sampling)?;
    if prompt.is_empty() {
        return Err(SpecError::Invalid("the prompt is empty".into()));
    }
    let mut context = target.config().context_length;
    let vocab = target.config().vocab_size;
    if let Some(d) = &draft {
        if d.config().vocab_size != vocab {
            return Err(SpecError::Invalid(format!(
                "the draft's vocabulary has {} tokens, the target's {vocab}: they must share one",
                d.config().vocab_size
            )));
        }
        context = context.min(d.config().context_length);
    }
    if opts.strategy.needs_draft() && draft.is_none() {
        return Err(SpecError::Invalid(format!(
            "the {} strategy needs a draft model",
            opts.strategy.name()
        )));
    }
    if prompt.len() >= context {
        return Err(SpecError::Invalid(format!(
            "the prompt has {} tokens; the context is {context}",
            prompt.len()
        )));
    }
    let sampling_mode = !opts.sampling.is_greedy() && opts.verification == Verification::Exact;
    let mut run = Run {
        target: Some(target),
        draft,
        opts: opts.clone(),
        seq: prompt.to_vec(),
        prompt_len: prompt.len(),
        context,
        vocab,
        rng: Rng::new(opts.sampling.seed ^ 0x5bec_u64),
        sampler,
        stats: DecodeStats::new(prompt.len()),
        done: None,
        sampling_mode,
        accept_rate: 0.7,
        draft_step: None,
        shown: Vec::new(),
        seed: None,
        started: Instant::now(),
        trace: Vec::new(),
    };
    run.run(on)?;
    let stats = DecodeStats {
        generated_tokens: run.seq.len() - run.prompt_len,
        stop: run.done.unwrap_or(StopReason::MaxTokens),
        ..run.stats
    };
    Ok(Decoded {
        tokens: run.seq[run.prompt_len..].to_vec(),
        stats,
        started: run.started,
        trace: run.trace,
    })
}

struct Run<'t, 'd> {
    /// Lent to the verification thread during a provisional round.
    target: Option<&'t mut dyn LanguageModel>,
    draft: Option<&'d mut dyn LanguageModel>,
    opts: DecodeOptions,
    /// The prompt followed by every committed token.
    seq: Vec<u32>,
    prompt_len: usize,
    context: usize,
    vocab: usize,
    sampler: Sampler,
    rng: Rng,
    stats: DecodeStats,
    done: Option<StopReason>,
    /// Exact verification at temperature > 0: drafts are drawn from the
    /// draft distribution and checked by rejection sampling.
    sampling_mode: bool,
    /// Running estimate of how often the target accepts a draft token.
    accept_rate: f64,
    /// Running estimate of one draft forward, seconds.
    draft_step: Option<f64>,
    /// Provisional tokens the caller is showing after the confirmed ones.
    shown: Vec<u32>,
    /// The draft's work under the last committed token, kept from the
    /// previous provisional round (its fed nodes are in the draft cache).
    seed: Option<Seed>,
    started: Instant,
    trace: Vec<PhaseSpan>,
}

/// A grown tree with what the loop knows about each node.
struct Grown {
    tree: TokenTree,
    /// The draft distribution each node's children were drawn from
    /// (sampling mode only).
    dists: Vec<Option<Vec<f32>>>,
    /// Whether the node was drafted while the target waited.
    prov: Vec<bool>,
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
struct Seed {
    grown: Grown,
    fed: Vec<usize>,
}

/// The draft tree as fed to the draft model: `fed[i]` is the node in cache
/// slot `base + i` (the root is in slot `base`).
struct Fed {
    base: usize,
    fed: Vec<usize>,
}

/// What the draft proposes after one node.
struct Proposal {
    /// Children to add, first choice (or first draw) first, with their
    /// draft probabilities.
    children: Vec<(u32, f32)>,
    /// The draft distribution they were drawn from (sampling mode only).
    q: Option<Vec<f32>>,
}

/// Provisional steps stop where the branch's chance of being accepted
/// whole (acceptance rate ^ depth) falls below this.
const PROVISIONAL_MIN_CHANCE: f64 = 0.25;

fn ema(old: Option<f64>, new: f64) -> f64 {
    old.map_or(new, |o| 0.7 * o + 0.3 * new)
}

impl Run<'_, '_> {
    fn run(&mut self, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        let start = Instant::now();
        self.target().truncate_cache(0)?;
        let mut logits = Vec::new();
        let target = self.target.as_deref_mut().expect("the target is here");
        for chunk in self.seq.chunks(PREFILL_CHUNK) {
            logits = target.step(chunk)?;
        }
        self.stats.prefill_secs = start.elapsed().as_secs_f64();
        self.span(Phase::Prefill, start);
        let start = Instant::now();
        if self.opts.max_tokens == 0 {
            self.done = Some(StopReason::MaxTokens);
            return Ok(());
        }
        let first = self.sampler.sample(&logits)?;
        self.commit(&[first], on);
        if let Some(d) = self.draft.as_deref_mut() {
            d.truncate_cache(0)?;
        }
        let strategy = self.opts.strategy.clone();
        let mut fallback = match &strategy {
            Strategy::Tree(c) => Fallback::new(c.alpha),
            _ => Fallback::new(0.01),
        };
        while self.done.is_none() {
            match &strategy {
                Strategy::Autoregressive => self.target_step(on)?,
                Strategy::Chain { gamma } => self.round_chain(*gamma, on)?,
                Strategy::StaticTree { width, depth } => self.round_static(*width, *depth, on)?,
                Strategy::Tree(cfg) => {
                    if self.seed.is_some() || self.drafting_pays(cfg) {
                        self.round_tree(cfg, &mut fallback, on)?;
                    } else {
                        self.target_step(on)?;
                    }
                }
            }
        }
        if !self.shown.is_empty() {
            on(Event::Rollback(self.shown.len()));
            self.shown.clear();
        }
        self.stats.decode_secs = start.elapsed().as_secs_f64();
        Ok(())
    }

    fn target(&mut self) -> &mut dyn LanguageModel {
        self.target
            .as_deref_mut()
            .expect("the target is back after every verification")
    }

    fn span(&mut self, phase: Phase, start: Instant) {
        let at = |t: Instant| t.saturating_duration_since(self.started).as_secs_f64();
        let span = PhaseSpan {
            phase,
            start: at(start),
            end: at(Instant::now()),
        };
        self.trace.push(span);
    }

    /// Shows `tokens` as the provisional continuation (cut at a stop token
    /// and at the token limit): rolls back what differs from what is shown
    /// and appends the rest.
    fn show(&mut self, tokens: &[u32], on: &mut dyn FnMut(Event<'_>)) {
        let wanted = self.opts.max_tokens - (self.seq.len() - self.prompt_len);
        let end = tokens
            .iter()
            .position(|t| self.opts.stop_tokens.contains(t))
            .unwrap_or(tokens.len())
            .min(wanted);
        let tokens = &tokens[..end];
        let same = common_prefix(&self.shown, tokens);
        if same < self.shown.len() {
            on(Event::Rollback(self.shown.len() - same));
            self.shown.truncate(same);
        }
        if tokens.len() > same {
            on(Event::Provisional(&tokens[same..]));
            self.shown.extend_from_slice(&tokens[same..]);
        }
    }

    /// Appends tokens in order, stopping at a stop token, the token limit
    /// or the context, exactly as one-token decoding would.
    fn commit(&mut self, tokens: &[u32], on: &mut dyn FnMut(Event<'_>)) {
        let start = self.seq.len();
        for &t in tokens {
            if self.opts.stop_tokens.contains(&t) {
                self.done = Some(StopReason::StopToken);
                break;
            }
            self.seq.push(t);
            if self.seq.len() - self.prompt_len >= self.opts.max_tokens {
                self.done = Some(StopReason::MaxTokens);
                break;
            }
            if self.seq.len() >= self.context {
                self.done = Some(StopReason::ContextFull);
                break;
            }
        }
        if self.seq.len() > start {
            let new = &self.seq[start..];
            // Shown provisional tokens that disagree go first; those that
            // agree are replaced by the confirmation.
            let same = common_prefix(&self.shown, new);
            if same < new.len() {
                if self.shown.len() > same {
                    on(Event::Rollback(self.shown.len() - same));
                }
                self.shown.clear();
            } else {
                self.shown.drain(..same);
            }
            on(Event::Confirm(new));
        }
    }

    fn root(&self) -> u32 {
        *self.seq.last().expect("the sequence holds the prompt")
    }

    /// One plain target pass on the last committed token.
    fn target_step(&mut self, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        let t = Instant::now();
        let root = self.root();
        let logits = self.target().step(&[root])?;
        self.stats.target_secs += t.elapsed().as_secs_f64();
        self.span(Phase::Step, t);
        self.stats.target_steps += 1;
        let next = self.sampler.sample(&logits)?;
        self.commit(&[next], on);
        Ok(())
    }

    /// Draft tokens one verification may carry: bounded by `max`, the
    /// tokens still wanted and the context left.
    fn budget(&self, max: usize) -> usize {
        let wanted = self.opts.max_tokens - (self.seq.len() - self.prompt_len);
        let room = self.context.saturating_sub(self.seq.len() + 1);
        max.min(wanted).min(room)
    }

    fn draft(&mut self) -> &mut dyn LanguageModel {
        self.draft.as_deref_mut().expect("checked in decode()")
    }

    /// Feeds the draft every committed token it has not seen (the root
    /// last) and returns its logits after the root.
    fn draft_catch_up(&mut self) -> Result<(Fed, Vec<f32>)> {
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
        Ok((Fed { base, fed: vec![0] }, logits))
    }

    /// Runs `nodes` of `tree` through the draft; logits row `i` belongs
    /// to `nodes[i]`. One-node steps update the draft's step-time estimate
    /// when `timed` (provisional steps share the CPU and are not).
    fn draft_feed(
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

    /// The draft's proposal after a node: `width` is the most children;
    /// `threshold` (if any) admits children after the first only above it.
    fn propose(&mut self, logits: &[f32], width: usize, threshold: Option<f32>) -> Proposal {
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

    /// Verifies `tree` with one target pass, commits the outcome, and
    /// compacts both caches to the accepted path. `draft_ids[i]` is node
    /// `i`'s id in the tree the draft grew (whose feeding is in `fed`).
    /// Returns the accepted nodes.
    fn verify(
        &mut self,
        tree: &TokenTree,
        dists: &[Option<Vec<f32>>],
        fed: &Fed,
        draft_ids: &[usize],
        on: &mut dyn FnMut(Event<'_>),
    ) -> Result<Vec<usize>> {
        let t = Instant::now();
        let pass = self.pass(tree)?;
        let logits =
            self.target()
                .forward(&pass.tokens, &pass.positions, &pass.mask, &pass.rows)?;
        self.span(Phase::Verify, t);
        let verdict = self.judge(tree, &logits, dists)?;
        self.stats.target_secs += t.elapsed().as_secs_f64();
        let (keep, _) = draft_keep(fed, draft_ids, &verdict.accepted);
        self.draft().keep_cache(&keep)?;
        self.settle(tree, &verdict, on);
        Ok(verdict.accepted)
    }

    /// The target's inputs for verifying `tree` after the cache.
    fn pass(&mut self, tree: &TokenTree) -> Result<Pass> {
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

    /// The verdict on `tree` from the target's logits; the target's cache
    /// keeps the accepted path.
    fn judge(
        &mut self,
        tree: &TokenTree,
        logits: &arbor_model::Logits,
        dists: &[Option<Vec<f32>>],
    ) -> Result<verify::Verdict> {
        let vocab = logits.vocab;
        let verdict = match self.opts.verification {
            Verification::Typical(policy) => {
                let policy = verify::Typical {
                    temperature: self.opts.sampling.temperature,
                    ..policy
                };
                verify::typical(tree, &logits.data, vocab, &policy, &mut self.rng)
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
        let prefix = self.seq.len() - 1;
        let keep: Vec<usize> = (0..=prefix)
            .chain(verdict.accepted.iter().map(|&i| prefix + i))
            .collect();
        self.target().keep_cache(&keep)?;
        self.stats.verifications += 1;
        self.stats.accepted_draft_tokens += verdict.accepted.len();
        Ok(verdict)
    }

    /// Commits a verdict's tokens and updates the acceptance estimate.
    fn settle(
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

    /// Accounts a drafting phase that began at `t` and proposed `tokens`
    /// new draft tokens.
    fn drafted(&mut self, t: Instant, tokens: usize) {
        self.stats.draft_secs += t.elapsed().as_secs_f64();
        self.span(Phase::Draft, t);
        self.stats.draft_tokens += tokens;
    }

    fn close_stops(&self, g: &mut Grower, ids: &[usize]) {
        for &id in ids {
            if self.opts.stop_tokens.contains(&g.tree().node(id).token) {
                g.close(id);
            }
        }
    }

    fn round_chain(&mut self, gamma: usize, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        let budget = self.budget(gamma);
        if budget == 0 {
            return self.target_step(on);
        }
        let t = Instant::now();
        let (mut fed, mut logits) = self.draft_catch_up()?;
        let mut tree = TokenTree::new(self.root());
        let mut dists: Vec<Option<Vec<f32>>> = vec![None];
        let mut leaf = 0;
        while tree.len() - 1 < budget {
            let p = self.propose(&logits, 1, None);
            dists[leaf] = p.q;
            let Some(&(tok, prob)) = p.children.first() else {
                break;
            };
            leaf = tree.push(leaf, tok, prob);
            dists.push(None);
            if tree.len() > budget || self.opts.stop_tokens.contains(&tok) {
                break;
            }
            logits = self.draft_feed(&tree, &mut fed, &[leaf], true)?;
        }
        self.drafted(t, tree.len() - 1);
        let ids: Vec<usize> = (0..tree.len()).collect();
        self.verify(&tree, &dists, &fed, &ids, on)?;
        Ok(())
    }

    fn round_static(
        &mut self,
        width: usize,
        depth: usize,
        on: &mut dyn FnMut(Event<'_>),
    ) -> Result<()> {
        let budget = self.budget(crate::MAX_DRAFT_TOKENS);
        if budget == 0 {
            return self.target_step(on);
        }
        let t = Instant::now();
        let (mut fed, root_logits) = self.draft_catch_up()?;
        let mut tree = TokenTree::new(self.root());
        let mut dists: Vec<Option<Vec<f32>>> = vec![None];
        let mut level = vec![0usize];
        let mut rows = root_logits;
        for d in 0..depth {
            let mut next = Vec::new();
            for (i, &node) in level.iter().enumerate() {
                if self.opts.stop_tokens.contains(&tree.node(node).token) && node != 0 {
                    continue;
                }
                let room = budget - (tree.len() - 1);
                let row = rows[i * self.vocab..(i + 1) * self.vocab].to_vec();
                let p = self.propose(&row, width.min(room), None);
                dists[node] = p.q;
                for (tok, prob) in p.children {
                    next.push(tree.push(node, tok, prob));
                    dists.push(None);
                }
            }
            if next.is_empty() || d + 1 == depth {
                break;
            }
            rows = self.draft_feed(&tree, &mut fed, &next, true)?;
            level = next;
        }
        self.drafted(t, tree.len() - 1);
        let ids: Vec<usize> = (0..tree.len()).collect();
        self.verify(&tree, &dists, &fed, &ids, on)?;
        Ok(())
    }

    /// Whether a draft round is expected to produce tokens faster than
    /// plain decoding (`1 / L_fp(1)`): the best chain length `k` at the
    /// observed acceptance rate `a`, expecting `Σ_{i≤k} a^i` tokens for
    /// the draft's catch-up, `k − 1` draft steps and a `k + 1`-token
    /// verification. Without both latency profiles it always drafts.
    fn drafting_pays(&mut self, cfg: &TreeConfig) -> bool {
        let (Some(target), Some(draft)) = (&cfg.profile, &cfg.draft_profile) else {
            return true;
        };
        let plain = 1.0 / target.at(1);
        let behind = self.seq.len() - self.draft.as_deref().map_or(0, |d| d.cache_len());
        let a = self.accept_rate.clamp(0.0, 0.99);
        let mut tokens = 1.0;
        for k in 1..=cfg.max_nodes {
            tokens += a.powi(k as i32);
            // Steady state: the draft re-reads one or two tokens per round
            // (a longer first catch-up is paid once).
            let cost =
                draft.at(behind.clamp(1, 2)) + (k - 1) as f64 * draft.at(1) + target.at(k + 1);
            if tokens / cost > plain {
                return true;
            }
        }
        false
    }

    /// Whether one more draft step on `leaf` is expected to raise the
    /// round's tokens per second, given the time already spent drafting.
    fn worth_extending(
        &self,
        g: &Grower,
        leaf: usize,
        profile: &LatencyProfile,
        spent: f64,
    ) -> bool {
        let Some(step) = self.draft_step else {
            return true;
        };
        let cums = g.tree().confidences();
        let (n, _) = best_size(&cums, profile);
        let tau: f64 = 1.0 + cums[..n].iter().map(|&c| c as f64).sum::<f64>();
        let now = tau / (spent + profile.at(n + 1));
        let gain = g.tree().node(leaf).cum as f64 * self.accept_rate;
        let next = (tau + gain) / (spent + step + profile.at(n + 2));
        next > now
    }

    fn round_tree(
        &mut self,
        cfg: &TreeConfig,
        fallback: &mut Fallback,
        on: &mut dyn FnMut(Event<'_>),
    ) -> Result<()> {
        let budget = self.budget(cfg.max_nodes);
        if budget == 0 {
            self.drop_seed()?;
            return self.target_step(on);
        }
        let t = Instant::now();
        let width = cfg.grow.max_children.max(1);
        let threshold = Some(cfg.grow.branch_threshold);
        let (mut fed, mut g, mut dists, mut prov, seeded) = match self.take_seed(cfg.grow)? {
            Some(seeded) => seeded,
            None => {
                let (fed, logits) = self.draft_catch_up()?;
                let mut g = Grower::new(self.root(), cfg.grow);
                let p = self.propose(&logits, width.min(budget), threshold);
                let ids = g.expand(0, &p.children);
                self.close_stops(&mut g, &ids);
                let mut dists = vec![p.q];
                dists.resize(g.tree().len(), None);
                let prov = vec![false; g.tree().len()];
                (fed, g, dists, prov, 0)
            }
        };
        while g.total() < budget && !(cfg.fallback && fallback.should_verify(g.best_confidence())) {
            let Some(leaf) = g.next() else { break };
            if let Some(profile) = &cfg.profile
                && !self.worth_extending(&g, leaf, profile, t.elapsed().as_secs_f64())
            {
                break;
            }
            let logits = self.draft_feed(g.tree(), &mut fed, &[leaf], true)?;
            let room = budget - g.total();
            let p = self.propose(&logits, width.min(room), threshold);
            dists[leaf] = p.q;
            let ids = g.expand(leaf, &p.children);
            dists.resize(g.tree().len(), None);
            prov.resize(g.tree().len(), false);
            self.close_stops(&mut g, &ids);
        }
        let t_c = g.best_confidence();
        let mut grown = Grown {
            tree: g.into_tree(),
            dists,
            prov,
        };
        self.drafted(t, grown.tree.len() - 1 - seeded);

        // Send the target only the part worth its latency. (Greedy only:
        // pruning children by their drawn values would bias rejection
        // sampling; in sampling mode nothing is seeded, so the tree is
        // within the budget.)
        let limit = match &cfg.profile {
            Some(profile) if !self.sampling_mode => {
                best_size(&grown.tree.confidences(), profile).0.min(budget)
            }
            _ => budget,
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
            self.draft().keep_cache(&keep)?;
            return self.target_step(on);
        }
        let tree_dists: Vec<Option<Vec<f32>>> =
            old.iter().map(|&o| grown.dists[o].clone()).collect();
        // α learns from the tree as grown before any provisional steps.
        let before = grown.tree.clone();
        let accepted = if cfg.provisional && !self.sampling_mode {
            self.verify_provisional(&tree, &tree_dists, &old, &mut grown, &mut fed, cfg, on)?
        } else {
            self.verify(&tree, &tree_dists, &fed, &old, on)?
        };
        // α follows the best-matching branch: the deepest grown branch
        // through the last accepted node (the whole tree if none was).
        let from = accepted.last().map_or(0, |&a| old[a]);
        let n_all = before.deepest_below(from).max(1);
        fallback.update(n_all, accepted.len().min(n_all), t_c.max(1e-6));
        Ok(())
    }

    /// The seed kept by the last round as a grower (with its fed nodes in
    /// the draft cache, node distributions and provisional marks, and its
    /// size), if it still matches the draft's cache.
    #[allow(clippy::type_complexity)]
    fn take_seed(
        &mut self,
        grow: arbor_tree::GrowConfig,
    ) -> Result<Option<(Fed, Grower, Vec<Option<Vec<f32>>>, Vec<bool>, usize)>> {
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
        Ok(Some((fed, g, dists, prov, src.len() - 1)))
    }

    /// Forgets a kept seed and its nodes in the draft's cache.
    fn drop_seed(&mut self) -> Result<()> {
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
    fn verify_provisional(
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
        let logits = logits?;
        self.span(Phase::Verify, t);
        let verdict = self.judge(tree, &logits, dists)?;
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
                && node.depth < self.budget(2 * cfg.max_nodes)
                && fed.slot(*end).is_none()
                && !self.opts.stop_tokens.contains(&node.token);
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
                self.span(Phase::Provisional, t);
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
            match rx.recv() {
                Ok(w) => waiting = w == WeightWait::Waiting,
                Err(_) => (open, waiting) = (false, false),
            }
        }
    }
}

/// The target's inputs for one verification pass.
struct Pass {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    mask: arbor_model::Mask,
    rows: Vec<usize>,
}

impl Fed {
    /// The draft cache slot (after `base`) holding `node`.
    fn slot(&self, node: usize) -> Option<usize> {
        self.fed.iter().position(|&n| n == node)
    }
}

/// Draft cache positions to keep after a verdict: the prefix, the root and
/// the accepted nodes the draft has read; and whether it had read them all.
fn draft_keep(fed: &Fed, draft_ids: &[usize], accepted: &[usize]) -> (Vec<usize>, bool) {
    let mut keep: Vec<usize> = (0..=fed.base).collect();
    for &a in accepted {
        match fed.slot(draft_ids[a]) {
            Some(slot) => keep.push(fed.base + slot),
            None => return (keep, false),
        }
    }
    (keep, true)
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

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The `k` most probable tokens with their softmax probabilities, most
/// probable first (ties: lower id first).
fn top_probs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    let mut max = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        max = max.max(l);
        if top.len() < k || l > top[top.len() - 1].1 {
            let at = top.partition_point(|&(_, v)| v >= l);
            top.insert(at, (i as u32, l));
            top.truncate(k);
        }
    }
    let sum: f32 = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| (l - max).exp())
        .sum();
    top.into_iter()
        .map(|(t, l)| (t, (l - max).exp() / sum))
        .collect()
}

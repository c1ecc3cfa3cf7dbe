//! The decoding loop shared by every strategy.

use std::time::Instant;

use arbor_model::LanguageModel;
use arbor_sampling::{Rng, Sampler, filtered};
use arbor_tree::{Fallback, Grower, TokenTree};
use arbor_verify as verify;

use crate::{
    DecodeOptions, DecodeStats, Decoded, LatencyProfile, PREFILL_CHUNK, Result, SpecError,
    StopReason, Strategy, TreeConfig, Verification, best_size,
};

/// Generates from `prompt` with `target` (and `draft` for the speculative
/// strategies); `on_tokens` receives every batch of newly committed tokens.
pub fn decode(
    target: &mut dyn LanguageModel,
    draft: Option<&mut dyn LanguageModel>,
    prompt: &[u32],
    opts: &DecodeOptions,
    on_tokens: &mut dyn FnMut(&[u32]),
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
        target,
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
    };
    run.run(on_tokens)?;
    let stats = DecodeStats {
        generated_tokens: run.seq.len() - run.prompt_len,
        stop: run.done.unwrap_or(StopReason::MaxTokens),
        ..run.stats
    };
    Ok(Decoded {
        tokens: run.seq[run.prompt_len..].to_vec(),
        stats,
    })
}

struct Run<'t, 'd> {
    target: &'t mut dyn LanguageModel,
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

fn ema(old: Option<f64>, new: f64) -> f64 {
    old.map_or(new, |o| 0.7 * o + 0.3 * new)
}

impl Run<'_, '_> {
    fn run(&mut self, on: &mut dyn FnMut(&[u32])) -> Result<()> {
        let start = Instant::now();
        self.target.truncate_cache(0)?;
        let mut logits = Vec::new();
        for chunk in self.seq.chunks(PREFILL_CHUNK) {
            logits = self.target.step(chunk)?;
        }
        self.stats.prefill_secs = start.elapsed().as_secs_f64();
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
                    if self.drafting_pays(cfg) {
                        self.round_tree(cfg, &mut fallback, on)?;
                    } else {
                        self.target_step(on)?;
                    }
                }
            }
        }
        self.stats.decode_secs = start.elapsed().as_secs_f64();
        Ok(())
    }

    /// Appends tokens in order, stopping at a stop token, the token limit
    /// or the context, exactly as one-token decoding would.
    fn commit(&mut self, tokens: &[u32], on: &mut dyn FnMut(&[u32])) {
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
            on(&self.seq[start..]);
        }
    }

    fn root(&self) -> u32 {
        *self.seq.last().expect("the sequence holds the prompt")
    }

    /// One plain target pass on the last committed token.
    fn target_step(&mut self, on: &mut dyn FnMut(&[u32])) -> Result<()> {
        let t = Instant::now();
        let logits = self.target.step(&[self.root()])?;
        self.stats.target_secs += t.elapsed().as_secs_f64();
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
    /// to `nodes[i]`.
    fn draft_feed(&mut self, tree: &TokenTree, fed: &mut Fed, nodes: &[usize]) -> Result<Vec<f32>> {
        let t = Instant::now();
        let parents = tree.parents();
        let mask = arbor_mask::append_mask(fed.base, &parents, &fed.fed, nodes)?;
        let positions = arbor_mask::positions(fed.base, &parents, nodes)?;
        let tokens: Vec<u32> = nodes.iter().map(|&n| tree.node(n).token).collect();
        let rows: Vec<usize> = (0..nodes.len()).collect();
        let logits = self.draft().forward(&tokens, &positions, &mask, &rows)?;
        fed.fed.extend_from_slice(nodes);
        let secs = t.elapsed().as_secs_f64();
        if nodes.len() == 1 {
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
        on: &mut dyn FnMut(&[u32]),
    ) -> Result<Vec<usize>> {
        let t = Instant::now();
        let prefix = self.target.cache_len();
        debug_assert_eq!(prefix + 1, self.seq.len());
        let parents = tree.parents();
        let all: Vec<usize> = (0..tree.len()).collect();
        let mask = arbor_mask::tree_mask(prefix, &parents)?;
        let positions = arbor_mask::positions(prefix, &parents, &all)?;
        let logits = self
            .target
            .forward(&tree.tokens(), &positions, &mask, &all)?;
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
        let keep: Vec<usize> = (0..=prefix)
            .chain(verdict.accepted.iter().map(|&i| prefix + i))
            .collect();
        self.target.keep_cache(&keep)?;
        self.stats.target_secs += t.elapsed().as_secs_f64();
        self.stats.verifications += 1;
        self.stats.accepted_draft_tokens += verdict.accepted.len();

        // The draft keeps the root and the accepted nodes it has read.
        let mut keep: Vec<usize> = (0..=fed.base).collect();
        for &a in &verdict.accepted {
            match fed.fed.iter().position(|&n| n == draft_ids[a]) {
                Some(slot) => keep.push(fed.base + slot),
                None => break,
            }
        }
        self.draft().keep_cache(&keep)?;

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
        Ok(verdict.accepted)
    }

    fn close_stops(&self, g: &mut Grower, ids: &[usize]) {
        for &id in ids {
            if self.opts.stop_tokens.contains(&g.tree().node(id).token) {
                g.close(id);
            }
        }
    }

    fn round_chain(&mut self, gamma: usize, on: &mut dyn FnMut(&[u32])) -> Result<()> {
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
            logits = self.draft_feed(&tree, &mut fed, &[leaf])?;
        }
        self.stats.draft_secs += t.elapsed().as_secs_f64();
        self.stats.draft_tokens += tree.len() - 1;
        let ids: Vec<usize> = (0..tree.len()).collect();
        self.verify(&tree, &dists, &fed, &ids, on)?;
        Ok(())
    }

    fn round_static(
        &mut self,
        width: usize,
        depth: usize,
        on: &mut dyn FnMut(&[u32]),
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
            rows = self.draft_feed(&tree, &mut fed, &next)?;
            level = next;
        }
        self.stats.draft_secs += t.elapsed().as_secs_f64();
        self.stats.draft_tokens += tree.len() - 1;
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
        on: &mut dyn FnMut(&[u32]),
    ) -> Result<()> {
        let budget = self.budget(cfg.max_nodes);
        if budget == 0 {
            return self.target_step(on);
        }
        let t = Instant::now();
        let width = cfg.grow.max_children.max(1);
        let threshold = Some(cfg.grow.branch_threshold);
        let (mut fed, logits) = self.draft_catch_up()?;
        let mut g = Grower::new(self.root(), cfg.grow);
        let mut dists: Vec<Option<Vec<f32>>> = vec![None];
        let p = self.propose(&logits, width.min(budget), threshold);
        dists[0] = p.q;
        let ids = g.expand(0, &p.children);
        dists.resize(g.tree().len(), None);
        self.close_stops(&mut g, &ids);
        while g.total() < budget && !fallback.should_verify(g.best_confidence()) {
            let Some(leaf) = g.next() else { break };
            if let Some(profile) = &cfg.profile
                && !self.worth_extending(&g, leaf, profile, t.elapsed().as_secs_f64())
            {
                break;
            }
            let logits = self.draft_feed(g.tree(), &mut fed, &[leaf])?;
            let room = budget - g.total();
            let p = self.propose(&logits, width.min(room), threshold);
            dists[leaf] = p.q;
            let ids = g.expand(leaf, &p.children);
            dists.resize(g.tree().len(), None);
            self.close_stops(&mut g, &ids);
        }
        let t_c = g.best_confidence();
        let grown = g.into_tree();
        self.stats.draft_secs += t.elapsed().as_secs_f64();
        self.stats.draft_tokens += grown.len() - 1;

        // Send the target only the part worth its latency. (Greedy only:
        // pruning children by their drawn values would bias rejection
        // sampling.)
        let (tree, old) = match &cfg.profile {
            Some(profile) if !self.sampling_mode => {
                let (n, _) = best_size(&grown.confidences(), profile);
                grown.top(n)
            }
            _ => (grown.clone(), (0..grown.len()).collect()),
        };
        if tree.len() == 1 {
            // Nothing worth verifying: forget the draft's tree, decode one
            // token plainly.
            let keep: Vec<usize> = (0..=fed.base).collect();
            self.draft().keep_cache(&keep)?;
            return self.target_step(on);
        }
        let tree_dists: Vec<Option<Vec<f32>>> = old.iter().map(|&o| dists[o].clone()).collect();
        let accepted = self.verify(&tree, &tree_dists, &fed, &old, on)?;
        // α follows the best-matching branch: the deepest grown branch
        // through the last accepted node (the whole tree if none was).
        let from = accepted.last().map_or(0, |&a| old[a]);
        let n_all = grown.deepest_below(from).max(1);
        fallback.update(n_all, accepted.len().min(n_all), t_c.max(1e-6));
        Ok(())
    }
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

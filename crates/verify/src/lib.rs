//! Verification policies: given a draft [`TokenTree`] and the target's
//! output for every node of it (one forward pass over the flattened tree,
//! row `i` = the target's next-token distribution after node `i`), decide
//! which root path to keep and which token the target adds after it.
//!
//! - [`greedy`]: exact. A child is accepted when it is the target's argmax
//!   at its parent, so the result is exactly what target-only greedy
//!   decoding produces.
//! - [`typical`]: Medusa/PPD typical acceptance, which trades exactness for
//!   longer accepted paths at temperature > 0.
//! - [`sampling`]: recursive rejection sampling over each node's children,
//!   drawn without replacement from the draft; the kept path and the added
//!   token follow the target's sampling distribution exactly.
//! - [`matching`]: exact sampling for candidates proposed without a
//!   distribution (point masses, such as PPD's top-k guesses).

use arbor_sampling::{Rng, argmax};
use arbor_tree::TokenTree;

/// The outcome of a verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Accepted nodes from the root down (the root itself excluded).
    pub accepted: Vec<usize>,
    /// The target's token after the last accepted node: a correction when
    /// a draft token was rejected there, a bonus when the path ran out.
    pub next: u32,
}

fn row(logits: &[f32], vocab: usize, i: usize) -> &[f32] {
    &logits[i * vocab..(i + 1) * vocab]
}

/// Exact greedy verification; `logits` is row-major `[tree.len(), vocab]`.
pub fn greedy(tree: &TokenTree, logits: &[f32], vocab: usize) -> Verdict {
    let mut cur = 0;
    let mut accepted = Vec::new();
    loop {
        let best = argmax(row(logits, vocab, cur)).unwrap_or(0);
        match tree.child_with_token(cur, best) {
            Some(child) => {
                accepted.push(child);
                cur = child;
            }
            None => {
                return Verdict {
                    accepted,
                    next: best,
                };
            }
        }
    }
}

/// Typical acceptance: a draft token `x` is accepted when
/// `p(x) > min(ε, δ · exp(−H(p)))` for the target distribution `p` at its
/// parent (at `temperature`, 1 when greedy). The first token is always
/// checked greedily.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Typical {
    pub epsilon: f32,
    pub delta: f32,
    pub temperature: f32,
}

impl Default for Typical {
    fn default() -> Self {
        Self {
            epsilon: 0.09,
            delta: 0.3,
            temperature: 0.0,
        }
    }
}

fn softmax(logits: &[f32], temperature: f32) -> Vec<f32> {
    arbor_sampling::softmax(logits, if temperature > 0.0 { temperature } else { 1.0 })
}

impl Typical {
    /// The acceptance threshold `min(ε, δ · exp(−H(p)))`.
    pub fn threshold(&self, p: &[f32]) -> f32 {
        let entropy: f32 = p.iter().filter(|&&v| v > 0.0).map(|&v| -v * v.ln()).sum();
        self.epsilon.min(self.delta * (-entropy).exp())
    }

    pub fn accepts(&self, p: &[f32], token: u32) -> bool {
        p.get(token as usize)
            .is_some_and(|&v| v > self.threshold(p))
    }
}

/// Typical-acceptance verification: the longest root path whose first
/// token is the target's argmax and whose later tokens pass the typical
/// test; the token after it is the argmax (greedy) or drawn from the
/// target at the policy's temperature.
pub fn typical(
    tree: &TokenTree,
    logits: &[f32],
    vocab: usize,
    policy: &Typical,
    rng: &mut Rng,
) -> Verdict {
    // Depth of the longest acceptable path below each node, bottom-up
    // (children always have larger ids than their parents).
    let n = tree.len();
    let mut best_len = vec![0usize; n];
    let mut best_child: Vec<Option<usize>> = vec![None; n];
    for i in (0..n).rev() {
        let node = tree.node(i);
        if node.children.is_empty() {
            continue;
        }
        let r = row(logits, vocab, i);
        let ok: Vec<usize> = if i == 0 {
            let top = argmax(r).unwrap_or(0);
            node.children
                .iter()
                .copied()
                .filter(|&c| tree.node(c).token == top)
                .collect()
        } else {
            let p = softmax(r, policy.temperature);
            node.children
                .iter()
                .copied()
                .filter(|&c| policy.accepts(&p, tree.node(c).token))
                .collect()
        };
        if let Some(&c) = ok
            .iter()
            .max_by_key(|&&c| (best_len[c], std::cmp::Reverse(c)))
        {
            best_len[i] = best_len[c] + 1;
            best_child[i] = Some(c);
        }
    }
    let mut accepted = Vec::new();
    let mut cur = 0;
    while let Some(c) = best_child[cur] {
        accepted.push(c);
        cur = c;
    }
    let r = row(logits, vocab, cur);
    let next = if policy.temperature > 0.0 {
        draw(&softmax(r, policy.temperature), rng)
    } else {
        argmax(r).unwrap_or(0)
    };
    Verdict { accepted, next }
}

/// Draws an index from a (normalised) distribution.
pub fn draw(p: &[f32], rng: &mut Rng) -> u32 {
    let total: f64 = p.iter().map(|&v| v as f64).sum();
    let r = rng.next_f64() * total;
    let mut cum = 0.0f64;
    let mut last = 0;
    for (i, &v) in p.iter().enumerate() {
        if v > 0.0 {
            cum += v as f64;
            last = i;
            if r < cum {
                return i as u32;
            }
        }
    }
    last as u32
}

/// Draws `k` distinct indices from `q` without replacement (each draw from
/// `q` restricted to what is left, renormalised), in draw order.
pub fn draw_without_replacement(q: &[f32], k: usize, rng: &mut Rng) -> Vec<u32> {
    let mut left = q.to_vec();
    let mut out = Vec::with_capacity(k);
    for _ in 0..k {
        if !left.iter().any(|&v| v > 0.0) {
            break;
        }
        let x = draw(&left, rng);
        left[x as usize] = 0.0;
        out.push(x);
    }
    out
}

/// Lossless sampling verification of candidates that are point masses
/// (deterministic guesses, no draft distribution): at each node the next
/// token is drawn from the target (`sample(i)`, node `i`'s row); the walk
/// follows the child holding it, or stops with it. Trying point-mass
/// children in turn with sequential residuals accepts child `x` with
/// probability `p(x)`, which is what this does in one draw; each committed
/// token costs exactly one draw, as in plain sampling, so with the same
/// sampler the output equals target-only sampling token for token.
pub fn matching<E>(
    tree: &TokenTree,
    sample: &mut dyn FnMut(usize) -> Result<u32, E>,
) -> Result<Verdict, E> {
    let mut accepted = Vec::new();
    let mut cur = 0;
    loop {
        let x = sample(cur)?;
        match tree.child_with_token(cur, x) {
            Some(child) => {
                accepted.push(child);
                cur = child;
            }
            None => return Ok(Verdict { accepted, next: x }),
        }
    }
}

/// Lossless speculative sampling on a tree (recursive rejection sampling
/// without replacement).
///
/// `target(i)` is the target's sampling distribution after node `i` (dense
/// over the vocabulary, temperature and filters applied); `draft[i]` is
/// the draft distribution that node `i`'s children were drawn from,
/// without replacement, in child order. At each node the children are
/// tried in turn: child `x` is accepted with probability
/// `min(1, p(x) / q(x))`; on rejection `p ← norm(max(p − q, 0))` and `x` is
/// removed from `q`. If every child is rejected (or there are none) the
/// added token is drawn from what is left of `p`.
pub fn sampling(
    tree: &TokenTree,
    target: &mut dyn FnMut(usize) -> Vec<f32>,
    draft: &[Option<Vec<f32>>],
    rng: &mut Rng,
) -> Verdict {
    let mut accepted = Vec::new();
    let mut cur = 0;
    'walk: loop {
        let mut p = target(cur);
        let children = &tree.node(cur).children;
        if let (false, Some(Some(q))) = (children.is_empty(), draft.get(cur)) {
            let mut q = q.clone();
            for &c in children {
                let x = tree.node(c).token as usize;
                let (px, qx) = (p[x], q[x]);
                if qx > 0.0 && (rng.next_f64() as f32) < (px / qx).min(1.0) {
                    accepted.push(c);
                    cur = c;
                    continue 'walk;
                }
                let residual: Vec<f32> = p.iter().zip(&q).map(|(a, b)| (a - b).max(0.0)).collect();
                let mass: f32 = residual.iter().sum();
                if mass > 1e-12 {
                    p = residual.into_iter().map(|v| v / mass).collect();
                }
                q[x] = 0.0;
                let left: f32 = q.iter().sum();
                if left <= 0.0 {
                    break;
                }
                q.iter_mut().for_each(|v| *v /= left);
            }
        }
        return Verdict {
            accepted,
            next: draw(&p, rng),
        };
    }
}

#[cfg(test)]
mod tests;

//! The `auto` strategy's planner: given a memory budget and what the
//! device profile measured (disk bandwidth, the target's `L_fp(n)`, draft
//! step costs), it estimates the tokens per second of every draft source
//! that fits — none, prompt lookup, the target's own resident layers, PPD's
//! prompt tokens, a slim or full draft model — and picks the best.
//!
//! Every source is planned as the trees it drafts. What a source's guesses
//! are worth is an accuracy table — at each depth, how often the target
//! takes the draft's most likely candidate, its second, … — as runs counted
//! it (`crate::acceptance`; a measured prior until then). The best tree of
//! `n` candidates holds the `n` with the highest chance of acceptance
//! ([`arbor_ppd::optimal_tree`]); a round drafts it (one draft step for the
//! root and one for each candidate that has children) and verifies it in
//! one target pass of `n + 1` rows, and yields one token more than the
//! candidates it keeps. Under a budget a pass costs
//! `max(L_fp(rows), io − exposed) + exposed`: the reads of streamed layers
//! overlap the compute of the layers before them, except the first (see
//! [`crate::Profiles::target_under_budget`]). A draft's memory comes out of
//! the target's resident layers, so every source has its own `io`. PPD
//! (the target guessing with trained prompt tokens) is costed the same way
//! from its accuracy table's planned dynamic sparse tree.

use arbor_ppd::Accuracy;
use arbor_speculative::{LatencyProfile, MAX_DRAFT_TOKENS, PPD_ROWS};

/// A draft source the planner may pick.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// What `draft` in the run config becomes (`None`: no draft).
    pub draft: Option<String>,
    /// Short label for explanations (`none`, `lookup`, `self`, `slim 32k`, ...).
    pub label: String,
    /// Bytes the source holds (weights and caches) out of the budget.
    pub memory: u64,
    /// Seconds of one draft step.
    pub step_secs: f64,
    /// What the source's guesses are worth: top-k acceptance by depth
    /// (for PPD, its prompt tokens' table).
    pub accuracy: Accuracy,
    /// Verified trees the table was counted from (0: the prior alone).
    pub measured: f64,
    /// PPD: the target guesses with these prompt tokens (no draft; they
    /// are costed from `accuracy` as PPD's dynamic sparse trees).
    pub ppd: Option<std::sync::Arc<arbor_speculative::PromptTokens>>,
}

/// What a pass under the budget costs when the target streams `read`
/// bytes, and what the planner expects of one candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    pub candidate: Candidate,
    /// Bytes the target reads per pass with this source loaded (`None`:
    /// the budget cannot hold the source and the target's minimum).
    pub read_per_pass: Option<u64>,
    /// Draft tokens per round that maximise the rate (0: plain decoding).
    pub depth: usize,
    /// Tokens a round (a target pass) is expected to produce.
    pub tokens_per_pass: f64,
    /// The rate planned with: the measured one where runs measured this
    /// source under the budget ([`with_measured`]), else the model's.
    pub tok_s: f64,
    /// The model's rate.
    pub model_tok_s: f64,
    /// What runs measured (tok/s, tokens decoded, fading), when they had
    /// decoded enough to count ([`crate::rates::MIN_TOKENS`]).
    pub measured: Option<(f64, f64)>,
}

/// Device facts the estimate uses.
pub struct Device {
    /// The target's resident `L_fp(n)`.
    pub target: LatencyProfile,
    /// Bytes per second a pass brings streamed layers in at, by bytes per
    /// pass: the disk's read bandwidth (see `DiskRecord::bandwidth_for`),
    /// or under a GPU's budget its uploads' and reads' together
    /// ([`crate::pass_io_secs`]).
    pub bandwidth: Box<dyn Fn(u64) -> f64>,
    /// Layers streamed per pass for a given read volume (for the exposed
    /// read); the planner only needs the mean layer size.
    pub mean_layer_bytes: u64,
    /// The target's output head's share of a row's compute (PPD passes
    /// take logits of few of their rows).
    pub head_share: f64,
    /// Sequences whose rows every pass carries (a server's slots): a
    /// source's rows and draft steps count once per sequence, its tokens
    /// too, and the reads once for all.
    pub sequences: usize,
}

/// What a drafting round costs beyond its draft steps and pass: the
/// verification's masks and bookkeeping and the extra rows' head and
/// attention (measured: prompt lookup, which drafts for free, made the
/// 1.5B's streamed passes 15 ms longer than plain ones).
const ROUND_OVERHEAD: f64 = 0.015;

impl Device {
    /// Seconds of a target pass over `n` tokens while `read` bytes stream.
    pub fn pass_secs(&self, n: usize, read: u64) -> f64 {
        self.overlapped(self.target.at(n), read)
    }

    /// Seconds of a pass that computes for `compute` seconds while `read`
    /// bytes stream: the reads overlap the compute except the first
    /// streamed layer's.
    fn overlapped(&self, compute: f64, read: u64) -> f64 {
        let bw = (self.bandwidth)(read).max(1.0);
        let io = read as f64 / bw;
        let exposed = if read == 0 {
            0.0
        } else {
            self.mean_layer_bytes.min(read) as f64 / bw
        };
        compute.max(io - exposed) + exposed
    }

    /// The best tree size, tokens per pass and rate of `c` when the
    /// target streams `read` bytes per pass (for PPD, the size is the
    /// deepest state's candidates).
    pub fn rate(&self, c: &Candidate, read: u64) -> (usize, f64, f64) {
        let s = self.sequences.max(1);
        let plain = s as f64 / self.pass_secs(s, read);
        let mut best = (0, 1.0, plain);
        if let Some(p) = &c.ppd {
            let count = p.count().min(c.accuracy.distances());
            // Every sequence's rows in each pass: the plan's rate is one
            // sequence's.
            let cost = |rows: usize, logits: usize| {
                let compute = arbor_speculative::ppd_pass_secs(
                    &self.target,
                    rows * s,
                    logits * s,
                    self.head_share,
                );
                self.overlapped(compute, read) + ROUND_OVERHEAD
            };
            let logit_cap = arbor_speculative::ppd_logit_rows(PPD_ROWS);
            return match arbor_ppd::plan(&c.accuracy, count, p.epts, PPD_ROWS, logit_cap, cost) {
                Ok(plan) if plan.prompts > 0 && plan.tokens_per_sec * s as f64 > plain => (
                    plan.candidates(),
                    plan.tokens_per_pass,
                    plan.tokens_per_sec * s as f64,
                ),
                _ => best,
            };
        }
        if c.draft.is_none() {
            return best;
        }
        let acc = &c.accuracy;
        let Ok(tree) = arbor_ppd::optimal_tree(acc, acc.distances(), MAX_DRAFT_TOKENS) else {
            return best;
        };
        let mut kept = 0.0;
        let mut expanded = std::collections::HashSet::new();
        for (n, node) in tree.nodes().iter().enumerate() {
            kept += node.value;
            if let Some(parent) = node.parent {
                expanded.insert(parent);
            }
            // The root's step (the draft catching up), then one per
            // candidate with children; each sequence drafts its own.
            let steps = (1 + expanded.len()) * s;
            let round =
                steps as f64 * c.step_secs + self.pass_secs(s * (n + 2), read) + ROUND_OVERHEAD;
            let tokens = (1.0 + kept) * s as f64;
            if tokens / round > best.2 {
                best = (n + 1, tokens / s as f64, tokens / round);
            }
        }
        best
    }
}

/// Estimates every candidate; `read_for(candidate)` is the target's bytes
/// per pass when the candidate's memory goes to the draft (`None` when the
/// target cannot run beside it). Best first.
pub fn estimate(
    device: &Device,
    candidates: Vec<Candidate>,
    read_for: &mut dyn FnMut(&Candidate) -> Option<u64>,
) -> Vec<Estimate> {
    let mut out: Vec<Estimate> = candidates
        .into_iter()
        .map(|candidate| {
            let read = read_for(&candidate);
            let (depth, tokens_per_pass, tok_s) =
                read.map_or((0, 1.0, 0.0), |r| device.rate(&candidate, r));
            Estimate {
                candidate,
                read_per_pass: read,
                depth,
                tokens_per_pass,
                tok_s,
                model_tok_s: tok_s,
                measured: None,
            }
        })
        .collect();
    out.sort_by(|a, b| b.tok_s.total_cmp(&a.tok_s));
    out
}

/// Plans with measured rates where runs measured them: `measured(e)` is
/// the (tok/s, tokens) runs saw of `e`'s source under its strategy and the
/// budget. A measured rate replaces the model's (sources that do not fit
/// keep 0); best first again.
pub fn with_measured(
    estimates: &mut [Estimate],
    measured: &mut dyn FnMut(&Estimate) -> Option<(f64, f64)>,
) {
    for e in estimates.iter_mut() {
        if e.read_per_pass.is_none() {
            continue;
        }
        e.measured = measured(e);
        e.tok_s = e.measured.map_or(e.model_tok_s, |(r, _)| r);
    }
    estimates.sort_by(|a, b| b.tok_s.total_cmp(&a.tok_s));
}

/// One line per estimate, for `--explain`.
pub fn explain(estimates: &[Estimate]) -> Vec<String> {
    estimates
        .iter()
        .map(|e| {
            let c = &e.candidate;
            match e.read_per_pass {
                None => format!(
                    "  {:<12} holds {:>5} MiB: does not fit beside the target",
                    c.label,
                    c.memory >> 20
                ),
                Some(r) => format!(
                    "  {:<12} holds {:>5} MiB, target reads {:>4} MiB/pass, accepts {:.2}/{:.2} \
                     (top-1/2, {}), step {:>5.1} ms -> {:>4.2} tokens/pass, {:>5.2} tok/s \
                     ({} candidates){}",
                    c.label,
                    c.memory >> 20,
                    r >> 20,
                    c.accuracy.top(1, 1),
                    c.accuracy.top(1, 2.min(c.accuracy.ranks())),
                    match c.measured {
                        0.0 => "prior".to_string(),
                        m => format!("{m:.0} trees counted"),
                    },
                    c.step_secs * 1e3,
                    e.tokens_per_pass,
                    e.model_tok_s,
                    e.depth,
                    match e.measured {
                        Some((rate, tokens)) => {
                            format!("; measured {rate:.2} tok/s over {tokens:.0} tokens: planned with it")
                        }
                        None => String::new(),
                    }
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> Device {
        Device {
            // 30 ms for one token, +25 ms per extra token.
            target: LatencyProfile {
                points: vec![(1, 0.030), (2, 0.055), (64, 1.605)],
            },
            bandwidth: Box::new(|_| 1e9),
            mean_layer_bytes: 27 << 20,
            head_share: 0.15,
            sequences: 1,
        }
    }

    fn cand(label: &str, memory: u64, step: f64, a: f64) -> Candidate {
        Candidate {
            draft: (label != "none").then(|| label.to_string()),
            label: label.into(),
            memory,
            step_secs: step,
            accuracy: chain(a),
            measured: 0.0,
            ppd: None,
        }
    }

    /// A source that offers one candidate per node, taken with chance `a`.
    fn chain(a: f64) -> Accuracy {
        Accuracy::new(vec![vec![a]; 8]).unwrap()
    }

    #[test]
    fn several_sequences_share_reads_and_make_drafting_pay_less() {
        let read = 400 << 20;
        let draft = cand("0.5b", 0, 0.010, 0.6);
        let at = |s: usize| {
            let d = Device {
                sequences: s,
                ..device()
            };
            let plain = d.rate(&cand("none", 0, 0.0, 0.0), read).2;
            (plain, d.rate(&draft, read).2)
        };
        let (one, one_draft) = at(1);
        let (eight, eight_draft) = at(8);
        // Eight sequences' rows ride on one read: nearly eight times the
        // tokens while the reads dominate.
        assert!((one - 1.0 / device().pass_secs(1, read)).abs() < 1e-9);
        assert!(eight > 7.0 * one, "{eight} vs {one}");
        // A draft's extra rows and steps are paid per sequence: its gain
        // over plain decoding shrinks.
        assert!(
            one_draft / one > eight_draft / eight,
            "{one_draft}/{one} vs {eight_draft}/{eight}"
        );
    }

    #[test]
    fn passes_cost_their_reads_until_compute_outgrows_them() {
        let d = device();
        let read = 400 << 20;
        let io = read as f64 / 1e9;
        assert!((d.pass_secs(1, read) - io).abs() < 1e-9);
        assert!(
            (d.pass_secs(4, read) - io).abs() < 1e-9,
            "4 tokens hide under the reads"
        );
        assert!(
            d.pass_secs(32, read) > io,
            "32 tokens compute longer than the reads"
        );
        assert!((d.pass_secs(1, 0) - 0.030).abs() < 1e-9);
    }

    #[test]
    fn free_drafts_win_when_reads_dominate_and_lose_when_they_miss() {
        let d = device();
        let read_for = &mut |c: &Candidate| Some((400u64 << 20) + c.memory);
        let est = estimate(
            &d,
            vec![cand("none", 0, 0.0, 0.0), cand("good", 0, 0.01, 0.7)],
            read_for,
        );
        assert_eq!(est[0].candidate.label, "good");
        assert!(est[0].depth >= 3, "IO-bound passes pay for deep chains");
        let est = estimate(
            &d,
            vec![cand("none", 0, 0.0, 0.0), cand("bad", 0, 0.05, 0.01)],
            read_for,
        );
        assert_eq!(est[0].candidate.label, "none");
    }

    #[test]
    fn a_draft_that_costs_memory_pays_in_reads() {
        let d = device();
        // The same acceptance and step time; one source holds 400 MiB that
        // the target then streams on every pass.
        let est = estimate(
            &d,
            vec![
                cand("heavy", 400 << 20, 0.01, 0.8),
                cand("light", 0, 0.01, 0.8),
            ],
            &mut |c| Some((200u64 << 20) + c.memory),
        );
        assert_eq!(est[0].candidate.label, "light");
        assert!(est[1].tok_s < est[0].tok_s);
    }

    fn ppd(top1: f64) -> Candidate {
        let topk = (0..3)
            .map(|d| {
                (1..=10)
                    .map(|k| (top1 * (1.0 + 0.05 * k as f64) / (1 + d) as f64).min(1.0))
                    .collect()
            })
            .collect();
        let accuracy = arbor_ppd::Accuracy::new(topk).unwrap();
        Candidate {
            label: "ppd".into(),
            ppd: Some(std::sync::Arc::new(arbor_speculative::PromptTokens {
                hidden: 1,
                epts: 1,
                vectors: vec![0.0; 3],
                accuracy: accuracy.clone(),
            })),
            accuracy,
            ..cand("none", 0, 0.0, 0.0)
        }
    }

    #[test]
    fn ppd_pays_when_passes_cost_their_reads() {
        // The 1.5B's curve: rows are cheap next to a streamed pass's reads.
        let d = Device {
            target: LatencyProfile {
                points: vec![(1, 0.027), (8, 0.097), (64, 0.77)],
            },
            ..device()
        };
        let est = estimate(&d, vec![cand("none", 0, 0.0, 0.0), ppd(0.45)], &mut |_| {
            Some(400 << 20)
        });
        assert_eq!(est[0].candidate.label, "ppd");
        assert!(est[0].depth >= 1 && est[0].tok_s > est[1].tok_s * 1.1);
        // Resident, with guesses that rarely land: rows cost, plain passes
        // are best and ppd's estimate is plain's.
        let est = estimate(
            &device(),
            vec![cand("none", 0, 0.0, 0.0), ppd(0.02)],
            &mut |_| Some(0),
        );
        assert_eq!(est[0].tok_s, est[1].tok_s);
        assert!(est.iter().all(|e| e.depth == 0));
    }

    #[test]
    fn trees_are_planned_as_trees() {
        let d = device();
        let read = 400 << 20;
        let chain = cand("d", 0, 0.002, 0.5);
        // The same top-1 chance, and the second guess lands 30% more.
        let tree = Candidate {
            accuracy: Accuracy::new(vec![vec![0.5, 0.8]; 8]).unwrap(),
            ..chain.clone()
        };
        let (n_chain, tokens_chain, rate_chain) = d.rate(&chain, read);
        let (n_tree, tokens_tree, rate_tree) = d.rate(&tree, read);
        assert!(
            tokens_chain < 2.0,
            "a chain of 0.5s keeps under one: {tokens_chain}"
        );
        assert!(
            tokens_tree > tokens_chain + 0.3,
            "{tokens_tree} vs {tokens_chain}"
        );
        assert!(
            rate_tree > rate_chain && n_tree > n_chain,
            "{n_tree} vs {n_chain}"
        );
        // Plain decoding's passes: one token each.
        let (n, tokens, rate) = d.rate(&cand("none", 0, 0.0, 0.0), read);
        assert_eq!((n, tokens), (0, 1.0));
        assert!((rate - 1.0 / d.pass_secs(1, read)).abs() < 1e-9);
        // Draft steps count per expanded node: a slow draft's tree is
        // smaller.
        let slow = Candidate {
            step_secs: 0.05,
            ..tree.clone()
        };
        assert!(d.rate(&slow, read).0 < n_tree);
    }

    #[test]
    fn measured_rates_replace_the_model_where_runs_measured_them() {
        let d = device();
        let mut est = estimate(
            &d,
            vec![
                cand("none", 0, 0.0, 0.0),
                cand("good", 0, 0.01, 0.7),
                cand("huge", 1 << 30, 0.01, 0.9),
            ],
            &mut |c| (c.memory < (1 << 30)).then_some(400 << 20),
        );
        assert_eq!(est[0].candidate.label, "good", "the model's ranking");
        let model: Vec<f64> = est.iter().map(|e| e.model_tok_s).collect();
        // Runs measured `good` slower than plain decoding, and something
        // for `huge` (which cannot fit here: it stays out).
        with_measured(&mut est, &mut |e| match e.candidate.label.as_str() {
            "good" => Some((0.5, 512.0)),
            "huge" => Some((99.0, 512.0)),
            _ => None,
        });
        let labels: Vec<&str> = est.iter().map(|e| e.candidate.label.as_str()).collect();
        assert_eq!(labels, ["none", "good", "huge"]);
        assert_eq!(est[1].tok_s, 0.5);
        assert_eq!(est[1].measured, Some((0.5, 512.0)));
        assert_eq!(est[0].measured, None);
        assert_eq!(est[2].tok_s, 0.0);
        // The model's figures stay, and --explain shows both.
        let mut model_now: Vec<f64> = est.iter().map(|e| e.model_tok_s).collect();
        let mut model = model;
        model.sort_by(f64::total_cmp);
        model_now.sort_by(f64::total_cmp);
        assert_eq!(model, model_now);
        let lines = explain(&est);
        assert!(
            lines[1].contains("measured 0.50 tok/s over 512 tokens"),
            "{}",
            lines[1]
        );
        assert!(!lines[0].contains("measured"));
    }

    #[test]
    fn sources_that_do_not_fit_rank_last() {
        let d = device();
        let est = estimate(
            &d,
            vec![cand("huge", 1 << 30, 0.01, 0.9), cand("none", 0, 0.0, 0.0)],
            &mut |c| (c.memory < (1 << 30)).then_some(300 << 20),
        );
        assert_eq!(est[0].candidate.label, "none");
        assert_eq!(est[1].read_per_pass, None);
        assert!(explain(&est)[1].contains("does not fit"));
    }
}

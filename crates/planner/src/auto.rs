//! The `auto` strategy's planner: given a memory budget and what the
//! device profile measured (disk bandwidth, the target's `L_fp(n)`, draft
//! step costs), it estimates the tokens per second of every draft source
//! that fits — none, prompt lookup, the target's own resident layers, a
//! slim or full draft model — and picks the best.
//!
//! The model of a round: the draft proposes a chain of `k` tokens (`k`
//! steps of `d` seconds), the target verifies `k + 1` tokens in one pass.
//! Under a budget a pass costs `max(L_fp(k + 1), io − exposed) + exposed`:
//! the reads of streamed layers overlap the compute of the layers before
//! them, except the first (see [`crate::Profiles::target_under_budget`]).
//! With a per-token acceptance `a` the round yields `(1 − a^(k+1)) / (1 − a)`
//! tokens. A draft's memory comes out of the target's resident layers, so
//! every source has its own `io`. Trees do at least as well as the chain
//! the estimate assumes: the estimate ranks sources, the tree strategy
//! sizes each round from what it observes. PPD (the target guessing with
//! trained prompt tokens) is costed from its accuracy table's planned
//! dynamic sparse tree, its passes paying reads and compute in full (a
//! lower bound, like the chain's for trees).

use arbor_speculative::{LatencyProfile, PPD_ROWS};

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
    /// Probability that the target accepts a drafted token (greedy,
    /// per position).
    pub acceptance: f64,
    /// PPD: the target guesses with these prompt tokens (no draft; the
    /// accuracy table, not `acceptance`, gives its tokens per pass).
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
    pub tok_s: f64,
}

/// Device facts the estimate uses.
pub struct Device {
    /// The target's resident `L_fp(n)`.
    pub target: LatencyProfile,
    /// Read bandwidth of the disk holding the target while streaming, by
    /// bytes read per pass (see `DiskRecord::bandwidth_for`).
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

/// Longest chain the estimate considers.
const MAX_DEPTH: usize = 16;

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

    /// The best depth and rate of `c` when the target streams `read` bytes
    /// per pass (for PPD, the depth is the deepest state's candidates).
    pub fn rate(&self, c: &Candidate, read: u64) -> (usize, f64) {
        let s = self.sequences.max(1);
        let plain = s as f64 / self.pass_secs(s, read);
        let mut best = (0, plain);
        if let Some(p) = &c.ppd {
            // Reads added to compute, none hidden: a lower bound, as the
            // chain estimate is for draft trees, so the two compare fairly.
            // For the 1.5B at 1 GB/s it expects 2.42 / 2.87 / 4.53 tok/s at
            // 600 / 800 / 1000 MiB where ppd measured 2.81 / 3.94 / 6.61.
            // The overlap cost expects 3.75 / 4.15 / 7.99, closer, but
            // against the trees' lower bounds it ranked ppd first at
            // 800 MiB, where the slim-draft tree measured 4.90 to ppd's 3.94.
            let count = p.count().min(p.accuracy.distances());
            // Every sequence's rows in each pass: the plan's rate is one
            // sequence's.
            let cost = |rows: usize, logits: usize| {
                let compute = arbor_speculative::ppd_pass_secs(
                    &self.target,
                    rows * s,
                    logits * s,
                    self.head_share,
                );
                compute + read as f64 / (self.bandwidth)(read).max(1.0) + ROUND_OVERHEAD
            };
            let logit_cap = arbor_speculative::ppd_logit_rows(PPD_ROWS);
            return match arbor_ppd::plan(&p.accuracy, count, p.epts, PPD_ROWS, logit_cap, cost) {
                Ok(plan) if plan.prompts > 0 && plan.tokens_per_sec * s as f64 > plain => {
                    (plan.candidates(), plan.tokens_per_sec * s as f64)
                }
                _ => best,
            };
        }
        if c.draft.is_none() {
            return best;
        }
        let a = c.acceptance.clamp(0.0, 0.999);
        for k in 1..=MAX_DEPTH {
            let tokens = (1.0 - a.powi(k as i32 + 1)) / (1.0 - a) * s as f64;
            // Each sequence's draft steps, counted one after another.
            let drafting = (k * s) as f64 * c.step_secs;
            let round = drafting + self.pass_secs(s * (k + 1), read) + ROUND_OVERHEAD;
            let rate = tokens / round;
            if rate > best.1 {
                best = (k, rate);
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
            let (depth, tok_s) = read.map_or((0, 0.0), |r| device.rate(&candidate, r));
            Estimate {
                candidate,
                read_per_pass: read,
                depth,
                tok_s,
            }
        })
        .collect();
    out.sort_by(|a, b| b.tok_s.total_cmp(&a.tok_s));
    out
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
                    "  {:<12} holds {:>5} MiB, target reads {:>4} MiB/pass, acceptance {:.2}, \
                     step {:>5.1} ms -> {:>5.2} tok/s (depth {})",
                    c.label,
                    c.memory >> 20,
                    r >> 20,
                    c.acceptance,
                    c.step_secs * 1e3,
                    e.tok_s,
                    e.depth
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
            acceptance: a,
            ppd: None,
        }
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
            let plain = d.rate(&cand("none", 0, 0.0, 0.0), read).1;
            (plain, d.rate(&draft, read).1)
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
                accuracy,
            })),
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

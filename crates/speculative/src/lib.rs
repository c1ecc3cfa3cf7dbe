//! Decoding strategies over a target model and an optional draft model.
//!
//! A [`Strategy`] is a [`Decoding`] (the rounds the loop runs) and a
//! [`Streaming`] mode (how target layers outside a memory budget are read;
//! the loop itself ignores it). Strategies parse from and print to one name
//! each (`tree`, `chain-on-demand`, ...; see [`Strategy::NAMES`]).
//!
//! - [`Decoding::Autoregressive`]: the target alone, one token per pass.
//! - [`Decoding::Chain`]: classic speculative decoding; the draft proposes
//!   `gamma` tokens one after another and the target checks them in one pass.
//! - [`Decoding::Tree`]: the draft grows a token tree (LLMCad's
//!   confidence-paced branches, decoded through tree masks so switching
//!   branch costs nothing), verification starts when the tree's best
//!   cumulative confidence drops under the adaptive threshold α, and the
//!   tree sent to the target is cut to the size that maximises expected
//!   tokens per second under the measured latency profile `L_fp(n)`.
//! - [`Decoding::StaticTree`]: a fixed width × depth tree, for comparison.
//! - [`Decoding::Ppd`]: parallel prompt decoding, no draft model: trained
//!   prompt-token embeddings after the committed token and after every
//!   candidate guess the next tokens in the same pass that verifies the
//!   candidates of the last one (a dynamic sparse tree, [`arbor_ppd`]).
//! - `tree-provisional` ([`TreeConfig::provisional`]): the tree strategy
//!   plus LLMCad's provisional generation. While the target's verification
//!   pass waits for weights read from disk, the draft keeps extending the
//!   tree's most confident branch; those tokens are streamed as
//!   [`Event::Provisional`], and when the target's verdict agrees with the
//!   branch, the draft's work under the next committed token (provisional
//!   tokens and tree branches the verification did not carry) seeds the
//!   next round's tree instead of being thrown away.
//!
//! [`decode`] runs the loop: prefill, then one round at a time (each
//! decoding has its round in `rounds/`) until a stop token, the token limit
//! or the context ends it. With greedy sampling and exact verification
//! every strategy produces the target's own output token for token (the
//! tests check it). Above temperature 0, exact verification is recursive
//! rejection sampling, so outputs follow the target's distribution.

mod acceptance;
mod decode;
mod profile;
mod rounds;
mod run;
mod strategy;

pub use acceptance::{ACCEPTANCE_DEPTHS, ACCEPTANCE_RANKS, Acceptance};
pub use decode::{Control, decode, decode_with};
pub use profile::{LatencyProfile, PROFILE_SIZES, best_size};
pub use strategy::{Decoding, Strategy, Streaming};

use std::time::Instant;

use arbor_sampling::SamplingParams;
pub use arbor_tree::GrowConfig;
pub use arbor_verify::Typical;

/// Trained prompt tokens of one target (PPD): `count` prompt tokens of
/// `epts` embedding vectors each (ensemble prompt tokens, EPTs; 1 makes
/// them plain prompt tokens), and how well they guess. Appended after a row
/// at position `P`, prompt token `i` (0-based) sits at `P + 1 + i` and
/// guesses the token at `P + 2 + i`: `i + 1` places past the token the
/// target itself commits after that row. With several EPTs, the `j`-th
/// EPTs of successive prompt tokens form a chain that sees the text and its
/// own earlier rows only (the thesis' ensemble attention mask), and a
/// prompt token's guess is the mean of its EPTs' logits.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptTokens {
    pub hidden: usize,
    /// EPTs per prompt token (at least 1).
    pub epts: usize,
    /// `count × epts × hidden`: prompt token by prompt token, its EPTs in
    /// order.
    pub vectors: Vec<f32>,
    /// Top-k accuracy per distance (its distances bound the prompt tokens
    /// a pass carries).
    pub accuracy: arbor_ppd::Accuracy,
}

impl PromptTokens {
    pub fn count(&self) -> usize {
        self.vectors.len() / (self.hidden * self.epts).max(1)
    }

    /// EPT `j` of prompt token `i`.
    pub fn vector(&self, i: usize, j: usize) -> &[f32] {
        let at = (i * self.epts + j) * self.hidden;
        &self.vectors[at..at + self.hidden]
    }

    /// Checks the shape against a model of width `hidden`.
    pub fn check(&self, hidden: usize) -> Result<()> {
        if self.hidden != hidden
            || self.epts == 0
            || self.count() == 0
            || self.vectors.len() != self.count() * self.epts * hidden
        {
            return Err(SpecError::Invalid(format!(
                "prompt tokens of width {} ({} EPTs, {} values) for a model of width {hidden}",
                self.hidden,
                self.epts,
                self.vectors.len()
            )));
        }
        Ok(())
    }
}

/// The guess rows of prompt tokens: row `i` the mean of the `epts` rows
/// `rows(i, j)` of `logits` (the row itself for one EPT).
pub fn ensemble(
    logits: &arbor_model::Logits,
    count: usize,
    epts: usize,
    rows: impl Fn(usize, usize) -> usize,
) -> Vec<Vec<f32>> {
    (0..count)
        .map(|i| {
            let mut sum = logits.row(rows(i, 0)).to_vec();
            for j in 1..epts {
                sum.iter_mut()
                    .zip(logits.row(rows(i, j)))
                    .for_each(|(s, x)| *s += x);
            }
            if epts > 1 {
                sum.iter_mut().for_each(|s| *s /= epts as f32);
            }
            sum
        })
        .collect()
}

/// Rows of a `ppd` pass by default (candidates and prompt tokens).
pub const PPD_ROWS: usize = 48;

/// Prompt tokens a `ppd` pass is planned for (what `arbor train ppd`
/// trains); a file with fewer gets trees no wider in logit rows.
pub const PPD_PROMPTS: usize = 3;

/// Most rows of logits a `ppd` pass of at most `max_rows` rows asks for
/// from a model that keeps its last pass ([`arbor_model::LanguageModel::keep_last_pass`]):
/// the committed token and the candidates, then the prompt rows after the
/// deepest accepted one. The memory plan reserves this many.
pub fn ppd_logit_rows(max_rows: usize) -> usize {
    // Candidates carry 1 to 3 prompt tokens: about two on average.
    (max_rows / 3).max(1) + PPD_PROMPTS
}

/// Seconds of a `ppd` pass of `rows` rows of which `logit_rows` return
/// logits, from a curve of passes that return logits for every row: the
/// other rows cost the curve's slope less the head's share of it
/// (`head_share`, see [`arbor_model::Config::head_share`]).
pub fn ppd_pass_secs(
    profile: &LatencyProfile,
    rows: usize,
    logit_rows: usize,
    head_share: f64,
) -> f64 {
    let logits = logit_rows.clamp(1, rows.max(1));
    let (all, taken) = (profile.at(rows), profile.at(logits));
    taken + (all - taken).max(0.0) * (1.0 - head_share)
}

/// Prompt tokens a `tree-ppd` draft step carries unless told: the count that maximises tokens
/// per draft-pass second in steady state, where a pass reads the branch's
/// first child and the `q` guesses made after it (`1 + q` rows), carries
/// `q` prompt tokens (`q` rows per EPT), and grows the branch by its child plus the run of
/// guesses the draft confirms (top-1 accuracies taken as independent).
pub fn draft_guesses(prompts: &PromptTokens, draft: Option<&LatencyProfile>) -> usize {
    let m = prompts.count().min(prompts.accuracy.distances());
    let e = prompts.epts;
    let Some(profile) = draft else {
        return m;
    };
    let mut best = (0, 1.0 / profile.at(1));
    let (mut tokens, mut chain) = (1.0, 1.0);
    for q in 1..=m {
        chain *= prompts.accuracy.top(q, 1);
        tokens += chain;
        let rate = tokens / profile.at(1 + q + e * q);
        if rate > best.1 {
            best = (q, rate);
        }
    }
    best.0
}

/// Settings of [`Decoding::Ppd`].
#[derive(Debug, Clone, PartialEq)]
pub struct PpdConfig {
    /// The target's prompt tokens (attached by the caller; a run without
    /// them is refused).
    pub prompts: Option<std::sync::Arc<PromptTokens>>,
    /// Most rows one pass carries (candidates and prompt tokens).
    pub max_rows: usize,
    /// The target's pass cost by rows; without it every row is free and
    /// the largest tree that fits is verified.
    pub profile: Option<LatencyProfile>,
}

impl Default for PpdConfig {
    fn default() -> Self {
        Self {
            prompts: None,
            max_rows: PPD_ROWS,
            profile: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error(transparent)]
    Model(#[from] arbor_model::ModelError),
    #[error(transparent)]
    Sampling(#[from] arbor_sampling::SamplingError),
    #[error(transparent)]
    Mask(#[from] arbor_mask::MaskError),
    #[error(transparent)]
    Ppd(#[from] arbor_ppd::PpdError),
    #[error("{0}")]
    Invalid(String),
    /// The output constraint failed (a grammar engine's error).
    #[error("the output constraint: {0}")]
    Constraint(String),
}

pub type Result<T, E = SpecError> = std::result::Result<T, E>;

/// Settings of the tree strategy.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeConfig {
    pub grow: GrowConfig,
    /// Initial verification threshold α.
    pub alpha: f32,
    /// Most draft tokens sent to one verification.
    pub max_nodes: usize,
    /// The target's latency profile; without it trees are only capped by
    /// `max_nodes` and α.
    pub profile: Option<LatencyProfile>,
    /// The draft's latency profile. With both profiles, each round first
    /// checks that drafting can beat plain decoding at the observed
    /// acceptance rate, and decodes plainly when it cannot.
    pub draft_profile: Option<LatencyProfile>,
    /// Provisional generation: the draft extends the most confident branch
    /// while the target waits for its weights, and the draft's work under
    /// the next committed token is kept for the next round. Greedy and
    /// typical verification only (at temperature > 0 with exact
    /// verification it is ignored: reusing draws across rounds is not
    /// covered by the rejection sampler's proof).
    pub provisional: bool,
    /// LLMCad's fallback: verify as soon as the tree's best cumulative
    /// confidence drops under the adaptive threshold α. Without it
    /// (`tree-no-fallback`, for ablations) the tree grows to its size limit
    /// every round.
    pub fallback: bool,
    /// `tree-ppd`: the draft reads each leaf with its own prompt tokens
    /// after it, and their guesses extend the branch past the leaf's first
    /// child before the draft has read them (see [`DraftPrompts`]).
    pub draft_prompts: Option<DraftPrompts>,
}

/// The draft's prompt tokens in `tree-ppd`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DraftPrompts {
    /// The draft's trained prompt tokens (attached by the caller; a round
    /// without them is refused).
    pub prompts: Option<std::sync::Arc<PromptTokens>>,
    /// Prompt tokens a draft step carries: `None` sizes it from the draft's
    /// latency profile and accuracy table (all of them without a profile),
    /// 0 makes `tree-ppd` plain `tree`.
    pub count: Option<usize>,
}

impl Default for TreeConfig {
    fn default() -> Self {
        Self {
            grow: GrowConfig::default(),
            alpha: 0.01,
            max_nodes: 32,
            profile: None,
            draft_profile: None,
            provisional: false,
            fallback: true,
            draft_prompts: None,
        }
    }
}

/// How drafted tokens are checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verification {
    /// Greedy: argmax matching. Temperature > 0: rejection sampling. The
    /// output is the target's (greedy) or follows its distribution.
    Exact,
    /// Typical acceptance (not exact: accepts tokens the target finds
    /// plausible).
    Typical(Typical),
}

#[derive(Debug, Clone, PartialEq)]
pub struct DecodeOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_tokens: Vec<u32>,
    pub strategy: Strategy,
    pub verification: Verification,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    MaxTokens,
    StopToken,
    ContextFull,
    /// The caller's cancel flag was set (see [`decode_with`]).
    Cancelled,
}

/// Counters and timings of one decode.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_secs: f64,
    /// Wall time after the prefill.
    pub decode_secs: f64,
    /// Target passes that verified draft tokens.
    pub verifications: usize,
    /// Draft tokens the target accepted.
    pub accepted_draft_tokens: usize,
    /// Draft tokens proposed (put in a tree or chain).
    pub draft_tokens: usize,
    /// Plain one-token target passes (autoregressive, or the tree strategy
    /// falling back when drafting does not pay).
    pub target_steps: usize,
    pub draft_secs: f64,
    pub target_secs: f64,
    /// Draft tokens generated while the target waited for weights.
    pub provisional_tokens: usize,
    /// Provisional tokens the target later accepted.
    pub provisional_accepted: usize,
    /// Seconds the draft spent on provisional tokens (inside verification
    /// passes, so also inside `target_secs`).
    pub provisional_secs: f64,
    pub stop: StopReason,
    /// The target's choices among the draft's candidates along every
    /// verified path.
    pub acceptance: Acceptance,
}

impl DecodeStats {
    fn new(prompt_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            generated_tokens: 0,
            prefill_secs: 0.0,
            decode_secs: 0.0,
            verifications: 0,
            accepted_draft_tokens: 0,
            draft_tokens: 0,
            target_steps: 0,
            draft_secs: 0.0,
            target_secs: 0.0,
            provisional_tokens: 0,
            provisional_accepted: 0,
            provisional_secs: 0.0,
            stop: StopReason::MaxTokens,
            acceptance: Acceptance::default(),
        }
    }

    /// Tokens produced per target pass (verifications and plain steps; the
    /// first token comes from the prefill, a final stop token counts as
    /// produced): 1 for autoregressive decoding.
    pub fn mean_accepted(&self) -> f64 {
        let passes = self.verifications + self.target_steps;
        if passes == 0 {
            return 0.0;
        }
        self.produced_after_prefill() as f64 / passes as f64
    }

    /// Tokens the target passes after the prefill produced, a final stop
    /// token included.
    pub fn produced_after_prefill(&self) -> usize {
        let stop = usize::from(self.stop == StopReason::StopToken);
        (self.generated_tokens + stop).saturating_sub(1)
    }

    /// Draft tokens proposed but not accepted.
    pub fn wasted_draft_tokens(&self) -> usize {
        self.draft_tokens - self.accepted_draft_tokens
    }

    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_secs.max(1e-9)
    }

    /// Tokens after the first over the time after the prefill.
    pub fn decode_tok_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_secs.max(1e-9)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// Generated tokens, without the prompt and without a stop token.
    pub tokens: Vec<u32>,
    pub stats: DecodeStats,
    /// When decoding started; the trace's times count from here.
    pub started: Instant,
    /// What the loop did when: prefill, draft growth, verification passes,
    /// provisional draft steps, plain target steps.
    pub trace: Vec<PhaseSpan>,
    /// One score per generated token when [`Control::logprobs`] asked.
    pub logprobs: Vec<arbor_sampling::Scored>,
}

/// What the decoding loop streams to its caller.
///
/// A consumer keeps the confirmed tokens and, after them, the provisional
/// ones shown so far (only `tree-provisional` shows any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// Tokens the target produced: final. If provisional tokens are shown,
    /// the first `min(len, shown)` of them equal the start of these and are
    /// replaced by them.
    Confirm(&'a [u32]),
    /// Draft guesses shown after the confirmed tokens while the target
    /// works; appended to those already shown.
    Provisional(&'a [u32]),
    /// The last `n` provisional tokens shown were wrong: remove them.
    Rollback(usize),
}

/// One interval of the decoding loop, in seconds since [`Decoded::started`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhaseSpan {
    pub phase: Phase,
    pub start: f64,
    pub end: f64,
    /// Tokens the pass fed to its model (the prompt for the prefill, the
    /// tree with its root for a verification, 1 for a plain or
    /// provisional step; draft tokens proposed for a drafting phase).
    pub tokens: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Prefill,
    /// The draft growing a tree or chain (G).
    Draft,
    /// A target pass verifying draft tokens (V).
    Verify,
    /// One draft step while the target waited for weights (P).
    Provisional,
    /// A plain one-token target pass.
    Step,
}

/// Most draft tokens one verification carries: with the root, one
/// verification pass stays within the rows a backend computes exactly as
/// one-token passes ([`arbor_tensor::EXACT_BATCH_ROWS`]). Larger static
/// trees are cut to their first nodes.
pub const MAX_DRAFT_TOKENS: usize = arbor_tensor::EXACT_BATCH_ROWS - 1;

/// Prompts are prefilled in chunks of this many tokens, which bounds the
/// activation memory of long prompts.
pub const PREFILL_CHUNK: usize = 512;

//! The state of one decode, which the loop (`crate::decode`) and its
//! rounds share: [`Run`]. Its helpers are split by what they touch:
//!
//! - here: committing and showing tokens, plain target steps, the room
//!   left for draft tokens;
//! - `draft`: feeding the draft and reading its proposals;
//! - `verify`: verification passes and their verdicts;
//! - `provisional`: drafting while the target waits for weights, and the
//!   seeds it leaves for the next round.

mod draft;
mod provisional;
mod verify;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use arbor_model::LanguageModel;
use arbor_sampling::{Constraint, Rng, Sampler, Scored};

pub(crate) use draft::{Fed, top_logits, top_probs};
use provisional::Seed;
pub(crate) use provisional::{Grown, Start};

use crate::{DecodeOptions, DecodeStats, Event, Phase, PhaseSpan, Result, SpecError, StopReason};

/// The state of one decode, shared by the loop and its rounds.
pub(crate) struct Run<'t, 'd> {
    /// Lent to the verification thread during a provisional round.
    pub(crate) target: Option<&'t mut dyn LanguageModel>,
    pub(crate) draft: Option<&'d mut dyn LanguageModel>,
    pub(crate) opts: DecodeOptions,
    /// The prompt followed by every committed token.
    pub(crate) seq: Vec<u32>,
    pub(crate) prompt_len: usize,
    pub(crate) context: usize,
    pub(crate) vocab: usize,
    pub(crate) sampler: Sampler,
    pub(crate) rng: Rng,
    pub(crate) stats: DecodeStats,
    pub(crate) done: Option<StopReason>,
    /// Exact verification at temperature > 0: drafts are drawn from the
    /// draft distribution and checked by rejection sampling.
    pub(crate) sampling_mode: bool,
    /// Running estimate of how often the target accepts a draft token.
    pub(crate) accept_rate: f64,
    /// Running estimate of one draft forward, seconds.
    pub(crate) draft_step: Option<f64>,
    /// The draft's most likely tokens at this round's root, best first
    /// (counted against the target's choice when the round settles).
    pub(crate) root_guesses: Option<Vec<u32>>,
    /// Provisional tokens the caller is showing after the confirmed ones.
    pub(crate) shown: Vec<u32>,
    /// The draft's work under the last committed token, kept from the
    /// previous provisional round (its fed nodes are in the draft cache).
    pub(crate) seed: Option<Seed>,
    pub(crate) started: Instant,
    pub(crate) trace: Vec<PhaseSpan>,
    /// Set by the caller to stop (see [`crate::decode_with`]).
    pub(crate) cancel: Option<&'t AtomicBool>,
    /// What may come next (see [`crate::Control::constraint`]).
    pub(crate) constraint: Option<&'t dyn Constraint>,
    /// The constraint failed on committed tokens: decoding stopped there.
    pub(crate) constraint_error: Option<String>,
    /// Alternatives to list with each generated token's score (`None`:
    /// tokens are not scored).
    pub(crate) logprobs: Option<usize>,
    /// One score per generated token.
    pub(crate) scored: Vec<Scored>,
    /// Scores of the tokens the next [`Run::commit`] gets, in order.
    pub(crate) pending: Vec<Scored>,
}

impl Run<'_, '_> {
    /// Whether the caller asked to stop; if so, says so in `done`.
    pub(crate) fn cancelled(&mut self) -> bool {
        let set = self.cancel.is_some_and(|c| c.load(Ordering::Relaxed));
        if set {
            self.done = Some(StopReason::Cancelled);
        }
        set
    }

    pub(crate) fn target(&mut self) -> &mut dyn LanguageModel {
        self.target
            .as_deref_mut()
            .expect("the target is back after every verification")
    }

    pub(crate) fn draft(&mut self) -> &mut dyn LanguageModel {
        self.draft.as_deref_mut().expect("checked in decode()")
    }

    pub(crate) fn span(&mut self, phase: Phase, start: Instant, tokens: usize) {
        let at = |t: Instant| t.saturating_duration_since(self.started).as_secs_f64();
        let span = PhaseSpan {
            phase,
            start: at(start),
            end: at(Instant::now()),
            tokens,
        };
        self.trace.push(span);
    }

    /// Tokens generated so far.
    fn generated(&self) -> usize {
        self.seq.len() - self.prompt_len
    }

    /// Shows `tokens` as the provisional continuation (cut at a stop token
    /// and at the token limit): rolls back what differs from what is shown
    /// and appends the rest.
    pub(crate) fn show(&mut self, tokens: &[u32], on: &mut dyn FnMut(Event<'_>)) {
        let wanted = self.opts.max_tokens - self.generated();
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
    pub(crate) fn commit(&mut self, tokens: &[u32], on: &mut dyn FnMut(Event<'_>)) {
        let start = self.seq.len();
        for &t in tokens {
            if self.opts.stop_tokens.contains(&t) {
                self.done = Some(StopReason::StopToken);
                break;
            }
            self.seq.push(t);
            if self.generated() >= self.opts.max_tokens {
                self.done = Some(StopReason::MaxTokens);
                break;
            }
            if self.seq.len() >= self.context {
                self.done = Some(StopReason::ContextFull);
                break;
            }
        }
        let scores = std::mem::take(&mut self.pending);
        if self.logprobs.is_some() {
            let n = self.seq.len() - start;
            self.scored.extend(scores.into_iter().take(n));
        }
        if self.seq.len() > start {
            let new = &self.seq[start..];
            if let Some(c) = self.constraint
                && let Err(e) = c.commit(new)
            {
                // Rows are masked before a token is chosen, so only the
                // rule's own failure gets here: generation ends with it.
                self.constraint_error = Some(e);
                self.done = Some(StopReason::StopToken);
            }
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

    /// Masks one row of target logits for the position after the
    /// committed tokens and `path` (no-op without a constraint).
    pub(crate) fn constrain(&self, path: &[u32], logits: &mut [f32]) -> Result<()> {
        match self.constraint {
            Some(c) => c.mask(path, logits).map_err(SpecError::Constraint),
            None => Ok(()),
        }
    }

    /// Scores `token`, chosen from `logits`, for the next commit (no-op
    /// unless the caller asked for scores).
    pub(crate) fn score(&mut self, logits: &[f32], token: u32) {
        if let Some(top) = self.logprobs {
            self.pending.push(Scored::new(logits, token, top));
        }
    }

    /// The last committed token: the root of the next round's draft.
    pub(crate) fn root(&self) -> u32 {
        *self.seq.last().expect("the sequence holds the prompt")
    }

    pub(crate) fn is_stop(&self, token: u32) -> bool {
        self.opts.stop_tokens.contains(&token)
    }

    /// One plain target pass on the last committed token.
    pub(crate) fn target_step(&mut self, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        let t = Instant::now();
        let root = self.root();
        let mut logits = self.target().step(&[root])?;
        self.stats.target_secs += t.elapsed().as_secs_f64();
        self.span(Phase::Step, t, 1);
        self.stats.target_steps += 1;
        self.constrain(&[], &mut logits)?;
        let next = self.sampler.sample(&logits)?;
        // A round whose draft ran and then proposed nothing worth
        // verifying counts too: what the draft's guesses are worth includes
        // the rounds they were not worth sending.
        if let Some(guesses) = self.root_guesses.take() {
            self.stats.acceptance.observe_root(&guesses, next);
        }
        self.score(&logits, next);
        self.commit(&[next], on);
        Ok(())
    }

    /// Room for draft tokens in one verification: at most `max`, the
    /// tokens still wanted and the context left after the root.
    pub(crate) fn room(&self, max: usize) -> usize {
        let wanted = self.opts.max_tokens - self.generated();
        let context_left = self.context.saturating_sub(self.seq.len() + 1);
        max.min(wanted).min(context_left)
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

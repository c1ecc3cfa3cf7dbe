//! The decoding loop shared by every strategy: checks, prefill, then one
//! [`Round`](crate::rounds::Round) after another until a stop token, the
//! token limit or the context ends it. The state the rounds share is a
//! [`Run`]; the rounds (`crate::rounds`) and the state (`crate::run`) do
//! not name each other's loop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use arbor_model::LanguageModel;
use arbor_sampling::{Constraint, Rng, Sampler};

use crate::run::Run;
use crate::{
    DecodeOptions, DecodeStats, Decoded, Event, PREFILL_CHUNK, Phase, Result, SpecError,
    StopReason, Verification, rounds,
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
    decode_with(target, draft, prompt, opts, Control::default(), on)
}

/// How a caller steers one decode from outside (see [`decode_with`]).
#[derive(Default, Clone, Copy)]
pub struct Control<'a> {
    /// Once set (by `on`, or by another thread: a server whose client went
    /// away) decoding ends with [`StopReason::Cancelled`]. It is read
    /// between prefill chunks and between rounds: within one target pass.
    pub cancel: Option<&'a AtomicBool>,
    /// The target's cache already holds the keys and values of the
    /// prompt's first `reuse` tokens (an earlier turn of the same
    /// conversation): only the rest is prefilled. At most the prompt's
    /// length minus one; the caller vouches for the cache's content.
    pub reuse: usize,
    /// A rule on which tokens may come next, applied to every target row a
    /// token is chosen from (see [`Constraint`]).
    pub constraint: Option<&'a dyn Constraint>,
    /// Score every generated token ([`Decoded::logprobs`]) with this many
    /// of the most probable alternatives.
    pub logprobs: Option<usize>,
}

impl std::fmt::Debug for Control<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("cancel", &self.cancel)
            .field("reuse", &self.reuse)
            .field("constraint", &self.constraint.is_some())
            .field("logprobs", &self.logprobs)
            .finish()
    }
}

/// [`decode`] under a caller's [`Control`].
pub fn decode_with(
    target: &mut dyn LanguageModel,
    draft: Option<&mut dyn LanguageModel>,
    prompt: &[u32],
    opts: &DecodeOptions,
    control: Control<'_>,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<Decoded> {
    let Control {
        cancel,
        reuse,
        constraint,
        logprobs,
    } = control;
    opts.strategy.decoding.validate()?;
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
    if reuse >= prompt.len() || reuse > target.cache_len() {
        return Err(SpecError::Invalid(format!(
            "cannot reuse {reuse} cached tokens of a {}-token prompt with {} in the cache",
            prompt.len(),
            target.cache_len()
        )));
    }
    let sampling_mode = !opts.sampling.is_greedy() && opts.verification == Verification::Exact;
    // Greedy exact decoding reads each row of the target's logits for its
    // argmax only: a model with an approximate head may use it.
    let argmax_only = opts.sampling.is_greedy()
        && opts.verification == Verification::Exact
        && constraint.is_none()
        && logprobs.is_none();
    target.set_argmax_only(argmax_only);
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
        root_guesses: None,
        shown: Vec::new(),
        seed: None,
        started: Instant::now(),
        trace: Vec::new(),
        cancel,
        constraint,
        constraint_error: None,
        logprobs,
        scored: Vec::new(),
        pending: Vec::new(),
    };
    let driven = drive(&mut run, reuse, on);
    if let Some(t) = run.target.as_deref_mut() {
        t.set_argmax_only(false);
    }
    driven?;
    if let Some(e) = run.constraint_error.take() {
        return Err(SpecError::Constraint(e));
    }
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
        logprobs: run.scored,
    })
}

/// Prefills the prompt past its first `reuse` tokens (already in the
/// target's cache), then runs rounds until done.
fn drive(run: &mut Run<'_, '_>, reuse: usize, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
    let start = Instant::now();
    run.target().truncate_cache(reuse)?;
    let mut logits = Vec::new();
    let target = run.target.as_deref_mut().expect("the target is here");
    let cancel = run.cancel;
    for chunk in run.seq[reuse..].chunks(PREFILL_CHUNK) {
        if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            break;
        }
        logits = target.step(chunk)?;
    }
    run.stats.prefill_secs = start.elapsed().as_secs_f64();
    run.span(Phase::Prefill, start, run.seq.len() - reuse);
    let start = Instant::now();
    if run.cancelled() {
        return Ok(());
    }
    if run.opts.max_tokens == 0 {
        run.done = Some(StopReason::MaxTokens);
        return Ok(());
    }
    run.constrain(&[], &mut logits)?;
    let first = run.sampler.sample(&logits)?;
    run.score(&logits, first);
    run.commit(&[first], on);
    if let Some(d) = run.draft.as_deref_mut() {
        d.truncate_cache(0)?;
    }
    let mut round = rounds::for_decoding(&run.opts.strategy.decoding);
    while run.done.is_none() && !run.cancelled() {
        round.round(run, on)?;
    }
    if !run.shown.is_empty() {
        on(Event::Rollback(run.shown.len()));
        run.shown.clear();
    }
    run.stats.decode_secs = start.elapsed().as_secs_f64();
    Ok(())
}

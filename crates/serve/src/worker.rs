//! The one thread that owns the engine run: it loads it, takes requests
//! from a bounded queue in order and generates for each, sending text to
//! the request's handler as it is confirmed. A request whose client has
//! left, or whose time is up, is stopped within one pass (the decoding loop
//! reads its cancel flag between passes). A generation that panics fails
//! its request with a 500; the run, whose caches it may have left half
//! written, is dropped and loaded again.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arbor_engine::slo::{SloError, SloPrompt, SloReport, SloTables, protected_mask};
use arbor_engine::{EngineError, GenerateOptions, Run, StopReason, TextEvent};
use tokio::sync::mpsc;

use crate::api::Settings;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::status::{Facts, Phase, Status};
use crate::stops::StopScanner;
use crate::{Clock, Loader, ServeOptions, Served};

/// One generation request, as the worker gets it.
pub struct Job {
    pub prompt: Vec<u32>,
    /// With an objective: the prompt tokens no prompt level drops.
    pub protected: Option<Vec<bool>>,
    pub settings: Settings,
    /// Resolved: the request's, or the server's default.
    pub max_tokens: usize,
    pub out: mpsc::UnboundedSender<Out>,
    pub cancel: Arc<AtomicBool>,
    /// Queue wait counts: a request still queued at its deadline fails.
    pub deadline: Instant,
    pub timeout: Duration,
    /// What `deadline` is read against.
    pub clock: Clock,
    /// When the request arrived (for the latency histograms).
    pub arrived: Instant,
    /// Tests only: panic at the first token.
    pub fault: bool,
    /// The rule the answer must follow (structured output, forced calls).
    pub constraint: Option<Arc<arbor_grammar::Grammar>>,
    /// Penalties and biases on the target's rows.
    pub shaping: Option<Arc<arbor_engine::Shaping>>,
    /// Tokens that end this answer instead of the model's end tokens (a
    /// fill-in-the-middle ends at FIM tokens too).
    pub stop_tokens: Option<Vec<u32>>,
}

/// What the worker sends a request's handler.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    /// Confirmed text (never part of a stop sequence).
    Text(String),
    /// The draft's provisional text (only when the request asked).
    Provisional(String),
    /// The last `n` characters of provisional text were wrong.
    Rollback(usize),
    Done(Finish),
    Failed(ApiError),
}

/// How a generation ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// `stop` (a stop token or sequence) or `length`.
    pub reason: &'static str,
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the prompt cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub tokens_per_pass: f64,
    pub decode_tok_s: f64,
    pub strategy: String,
    /// The sampling seed (drawn afresh when the request gave none).
    pub seed: u64,
    /// With a rule on the answer: rows masked and the seconds it took.
    pub masked: Option<(usize, f64)>,
    /// How a request with an objective was served (its `arbor.slo`).
    pub slo: Option<serde_json::Value>,
    /// The delivered tokens' scores, when the request asked.
    pub scored: Option<Vec<arbor_engine::Scored>>,
}

/// Sets the flag when dropped: held by a request's handler (and its
/// response stream), so a client that disconnects cancels its generation.
pub struct CancelOnDrop(pub Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Loads the run, then serves jobs until the queue closes (every sender
/// dropped: shutdown). Requests that find no run (its load failed) get 503.
pub(crate) fn run_worker(
    mut load: Loader,
    mut jobs: mpsc::Receiver<Job>,
    metrics: Arc<Metrics>,
    status: Arc<Status>,
    options: ServeOptions,
) {
    let mut served = open(&mut load, &status, &options);
    while let Some(job) = jobs.blocking_recv() {
        metrics.queued.fetch_sub(1, Ordering::Relaxed);
        metrics
            .queue_wait
            .observe(job.arrived.elapsed().as_secs_f64());
        let Some(s) = served.as_mut() else {
            let why = match status.phase() {
                Phase::Failed(why) => why,
                _ => "the model is not loaded".into(),
            };
            let _ = job.out.send(Out::Failed(ApiError::not_loaded(&why)));
            continue;
        };
        let out = job.out.clone();
        metrics.busy.store(1, Ordering::Relaxed);
        let slo = s.slo.as_ref().or(options.slo.as_ref());
        let tokenizer = status.facts().map(|f| f.tokenizer.clone());
        let result = catch_unwind(AssertUnwindSafe(|| {
            serve(&mut s.run, job, &metrics, slo, tokenizer.as_deref())
        }));
        metrics.busy.store(0, Ordering::Relaxed);
        if let Err(panic) = result {
            let what = panic_message(&panic);
            metrics.panics.fetch_add(1, Ordering::Relaxed);
            metrics.errors.fetch_add(1, Ordering::Relaxed);
            // Recovering before the 500 goes out: a client that reads
            // `/health` on its error sees the state the server is in.
            status.set(Phase::Recovering);
            let _ = out.send(Out::Failed(ApiError::server(format!(
                "the engine failed on this request ({what}); it is being reloaded"
            ))));
            // The run may hold half-written caches: dropped, never reused.
            let dropped = catch_unwind(AssertUnwindSafe(|| drop(served.take())));
            drop(dropped);
            served = open(&mut load, &status, &options);
        }
    }
}

/// Runs the loader (a panic in it counts as a failure), publishes what the
/// handlers need on the first success, and sets the phase.
pub(crate) fn open(load: &mut Loader, status: &Status, options: &ServeOptions) -> Option<Served> {
    let loaded = match catch_unwind(AssertUnwindSafe(&mut *load)) {
        Ok(r) => r,
        Err(panic) => Err(format!("loading panicked: {}", panic_message(&panic))),
    };
    let facts = loaded.and_then(|mut s| {
        if status.facts().is_none() {
            status.publish(facts(&s.run, options)?);
        }
        // A conversation's next turn prefills only its new tokens.
        s.run.set_prompt_cache(true);
        Ok(s)
    });
    match facts {
        Ok(s) => {
            status.set(Phase::Ready);
            Some(s)
        }
        Err(why) => {
            status.set(Phase::Failed(why));
            None
        }
    }
}

/// The handlers' view of a loaded run (with a tokenizer of their own: the
/// worker's is inside the run).
fn facts(run: &Run, options: &ServeOptions) -> Result<Facts, String> {
    let engine = run.engine();
    let file = arbor_gguf::GgufFile::open(engine.path()).map_err(|e| e.to_string())?;
    let tokenizer = arbor_engine::Tokenizer::from_gguf(file.header()).map_err(|e| e.to_string())?;
    let mut context = engine.model().config().context_length;
    if let Some(m) = engine.memory() {
        // The plan's context is shared by the slots.
        context = context.min(m.context / options.slots.max(1));
    }
    if let Some(d) = engine.draft() {
        context = context.min(d.config().context_length);
    }
    let model_id = options.model_id.clone().unwrap_or_else(|| {
        (engine.path().file_stem()).map_or("arbor".into(), |s| s.to_string_lossy().into_owned())
    });
    Ok(Facts {
        tokenizer: Arc::new(tokenizer),
        model_id,
        context,
        default_max_tokens: run.config().max_tokens,
        resident: engine.memory().map_or(0, |m| m.target_resident_bytes),
        vocab: engine.model().config().vocab_size,
        grammars: std::sync::OnceLock::new(),
    })
}

pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    (panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// What a generation gave: the generation, the objective's report, and
/// the strategy that ran.
pub(crate) struct Generated {
    pub g: arbor_engine::Generation,
    pub report: Option<SloReport>,
    pub strategy: String,
}

/// How one request's generation is run: with its options (the server's
/// with the request's sampling, limit and stop tokens), its control and
/// the text callback.
pub(crate) type Generate<'a> = dyn FnOnce(
        &GenerateOptions,
        arbor_engine::Control<'_>,
        &mut dyn FnMut(TextEvent<'_>),
    ) -> Result<Generated, ApiError>
    + 'a;

fn serve(
    run: &mut Run,
    job: Job,
    metrics: &Metrics,
    slo: Option<&SloTables>,
    tokenizer: Option<&arbor_engine::Tokenizer>,
) {
    let base = run.options().clone();
    let cached = run.cached_prefix(&job.prompt);
    let settings = job.settings.clone();
    let prompt = job.prompt.clone();
    let protected = job.protected.clone();
    let generate = move |options: &GenerateOptions,
                         control: arbor_engine::Control<'_>,
                         on: &mut dyn FnMut(TextEvent<'_>)| {
        // A request's own strategy, for this request only.
        let previous = run.strategy().clone();
        if let Some(name) = &settings.strategy
            && *name != previous.name()
            && let Err(e) = run.use_strategy(name, &mut |_| {})
        {
            return Err(ApiError::invalid_param(
                "arbor.strategy",
                format!("strategy `{name}`: {e}"),
            ));
        }
        // The request's options were built on the server's; they carry
        // the strategy now in use.
        let options = &GenerateOptions {
            strategy: run.strategy().clone(),
            ..options.clone()
        };
        let result = match (&settings.slo, slo) {
            (None, _) => (run.generate_controlled(&prompt, options, control, on))
                .map(|g| (g, None))
                .map_err(|e| ApiError::server(e.to_string())),
            (Some(_), None) => Err(ApiError::invalid_param(
                "arbor.slo",
                "this server's model is not elastic: latency objectives choose among an elastic \
                 model's levels (serve a file from `arbor elastic build`)",
            )),
            (Some((objective, on_miss)), Some(tables)) => {
                let prompt = SloPrompt {
                    tokens: prompt.clone(),
                    protected: protected.unwrap_or_else(|| protected_mask(&prompt, &[])),
                };
                let level = run.config().level.unwrap_or(1.0);
                let r = run.generate_slo(
                    &prompt,
                    (objective, *on_miss),
                    tables,
                    options,
                    control.cancel,
                    on,
                );
                // The next request runs at the server's own level.
                let _ = run.set_level(level);
                r.map(|(g, report)| (g, Some(report))).map_err(|e| match e {
                    EngineError::Slo(e @ SloError::Unmet { .. }) => ApiError {
                        code: Some("slo_unmet"),
                        ..ApiError::invalid_param("arbor.slo", e.to_string())
                    },
                    e => ApiError::server(e.to_string()),
                })
            }
        };
        let strategy = run.strategy().name();
        if *run.strategy() != previous {
            // Back to the server's strategy; it was in use before, so this
            // cannot fail for want of a draft or a plan.
            let _ = run.set_strategy(previous);
        }
        result.map(|(g, report)| Generated {
            g,
            report,
            strategy,
        })
    };
    answer(job, metrics, &base, cached, tokenizer, Box::new(generate));
}

/// Answers one request: checks it is still wanted, generates (sending
/// text as it is confirmed, cut at stop sequences), counts it and sends
/// how it finished.
pub(crate) fn answer(
    job: Job,
    metrics: &Metrics,
    base: &GenerateOptions,
    cached_tokens: usize,
    tokenizer: Option<&arbor_engine::Tokenizer>,
    generate: Box<Generate<'_>>,
) {
    let fail = |e: ApiError| {
        metrics.errors.fetch_add(1, Ordering::Relaxed);
        let _ = job.out.send(Out::Failed(e));
    };
    if job.cancel.load(Ordering::Relaxed) || job.out.is_closed() {
        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if job.clock.now() >= job.deadline {
        return fail(ApiError::timeout(job.timeout.as_secs_f64()));
    }
    let mut options = base.clone();
    options.max_tokens = job.max_tokens;
    options.sampling = job.settings.sampling;
    if let Some(stops) = &job.stop_tokens {
        options.stop_tokens = Some(stops.clone());
    }
    let mut stops = StopScanner::new(job.settings.stop.clone());
    let (mut timed_out, mut gone) = (false, false);
    let provisional = job.settings.provisional;
    let mut first: Option<Instant> = None;
    let mut sent_bytes = 0;
    let mut on = |event: TextEvent<'_>| {
        let sent = match event {
            TextEvent::Confirmed(text) => {
                if first.is_none() {
                    first = Some(Instant::now());
                    metrics.ttft.observe(job.arrived.elapsed().as_secs_f64());
                    if job.fault {
                        panic!("a test asked this generation to fail");
                    }
                }
                let text = stops.push(text);
                if stops.stopped() {
                    job.cancel.store(true, Ordering::Relaxed);
                }
                sent_bytes += text.len();
                text.is_empty() || job.out.send(Out::Text(text)).is_ok()
            }
            TextEvent::Provisional(text) if provisional => {
                job.out.send(Out::Provisional(text.to_string())).is_ok()
            }
            TextEvent::Rollback { chars } if provisional => {
                job.out.send(Out::Rollback(chars)).is_ok()
            }
            _ => true,
        };
        if !sent {
            gone = true;
            job.cancel.store(true, Ordering::Relaxed);
        }
        if job.clock.now() >= job.deadline {
            timed_out = true;
            job.cancel.store(true, Ordering::Relaxed);
        }
    };
    let grammar = (job.constraint.as_deref()).map(|g| g as &dyn arbor_engine::Constraint);
    let shaping = (job.shaping.as_deref()).map(|s| s as &dyn arbor_engine::Constraint);
    let both = grammar.zip(shaping).map(|(g, s)| arbor_engine::Both(s, g));
    let control = arbor_engine::Control {
        cancel: Some(&job.cancel),
        constraint: match &both {
            Some(b) => Some(b),
            None => grammar.or(shaping),
        },
        logprobs: job.settings.logprobs,
        ..Default::default()
    };
    let result = generate(&options, control, &mut on);
    let Generated {
        g,
        report,
        strategy,
    } = match result {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if let Some(r) = &report {
        metrics.slo_requests.fetch_add(1, Ordering::Relaxed);
        metrics
            .slo_met
            .fetch_add(u64::from(r.met()), Ordering::Relaxed);
    }
    metrics
        .prompt_tokens
        .fetch_add(job.prompt.len() as u64, Ordering::Relaxed);
    (metrics.generated_tokens).fetch_add(g.tokens.len() as u64, Ordering::Relaxed);
    let passes = g.stats.verifications + g.stats.target_steps;
    metrics.passes.fetch_add(passes as u64, Ordering::Relaxed);
    (metrics.streamed_bytes).fetch_add(g.stream.bytes, Ordering::Relaxed);
    *metrics.last.lock().unwrap_or_else(|e| e.into_inner()) =
        (g.stats.decode_tok_s(), g.stats.mean_accepted());
    if let Some(t) = first
        && g.tokens.len() > 1
    {
        let per = t.elapsed().as_secs_f64() / (g.tokens.len() - 1) as f64;
        metrics.tpot.observe(per);
    }
    if timed_out && !stops.stopped() {
        return fail(ApiError::timeout(job.timeout.as_secs_f64()));
    }
    let cancelled = g.stats.stop == StopReason::Cancelled && !stops.stopped();
    if gone || cancelled || job.out.is_closed() {
        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let rest = stops.finish();
    if !rest.is_empty() && !stops.stopped() {
        sent_bytes += rest.len();
        let _ = job.out.send(Out::Text(rest));
    }
    let scored = job.settings.logprobs.map(|_| {
        let mut scored = g.logprobs.clone();
        if stops.stopped()
            && let Some(t) = tokenizer
        {
            crate::scoring::delivered(t, &mut scored, sent_bytes);
        }
        scored
    });
    let reason = match (stops.stopped(), g.stats.stop) {
        (true, _) | (_, StopReason::StopToken) => "stop",
        _ => "length",
    };
    let _ = job.out.send(Out::Done(Finish {
        reason,
        prompt_tokens: job.prompt.len(),
        cached_tokens,
        completion_tokens: g.tokens.len(),
        tokens_per_pass: g.stats.mean_accepted(),
        decode_tok_s: g.stats.decode_tok_s(),
        strategy,
        seed: job.settings.sampling.seed,
        masked: job.constraint.as_ref().map(|g| g.spent()),
        slo: report.as_ref().map(slo_summary),
        scored,
    }));
}

/// A served objective as the response's `arbor.slo` reports it.
fn slo_summary(r: &SloReport) -> serde_json::Value {
    let (ttft, tpot) = r.fractions();
    serde_json::json!({
        "objective": {"ttft": r.slo.ttft, "tpot": r.slo.tpot},
        "model_level": r.choice.pair.model,
        "prompt_level": r.choice.pair.prompt,
        "prompt_tokens_kept": r.choice.kept,
        "predicted_met": r.choice.met,
        "ttft_fraction": ttft,
        "tpot_fraction": tpot,
        "met": r.met(),
        "report": r.line(),
    })
}

//! Serving several requests at once (`--slots N`, continuous batching).
//!
//! The worker thread owns the run. Each request it takes gets a free
//! slot and a thread of its own, where the ordinary decoding loop runs
//! against a [`SlotModel`] (its slot of the shared target) and the slot's
//! fork of the draft; the target's passes of every running request go
//! through the model together ([`Batch`]), so a streamed layer is read
//! once for all of them, and each request's tokens are the ones it would
//! get alone. A request joins at the next pass, not at the end of the
//! others. Each slot keeps its cache between requests: a request goes to
//! the free slot whose last conversation shares the longest start with it.
//!
//! Every request runs the server's strategy (preparing another while
//! others run would stall them), and latency objectives, which switch the
//! model's level per request, are served with one slot only.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;

use arbor_engine::slots::{Batch, Call, SlotKit, SlotModel, generate_in_slot};
use arbor_engine::{GenerateOptions, LanguageModel, Run, RunConfig};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::status::{Phase, Status};
use crate::worker::{Generated, Job, Out, answer, open, panic_message};
use crate::{Loader, ServeOptions};

/// The config planned for `slots` requests at once: `auto` plans passes
/// carrying every slot's rows, and under a budget the context of every
/// slot is planned.
pub fn for_slots(mut config: RunConfig, slots: usize) -> RunConfig {
    if slots > 1 && config.memory_budget.is_some() {
        config.context = Some(config.planned_context() * slots);
    }
    config.slots = Some(slots);
    config
}

enum Msg {
    Job(Box<Job>),
    Call(Call),
    /// A request ended on a slot: its kit comes back.
    Done(Box<Slot>),
    /// No more requests will come.
    Closed,
}

/// A slot between requests.
struct Slot {
    kit: SlotKit,
    target: SlotModel,
    /// The tokens whose keys and values the slot's cache holds.
    held: Vec<u32>,
}

fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Loads the run, gives its target `n` slots, then serves requests on
/// them until the queue closes.
pub(crate) fn run_slots(
    mut load: Loader,
    jobs: mpsc::Receiver<Job>,
    metrics: Arc<Metrics>,
    status: Arc<Status>,
    options: ServeOptions,
    n: usize,
) {
    let (tx, rx) = std_mpsc::channel::<Msg>();
    let forward = tx.clone();
    let mut jobs = jobs;
    let taker = std::thread::spawn(move || {
        while let Some(job) = jobs.blocking_recv() {
            if forward.send(Msg::Job(Box::new(job))).is_err() {
                return;
            }
        }
        let _ = forward.send(Msg::Closed);
    });
    let mut served = open(&mut load, &status, &options);
    let slots = served.as_mut().map(|s| start_slots(&mut s.run, n, &tx));
    let mut free = match slots {
        Some(Ok(slots)) => slots,
        Some(Err(why)) => {
            status.set(Phase::Failed(why));
            served = None;
            Vec::new()
        }
        None => Vec::new(),
    };
    let mut batch = Batch::default();
    let mut queue: VecDeque<Box<Job>> = VecDeque::new();
    let mut closed = false;
    while let Ok(msg) = rx.recv() {
        let Some(s) = served.as_mut() else {
            // Nothing loaded: every request is told why.
            if let Msg::Job(job) = msg {
                metrics.queued.fetch_sub(1, Ordering::Relaxed);
                let why = match status.phase() {
                    Phase::Failed(why) => why,
                    _ => "the model is not loaded".into(),
                };
                let _ = job.out.send(Out::Failed(ApiError::not_loaded(&why)));
                continue;
            }
            if matches!(msg, Msg::Closed) {
                break;
            }
            continue;
        };
        let target = s.run.engine_mut().model_mut();
        match msg {
            Msg::Job(job) => queue.push_back(job),
            Msg::Call(call) => batch.call(target, call),
            Msg::Done(slot) => {
                free.push(*slot);
                batch.ended(target);
            }
            Msg::Closed => closed = true,
        }
        while !free.is_empty()
            && let Some(job) = queue.pop_front()
        {
            // The free slot whose cache shares the longest start.
            let best = (0..free.len())
                .max_by_key(|&i| common(&free[i].held, &job.prompt))
                .expect("a free slot");
            let slot = free.swap_remove(best);
            metrics.queued.fetch_sub(1, Ordering::Relaxed);
            metrics
                .queue_wait
                .observe(job.arrived.elapsed().as_secs_f64());
            batch.started();
            metrics.busy.store(batch.running(), Ordering::Relaxed);
            let base = s.run.options().clone();
            let (metrics, tx) = (metrics.clone(), tx.clone());
            std::thread::spawn(move || {
                let slot = generate(*job, slot, &base, &metrics);
                let _ = tx.send(Msg::Done(Box::new(slot)));
            });
        }
        metrics.busy.store(batch.running(), Ordering::Relaxed);
        (metrics.batched_passes).store(batch.passes, Ordering::Relaxed);
        (metrics.batched_sequences).store(batch.sequences, Ordering::Relaxed);
        if closed && batch.running() == 0 && queue.is_empty() {
            break;
        }
    }
    drop(served);
    let _ = taker.join();
}

/// Opens `n` slots on the run: each with its kit and its view of the
/// target, whose calls come to this thread through `tx`.
fn start_slots(run: &mut Run, n: usize, tx: &std_mpsc::Sender<Msg>) -> Result<Vec<Slot>, String> {
    let kits = run.open_slots(n).map_err(|e| {
        format!("{n} slots: {e} (serve with --slots 1, or a strategy whose draft can be shared)")
    })?;
    let model = run.engine().model();
    let (config, backend) = (model.config().clone(), model.backend_name());
    Ok(kits
        .into_iter()
        .map(|kit| {
            let tx = tx.clone();
            let send = Box::new(move |c: Call| tx.send(Msg::Call(c)).is_ok());
            Slot {
                target: SlotModel::new(kit.slot, config.clone(), backend, send),
                kit,
                held: Vec::new(),
            }
        })
        .collect())
}

/// Serves one request on `slot` (on the slot's own thread) and gives the
/// slot back. A panicking generation fails its request with a 500 and
/// leaves the slot's cache unknown (the next request on it starts over).
fn generate(job: Job, mut slot: Slot, base: &GenerateOptions, metrics: &Metrics) -> Slot {
    let out = job.out.clone();
    let prompt = job.prompt.clone();
    let reuse = arbor_engine::reusable_prefix(&slot.held, &prompt, slot.target.cache_len());
    let server_strategy = base.strategy.name();
    let asked = job.settings.strategy.clone();
    let slo = job.settings.slo.is_some();
    let mut tokens = None;
    let tokenizer = slot.kit.tokenizer.clone();
    let result = catch_unwind(AssertUnwindSafe(|| {
        let generate = |options: &GenerateOptions,
                        control: arbor_engine::Control<'_>,
                        on: &mut dyn FnMut(arbor_engine::TextEvent<'_>)| {
            if let Some(name) = asked.filter(|n| *n != server_strategy) {
                return Err(ApiError::invalid_param(
                    "arbor.strategy",
                    format!(
                        "this server runs several requests at once, each with its strategy \
                         (`{server_strategy}`): `{name}` needs a server of its own (--slots 1)"
                    ),
                ));
            }
            if slo {
                return Err(ApiError::invalid_param(
                    "arbor.slo",
                    "latency objectives switch the model's level per request: they need a \
                     server with one slot (--slots 1)",
                ));
            }
            let control = arbor_engine::Control { reuse, ..control };
            let g = generate_in_slot(
                &mut slot.target,
                (slot.kit.draft.as_mut()).map(|d| d.as_mut() as &mut dyn LanguageModel),
                &tokenizer,
                &prompt,
                options,
                control,
                on,
            )
            .map_err(|e| ApiError::server(e.to_string()))?;
            tokens = Some(g.tokens.clone());
            Ok(Generated {
                g,
                report: None,
                strategy: server_strategy.clone(),
            })
        };
        answer(
            job,
            metrics,
            base,
            reuse,
            Some(&tokenizer),
            Box::new(generate),
        );
    }));
    slot.held = match (result, tokens) {
        (Ok(()), Some(t)) => {
            let mut held = [prompt.as_slice(), &t].concat();
            held.truncate(slot.target.cache_len());
            held
        }
        (Ok(()), None) => Vec::new(),
        (Err(panic), _) => {
            metrics.panics.fetch_add(1, Ordering::Relaxed);
            metrics.errors.fetch_add(1, Ordering::Relaxed);
            let _ = out.send(Out::Failed(ApiError::server(format!(
                "the engine failed on this request ({})",
                panic_message(&panic)
            ))));
            Vec::new()
        }
    };
    slot
}

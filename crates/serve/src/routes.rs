//! The HTTP face: OpenAI's endpoints plus `/health`, `/metrics` and
//! `/tokenize`. A generation request is checked and tokenized here, queued
//! for the worker, and answered from what the worker sends back: one JSON
//! body, or server-sent events in the chunk format the official clients
//! parse (one id throughout, the role in the first delta, a last chunk with
//! `finish_reason`, usage on request, then `[DONE]`).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use arbor_engine::{Run, Tokenizer};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State as Axum};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::api::{self, Settings};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::worker::{CancelOnDrop, Finish, Job, Out};
use crate::{Clock, ServeOptions};

/// What every handler shares.
pub(crate) struct State {
    jobs: mpsc::Sender<Job>,
    queue: usize,
    metrics: Arc<Metrics>,
    tokenizer: Arc<Tokenizer>,
    model_id: String,
    api_key: Option<String>,
    timeout: Duration,
    clock: Clock,
    /// Prompt plus new tokens one request may hold.
    context: usize,
    default_max_tokens: usize,
    resident: u64,
    started: u64,
    ids: AtomicU64,
}

impl State {
    pub(crate) fn new(
        run: &Run,
        options: &ServeOptions,
        jobs: mpsc::Sender<Job>,
        tokenizer: Arc<Tokenizer>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let engine = run.engine();
        let mut context = engine.model().config().context_length;
        if let Some(m) = engine.memory() {
            context = context.min(m.context);
        }
        if let Some(d) = engine.draft() {
            context = context.min(d.config().context_length);
        }
        let model_id = options.model_id.clone().unwrap_or_else(|| {
            (engine.path().file_stem()).map_or("arbor".into(), |s| s.to_string_lossy().into_owned())
        });
        Self {
            jobs,
            queue: options.queue,
            metrics,
            tokenizer,
            model_id,
            api_key: options.api_key.clone(),
            timeout: options.timeout,
            clock: options.clock.clone(),
            context,
            default_max_tokens: run.options().max_tokens,
            resident: engine.memory().map_or(0, |m| m.target_resident_bytes),
            started: unix_now(),
            ids: AtomicU64::new(0),
        }
    }
}

type Shared = Arc<State>;

pub(crate) fn router(state: State, body_limit: usize) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/tokenize", post(tokenize))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(Arc::new(state))
}

fn unix_now() -> u64 {
    (SystemTime::now().duration_since(SystemTime::UNIX_EPOCH)).map_or(0, |d| d.as_secs())
}

/// 401 unless the request carries the server's key (when it has one).
fn authorize(state: &State, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else {
        return Ok(());
    };
    let sent = (headers.get(header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match sent == Some(key.as_str()) {
        true => Ok(()),
        false => Err(ApiError::unauthorized()),
    }
}

/// The body, or the reason it could not be read (too large: 413).
fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let status = e.status();
        ApiError {
            status,
            ..ApiError::invalid(format!("the request body could not be read: {e}"))
        }
    })
}

async fn health(Axum(state): Axum<Shared>) -> Response {
    let m = &state.metrics;
    axum::Json(json!({
        "status": "ok",
        "queue": m.queued.load(Ordering::Relaxed),
        "busy": m.busy.load(Ordering::Relaxed) == 1,
    }))
    .into_response()
}

async fn metrics(Axum(state): Axum<Shared>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(state.resident),
    )
        .into_response()
}

fn model_object(state: &State) -> Value {
    json!({
        "id": state.model_id,
        "object": "model",
        "created": state.started,
        "owned_by": "arbor",
    })
}

async fn models(Axum(state): Axum<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    Ok(axum::Json(json!({"object": "list", "data": [model_object(&state)]})).into_response())
}

async fn model(
    Axum(state): Axum<Shared>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    // A percent-escape that decodes to invalid UTF-8 is the client's error,
    // answered in the API's JSON shape like every other.
    let Path(id) = id.map_err(|e| {
        ApiError::invalid_param(
            "model",
            format!("the model id in the path: {}", e.body_text()),
        )
    })?;
    check_model(&state, &id)?;
    Ok(axum::Json(model_object(&state)).into_response())
}

fn check_model(state: &State, id: &str) -> Result<(), ApiError> {
    match id == state.model_id {
        true => Ok(()),
        false => Err(ApiError::not_found(format!(
            "the model `{id}` does not exist: this server serves `{}`",
            state.model_id
        ))),
    }
}

/// Token ids of a prompt: raw text, or chat messages through the model's
/// template.
fn encode(state: &State, text: &str) -> Result<Vec<u32>, ApiError> {
    let ids = (state.tokenizer.encode(text))
        .map_err(|e| ApiError::invalid(format!("the prompt could not be tokenized: {e}")))?;
    match ids.is_empty() {
        true => Err(ApiError::invalid_param("prompt", "the prompt is empty")),
        false => Ok(ids),
    }
}

fn chat_text(state: &State, messages: &[api::Message]) -> Result<String, ApiError> {
    let messages = api::chat_messages(messages)?;
    (state.tokenizer.chat_prompt(&messages))
        .map_err(|e| ApiError::invalid_param("messages", format!("the chat template: {e}")))
}

async fn tokenize(
    Axum(state): Axum<Shared>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let request: api::TokenizeRequest = api::parse(&body(raw)?)?;
    let text = match (&request.content, &request.messages) {
        (Some(text), None) => text.clone(),
        (None, Some(messages)) => chat_text(&state, messages)?,
        _ => {
            return Err(ApiError::invalid(
                "give either `content` (text) or `messages` (a chat)",
            ));
        }
    };
    let tokens = (state.tokenizer.encode(&text))
        .map_err(|e| ApiError::invalid(format!("the text could not be tokenized: {e}")))?;
    Ok(axum::Json(json!({"count": tokens.len(), "tokens": tokens})).into_response())
}

/// Which endpoint a generation answers: their bodies differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

async fn chat(
    Axum(state): Axum<Shared>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let request: api::ChatRequest = api::parse(&body(raw)?)?;
    let settings = request.common.settings()?;
    check_model(&state, &request.common.model)?;
    let prompt = encode(&state, &chat_text(&state, &request.messages)?)?;
    let protected = match settings.slo {
        Some(_) => Some(template_tokens(&state, &request.messages, &prompt)?),
        None => None,
    };
    generate(state, Kind::Chat, prompt, protected, settings).await
}

async fn completions(
    Axum(state): Axum<Shared>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let request: api::CompletionRequest = api::parse(&body(raw)?)?;
    let mut settings = request.common.settings()?;
    check_model(&state, &request.common.model)?;
    // OpenAI's default for completions.
    settings.max_tokens = settings.max_tokens.or(Some(16));
    let prompt = encode(&state, &api::one_prompt(&request.prompt)?)?;
    // A raw prompt keeps its first and last token at every prompt level.
    let protected = settings
        .slo
        .map(|_| arbor_engine::slo::protected_mask(&prompt, &[]));
    generate(state, Kind::Text, prompt, protected, settings).await
}

/// Which tokens of a chat prompt its template wrote (and the system
/// turns): those it shares, before and after, with the same conversation
/// whose user and assistant turns are empty. No prompt level drops them.
fn template_tokens(
    state: &State,
    messages: &[api::Message],
    prompt: &[u32],
) -> Result<Vec<bool>, ApiError> {
    let mut empty = api::chat_messages(messages)?;
    for m in &mut empty {
        if m.role != arbor_engine::Role::System {
            m.content.clear();
        }
    }
    let text = (state.tokenizer.chat_prompt(&empty))
        .map_err(|e| ApiError::invalid_param("messages", format!("the chat template: {e}")))?;
    let ids = (state.tokenizer.encode(&text))
        .map_err(|e| ApiError::invalid(format!("the prompt could not be tokenized: {e}")))?;
    Ok(arbor_engine::slo::protected_mask(prompt, &ids))
}

/// Queues a checked request and answers it.
async fn generate(
    state: Shared,
    kind: Kind,
    prompt: Vec<u32>,
    protected: Option<Vec<bool>>,
    settings: Settings,
) -> Result<Response, ApiError> {
    let room = state.context.saturating_sub(prompt.len());
    let max_tokens = match settings.max_tokens {
        _ if room == 0 => 0,
        Some(n) => n,
        None => state.default_max_tokens.min(room),
    };
    if max_tokens == 0 || max_tokens > room {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid_param(
                "messages",
                format!(
                    "the prompt's {} tokens and {max_tokens} new ones exceed the context of {} \
                     tokens",
                    prompt.len(),
                    state.context
                ),
            )
        });
    }
    let cancel = Arc::new(AtomicBool::new(false));
    let guard = CancelOnDrop(cancel.clone());
    let (tx, rx) = mpsc::unbounded_channel();
    let deadline = state.clock.now() + state.timeout;
    let job = Job {
        prompt,
        protected,
        settings: settings.clone(),
        max_tokens,
        out: tx,
        cancel,
        deadline,
        timeout: state.timeout,
        clock: state.clock.clone(),
    };
    state.metrics.queued.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = state.jobs.try_send(job) {
        state.metrics.queued.fetch_sub(1, Ordering::Relaxed);
        return Err(match e {
            mpsc::error::TrySendError::Full(_) => {
                state.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                ApiError::busy(state.queue)
            }
            mpsc::error::TrySendError::Closed(_) => ApiError::unavailable(),
        });
    }
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let id = format!(
        "{}-{}-{}",
        if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        },
        state.started,
        state.ids.fetch_add(1, Ordering::Relaxed)
    );
    let reply = Reply {
        id,
        kind,
        model: state.model_id.clone(),
        created: unix_now(),
    };
    match settings.stream {
        true => Ok(stream(
            reply,
            rx,
            guard,
            deadline,
            settings.include_usage,
            state.timeout,
        )),
        false => whole(reply, rx, guard, deadline, state.timeout).await,
    }
}

/// What every response body of one request repeats.
struct Reply {
    id: String,
    kind: Kind,
    model: String,
    created: u64,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }

    fn usage(f: &Finish) -> Value {
        json!({
            "prompt_tokens": f.prompt_tokens,
            "completion_tokens": f.completion_tokens,
            "total_tokens": f.prompt_tokens + f.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": f.cached_tokens},
        })
    }

    /// arbor's own account of the generation.
    fn arbor(f: &Finish) -> Value {
        let mut v = json!({
            "strategy": f.strategy,
            "tokens_per_pass": f.tokens_per_pass,
            "decode_tokens_per_second": f.decode_tok_s,
        });
        if let Some(slo) = &f.slo {
            v["slo"] = slo.clone();
        }
        v
    }

    fn whole(&self, text: String, f: &Finish) -> Value {
        let choice = match self.kind {
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": f.reason,
                "logprobs": null,
            }),
            Kind::Text => json!({
                "index": 0,
                "text": text,
                "finish_reason": f.reason,
                "logprobs": null,
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": Self::usage(f),
            "arbor": Self::arbor(f),
        })
    }

    /// A chunk with one choice: `delta` text (and the role first, for
    /// chat), or the finish reason.
    fn chunk(&self, text: Option<&str>, first: bool, finish: Option<&str>) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null})
            }
            Kind::Text => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "finish_reason": finish,
                "logprobs": null,
            }),
        };
        self.frame(vec![choice])
    }

    fn frame(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

/// The next message from the worker, or a timeout error at the deadline
/// (with a grace second: the worker reports its own timeouts first).
async fn next(rx: &mut mpsc::UnboundedReceiver<Out>, deadline: Instant, timeout: Duration) -> Out {
    let until = tokio::time::Instant::from_std(deadline + Duration::from_secs(1));
    match tokio::time::timeout_at(until, rx.recv()).await {
        Ok(Some(out)) => out,
        Ok(None) => Out::Failed(ApiError::server("the generation ended without a result")),
        Err(_) => Out::Failed(ApiError::timeout(timeout.as_secs_f64())),
    }
}

async fn whole(
    reply: Reply,
    mut rx: mpsc::UnboundedReceiver<Out>,
    guard: CancelOnDrop,
    deadline: Instant,
    timeout: Duration,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    loop {
        match next(&mut rx, deadline, timeout).await {
            Out::Text(t) => text.push_str(&t),
            Out::Provisional(_) | Out::Rollback(_) => {}
            Out::Done(f) => {
                drop(guard);
                return Ok(axum::Json(reply.whole(text, &f)).into_response());
            }
            // Dropping the guard cancels the generation.
            Out::Failed(e) => return Err(e),
        }
    }
}

/// Server-sent events fed by a task that forwards the worker's messages;
/// the task (and with it the cancel guard) ends when the client leaves.
fn stream(
    reply: Reply,
    mut rx: mpsc::UnboundedReceiver<Out>,
    guard: CancelOnDrop,
    deadline: Instant,
    include_usage: bool,
    timeout: Duration,
) -> Response {
    let (tx, events) = mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let _guard = guard;
        let send = |v: Value| Event::default().data(v.to_string());
        let mut first = true;
        if reply.kind == Kind::Chat
            && tx
                .send(Ok(send(reply.chunk(None, true, None))))
                .await
                .is_err()
        {
            return;
        }
        first = first && reply.kind != Kind::Chat;
        loop {
            let out = tokio::select! {
                out = next(&mut rx, deadline, timeout) => out,
                _ = tx.closed() => return,
            };
            let (event, last) = match out {
                Out::Text(t) => {
                    let e = send(reply.chunk(Some(&t), first, None));
                    first = false;
                    (e, false)
                }
                Out::Provisional(t) => {
                    let mut v = reply.frame(vec![]);
                    v["arbor"] = json!({"provisional": t});
                    (send(v), false)
                }
                Out::Rollback(n) => {
                    let mut v = reply.frame(vec![]);
                    v["arbor"] = json!({"rollback": n});
                    (send(v), false)
                }
                Out::Done(f) => {
                    let mut end = reply.chunk(None, false, Some(f.reason));
                    end["arbor"] = Reply::arbor(&f);
                    if tx.send(Ok(send(end))).await.is_err() {
                        return;
                    }
                    if include_usage {
                        let mut usage = reply.frame(vec![]);
                        usage["usage"] = Reply::usage(&f);
                        if tx.send(Ok(send(usage))).await.is_err() {
                            return;
                        }
                    }
                    (Event::default().data("[DONE]"), true)
                }
                Out::Failed(e) => (send(e.body()), true),
            };
            if tx.send(Ok(event)).await.is_err() || last {
                return;
            }
        }
    });
    let body = Sse::new(tokio_stream::wrappers::ReceiverStream::new(events))
        .keep_alive(KeepAlive::default());
    (StatusCode::OK, body).into_response()
}

#[cfg(test)]
mod fuzz;

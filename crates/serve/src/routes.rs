//! The HTTP face: OpenAI's endpoints plus `/health`, `/metrics` and
//! `/tokenize`. A generation request is checked and tokenized here, queued
//! for the worker, and answered from what the worker sends back
//! ([`crate::respond`]). POST bodies must say they are JSON (a page on
//! another site cannot send one without the browser asking first, and no
//! CORS policy answers yes unless `--cors` names that site).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State as Axum};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;

use crate::api::{self, Settings};
use crate::error::ApiError;
use crate::fields::Endpoint;
use crate::metrics::Metrics;
use crate::respond::{self, Kind, Reply};
use crate::status::{Facts, Phase, Status};
use crate::tools::ToolRequest;
use crate::worker::{CancelOnDrop, Job};
use crate::{ServeError, ServeOptions};

/// What every handler shares.
pub(crate) struct State {
    pub(crate) jobs: mpsc::Sender<Job>,
    pub(crate) options: ServeOptions,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) status: Arc<Status>,
    pub(crate) started: u64,
    pub(crate) ids: AtomicU64,
}

type Shared = Arc<State>;

pub(crate) fn router(
    options: &ServeOptions,
    jobs: mpsc::Sender<Job>,
    metrics: Arc<Metrics>,
    status: Arc<Status>,
) -> Result<Router, ServeError> {
    let cors = match &options.cors {
        None => None,
        Some(origin) => {
            let origin = HeaderValue::from_str(origin)
                .map_err(|_| ServeError::Invalid(format!("--cors `{origin}` is not an origin")))?;
            Some(
                tower_http::cors::CorsLayer::new()
                    .allow_origin(origin)
                    .allow_methods([Method::GET, Method::POST])
                    .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE]),
            )
        }
    };
    let state = State {
        jobs,
        options: options.clone(),
        metrics,
        status,
        started: unix_now(),
        ids: AtomicU64::new(0),
    };
    let router = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/tokenize", post(tokenize))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/infill", post(infill::infill))
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(DefaultBodyLimit::max(options.body_limit))
        .with_state(Arc::new(state));
    Ok(match cors {
        Some(layer) => router.layer(layer),
        None => router,
    })
}

fn unix_now() -> u64 {
    (SystemTime::now().duration_since(SystemTime::UNIX_EPOCH)).map_or(0, |d| d.as_secs())
}

/// The loaded model's facts, or 503 while there is none.
fn ready(state: &State) -> Result<&Facts, ApiError> {
    match (state.status.facts(), state.status.phase()) {
        (_, Phase::Failed(why)) => Err(ApiError::not_loaded(&why)),
        (Some(f), _) => Ok(f),
        (None, _) => Err(ApiError::not_loaded("it is loading")),
    }
}

/// 401 unless the request carries the server's key (when it has one),
/// compared in constant time.
fn authorize(state: &State, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.options.api_key else {
        return Ok(());
    };
    let sent = (headers.get(header::AUTHORIZATION))
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or_default();
    match bool::from(sent.ct_eq(key.as_bytes())) {
        true => Ok(()),
        false => Err(ApiError::unauthorized()),
    }
}

/// The body of a POST, which must be JSON (415 otherwise), or the reason
/// it could not be read (too large: 413).
fn body(headers: &HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("?"));
    let json = content_type.is_some_and(|c| {
        let essence = c.split(';').next().unwrap_or("").trim();
        essence.eq_ignore_ascii_case("application/json")
    });
    if !json {
        return Err(ApiError::not_json(content_type));
    }
    body.map_err(|e| {
        let status = e.status();
        ApiError {
            status,
            ..ApiError::invalid(format!("the request body could not be read: {e}"))
        }
    })
}

/// 200 with `ok` when the model serves; 503 with `loading`, `recovering`
/// (after a panic) or `failed` (and why) otherwise.
async fn health(Axum(state): Axum<Shared>) -> Response {
    let m = &state.metrics;
    let phase = state.status.phase();
    let mut body = json!({
        "status": phase.name(),
        "queue": m.queued.load(Ordering::Relaxed),
        "busy": m.busy.load(Ordering::Relaxed) > 0,
    });
    if let Phase::Failed(why) = &phase {
        body["error"] = why.as_str().into();
    }
    let code = match phase {
        Phase::Ready => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    (code, axum::Json(body)).into_response()
}

async fn metrics_text(Axum(state): Axum<Shared>) -> Response {
    let resident = state.status.facts().map_or(0, |f| f.resident);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(resident),
    )
        .into_response()
}

/// The model object; `max_model_len` is the context one request may fill
/// (prompt plus new tokens), as vLLM reports it.
fn model_object(state: &State, facts: &Facts) -> Value {
    json!({
        "id": facts.model_id,
        "object": "model",
        "created": state.started,
        "owned_by": "arbor",
        "max_model_len": facts.context,
    })
}

async fn models(Axum(state): Axum<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let facts = ready(&state)?;
    let list = json!({"object": "list", "data": [model_object(&state, facts)]});
    Ok(axum::Json(list).into_response())
}

async fn model(
    Axum(state): Axum<Shared>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let facts = ready(&state)?;
    // A percent-escape that decodes to invalid UTF-8 is the client's error,
    // answered in the API's JSON shape like every other.
    let Path(id) = id.map_err(|e| {
        ApiError::invalid_param(
            "model",
            format!("the model id in the path: {}", e.body_text()),
        )
    })?;
    check_model(facts, &id)?;
    Ok(axum::Json(model_object(&state, facts)).into_response())
}

fn check_model(facts: &Facts, id: &str) -> Result<(), ApiError> {
    match id == facts.model_id {
        true => Ok(()),
        false => Err(ApiError::not_found(format!(
            "the model `{id}` does not exist: this server serves `{}`",
            facts.model_id
        ))),
    }
}

/// Token ids of a raw-text prompt (special-token text in it is special:
/// its writer wrote the whole prompt).
fn encode(facts: &Facts, text: &str) -> Result<Vec<u32>, ApiError> {
    let ids = (facts.tokenizer.encode(text))
        .map_err(|e| ApiError::invalid(format!("the prompt could not be tokenized: {e}")))?;
    match ids.is_empty() {
        true => Err(ApiError::invalid_param("prompt", "the prompt is empty")),
        false => Ok(ids),
    }
}

/// Token ids of a chat through the model's template, with the tools it may
/// call and the start its answer is made to have. Special-token text in a
/// message is encoded as text unless the server opted in.
fn encode_chat(
    state: &State,
    facts: &Facts,
    messages: &[api::Message],
    tools: &ToolRequest,
) -> Result<Vec<u32>, ApiError> {
    let messages = api::chat_messages(messages)?;
    let tokenizer = &facts.tokenizer;
    let defined = &tools.tools;
    let ids = match state.options.special_tokens_in_content {
        true => tokenizer
            .chat_prompt_with_tools(&messages, defined)
            .and_then(|text| tokenizer.encode(&text)),
        false => tokenizer.encode_chat_with_tools(&messages, defined),
    };
    let mut ids = ids.map_err(|e| ApiError::invalid_param("messages", format!("the chat: {e}")))?;
    if let Some(prefix) = tools.prefix.as_deref().filter(|p| !p.is_empty()) {
        let start = (tokenizer.encode(prefix))
            .map_err(|e| ApiError::server(format!("the tool call's start: {e}")))?;
        let bos = usize::from(tokenizer.adds_bos());
        ids.extend_from_slice(&start[bos.min(start.len())..]);
    }
    match ids.is_empty() {
        true => Err(ApiError::invalid_param("messages", "the prompt is empty")),
        false => Ok(ids),
    }
}

async fn tokenize(
    Axum(state): Axum<Shared>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let request: api::TokenizeRequest = api::parse(&body(&headers, raw)?)?;
    let facts = ready(&state)?;
    let tokens = match (&request.content, &request.messages) {
        (Some(text), None) => (facts.tokenizer.encode(text))
            .map_err(|e| ApiError::invalid(format!("the text could not be tokenized: {e}")))?,
        (None, Some(messages)) => encode_chat(&state, facts, messages, &ToolRequest::default())?,
        _ => {
            return Err(ApiError::invalid(
                "give either `content` (text) or `messages` (a chat)",
            ));
        }
    };
    Ok(axum::Json(json!({"count": tokens.len(), "tokens": tokens})).into_response())
}

/// Tests only: whether the body asks for an injected fault.
fn fault(state: &State, raw: &[u8]) -> bool {
    (state.options.fault_trigger.as_deref())
        .is_some_and(|t| raw.windows(t.len().max(1)).any(|w| w == t.as_bytes()))
}

async fn chat(
    Axum(state): Axum<Shared>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    authorize(&state, &headers)?;
    let raw = body(&headers, raw)?;
    let request: api::ChatRequest = api::parse_generation(&raw, Endpoint::Chat)?;
    let settings = request.common.settings(Endpoint::Chat)?;
    let facts = ready(&state)?;
    check_model(facts, &request.common.model)?;
    let tools = crate::tools::request(request.tools.as_deref(), request.tool_choice.as_ref())?;
    let prompt = encode_chat(&state, facts, &request.messages, &tools)?;
    let protected = match settings.slo {
        Some(_) => Some(template_tokens(facts, &request.messages, &prompt)?),
        None => None,
    };
    let constraint =
        crate::structured::constraint(facts, request.response_format.as_ref(), &tools)?;
    if constraint.is_some() && settings.slo.is_some() {
        return Err(ApiError::invalid_param(
            "arbor.slo",
            "latency objectives and structured output (or forced tool calls) do not combine yet",
        ));
    }
    let checked = Checked {
        kind: Kind::Chat,
        prompt,
        protected,
        fault: fault(&state, &raw),
        settings,
        arrived,
        tools: tools.prefix,
        constraint,
        stop_tokens: None,
    };
    generate(state.clone(), checked).await
}

async fn completions(
    Axum(state): Axum<Shared>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    authorize(&state, &headers)?;
    let raw = body(&headers, raw)?;
    let request: api::CompletionRequest = api::parse_generation(&raw, Endpoint::Completion)?;
    let mut settings = request.common.settings(Endpoint::Completion)?;
    let facts = ready(&state)?;
    check_model(facts, &request.common.model)?;
    // OpenAI's default for completions.
    settings.max_tokens = settings.max_tokens.or(Some(16));
    let text = api::one_prompt(&request.prompt)?;
    // With a suffix the answer goes between the two: fill-in-the-middle.
    let (prompt, stop_tokens) = match request.suffix.as_deref().filter(|s| !s.is_empty()) {
        None => (encode(facts, &text)?, None),
        Some(suffix) => {
            let (ids, stops) = infill::encode(facts, &text, suffix, None, &[], "")?;
            (ids, Some(stops))
        }
    };
    // A raw prompt keeps its first and last token at every prompt level.
    let protected = settings
        .slo
        .map(|_| arbor_engine::slo::protected_mask(&prompt, &[]));
    let checked = Checked {
        kind: Kind::Text,
        prompt,
        protected,
        fault: fault(&state, &raw),
        settings,
        arrived,
        tools: None,
        constraint: None,
        stop_tokens,
    };
    generate(state.clone(), checked).await
}

/// Which tokens of a chat prompt its template wrote (and the system
/// turns): those it shares, before and after, with the same conversation
/// whose user and assistant turns are empty. No prompt level drops them.
fn template_tokens(
    facts: &Facts,
    messages: &[api::Message],
    prompt: &[u32],
) -> Result<Vec<bool>, ApiError> {
    let mut empty = api::chat_messages(messages)?;
    for m in &mut empty {
        if m.role != arbor_engine::Role::System {
            m.content.clear();
        }
    }
    let ids = (facts.tokenizer.encode_chat(&empty))
        .map_err(|e| ApiError::invalid_param("messages", format!("the chat: {e}")))?;
    Ok(arbor_engine::slo::protected_mask(prompt, &ids))
}

/// A checked request, ready to queue.
struct Checked {
    kind: Kind,
    prompt: Vec<u32>,
    /// With an objective: prompt tokens no prompt level drops.
    protected: Option<Vec<bool>>,
    settings: Settings,
    arrived: Instant,
    /// Tests only: make the generation panic.
    fault: bool,
    /// With tools: the start the answer was given.
    tools: Option<String>,
    /// The rule the answer must follow.
    constraint: Option<Arc<arbor_grammar::Grammar>>,
    /// Tokens that end the answer instead of the model's end tokens.
    stop_tokens: Option<Vec<u32>>,
}

/// Queues a checked request and answers it.
async fn generate(state: Shared, checked: Checked) -> Result<Response, ApiError> {
    let Checked {
        kind,
        prompt,
        protected,
        settings,
        arrived,
        fault,
        tools,
        constraint,
        stop_tokens,
    } = checked;
    let facts = ready(&state)?;
    let shaping = settings.shape.rule(facts.vocab)?;
    if settings.slo.is_some() && (shaping.is_some() || settings.logprobs.is_some()) {
        return Err(ApiError::invalid_param(
            "arbor.slo",
            "latency objectives do not combine with logprobs, penalties or logit_bias yet",
        ));
    }
    let room = facts.context.saturating_sub(prompt.len());
    let max_tokens = match settings.max_tokens {
        _ if room == 0 => 0,
        Some(n) => n,
        None => facts.default_max_tokens.map_or(room, |d| d.min(room)),
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
                    facts.context
                ),
            )
        });
    }
    let timeout = state.options.timeout;
    let clock = state.options.clock.clone();
    let cancel = Arc::new(AtomicBool::new(false));
    let guard = CancelOnDrop(cancel.clone());
    let (tx, rx) = mpsc::unbounded_channel();
    let deadline = clock.now() + timeout;
    let job = Job {
        prompt,
        protected,
        settings: settings.clone(),
        max_tokens,
        out: tx,
        cancel,
        deadline,
        timeout,
        clock,
        arrived,
        fault,
        constraint,
        shaping,
        stop_tokens,
    };
    state.metrics.queued.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = state.jobs.try_send(job) {
        state.metrics.queued.fetch_sub(1, Ordering::Relaxed);
        return Err(match e {
            mpsc::error::TrySendError::Full(_) => {
                state.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                ApiError::busy(state.options.queue)
            }
            mpsc::error::TrySendError::Closed(_) => ApiError::unavailable(),
        });
    }
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Text => "cmpl",
        Kind::Infill => "infill",
    };
    let n = state.ids.fetch_add(1, Ordering::Relaxed);
    let reply = Reply {
        id: format!("{prefix}-{}-{n}", state.started),
        kind,
        model: facts.model_id.clone(),
        created: unix_now(),
        tools,
        scores: settings.logprobs.map(|_| facts.tokenizer.clone()),
    };
    match settings.stream {
        true => Ok(respond::stream(
            reply,
            rx,
            guard,
            deadline,
            settings.include_usage,
            timeout,
        )),
        false => respond::whole(reply, rx, guard, deadline, timeout).await,
    }
}

mod infill;

#[cfg(test)]
mod fuzz;

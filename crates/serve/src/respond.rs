//! Answering a queued request from what the worker sends back: one JSON
//! body, or server-sent events in the chunk format the official clients
//! parse (one id throughout, the role in the first delta, a last chunk with
//! `finish_reason`, usage on request, then `[DONE]`).

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::tools::{Call, Calls};
use crate::worker::{CancelOnDrop, Finish, Out};

/// Which endpoint a generation answers: their bodies differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    Text,
    /// llama-server's `/infill`: `content` and `stop`, no `choices`.
    Infill,
}

/// What every response body of one request repeats.
pub(crate) struct Reply {
    pub id: String,
    pub kind: Kind,
    pub model: String,
    pub created: u64,
    /// With tools: what the answer was made to start with (it is read for
    /// calls, [`Calls`]).
    pub tools: Option<String>,
    /// With `logprobs`: the tokenizer that names the scored tokens.
    pub scores: Option<std::sync::Arc<arbor_engine::Tokenizer>>,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text | Kind::Infill, _) => "text_completion",
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
            "seed": f.seed,
        });
        if let Some(slo) = &f.slo {
            v["slo"] = slo.clone();
        }
        if let Some((rows, secs)) = f.masked {
            v["constraint"] = json!({"masked_rows": rows, "mask_seconds": secs});
        }
        v
    }

    /// The `logprobs` of a choice: `null` unless the request asked.
    fn logprobs(&self, f: &Finish) -> Value {
        match (&self.scores, &f.scored, self.kind) {
            (Some(t), Some(s), Kind::Chat) => crate::scoring::chat(t, s),
            (Some(t), Some(s), Kind::Text | Kind::Infill) => crate::scoring::completion(t, s, 0),
            _ => Value::Null,
        }
    }

    /// The reader of calls for this request's answer, if it has tools.
    fn calls(&self) -> Option<Calls> {
        self.tools.as_deref().map(Calls::new)
    }

    fn whole(&self, text: String, f: &Finish) -> Value {
        let (text, calls) = match self.calls() {
            None => (text, vec![]),
            Some(mut reader) => {
                let mut content = reader.push(&text);
                let (calls, rest) = reader.finish();
                content.push_str(&rest);
                (content, calls)
            }
        };
        if self.kind == Kind::Infill {
            return self.infill_end(Some(text), f);
        }
        let mut choice = match self.kind {
            Kind::Chat if !calls.is_empty() => json!({
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": if text.is_empty() { Value::Null } else { text.into() },
                    "tool_calls": calls.iter().map(|c| c.json(None)).collect::<Vec<_>>(),
                },
                "finish_reason": "tool_calls",
                "logprobs": null,
            }),
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": f.reason,
                "logprobs": null,
            }),
            Kind::Text | Kind::Infill => json!({
                "index": 0,
                "text": text,
                "finish_reason": f.reason,
                "logprobs": null,
            }),
        };
        choice["logprobs"] = self.logprobs(f);
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

    /// An infill's whole answer, or (without text) its last event.
    fn infill_end(&self, text: Option<String>, f: &Finish) -> Value {
        let mut v = json!({
            "content": text.unwrap_or_default(),
            "stop": true,
            "model": self.model,
            "tokens_predicted": f.completion_tokens,
            "tokens_evaluated": f.prompt_tokens,
            "tokens_cached": f.cached_tokens,
            "stop_type": if f.reason == "length" { "limit" } else { "eos" },
            "arbor": Self::arbor(f),
        });
        if self.scores.is_some() {
            v["logprobs"] = self.logprobs(f);
        }
        v
    }

    /// A chunk with one choice: `delta` text (and the role first, for
    /// chat), or the finish reason.
    fn chunk(&self, text: Option<&str>, first: bool, finish: Option<&str>) -> Value {
        let choice = match self.kind {
            Kind::Infill => return json!({"content": text.unwrap_or(""), "stop": false}),
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

    /// A chunk whose delta holds whole calls.
    fn calls_chunk(&self, calls: &[Call]) -> Value {
        let calls: Vec<Value> = (calls.iter().enumerate())
            .map(|(i, c)| c.json(Some(i)))
            .collect();
        let delta = json!({"tool_calls": calls});
        self.frame(vec![
            json!({"index": 0, "delta": delta, "finish_reason": null, "logprobs": null}),
        ])
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

pub(crate) async fn whole(
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
pub(crate) fn stream(
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
        let mut calls = reply.calls();
        loop {
            let out = tokio::select! {
                out = next(&mut rx, deadline, timeout) => out,
                _ = tx.closed() => return,
            };
            let (event, last) = match out {
                Out::Text(t) => {
                    let t = match &mut calls {
                        Some(reader) => reader.push(&t),
                        None => t,
                    };
                    if t.is_empty() {
                        continue;
                    }
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
                Out::Done(f) if reply.kind == Kind::Infill => {
                    // llama-server's streams end with `stop: true`, no [DONE].
                    let _ = tx.send(Ok(send(reply.infill_end(None, &f)))).await;
                    return;
                }
                Out::Done(f) => {
                    let mut reason = f.reason;
                    if let Some(reader) = calls.take() {
                        let (found, rest) = reader.finish();
                        let mut parts = vec![];
                        if !rest.is_empty() {
                            parts.push(reply.chunk(Some(&rest), first, None));
                        }
                        if !found.is_empty() {
                            parts.push(reply.calls_chunk(&found));
                            reason = "tool_calls";
                        }
                        for part in parts {
                            if tx.send(Ok(send(part))).await.is_err() {
                                return;
                            }
                        }
                    }
                    // Scores go in one chunk of their own before the end
                    // (a client joins every chunk's `logprobs.content`).
                    if reply.scores.is_some() {
                        let mut part = reply.chunk(None, false, None);
                        part["choices"][0]["logprobs"] = reply.logprobs(&f);
                        if tx.send(Ok(send(part))).await.is_err() {
                            return;
                        }
                    }
                    let mut end = reply.chunk(None, false, Some(reason));
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

//! The request parser fuzzed: method, path, headers and body through the
//! real router in-process (no socket, no model: a byte-vocabulary
//! tokenizer, and a stand-in worker that answers every job at once).
//! Inputs are the committed seeds (`fuzz/seeds/serve_request`), every input
//! that ever failed (`fuzz/regressions/serve_request`), requests generated
//! from the API's fields and byte-level mutations of all of these.
//!
//! Whatever arrives, the answer is one of the statuses the API documents,
//! never a 500; an error has OpenAI's JSON error body; a job reaching the
//! worker has a non-empty prompt that fits the context with its new tokens;
//! a success has the worker's text in the shape its endpoint promises.
//!
//! An input is an HTTP request in text: `METHOD PATH`, header lines
//! `name: value`, an empty line, then the body (any bytes).

use std::sync::Arc;
use std::time::Duration;

use arbor_engine::Tokenizer;
use arbor_fuzz::{Fuzzer, Rng, outcome, repo_path};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::Value;
use tokio::sync::mpsc;
use tower::ServiceExt;

use super::router;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::status::{Facts, Phase, Status};
use crate::worker::{Finish, Job, Out};
use crate::{ServeOptions, api};

const KEY: &str = "sk-fuzz";
const MODEL: &str = "tiny";
/// Small, so that long prompts hit the context limit.
const CONTEXT: usize = 96;
const BODY_LIMIT: usize = 4096;
/// What the stand-in worker generates for every job.
const REPLY: &str = "ok";

fn tokenizer() -> Tokenizer {
    let mut w = arbor_gguf::GgufWriter::new();
    arbor_model::testing::add_byte_tokenizer(&mut w, Some(256));
    let header = arbor_gguf::parse_header(&w.to_bytes()).expect("header");
    Tokenizer::from_gguf(&header).expect("byte tokenizer")
}

/// Answers jobs at once; a job that breaks what the handlers promise the
/// worker fails with a 500 naming the broken promise.
async fn stand_in_worker(mut jobs: mpsc::Receiver<Job>) {
    while let Some(job) = jobs.recv().await {
        let broken = if job.prompt.is_empty() {
            Some("an empty prompt")
        } else if job.max_tokens == 0 || job.prompt.len() + job.max_tokens > CONTEXT {
            Some("a prompt and new tokens past the context")
        } else if job
            .protected
            .as_ref()
            .is_some_and(|p| p.len() != job.prompt.len())
        {
            Some("a protected mask of another length than the prompt")
        } else {
            None
        };
        if let Some(what) = broken {
            let _ = job
                .out
                .send(Out::Failed(ApiError::server(format!("job with {what}"))));
            continue;
        }
        let _ = job.out.send(Out::Text(REPLY.into()));
        let _ = job.out.send(Out::Done(Finish {
            reason: "length",
            prompt_tokens: job.prompt.len(),
            cached_tokens: 0,
            completion_tokens: 1,
            tokens_per_pass: 1.0,
            decode_tok_s: 1.0,
            strategy: "autoregressive".into(),
            seed: 0,
            masked: None,
            slo: None,
            scored: None,
        }));
    }
}

/// The router over a state without a model, and a runtime with the
/// stand-in worker.
fn app() -> (axum::Router, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (jobs, queue) = mpsc::channel(4);
    runtime.spawn(stand_in_worker(queue));
    let options = ServeOptions {
        api_key: Some(KEY.into()),
        timeout: Duration::from_secs(600),
        body_limit: BODY_LIMIT,
        ..ServeOptions::default()
    };
    let status = Arc::new(Status::default());
    status.publish(Facts {
        tokenizer: Arc::new(tokenizer()),
        model_id: MODEL.into(),
        context: CONTEXT,
        default_max_tokens: Some(16),
        resident: 0,
        vocab: 256,
        grammars: std::sync::OnceLock::new(),
    });
    status.set(Phase::Ready);
    let metrics = Arc::new(Metrics::default());
    let app = router(&options, jobs, metrics, status).expect("router");
    (app, runtime)
}

/// The request an input describes, or `None` when `http` cannot represent
/// it (then no server could receive it either).
fn request(input: &[u8]) -> Option<Request<Body>> {
    let split = input.windows(2).position(|w| w == b"\n\n");
    let (head, body) = match split {
        Some(i) => (&input[..i], &input[i + 2..]),
        None => (input, &[][..]),
    };
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.split('\n');
    let (method, path) = lines.next()?.split_once(' ')?;
    let mut builder = Request::builder().method(method).uri(path);
    for line in lines {
        let (name, value) = line.split_once(':')?;
        builder = builder.header(name, value.trim_start());
    }
    builder.body(Body::from(body.to_vec())).ok()
}

/// Sends one request; checks the answer; returns its outcome.
fn check(app: &axum::Router, runtime: &tokio::runtime::Runtime, input: &[u8]) -> u64 {
    let Some(req) = request(input) else {
        return outcome("unrepresentable");
    };
    let path = req.uri().path().to_string();
    let authorized = req.headers().get("authorization").map(|v| v.as_bytes())
        == Some(format!("Bearer {KEY}").as_bytes());
    let (status, body) = runtime.block_on(async {
        let response = app.clone().oneshot(req).await.expect("infallible");
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await;
        (status, body.expect("a response body is read whole"))
    });
    let text = String::from_utf8_lossy(&body);
    assert!(
        [200, 400, 401, 404, 405, 413, 415, 429, 503].contains(&status.as_u16()),
        "status {status} for {path}: {text}"
    );
    if status == StatusCode::METHOD_NOT_ALLOWED {
        return outcome((405, path.len().min(32)));
    }
    if status != StatusCode::OK {
        let v: Value = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("a {status} body is not JSON ({e}): {text}"));
        let error = &v["error"];
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{text}"
        );
        assert!(error["type"].is_string(), "{text}");
        return outcome((
            status.as_u16(),
            error["param"].as_str().map(String::from),
            error["code"].as_str().map(String::from),
        ));
    }
    let endpoint = path.trim_end_matches('/');
    let generates = ["/v1/chat/completions", "/v1/completions"].contains(&endpoint);
    if generates || endpoint.starts_with("/v1/models") || endpoint == "/tokenize" {
        assert!(authorized, "{path} answered 200 without the key: {text}");
    }
    if generates {
        check_generation(endpoint, &text);
    }
    outcome((200, path))
}

/// A 200 from a generating endpoint carries the worker's text.
fn check_generation(endpoint: &str, text: &str) {
    if text.starts_with("data: ") {
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert!(text.contains(&format!("\"{REPLY}\"")), "{text}");
        return;
    }
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let choice = &v["choices"][0];
    let got = match endpoint {
        "/v1/chat/completions" => &choice["message"]["content"],
        _ => &choice["text"],
    };
    assert_eq!(got.as_str(), Some(REPLY), "{text}");
    assert_eq!(v["model"].as_str(), Some(MODEL), "{text}");
}

#[test]
fn fuzz_serve_request() {
    let (app, runtime) = app();
    let report = Fuzzer::new("serve_request")
        .seeds_from(repo_path("fuzz/seeds/serve_request"))
        .regressions_from(repo_path("fuzz/regressions/serve_request"))
        .dictionary(DICTIONARY)
        .max_len(8 << 10)
        .execs(1500)
        .generator(generate)
        .run(|input| check(&app, &runtime, input));
    assert!(report.outcomes > 20, "{report}");
}

/// The API's keys, JSON syntax and HTTP words.
const DICTIONARY: &[&str] = &[
    "\"model\":",
    "\"messages\":",
    "\"role\":",
    "\"content\":",
    "\"prompt\":",
    "\"max_tokens\":",
    "\"max_completion_tokens\":",
    "\"temperature\":",
    "\"top_p\":",
    "\"seed\":",
    "\"top_k\":",
    "\"min_p\":",
    "\"tools\":",
    "\"response_format\":",
    "content-type: text/plain",
    "\"stop\":",
    "\"stream\":",
    "\"stream_options\":",
    "{\"include_usage\":true}",
    "\"n\":",
    "\"arbor\":",
    "{\"slo\":{\"ttft\":0.5}}",
    "\"strategy\":",
    "\"provisional\":",
    "\"type\":\"text\"",
    "\"text\":",
    "\"system\"",
    "\"user\"",
    "\"assistant\"",
    "\"tiny\"",
    "null",
    "true",
    "false",
    "[]",
    "{}",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "\"",
    "\\u0000",
    "\\ud800",
    "POST ",
    "GET ",
    "/v1/chat/completions",
    "/v1/completions",
    "/tokenize",
    "/v1/models/",
    "authorization: ",
    "Bearer sk-fuzz",
    "content-type: application/json",
    "\n\n",
];

// ---- generation -------------------------------------------------------------

/// A request built from the API's fields, most of them well-formed.
fn generate(rng: &mut Rng) -> Vec<u8> {
    let (method, path) = *rng.pick(&[
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/tokenize"),
        ("GET", "/v1/models"),
        ("GET", "/v1/models/tiny"),
        ("GET", "/health"),
        ("GET", "/v1/chat/completions"),
    ]);
    let mut out = format!("{method} {path}\n");
    if !rng.one_in(6) {
        out.push_str(one(
            rng,
            &[
                "authorization: Bearer sk-fuzz\n",
                "authorization: Bearer sk-fuzz\n",
                "authorization: Bearer wrong\n",
                "authorization: sk-fuzz\n",
            ],
        ));
    }
    if rng.one_in(2) {
        out.push_str("content-type: application/json\n");
    }
    out.push('\n');
    // Raw JSON text per field, so numbers serde_json would not write
    // (`1e309`, `18446744073709551616`) can be sent.
    let mut body: Vec<(&str, String)> = Vec::new();
    if !rng.one_in(8) {
        body.push(("model", one(rng, &["\"tiny\"", "\"other\"", "1"]).into()));
    }
    match path {
        "/v1/completions" => body.push(("prompt", prompt(rng).to_string())),
        "/tokenize" if rng.one_in(2) => {
            body.push(("content", Value::String(text(rng)).to_string()));
        }
        _ => body.push(("messages", messages(rng).to_string())),
    }
    for _ in 0..rng.small(4) {
        let (key, values) = *rng.pick(FIELDS);
        body.push((key, values[rng.below(values.len())].into()));
    }
    let fields: Vec<String> = body.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    out.push('{');
    out.push_str(&fields.join(","));
    out.push('}');
    out.into_bytes()
}

/// Optional fields and values to try, valid and not.
const FIELDS: &[(&str, &[&str])] = &[
    (
        "max_tokens",
        &["1", "16", "0", "-1", "100000", "1.5", "\"8\""],
    ),
    ("max_completion_tokens", &["2", "0", "9223372036854775807"]),
    (
        "temperature",
        &["0", "0.7", "2", "2.0001", "-0.1", "1e309", "null"],
    ),
    ("top_p", &["1", "0.5", "0", "1.01"]),
    ("seed", &["0", "-5", "18446744073709551615"]),
    (
        "stop",
        &[
            "\"\\n\"",
            "[\"a\",\"b\"]",
            "[]",
            "[\"\"]",
            "[\"1\",\"2\",\"3\",\"4\",\"5\"]",
            "7",
        ],
    ),
    ("stream", &["true", "false", "1"]),
    ("stream_options", &["{\"include_usage\":true}", "{}", "[]"]),
    ("n", &["1", "2", "0"]),
    ("user", &["\"u\""]),
    (
        "arbor",
        &[
            "{\"strategy\":\"tree\"}",
            "{\"provisional\":true}",
            "{\"slo\":{\"ttft\":0.5,\"tpot\":0.8}}",
            "{\"slo\":{\"ttft\":-1}}",
            "{\"slo\":{\"refuse\":true}}",
            "{\"unknown\":1}",
        ],
    ),
];

fn text(rng: &mut Rng) -> String {
    let pieces = [
        "hi",
        " ",
        "\n",
        "é",
        "<|im_start|>",
        "<|im_end|>",
        "\u{0}",
        "\u{feff}",
        "\"",
        "{{",
        "😀",
    ];
    let repeat = if rng.one_in(8) { 40 } else { 1 };
    (0..rng.small(6))
        .map(|_| rng.pick(&pieces).repeat(repeat))
        .collect()
}

fn prompt(rng: &mut Rng) -> Value {
    match rng.below(4) {
        0 => Value::Array(
            (0..rng.small(3))
                .map(|_| Value::String(text(rng)))
                .collect(),
        ),
        1 => Value::Null,
        _ => Value::String(text(rng)),
    }
}

fn messages(rng: &mut Rng) -> Value {
    let roles = ["system", "user", "assistant", "developer", "tool", ""];
    let list = (0..rng.small(4))
        .map(|_| {
            let mut m = serde_json::Map::new();
            m.insert("role".into(), Value::String(rng.pick(&roles).to_string()));
            let content = match rng.below(5) {
                0 => serde_json::json!([{"type": "text", "text": text(rng)}, {"type": "text"}]),
                1 => serde_json::json!([{"type": "image_url", "image_url": {"url": "x"}}]),
                2 => Value::Null,
                _ => Value::String(text(rng)),
            };
            m.insert("content".into(), content);
            Value::Object(m)
        })
        .collect();
    Value::Array(list)
}

/// The parsers the router calls agree with the ones tested above: a body
/// the generator marks well-formed parses.
#[test]
fn generated_chat_bodies_parse() {
    let mut rng = Rng::new(1);
    for _ in 0..200 {
        let v = messages(&mut rng);
        let body = serde_json::json!({"model": MODEL, "messages": v}).to_string();
        let parsed: api::ChatRequest = api::parse(body.as_bytes()).expect("parses");
        assert_eq!(parsed.messages.len(), v.as_array().unwrap().len());
    }
}

/// One of `items`.
fn one(rng: &mut Rng, items: &[&'static str]) -> &'static str {
    items[rng.below(items.len())]
}

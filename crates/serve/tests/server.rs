//! `arbor serve` against a real server on 127.0.0.1 over tiny random
//! models: the OpenAI response and stream formats, streamed text equal to
//! whole text at temperature 0, stop sequences, the errors of bad requests,
//! the API key, a full queue, and a client that leaves mid-stream.

use crate::common;
use common::*;

use arbor_engine::RunConfig;
use std::time::Duration;

use arbor_serve::{Clock, ServeOptions};
use serde_json::{Value, json};

fn plain() -> RunConfig {
    RunConfig {
        strategy: Some("autoregressive".into()),
        max_tokens: Some(24),
        ..RunConfig::default()
    }
}

fn chat(model: &str, content: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}],
        "temperature": 0,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Parses a stream's chunks (all but `[DONE]`, which must end it).
fn chunks(data: Vec<String>) -> Vec<Value> {
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    (data[..data.len() - 1].iter())
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn streamed_and_whole_responses_agree_in_the_openai_formats() {
    let path = tiny_model("formats", false);
    let server = serve(&path, plain(), ServeOptions::default());
    let addr = server.addr();
    assert_eq!(http(addr, "GET", "/health", &[], "").json()["status"], "ok");
    let models = http(addr, "GET", "/v1/models", &[], "").json();
    let id = models["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(models["object"], "list");
    assert_eq!(
        http(addr, "GET", &format!("/v1/models/{id}"), &[], "").status,
        200
    );

    let whole = post(
        addr,
        "/v1/chat/completions",
        &chat(&id, "hello", json!({"max_tokens": 12})),
    );
    assert_eq!(whole.status, 200, "{}", whole.body);
    let w = whole.json();
    assert_eq!(w["object"], "chat.completion");
    assert_eq!(w["choices"][0]["message"]["role"], "assistant");
    let text = w["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let usage = &w["usage"];
    let finish = w["choices"][0]["finish_reason"].as_str().unwrap();
    let n = usage["completion_tokens"].as_u64().unwrap();
    assert!(n <= 12 && (finish == "stop" || n == 12), "{w}");
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().unwrap() + n)
    );

    let body = chat(
        &id,
        "hello",
        json!({"max_tokens": 12, "stream": true, "stream_options": {"include_usage": true}}),
    );
    let stream = Events::open(addr, "/v1/chat/completions", &body);
    assert_eq!(stream.status, 200);
    let parts = chunks(stream.rest());
    let first_id = parts[0]["id"].clone();
    assert!(
        parts
            .iter()
            .all(|c| c["id"] == first_id && c["object"] == "chat.completion.chunk")
    );
    assert_eq!(parts[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = (parts.iter())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text, "streamed text equals the whole response's");
    let ends: Vec<&Value> = (parts.iter())
        .filter(|c| !c["choices"][0]["finish_reason"].is_null())
        .collect();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0]["choices"][0]["finish_reason"], finish);
    let last = parts.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(last["usage"][k], usage[k], "{k}");
    }
    // The same prompt again: all but its last token came from the cache.
    let reused = &last["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert_eq!(
        reused.as_u64(),
        usage["prompt_tokens"].as_u64().map(|n| n - 1)
    );

    // Text completions, both ways.
    let body = json!({"model": id, "prompt": "The sky", "max_tokens": 10, "temperature": 0});
    let w = post(addr, "/v1/completions", &body).json();
    assert_eq!(w["object"], "text_completion");
    let text = w["choices"][0]["text"].as_str().unwrap().to_string();
    let mut body = body;
    body["stream"] = json!(true);
    let streamed: String = chunks(Events::open(addr, "/v1/completions", &body).rest())
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, text);

    let t = post(addr, "/tokenize", &json!({"content": "abc"})).json();
    assert_eq!(t["count"], 3, "one token per byte: {t}");
    let t = post(
        addr,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "abc"}]}),
    );
    assert!(t.json()["count"].as_u64().unwrap() > 3);
    assert!(
        http(addr, "GET", "/metrics", &[], "")
            .body
            .contains("arbor_generated_tokens_total")
    );
    server.shutdown().unwrap();
    std::fs::remove_file(path).ok();
}

#[test]
fn a_stop_sequence_ends_the_text_before_it() {
    let path = tiny_model("stops", false);
    let server = serve(&path, plain(), ServeOptions::default());
    let addr = server.addr();
    let id = http(addr, "GET", "/v1/models", &[], "").json()["data"][0]["id"].clone();
    let body = |prompt: &str, stop: Value| json!({"model": id, "prompt": prompt, "max_tokens": 24, "temperature": 0, "stop": stop});
    // A random model's text: take a prompt whose continuation is long
    // enough (it may end at once or wander into partial UTF-8).
    let (prompt, text) = ["hello", "abc", "The sky", "x", "1 2 3", "zz", "Once upon"]
        .iter()
        .map(|p| {
            let free = post(addr, "/v1/completions", &body(p, Value::Null)).json();
            (*p, free["choices"][0]["text"].as_str().unwrap().to_string())
        })
        .find(|(_, t)| t.chars().count() >= 6)
        .expect("some prompt continues for six characters");
    let body = |stop: Value| body(prompt, stop);
    // Stop at the middle of the free text: a sequence that starts there.
    let chars: Vec<char> = text.chars().collect();
    let at = chars.len() / 2;
    let stop: String = chars[at..at + 2].iter().collect();
    let cut = text.find(&stop).unwrap();
    let stopped = post(addr, "/v1/completions", &body(json!([stop]))).json();
    assert_eq!(
        stopped["choices"][0]["text"].as_str().unwrap(),
        &text[..cut]
    );
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    let mut streaming = body(json!(stop));
    streaming["stream"] = json!(true);
    let streamed: String = chunks(Events::open(addr, "/v1/completions", &streaming).rest())
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, &text[..cut]);
    server.shutdown().unwrap();
    std::fs::remove_file(path).ok();
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let path = tiny_model("errors", false);
    let options = ServeOptions {
        body_limit: 64 << 10,
        ..ServeOptions::default()
    };
    let server = serve(&path, plain(), options);
    let addr = server.addr();
    let id = model_id(addr);
    let ok = chat(&id, "hi", json!({"max_tokens": 2}));
    let with = |k: &str, v: Value| {
        let mut b = ok.clone();
        b[k] = v;
        b.to_string()
    };
    let long = "word ".repeat(200); // 1000 byte tokens: past the 512 context
    let cases: Vec<(&str, &str, String, u16)> = vec![
        (
            "malformed JSON",
            "/v1/chat/completions",
            "{\"model\": ".into(),
            400,
        ),
        (
            "missing messages",
            "/v1/chat/completions",
            json!({"model": id}).to_string(),
            400,
        ),
        (
            "missing model",
            "/v1/chat/completions",
            json!({"messages": []}).to_string(),
            400,
        ),
        (
            "messages of the wrong type",
            "/v1/chat/completions",
            with("messages", json!("hi")),
            400,
        ),
        (
            "max_tokens of the wrong type",
            "/v1/chat/completions",
            with("max_tokens", json!("ten")),
            400,
        ),
        (
            "unknown model",
            "/v1/chat/completions",
            with("model", json!("gpt-4")),
            404,
        ),
        (
            "empty messages",
            "/v1/chat/completions",
            with("messages", json!([])),
            400,
        ),
        (
            "unknown role",
            "/v1/chat/completions",
            with("messages", json!([{"role": "wizard", "content": "x"}])),
            400,
        ),
        (
            "max_tokens 0",
            "/v1/chat/completions",
            with("max_tokens", json!(0)),
            400,
        ),
        (
            "max_tokens -5",
            "/v1/chat/completions",
            with("max_tokens", json!(-5)),
            400,
        ),
        (
            "max_tokens past the context",
            "/v1/chat/completions",
            with("max_tokens", json!(100_000)),
            400,
        ),
        (
            "prompt longer than the context",
            "/v1/chat/completions",
            with("messages", json!([{"role": "user", "content": long}])),
            400,
        ),
        (
            "temperature 3",
            "/v1/chat/completions",
            with("temperature", json!(3)),
            400,
        ),
        (
            "temperature -1",
            "/v1/chat/completions",
            with("temperature", json!(-1)),
            400,
        ),
        (
            "top_p 0",
            "/v1/chat/completions",
            with("top_p", json!(0)),
            400,
        ),
        (
            "top_p 1.5",
            "/v1/chat/completions",
            with("top_p", json!(1.5)),
            400,
        ),
        ("n 2", "/v1/chat/completions", with("n", json!(2)), 400),
        (
            "five stop sequences",
            "/v1/chat/completions",
            with("stop", json!(["a", "b", "c", "d", "e"])),
            400,
        ),
        (
            "unknown arbor option",
            "/v1/chat/completions",
            with("arbor", json!({"speed": "max"})),
            400,
        ),
        (
            "unknown strategy",
            "/v1/chat/completions",
            with("arbor", json!({"strategy": "magic"})),
            400,
        ),
        (
            "empty prompt",
            "/v1/completions",
            json!({"model": id, "prompt": ""}).to_string(),
            400,
        ),
        (
            "two prompts",
            "/v1/completions",
            json!({"model": id, "prompt": ["a", "b"]}).to_string(),
            400,
        ),
        (
            "body over the limit",
            "/v1/chat/completions",
            with("pad", json!("x".repeat(70_000))),
            413,
        ),
        ("unknown route", "/v1/embeddings", ok.to_string(), 404),
    ];
    eprintln!("| bad input | status |\n|---|---|");
    for (what, route, body, want) in &cases {
        let r = http(addr, "POST", route, &[], body);
        eprintln!("| {what} | {} |", r.status);
        assert_eq!(r.status, *want, "{what}: {}", r.body);
        let e = r.json();
        assert!(
            e["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}: {e}"
        );
        assert!(e["error"]["type"].is_string(), "{what}: {e}");
    }
    // Still serving.
    let r = http(addr, "POST", "/v1/chat/completions", &[], &ok.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    server.shutdown().unwrap();
    std::fs::remove_file(path).ok();
}

#[test]
fn the_api_key_is_checked_when_set() {
    let path = tiny_model("key", false);
    let options = ServeOptions {
        api_key: Some("sesame".into()),
        ..ServeOptions::default()
    };
    let server = serve(&path, plain(), options);
    let addr = server.addr();
    for headers in [vec![], vec![("Authorization", "Bearer nope")]] {
        let r = http(addr, "GET", "/v1/models", &headers, "");
        assert_eq!(r.status, 401);
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    }
    let r = http(
        addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sesame")],
        "",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        http(addr, "GET", "/health", &[], "").status,
        200,
        "health needs no key"
    );
    server.shutdown().unwrap();
    std::fs::remove_file(path).ok();
}

/// One request generating, one waiting: a third finds the queue (of one)
/// full; the first client then leaves mid-stream, its generation stops
/// well before its token limit, and the waiting request is served. The
/// model's passes go through a gate, so the first generation stands at a
/// pass while the others arrive.
#[test]
fn a_full_queue_is_429_and_a_client_that_leaves_stops_its_generation() {
    let path = tiny_model("queue", true);
    let options = ServeOptions {
        queue: 1,
        ..ServeOptions::default()
    };
    let gate = Gate::allowing(0);
    let server = serve_paced(&path, plain(), options, &gate);
    let addr = server.addr();
    let model = model_id(addr);
    let id = model.clone();
    let long = chat(&id, "go", json!({"max_tokens": 400, "stream": true}));
    let mut first = Events::open(addr, "/v1/chat/completions", &long);
    assert_eq!(first.status, 200);
    first.next_data().unwrap(); // the role chunk: queued
    gate.wait("the first request's first pass", |p| p.asked == 1);
    let waiting = std::thread::spawn(move || {
        post(
            addr,
            "/v1/chat/completions",
            &chat(&id, "next", json!({"max_tokens": 3})),
        )
    });
    // The second request is queued once the queue depth says so.
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while metric(addr, "queue_depth") < 1.0 {
        assert!(
            std::time::Instant::now() < until,
            "the second request never queued"
        );
        std::thread::yield_now();
    }
    let third = chat(&model, "third", json!({"max_tokens": 3}));
    let r = post(addr, "/v1/chat/completions", &third);
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.header("retry-after").is_some());
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    drop(first); // the client leaves
    // The worker finds it gone between passes: one pass at a time until
    // it does (the next pass asked is then the second request's).
    let mut passes = 0;
    while metric(addr, "requests_cancelled_total") < 1.0 {
        passes += 1;
        assert!(passes < 400, "the first generation ran to its limit");
        gate.allow(1);
        gate.wait("the next pass", |p| p.asked == passes + 1);
    }
    gate.open();
    let second = waiting.join().unwrap();
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(metric(addr, "requests_cancelled_total"), 1.0);
    let answered = second.json()["usage"]["completion_tokens"]
        .as_f64()
        .unwrap();
    let generated = metric(addr, "generated_tokens_total") - answered;
    assert!(
        generated < 400.0 && generated <= passes as f64,
        "the first generation stopped early: {generated} tokens, {passes} passes"
    );
    server.shutdown().unwrap();
    std::fs::remove_file(path).ok();
}

/// A conversation's second turn takes the first turn's prompt (and reply)
/// from the prompt cache, and answers exactly as it does without it.
#[test]
fn a_conversations_next_turn_reuses_its_cached_prefix() {
    let path = tiny_model("cache", false);
    let server = serve(&path, plain(), ServeOptions::default());
    let addr = server.addr();
    let id = http(addr, "GET", "/v1/models", &[], "").json()["data"][0]["id"].clone();
    let user = json!({"role": "user", "content": "hello there"});
    let turn = |messages: Value| {
        let body = json!({"model": id, "messages": messages, "max_tokens": 8, "temperature": 0});
        post(addr, "/v1/chat/completions", &body).json()
    };
    let first = turn(json!([user]));
    let reply = first["choices"][0]["message"]["content"].clone();
    let second_turn = json!([user, {"role": "assistant", "content": reply}, {"role": "user", "content": "and more"}]);
    let cached = turn(second_turn.clone());
    let p1 = first["usage"]["prompt_tokens"].as_u64().unwrap();
    let reused = cached["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        reused >= p1,
        "the first turn's {p1} prompt tokens were reused: {reused}"
    );
    // Another conversation in between: nothing to reuse.
    let other = json!({"model": id, "prompt": "zzz", "max_tokens": 4, "temperature": 0});
    assert_eq!(post(addr, "/v1/completions", &other).status, 200);
    let fresh = turn(second_turn);
    let again = fresh["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(again < p1, "{again}");
    assert_eq!(
        fresh["choices"][0]["message"]["content"], cached["choices"][0]["message"]["content"],
        "the cached prefix changes nothing"
    );
    server.shutdown().unwrap();
    std::fs::remove_file(path).ok();
}

/// A request past its deadline gets 408 and its generation stops; a
/// shutdown lets a stream in flight finish. The deadline is read from a
/// manual clock the test moves while the model is held between passes,
/// and the stream is held at a pass while the server stops listening.
#[test]
fn timeouts_are_408_and_shutdown_lets_streams_finish() {
    let path = tiny_model("timeout", true);
    let clock = Clock::manual();
    let timeout = Duration::from_secs(3600);
    let options = ServeOptions {
        timeout,
        clock: clock.clone(),
        ..ServeOptions::default()
    };
    let gate = Gate::allowing(3);
    let server = serve_paced(&path, plain(), options, &gate);
    let addr = server.addr();
    let id = http(addr, "GET", "/v1/models", &[], "").json()["data"][0]["id"].clone();
    let long = json!({"model": id, "prompt": "go", "max_tokens": 400, "temperature": 0});
    let request = std::thread::spawn(move || post(addr, "/v1/completions", &long));
    // Three passes within the deadline; the fourth waits while it passes.
    gate.wait("the fourth pass", |p| p.asked == 4);
    clock.advance(timeout);
    gate.open();
    let r = request.join().unwrap();
    assert_eq!(r.status, 408, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "timeout_error");
    let generated = metric(addr, "generated_tokens_total");
    assert!(
        (3.0..400.0).contains(&generated),
        "stopped at the deadline, not before: {generated}"
    );
    server.shutdown().unwrap();

    let gate = Gate::allowing(0);
    let server = serve_paced(&path, plain(), ServeOptions::default(), &gate);
    let addr = server.addr();
    let mut body = json!({"model": id, "prompt": "go", "max_tokens": 60, "temperature": 0});
    body["stream"] = json!(true);
    let events = Events::open(addr, "/v1/completions", &body);
    assert_eq!(events.status, 200);
    gate.wait("the stream's first pass", |p| p.asked == 1);
    let stopping = std::thread::spawn(move || server.shutdown());
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(addr).is_ok() {
        assert!(std::time::Instant::now() < until, "still listening");
        std::thread::yield_now();
    }
    // The server no longer listens; the stream, held at its first pass,
    // goes on to its end.
    gate.open();
    let rest = events.rest();
    assert_eq!(
        rest.last().map(String::as_str),
        Some("[DONE]"),
        "the stream finished"
    );
    assert!(rest.len() > 2, "{rest:?}");
    stopping.join().unwrap().unwrap();
    std::fs::remove_file(path).ok();
}

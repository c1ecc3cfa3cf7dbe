//! Tool calling through `/v1/chat/completions`: bad tool requests are 400s
//! naming the field; a named `tool_choice` makes the answer a call of that
//! function, read back as OpenAI's `tool_calls` (or, when the model's
//! arguments do not parse, returned as content rather than lost); the
//! conversation goes on with the call and a `tool` result; streamed and
//! whole answers agree. On SmolLM2 when it is cached (CI fetches it; its
//! arguments may be poor, the mechanics are what is checked), else on a
//! tiny random model.

use crate::common;
use common::*;

use arbor_engine::RunConfig;
use arbor_serve::ServeOptions;
use serde_json::{Value, json};

fn weather() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}])
}

fn ask(model: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": weather(),
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "temperature": 0,
        "max_tokens": 32,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The message of a whole response, or the same rebuilt from a stream's
/// deltas.
fn streamed_message(chunks: &[Value]) -> (Value, String) {
    let mut content = String::new();
    let mut calls: Vec<Value> = vec![];
    let mut finish = String::new();
    for c in chunks {
        let choice = &c["choices"][0];
        let delta = &choice["delta"];
        if let Some(t) = delta["content"].as_str() {
            content.push_str(t);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            assert!(call["index"].is_u64(), "{call}");
            calls.push(
                json!({"id": call["id"], "type": call["type"], "function": call["function"]}),
            );
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    let content = if content.is_empty() {
        Value::Null
    } else {
        content.into()
    };
    let mut m = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        m["tool_calls"] = calls.into();
    }
    (m, finish)
}

#[test]
fn a_named_tool_choice_is_answered_with_a_call_and_the_conversation_goes_on() {
    let tiny = tiny_model("tools", false);
    let path = arbor_fetch::testing::cached_model("smollm2-135m").unwrap_or(tiny.clone());
    let config = RunConfig {
        strategy: Some("autoregressive".into()),
        ..RunConfig::default()
    };
    let server = serve(&path, config, ServeOptions::default());
    let addr = server.addr();
    let id = model_id(addr);

    // Bad tool requests.
    let other = json!({"type": "function", "function": {"name": "launch"}});
    for (extra, param) in [
        (json!({"tool_choice": other}), "tool_choice"),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (json!({"tools": [{"type": "function"}]}), "tools[0]"),
        (
            json!({"tools": [], "tool_choice": "required"}),
            "tool_choice",
        ),
    ] {
        let r = post(addr, "/v1/chat/completions", &ask(&id, extra.clone()));
        assert_eq!(r.status, 400, "{extra}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{extra}");
    }

    let whole = post(addr, "/v1/chat/completions", &ask(&id, json!({})));
    assert_eq!(whole.status, 200, "{}", whole.body);
    let w = whole.json();
    let message = w["choices"][0]["message"].clone();
    let finish = w["choices"][0]["finish_reason"]
        .as_str()
        .unwrap()
        .to_string();
    match message["tool_calls"].as_array() {
        Some(calls) => {
            assert_eq!(finish, "tool_calls");
            assert_eq!(calls[0]["type"], "function");
            assert_eq!(calls[0]["function"]["name"], "get_weather");
            let args = calls[0]["function"]["arguments"].as_str().unwrap();
            let args: Value = serde_json::from_str(args).unwrap();
            assert!(args.is_object(), "{args}");
            assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
        }
        // Arguments that do not parse come back as content, the forced
        // start of the call included: nothing is lost.
        None => {
            let text = message["content"].as_str().unwrap();
            assert!(
                text.starts_with("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "),
                "{text}"
            );
        }
    }

    // The same request streamed gives the same message.
    let stream = Events::open(
        addr,
        "/v1/chat/completions",
        &ask(&id, json!({"stream": true})),
    );
    let data = stream.rest();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = (data[..data.len() - 1].iter())
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let (streamed, streamed_finish) = streamed_message(&chunks);
    assert_eq!(streamed_finish, finish);
    assert_eq!(streamed["content"], message["content"]);
    let strip = |calls: &Value| -> Vec<Value> {
        (calls.as_array().into_iter().flatten())
            .map(|c| c["function"].clone())
            .collect()
    };
    assert_eq!(
        strip(&streamed["tool_calls"]),
        strip(&message["tool_calls"])
    );

    // The conversation goes on with a call and its result, whatever the
    // model answered above.
    let call_id = "call_0123456789abcdef01234567";
    let follow = json!({
        "model": id,
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": call_id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": call_id, "content": "{\"celsius\": 21}"},
        ],
        "tools": weather(),
        "temperature": 0,
        "max_tokens": 8,
    });
    let r = post(addr, "/v1/chat/completions", &follow);
    assert_eq!(r.status, 200, "{}", r.body);
    let used = r.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    let first = w["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(used > first, "the call and its result are in the prompt");
    let mut bad = follow.clone();
    bad["messages"][1]["tool_calls"][0]["function"]["arguments"] = json!("{not json");
    let r = post(addr, "/v1/chat/completions", &bad);
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["param"],
        "messages[1].tool_calls[0].function.arguments"
    );
    // `none`: no tools rendered, a plain answer.
    let r = post(
        addr,
        "/v1/chat/completions",
        &ask(&id, json!({"tool_choice": "none"})),
    );
    assert_eq!(r.status, 200);
    assert!(r.json()["usage"]["prompt_tokens"].as_u64().unwrap() < first);
    server.shutdown().unwrap();
    std::fs::remove_file(tiny).ok();
}

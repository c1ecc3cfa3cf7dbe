//! Structured output through `/v1/chat/completions`: `response_format`
//! `json_schema` on 20 prompts whose schemas differ (nested objects,
//! enums, arrays, bounded numbers, constants) — every answer parses and
//! validates against its schema (checked with the `jsonschema` crate), and
//! with a draft under the `tree` strategy the answer equals the
//! target-only constrained answer; `json_object`; bad formats are 400s;
//! a forced tool call's arguments fit the tool's schema.
//!
//! On SmolLM2 drafting for itself when it is cached (CI), else on a tiny
//! random model. `ARBOR_STRUCTURED_TARGET` and `ARBOR_STRUCTURED_DRAFT`
//! (model names or paths) run it on others, e.g. the 1.5B with the 0.5B,
//! and `ARBOR_STRUCTURED_BUDGET` (e.g. `1.3GiB`) under a memory budget;
//! `--nocapture` prints a table.

use crate::common;
use common::*;

use arbor_engine::RunConfig;
use arbor_serve::ServeOptions;
use serde_json::{Value, json};

fn model_path(var: &str, fallback: &std::path::Path) -> String {
    match std::env::var(var) {
        Ok(name) => name,
        Err(_) => (arbor_fetch::testing::cached_model("smollm2-135m"))
            .unwrap_or(fallback.to_path_buf())
            .to_string_lossy()
            .into_owned(),
    }
}

fn chat(id: &str, prompt: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": id,
        "messages": [
            {"role": "system", "content": "Answer in JSON."},
            {"role": "user", "content": prompt},
        ],
        "temperature": 0,
        "max_tokens": 400,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[test]
fn json_schema_answers_validate_and_speculation_changes_nothing() {
    let tiny = tiny_model("structured", false);
    let target = model_path("ARBOR_STRUCTURED_TARGET", &tiny);
    let draft = std::env::var("ARBOR_STRUCTURED_DRAFT").unwrap_or(target.clone());
    let separate_draft = draft != target;
    let budget = std::env::var("ARBOR_STRUCTURED_BUDGET").ok();
    let cases: Vec<Value> =
        serde_json::from_str(include_str!("schemas.json")).expect("schemas.json");
    assert_eq!(cases.len(), 20);
    // One server per strategy: under a budget a run is planned for its
    // strategy. `chain` always drafts; `tree` drafts where its plan says
    // drafting pays, which a draft as large as its target (CI's SmolLM2
    // drafting for itself) never does: it runs with a separate draft only.
    let mut strategies = vec!["autoregressive", "chain"];
    if separate_draft {
        strategies.push("tree");
    }
    let answers: Vec<Vec<Value>> = (strategies.iter())
        .map(|strategy| {
            let config = RunConfig {
                target: Some(target.clone()),
                draft: Some(draft.clone()),
                strategy: Some(strategy.to_string()),
                memory_budget: budget.clone(),
                ..RunConfig::default()
            };
            let server = serve(
                std::path::Path::new(&target),
                config,
                ServeOptions::default(),
            );
            let addr = server.addr();
            let id = model_id(addr);
            let answers = (cases.iter().enumerate())
                .map(|(i, case)| {
                    let format = json!({"type": "json_schema", "json_schema": {
                        "name": format!("case{i}"), "schema": case["schema"], "strict": true}});
                    let prompt = case["prompt"].as_str().unwrap();
                    let body = chat(&id, prompt, json!({"response_format": format}));
                    let r = post(addr, "/v1/chat/completions", &body);
                    assert_eq!(r.status, 200, "{strategy} case {i}: {}", r.body);
                    r.json()
                })
                .collect();
            server.shutdown().unwrap();
            answers
        })
        .collect();
    eprintln!("target {target}, draft {draft}, budget {budget:?}");
    eprintln!(
        "| # | valid | {} equal | tokens | tokens/pass {} | mask µs/row |",
        strategies.join(" = "),
        strategies[1..].join(", ")
    );
    eprintln!("|---|---|---|---|---|---|");
    let (mut valid, mut equal) = (0, 0);
    let content = |r: &Value| r["choices"][0]["message"]["content"].clone();
    for (i, case) in cases.iter().enumerate() {
        let plain = &answers[0][i];
        let text = plain["choices"][0]["message"]["content"].as_str().unwrap();
        let ok = serde_json::from_str::<Value>(text)
            .is_ok_and(|v| jsonschema::is_valid(&case["schema"], &v));
        let same = answers.iter().all(|a| content(&a[i]) == content(plain));
        valid += usize::from(ok);
        equal += usize::from(same);
        let masked = &plain["arbor"]["constraint"];
        let per_row = masked["mask_seconds"].as_f64().unwrap_or(0.0)
            / masked["masked_rows"].as_f64().unwrap_or(1.0).max(1.0);
        let per_pass: Vec<String> = (answers[1..].iter())
            .map(|a| {
                format!(
                    "{:.2}",
                    a[i]["arbor"]["tokens_per_pass"].as_f64().unwrap_or(0.0)
                )
            })
            .collect();
        eprintln!(
            "| {i} | {ok} | {same} | {} | {} | {:.0} |",
            plain["usage"]["completion_tokens"],
            per_pass.join(", "),
            per_row * 1e6
        );
        assert!(ok, "case {i} does not validate: {text}");
        let all: Vec<Value> = answers.iter().map(|a| content(&a[i])).collect();
        assert!(same, "case {i}: {strategies:?} gave {all:?}");
    }
    eprintln!("valid {valid}/20, all strategies equal {equal}/20");

    // The rest on one server.
    let config = RunConfig {
        target: Some(target.clone()),
        strategy: Some("autoregressive".into()),
        memory_budget: budget.clone(),
        ..RunConfig::default()
    };
    let server = serve(
        std::path::Path::new(&target),
        config,
        ServeOptions::default(),
    );
    let addr = server.addr();
    let id = model_id(addr);

    // json_object: any object (which need not end: a small model may go
    // on until the token limit; one that stops has closed it).
    let format = json!({"response_format": {"type": "json_object"}, "max_tokens": 48});
    let r = post(
        addr,
        "/v1/chat/completions",
        &chat(&id, "Describe a dog.", format),
    )
    .json();
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with('{'), "{text}");
    if r["choices"][0]["finish_reason"] == "stop" {
        let v = serde_json::from_str::<Value>(text);
        assert!(v.is_ok_and(|v| v.is_object()), "{text}");
    }

    // Bad formats.
    for (format, why) in [
        (json!({"type": "xml"}), "an unknown type"),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x"}}),
            "no schema",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"schema": {"type": "object",
            "properties": {"a": {"$ref": "#/nowhere"}}}}}),
            "a dangling $ref",
        ),
    ] {
        let r = post(
            addr,
            "/v1/chat/completions",
            &chat(&id, "x", json!({"response_format": format})),
        );
        assert_eq!(r.status, 400, "{why}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], "response_format", "{why}");
    }

    // A forced call's arguments fit its tool's schema, whichever way the
    // call is forced.
    let params = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": false});
    let tools =
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": params}}]);
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let body = chat(
            &id,
            "What is the weather in Paris?",
            json!({"tools": tools, "tool_choice": choice}),
        );
        let r = post(addr, "/v1/chat/completions", &body).json();
        let call = &r["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather", "{choice}: {r}");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(jsonschema::is_valid(&params, &args), "{choice}: {args}");
        assert_eq!(r["choices"][0]["finish_reason"], "tool_calls");
    }
    server.shutdown().unwrap();
    std::fs::remove_file(tiny).ok();
}

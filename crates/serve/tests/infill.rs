//! Fill-in-the-middle on a tiny random model whose vocabulary has
//! Qwen2.5-Coder's FIM tokens: `/infill` (llama-server's shape, whole and
//! streamed) and `/v1/completions` with a `suffix` build the same FIM
//! prompt and give the same middle, with or without a draft; a model
//! without FIM tokens is a 400 that says so; bad fields are named.

use crate::common;
use common::*;

use arbor_engine::{Infill, RunConfig};
use arbor_model::testing::{TinyModel, add_fim_byte_tokenizer};
use arbor_serve::ServeOptions;
use serde_json::{Value, json};

fn fim_model(tag: &str) -> std::path::PathBuf {
    let model = TinyModel {
        arch: "qwen2",
        vocab: 265,
        seed: 11,
        ..TinyModel::default()
    };
    let mut w = model.writer();
    add_fim_byte_tokenizer(&mut w, Some(256));
    let path = std::env::temp_dir().join(format!("arbor-serve-{tag}-{}.gguf", std::process::id()));
    w.write(&path).unwrap();
    path
}

fn config(path: &std::path::Path) -> RunConfig {
    RunConfig {
        draft: Some(path.to_str().unwrap().into()),
        strategy: Some("autoregressive".into()),
        max_tokens: Some(64),
        ..RunConfig::default()
    }
}

#[test]
fn infill_fills_the_middle_whole_streamed_and_through_completions() {
    let path = fim_model("infill");
    let server = serve(&path, config(&path), ServeOptions::default());
    let addr = server.addr();
    let (prefix, suffix) = ("fn add(a: i32, b: i32) -> i32 {\n    ", "\n}\n");
    let body = json!({"input_prefix": prefix, "input_suffix": suffix, "n_predict": 12});
    let r = post(addr, "/infill", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let content = v["content"].as_str().unwrap().to_string();
    assert_eq!(v["stop"], true);
    let predicted = v["tokens_predicted"].as_u64().unwrap();
    assert!((1..=12).contains(&predicted), "{v}");
    // The prompt is the FIM prompt of the code.
    let file = arbor_gguf::GgufFile::open(&path).unwrap();
    let tokenizer = arbor_engine::Tokenizer::from_gguf(file.header()).unwrap();
    let want = tokenizer
        .encode_infill(&Infill {
            prefix,
            suffix,
            ..Infill::default()
        })
        .unwrap();
    assert_eq!(v["tokens_evaluated"], want.len());

    // Streamed: pieces, then one event with `stop: true` and the totals.
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let streamed = Events::open(addr, "/infill", &stream_body);
    let events: Vec<Value> = (streamed.rest().iter())
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect();
    let (last, pieces) = events.split_last().unwrap();
    assert_eq!(last["stop"], true);
    assert_eq!(last["tokens_predicted"], predicted);
    assert!(pieces.iter().all(|p| p["stop"] == false));
    let text: String = pieces
        .iter()
        .map(|p| p["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, content);

    // OpenAI's `suffix` on completions is the same infill.
    let id = model_id(addr);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": id, "prompt": prefix, "suffix": suffix, "max_tokens": 12,
                "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], content);
    assert_eq!(r.json()["usage"]["prompt_tokens"], want.len());

    // A draft changes nothing; other files go first, behind separators.
    for strategy in ["chain", "tree"] {
        let mut with = body.clone();
        with["arbor"] = json!({"strategy": strategy});
        let r = post(addr, "/infill", &with);
        assert_eq!(r.json()["content"], content, "{strategy}");
    }
    let mut with = body.clone();
    with["input_extra"] = json!([{"filename": "util.rs", "text": "pub fn one() -> i32 { 1 }"}]);
    let r = post(addr, "/infill", &with);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["tokens_evaluated"].as_u64().unwrap() > want.len() as u64 + 20);

    // Bad fields are named.
    for (field, value) in [
        ("frobnicate", json!(1)),
        ("temperature", json!(9)),
        ("echo", json!(true)),
    ] {
        let mut bad = body.clone();
        bad[field] = value;
        let r = post(addr, "/infill", &bad);
        assert_eq!(r.status, 400, "{field}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], field);
    }
    let r = post(addr, "/infill", &json!({"input_prefix": 3}));
    assert_eq!(r.status, 400, "{}", r.body);
    server.shutdown().unwrap();
    std::fs::remove_file(path).ok();
}

#[test]
fn a_model_without_fim_tokens_says_so() {
    let path = tiny_model("no-fim", false);
    let server = serve(&path, RunConfig::default(), ServeOptions::default());
    let addr = server.addr();
    let r = post(
        addr,
        "/infill",
        &json!({"input_prefix": "fn f() {", "input_suffix": "}"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("fill-in-the-middle"), "{message}");
    let id = model_id(addr);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": id, "prompt": "fn f() {", "suffix": "}"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    server.shutdown().unwrap();
    std::fs::remove_file(path).ok();
}

//! `arbor.slo` on a server over a tiny random elastic model: a full
//! objective is served by the full pair and reported; an objective no pair
//! meets is refused with `slo_unmet` when the request asks, else served by
//! the fastest pair and reported missed; bad objectives are 400; a server
//! whose model is not elastic refuses objectives and keeps serving.

use crate::common;
use common::*;

use arbor_engine::slo::Calibration;
use arbor_engine::{Engine, ProfileStore, RunConfig};
use arbor_model::testing::TinyModel;
use arbor_serve::ServeOptions;
use serde_json::{Value, json};

/// An elastic copy of the tiny byte-vocabulary model, its server with
/// objective tables measured into a scratch store.
fn elastic_server(tag: &str) -> (arbor_serve::Server, std::path::PathBuf) {
    let plain = tiny_model(tag, false);
    let m = TinyModel {
        arch: "qwen2",
        vocab: 256 + SPECIALS.len(),
        seed: 7,
        ..TinyModel::default()
    };
    // The elastic file lives in the test's directory, removed with it.
    let dir = std::env::temp_dir().join(format!("arbor-serve-slo-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let elastic = dir.join("model.elastic.gguf");
    arbor_elastic::testing::build_tiny(&m, &plain, &elastic).unwrap();
    let config = RunConfig {
        target: Some(elastic.display().to_string()),
        backend: Some("candle".into()),
        strategy: Some("autoregressive".into()),
        max_tokens: Some(8),
        ..RunConfig::default()
    };
    let mut run =
        Engine::open_with_store(&config, ProfileStore::new(dir.clone()), &mut |_| {}).unwrap();
    let text = "a tiny calibration text, said over and over. ".repeat(16);
    let prompts = vec!["Tell me about rivers and the sea.".to_string()];
    let calibration = Calibration {
        prompts: &prompts,
        text: &text,
        answer_tokens: 6,
        reference: None,
    };
    let tables = run.slo_tables(&calibration, false, &mut |_| {}).unwrap();
    let options = ServeOptions {
        slo: Some(tables),
        ..ServeOptions::default()
    };
    let server = arbor_serve::start(run, ServeOptions { port: 0, ..options }).unwrap();
    std::fs::remove_file(&plain).ok();
    (server, dir)
}

fn body(model: &str, slo: Value) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "How do tides work along a coast?"}],
        "temperature": 0,
        "max_tokens": 6,
        "arbor": {"slo": slo},
    })
}

#[test]
fn objectives_are_served_reported_or_refused() {
    let (server, dir) = elastic_server("served");
    let addr = server.addr();
    let id = model_id(addr);

    let r = post(
        addr,
        "/v1/chat/completions",
        &body(&id, json!({"ttft": 1, "tpot": 1})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let slo = &r.json()["arbor"]["slo"];
    assert_eq!(slo["model_level"], 1.0, "{slo}");
    assert_eq!(slo["prompt_level"], 1.0, "{slo}");
    assert_eq!(slo["objective"], json!({"ttft": 1.0, "tpot": 1.0}));
    assert!(
        slo["met"].is_boolean()
            && slo["report"]
                .as_str()
                .unwrap()
                .starts_with("slo ttft=1 tpot=1 -> model 1, prompt 1")
    );
    let usage = &r.json()["usage"];
    assert_eq!(usage["prompt_tokens"], slo["prompt_tokens_kept"]);

    let impossible = json!({"ttft": 0.001, "tpot": 0.001, "refuse": true});
    let r = post(addr, "/v1/chat/completions", &body(&id, impossible));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "slo_unmet", "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "arbor.slo");

    let r = post(
        addr,
        "/v1/chat/completions",
        &body(&id, json!({"ttft": 0.001, "tpot": 0.001})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let slo = &r.json()["arbor"]["slo"];
    assert_eq!(slo["predicted_met"], false);
    assert_eq!(slo["met"], false);
    assert!(
        slo["report"].as_str().unwrap().contains(": missed ("),
        "{slo}"
    );
    // The template's tokens stay: the prompt kept is never shorter than them.
    assert!(slo["prompt_tokens_kept"].as_u64().unwrap() > 10);

    for bad in [
        json!({"ttft": 2}),
        json!({"ttft": 0}),
        json!({"tpot": "fast"}),
        json!({"latency": 1}),
    ] {
        let r = post(addr, "/v1/chat/completions", &body(&id, bad.clone()));
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
    }
    // Streaming carries the report on its last chunk with a choice.
    let mut stream = body(&id, json!({"ttft": 1, "tpot": 1}));
    stream["stream"] = json!(true);
    let r = post(addr, "/v1/chat/completions", &stream);
    assert_eq!(r.status, 200);
    assert!(r.body.contains("\"slo\":{"), "{}", r.body);
    let metrics = http(addr, "GET", "/metrics", &[], "").body;
    assert!(metrics.contains("arbor_slo_requests_total 3"), "{metrics}");
    drop(server);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_server_without_levels_refuses_objectives() {
    let path = tiny_model("no-levels", false);
    let config = RunConfig {
        strategy: Some("autoregressive".into()),
        ..RunConfig::default()
    };
    let server = serve(&path, config, ServeOptions::default());
    let addr = server.addr();
    let id = model_id(addr);
    let r = post(
        addr,
        "/v1/chat/completions",
        &body(&id, json!({"ttft": 0.5})),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("not elastic"), "{}", r.body);
    let mut ok = body(&id, json!(null));
    ok["arbor"] = json!({});
    assert_eq!(post(addr, "/v1/chat/completions", &ok).status, 200);
    std::fs::remove_file(path).ok();
}

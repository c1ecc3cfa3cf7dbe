//! Several requests at once (`slots`): their target passes go through the
//! model together, and every request's greedy answer is the one a server
//! with one slot gives it, with a draft too; strategies other than the
//! server's and latency objectives are refused with a reason.

use crate::common;
use common::*;

use arbor_engine::RunConfig;
use arbor_serve::ServeOptions;
use serde_json::{Value, json};

const PROMPTS: [&str; 6] = [
    "Name three colours.",
    "hi",
    "Count to five, please, and then back down to one.",
    "What is a tree?",
    "x",
    "Tell me about the sea and the sky and the rain.",
];

fn ask(addr: std::net::SocketAddr, id: &str, prompt: &str, extra: &Value) -> Value {
    let mut body = json!({
        "model": id,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 24,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let r = post(addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn text(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Each prompt's answer from `addr`, all sent at once.
fn all_at_once(addr: std::net::SocketAddr, id: &str, extra: &Value) -> Vec<String> {
    std::thread::scope(|s| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| s.spawn(move || text(&ask(addr, id, p, extra))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn requests_batched_together_get_their_own_answers() {
    let path = tiny_model("slots", true);
    for strategy in ["autoregressive", "chain"] {
        let config = RunConfig {
            draft: Some(path.to_str().unwrap().into()),
            strategy: Some(strategy.into()),
            max_tokens: Some(24),
            ..RunConfig::default()
        };
        let one = serve(&path, config.clone(), ServeOptions::default());
        let id = model_id(one.addr());
        let alone: Vec<String> = (PROMPTS.iter())
            .map(|p| text(&ask(one.addr(), &id, p, &json!({}))))
            .collect();
        one.shutdown().unwrap();

        let options = ServeOptions {
            slots: 4,
            ..ServeOptions::default()
        };
        let many = serve(&path, config, options);
        let addr = many.addr();
        for round in 0..2 {
            // The second round reuses the slots' caches.
            let together = all_at_once(addr, &id, &json!({}));
            assert_eq!(together, alone, "{strategy}, round {round}");
        }
        let passes = metric(addr, "batched_passes_total");
        let sequences = metric(addr, "batched_sequences_total");
        assert!(
            sequences > 1.2 * passes,
            "{strategy}: {sequences} requests over {passes} passes"
        );
        // One request alone on a server with slots: the same answer.
        let single = text(&ask(addr, &id, PROMPTS[2], &json!({})));
        assert_eq!(single, alone[2]);
        // What needs a server of its own is refused by name.
        let other = if strategy == "chain" {
            "autoregressive"
        } else {
            "chain"
        };
        let mut body = json!({"model": id, "messages": [{"role": "user", "content": "hi"}],
                              "arbor": {"strategy": other}});
        let r = post(addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], "arbor.strategy");
        body["arbor"] = json!({"slo": {"tpot": 0.5}});
        let r = post(addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{}", r.body);
        many.shutdown().unwrap();
    }
    std::fs::remove_file(path).ok();
}

/// A generation that panics on its slot's thread fails its own request
/// with a 500; the target, on the worker's thread, was never in a half
/// state, so requests beside it and after it are served as before.
#[test]
fn a_panic_on_one_slot_fails_only_its_request() {
    let path = tiny_model("slots-panic", true);
    let config = RunConfig {
        strategy: Some("autoregressive".into()),
        max_tokens: Some(24),
        ..RunConfig::default()
    };
    let options = ServeOptions {
        slots: 3,
        fault_trigger: Some("PANIC-NOW".into()),
        ..ServeOptions::default()
    };
    let server = serve(&path, config, options);
    let addr = server.addr();
    let id = model_id(addr);
    let before = text(&ask(addr, &id, PROMPTS[0], &json!({})));
    let (beside, failed) = std::thread::scope(|s| {
        let beside = s.spawn(|| text(&ask(addr, &id, PROMPTS[0], &json!({}))));
        let failed = s.spawn(|| {
            // Greedy: a sampled first token may be the end of text, and
            // the fault fires on the first text.
            let body = json!({"model": id, "max_tokens": 8, "temperature": 0,
                              "messages": [{"role": "user", "content": "PANIC-NOW"}]});
            post(addr, "/v1/chat/completions", &body)
        });
        (beside.join().unwrap(), failed.join().unwrap())
    });
    assert_eq!(failed.status, 500, "{}", failed.body);
    assert_eq!(beside, before);
    assert_eq!(text(&ask(addr, &id, PROMPTS[0], &json!({}))), before);
    assert_eq!(metric(addr, "worker_panics_total"), 1.0);
    assert_eq!(http(addr, "GET", "/health", &[], "").json()["status"], "ok");
    server.shutdown().unwrap();
    std::fs::remove_file(path).ok();
}

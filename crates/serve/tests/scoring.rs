//! The sampling surface OpenAI clients use beyond the filters: `logprobs`
//! list each answer token with its log-probability and the most probable
//! alternatives, and those are the engine's own distribution (a fresh
//! forward pass over the prompt and the answer so far gives the same
//! numbers); penalties and `logit_bias` change the answer, and a
//! speculative strategy under them gives the one-token answer under them.

use crate::common;
use common::*;

use std::collections::HashMap;

use arbor_engine::{BackendKind, Engine, RunConfig};
use arbor_serve::ServeOptions;
use serde_json::{Value, json};

fn plain() -> RunConfig {
    RunConfig {
        strategy: Some("autoregressive".into()),
        max_tokens: Some(12),
        ..RunConfig::default()
    }
}

fn chat(model: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": "Count: one, two,"}],
        "temperature": 0,
        "max_tokens": 10,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    row.iter().map(|&l| l as f64 - max - z.ln()).collect()
}

#[test]
fn logprobs_are_the_engines_distribution_streamed_or_not() {
    let path = tiny_model("logprobs", false);
    let server = serve(&path, plain(), ServeOptions::default());
    let addr = server.addr();
    let id = model_id(addr);
    let body = chat(&id, json!({"logprobs": true, "top_logprobs": 4}));
    let r = post(addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    let n = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(content.len(), n);
    assert!(n > 0);
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    let bytes: Vec<u8> = (content.iter())
        .flat_map(|e| e["bytes"].as_array().unwrap().iter())
        .map(|b| b.as_u64().unwrap() as u8)
        .collect();
    assert_eq!(String::from_utf8_lossy(&bytes), text);

    // The numbers are the engine's: one forward pass over the prompt and
    // the answer so far, row by row.
    let prompt: Vec<u32> = {
        let messages = &body["messages"];
        let r = post(addr, "/tokenize", &json!({"messages": messages}));
        (r.json()["tokens"].as_array().unwrap().iter())
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    let mut engine = Engine::load(&path, BackendKind::Candle, &mut |_, _| {}).unwrap();
    let by_bytes: HashMap<Vec<u8>, u32> = (0..engine.tokenizer().vocab_size() as u32)
        .filter_map(|t| Some((engine.tokenizer().token_bytes(t).ok()?.to_vec(), t)))
        .collect();
    let id_of = |e: &Value| -> u32 {
        let b: Vec<u8> = (e["bytes"].as_array().unwrap().iter())
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        by_bytes[&b]
    };
    let mut seen = prompt.clone();
    for e in content {
        let model = engine.model_mut();
        model.truncate_cache(0).unwrap();
        let row = model.step(&seen).unwrap();
        let lp = log_softmax(&row);
        let token = id_of(e);
        let logprob = e["logprob"].as_f64().unwrap();
        assert!(
            (logprob - lp[token as usize]).abs() < 1e-3,
            "{e} vs {}",
            lp[token as usize]
        );
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 4);
        // Greedy: the chosen token is the most probable one.
        assert_eq!(id_of(&top[0]), token, "{e}");
        let mut best: Vec<(usize, f64)> = lp.iter().copied().enumerate().collect();
        best.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for (t, (want, want_lp)) in top.iter().zip(best) {
            assert_eq!(id_of(t) as usize, want, "{e}");
            assert!((t["logprob"].as_f64().unwrap() - want_lp).abs() < 1e-3);
        }
        seen.push(token);
    }

    // Streamed: the same entries, in a chunk of their own before the end.
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let data = Events::open(addr, "/v1/chat/completions", &stream_body).rest();
    let streamed: Vec<Value> = (data.iter())
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .flat_map(|c| {
            let lp = &c["choices"][0]["logprobs"];
            lp["content"].as_array().cloned().unwrap_or_default()
        })
        .collect();
    assert_eq!(&streamed, content);

    // Completions: parallel lists, the count of alternatives in `logprobs`.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": id, "prompt": "one, two,", "max_tokens": 5, "temperature": 0,
                "logprobs": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let lp = &r.json()["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), lp["token_logprobs"].as_array().unwrap().len());
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(lp["text_offset"][0], 0);
    server.shutdown().unwrap();
    std::fs::remove_file(path).ok();
}

#[test]
fn penalties_and_biases_steer_the_answer_with_a_draft_too() {
    let path = tiny_model("penalties", false);
    let config = RunConfig {
        draft: Some(path.to_str().unwrap().into()),
        ..plain()
    };
    let server = serve(&path, config, ServeOptions::default());
    let addr = server.addr();
    let id = model_id(addr);
    let answer = |extra: Value| -> (String, Value) {
        let r = post(addr, "/v1/chat/completions", &chat(&id, extra));
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let text = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        (text, v)
    };
    let (free, _) = answer(json!({}));
    // `x` (byte 120) pushed far up: the answer is all x.
    let (xs, _) = answer(json!({"logit_bias": {"120": 100}}));
    assert_eq!(xs, "x".repeat(10));
    // Penalties: a token said again costs more each time, so an answer
    // that repeats itself changes.
    let repeats = free.len() > free.chars().collect::<std::collections::HashSet<_>>().len();
    assert!(repeats, "the free answer repeats a byte: {free:?}");
    let tired = json!({"frequency_penalty": 2, "presence_penalty": 2});
    let (t, _) = answer(tired.clone());
    assert_ne!(t, free);
    // A request's strategy is the one that runs: the model is its own
    // draft, so unshaped, a chain's and a static tree's guesses are taken
    // several to a pass (shaped requests' drafts propose unshaped tokens).
    for strategy in ["chain", "static-tree"] {
        let (text, v) = answer(json!({"arbor": {"strategy": strategy}}));
        assert_eq!(text, free, "{strategy}");
        let per_pass = v["arbor"]["tokens_per_pass"].as_f64().unwrap();
        assert!(per_pass > 1.0, "{strategy}: {per_pass} tokens per pass");
    }
    // Every strategy gives the shaped one-token answer.
    for strategy in ["chain", "tree", "static-tree"] {
        for extra in [
            json!({"logit_bias": {"120": 100}}),
            tired.clone(),
            json!({"presence_penalty": 1.5}),
        ] {
            let mut with = extra.clone();
            with["arbor"] = json!({"strategy": strategy});
            let (spec, v) = answer(with);
            let (one, _) = answer(extra.clone());
            assert_eq!(spec, one, "{strategy} {extra}");
            assert_eq!(v["arbor"]["strategy"], strategy);
        }
    }
    server.shutdown().unwrap();
    std::fs::remove_file(path).ok();
}

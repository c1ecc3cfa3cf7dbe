//! A server on 127.0.0.1 over a tiny random model (or SmolLM2 when it is
//! cached), and a plain HTTP/1.1 client for it: whole responses, and
//! server-sent events read as they arrive.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use arbor_engine::{Engine, RunConfig};
use arbor_model::testing::TinyModel;
use arbor_serve::{ServeOptions, Server};

/// The chat tokens after the 256 bytes.
pub use arbor_model::testing::BYTE_SPECIALS as SPECIALS;

/// A random qwen2-shaped model whose vocabulary is the 256 bytes and the
/// ChatML tokens (its chat prompts fall back to ChatML), written to a
/// temporary file; `big` makes its passes take milliseconds, and a big
/// one has no end token (it always runs to its token limit).
pub fn tiny_model(tag: &str, big: bool) -> PathBuf {
    let vocab = 256 + SPECIALS.len();
    let model = match big {
        false => TinyModel {
            arch: "qwen2",
            vocab,
            seed: 7,
            ..TinyModel::default()
        },
        true => TinyModel {
            arch: "qwen2",
            vocab,
            hidden: 512,
            heads: 8,
            kv_heads: 2,
            ffn: 1536,
            layers: 8,
            seed: 8,
            ..TinyModel::default()
        },
    };
    let mut w = model.writer();
    arbor_model::testing::add_byte_tokenizer(&mut w, (!big).then_some(258));
    let path = std::env::temp_dir().join(format!("arbor-serve-{tag}-{}.gguf", std::process::id()));
    w.write(&path).unwrap();
    path
}

/// A server over the model at `path`.
pub fn serve(path: &std::path::Path, config: RunConfig, options: ServeOptions) -> Server {
    let config = RunConfig {
        target: Some(path.to_str().unwrap().into()),
        backend: Some("candle".into()),
        ..config
    };
    let run = Engine::open(&config, &mut |_| {}).unwrap();
    arbor_serve::start(run, ServeOptions { port: 0, ..options }).unwrap()
}

pub use arbor_serve::client::{Events as RawEvents, Response};

pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response {
    arbor_serve::client::http(addr, method, path, headers, body).unwrap()
}

pub fn post(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Response {
    http(addr, "POST", path, &[], &body.to_string())
}

/// Server-sent events as they arrive.
pub struct Events;

impl Events {
    pub fn open(addr: SocketAddr, path: &str, body: &serde_json::Value) -> RawEvents {
        RawEvents::open(addr, path, body).unwrap()
    }
}

/// A metric's value from `/metrics`.
pub fn metric(addr: SocketAddr, name: &str) -> f64 {
    arbor_serve::client::metric(addr, name).unwrap_or_else(|| panic!("no metric {name}"))
}

//! A server on 127.0.0.1 over a tiny random model (or SmolLM2 when it is
//! cached), and a plain HTTP/1.1 client for it: whole responses, and
//! server-sent events read as they arrive.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use arbor_engine::{Config, Engine, LanguageModel, Logits, Mask, RunConfig};
use arbor_model::Result as ModelResult;
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

/// The id of the one model the server at `addr` serves.
pub fn model_id(addr: SocketAddr) -> String {
    let models = http(addr, "GET", "/v1/models", &[], "").json();
    models["data"][0]["id"].as_str().unwrap().to_string()
}

/// A metric's value from `/metrics`.
pub fn metric(addr: SocketAddr, name: &str) -> f64 {
    arbor_serve::client::metric(addr, name).unwrap_or_else(|| panic!("no metric {name}"))
}

/// Lets a model's passes through only as the test allows: a server's
/// generation then stands at a known pass while the test does something
/// (moves the clock, sends another request, leaves). Waits end with a
/// panic after a minute, so a mistake fails instead of hanging.
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<Passes>, Condvar)>);

#[derive(Default)]
pub struct Passes {
    /// Passes that may still start; `None`: any number.
    permits: Option<usize>,
    /// Passes that asked to start, and those that finished.
    pub asked: usize,
    pub done: usize,
}

const STUCK: Duration = Duration::from_secs(60);

impl Gate {
    /// A gate that lets `n` passes through, then holds the next.
    pub fn allowing(n: usize) -> Self {
        let gate = Gate::default();
        gate.0.0.lock().unwrap().permits = Some(n);
        gate
    }

    /// Lets `n` more passes through.
    pub fn allow(&self, n: usize) {
        let mut p = self.0.0.lock().unwrap();
        p.permits = p.permits.map(|k| k + n);
        self.0.1.notify_all();
    }

    /// Lets every pass through from now on.
    pub fn open(&self) {
        self.0.0.lock().unwrap().permits = None;
        self.0.1.notify_all();
    }

    /// Waits until `until` holds of the counts, and returns them.
    pub fn wait(&self, what: &str, until: impl Fn(&Passes) -> bool) -> (usize, usize) {
        let p = self.0.0.lock().unwrap();
        let (p, timeout) = (self.0.1)
            .wait_timeout_while(p, STUCK, |p| !until(p))
            .unwrap();
        assert!(!timeout.timed_out(), "the model never got to: {what}");
        (p.asked, p.done)
    }

    fn enter(&self) {
        let mut p = self.0.0.lock().unwrap();
        p.asked += 1;
        self.0.1.notify_all();
        let (mut p, timeout) = (self.0.1)
            .wait_timeout_while(p, STUCK, |p| p.permits == Some(0))
            .unwrap();
        assert!(!timeout.timed_out(), "a pass was held for a minute");
        p.permits = p.permits.map(|k| k - 1);
    }

    fn leave(&self) {
        self.0.0.lock().unwrap().done += 1;
        self.0.1.notify_all();
    }
}

/// A model whose passes go through a [`Gate`].
struct Paced {
    inner: Box<dyn LanguageModel>,
    gate: Gate,
}

impl LanguageModel for Paced {
    fn forward(&mut self, t: &[u32], p: &[u32], m: &Mask, rows: &[usize]) -> ModelResult<Logits> {
        self.gate.enter();
        let out = self.inner.forward(t, p, m, rows);
        self.gate.leave();
        out
    }
    fn keep_last_pass(&mut self, on: bool) -> bool {
        self.inner.keep_last_pass(on)
    }
    fn later_logits(&mut self, rows: &[usize]) -> ModelResult<Option<Logits>> {
        self.inner.later_logits(rows)
    }
    fn cache_len(&self) -> usize {
        self.inner.cache_len()
    }
    fn truncate_cache(&mut self, len: usize) -> ModelResult<()> {
        self.inner.truncate_cache(len)
    }
    fn keep_cache(&mut self, positions: &[usize]) -> ModelResult<()> {
        self.inner.keep_cache(positions)
    }
    fn config(&self) -> &Config {
        self.inner.config()
    }
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
}

/// A run over the model at `path` whose target passes go through `gate`.
pub fn paced_run(path: &std::path::Path, config: RunConfig, gate: &Gate) -> arbor_engine::Run {
    let config = RunConfig {
        target: Some(path.to_str().unwrap().into()),
        backend: Some("candle".into()),
        ..config
    };
    let mut run = Engine::open(&config, &mut |_| {}).unwrap();
    let gate = gate.clone();
    (run.engine_mut()).wrap_model(move |inner| Box::new(Paced { inner, gate }));
    run
}

/// A server over the model at `path` whose target passes go through
/// `gate`.
pub fn serve_paced(
    path: &std::path::Path,
    config: RunConfig,
    options: ServeOptions,
    gate: &Gate,
) -> Server {
    let run = paced_run(path, config, gate);
    arbor_serve::start(run, ServeOptions { port: 0, ..options }).unwrap()
}

//! `arbor_llm`: arbor for Python. A `Model` opens a session of the `arbor`
//! crate; `generate` and `chat` return a `Reply`, a Python iterator of
//! text pieces. Each reply runs on a thread of its own with the GIL
//! released while Python waits for the next piece; dropping a reply (or
//! `Reply.cancel()`) stops it within one forward pass.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;

pyo3::create_exception!(arbor_llm, ArborError, PyException, "An error of arbor.");
pyo3::create_exception!(
    arbor_llm,
    InvalidOptionError,
    ArborError,
    "An option out of range (raised before anything loads)."
);

fn py_err(e: arbor::Error) -> PyErr {
    match e {
        arbor::Error::InvalidOption { .. } => InvalidOptionError::new_err(e.to_string()),
        e => ArborError::new_err(e.to_string()),
    }
}

/// A model (and draft) loaded once, replying to one request at a time.
#[pyclass(module = "arbor_llm")]
struct Model {
    session: Arc<Mutex<arbor::Session>>,
    /// Most new tokens of a reply that does not say.
    max_tokens: usize,
}

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (
        model, *, draft=None, strategy=None, memory_budget=None, backend=None, threads=None,
        max_tokens=128, temperature=0.0, top_k=0, top_p=1.0, seed=None, level=None, context=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: String,
        draft: Option<String>,
        strategy: Option<String>,
        memory_budget: Option<u64>,
        backend: Option<String>,
        threads: Option<usize>,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        seed: Option<u64>,
        level: Option<f64>,
        context: Option<usize>,
    ) -> PyResult<Self> {
        let mut b = arbor::Builder::new()
            .model(model)
            .max_tokens(max_tokens)
            .temperature(temperature)
            .top_k(top_k)
            .top_p(top_p);
        if let Some(d) = draft {
            b = b.draft(d);
        }
        if let Some(s) = strategy {
            b = b.strategy(s);
        }
        if let Some(bytes) = memory_budget {
            b = b.memory_budget(bytes);
        }
        if let Some(name) = backend {
            let kind = (name.parse::<arbor::Backend>())
                .map_err(|e| InvalidOptionError::new_err(format!("backend: {e}")))?;
            b = b.backend(kind);
        }
        if let Some(n) = threads {
            b = b.threads(n);
        }
        if let Some(s) = seed {
            b = b.seed(s);
        }
        if let Some(l) = level {
            b = b.level(l);
        }
        if let Some(c) = context {
            b = b.context(c);
        }
        let session = py.detach(|| b.build()).map_err(py_err)?;
        Ok(Self {
            session: Arc::new(Mutex::new(session)),
            max_tokens,
        })
    }

    /// Generates from `prompt` as it is (no chat template).
    #[pyo3(signature = (prompt, *, max_tokens=None))]
    fn generate(&self, prompt: String, max_tokens: Option<usize>) -> PyResult<Reply> {
        self.start(Request::Text(prompt), max_tokens)
    }

    /// Replies to `messages` (dicts with `role` and `content`), written with
    /// the model's chat template.
    #[pyo3(signature = (messages, *, max_tokens=None))]
    fn chat(&self, messages: Vec<Bound<'_, PyDict>>, max_tokens: Option<usize>) -> PyResult<Reply> {
        let messages = messages
            .iter()
            .map(message)
            .collect::<PyResult<Vec<arbor::Message>>>()?;
        self.start(Request::Chat(messages), max_tokens)
    }

    /// The strategy in use (after `auto`, the one it chose).
    #[getter]
    fn strategy(&self) -> PyResult<String> {
        lock(&self.session).strategy().map_err(py_err)
    }
}

/// A lock, even one a panicking thread held: the session's own thread
/// catches a generation's panic (the session says `Closed` from then on),
/// and the other guarded values stay whole.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn message(d: &Bound<'_, PyDict>) -> PyResult<arbor::Message> {
    let get = |key: &str| -> PyResult<String> {
        d.get_item(key)?
            .ok_or_else(|| InvalidOptionError::new_err(format!("a message needs `{key}`")))?
            .extract()
    };
    let role = match get("role")?.as_str() {
        "system" => arbor::Role::System,
        "user" => arbor::Role::User,
        "assistant" => arbor::Role::Assistant,
        "tool" => arbor::Role::Tool,
        other => {
            return Err(InvalidOptionError::new_err(format!(
                "role must be system, user, assistant or tool, got {other:?}"
            )));
        }
    };
    Ok(arbor::Message::new(role, get("content")?))
}

enum Request {
    Text(String),
    Chat(Vec<arbor::Message>),
}

enum Msg {
    Piece(String),
    Done(arbor::Result<arbor::Reply>),
}

/// How Python stops a reply: the flag is set first, then the handle (once
/// the reply's thread has put it there) is told.
#[derive(Default)]
struct Stop {
    wanted: AtomicBool,
    handle: Mutex<Option<arbor::CancelHandle>>,
}

impl Stop {
    fn request(&self) {
        self.wanted.store(true, Ordering::SeqCst);
        if let Some(h) = &*lock(&self.handle) {
            h.cancel();
        }
    }

    fn attach(&self, h: arbor::CancelHandle) {
        *lock(&self.handle) = Some(h.clone());
        if self.wanted.load(Ordering::SeqCst) {
            h.cancel();
        }
    }
}

impl Model {
    fn start(&self, request: Request, max_tokens: Option<usize>) -> PyResult<Reply> {
        if max_tokens == Some(0) {
            return Err(InvalidOptionError::new_err(
                "max_tokens: must be at least 1",
            ));
        }
        let max_tokens = max_tokens.unwrap_or(self.max_tokens);
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(Stop::default());
        let session = self.session.clone();
        let stopper = stop.clone();
        std::thread::Builder::new()
            .name("arbor-llm-reply".into())
            .spawn(move || {
                let mut session = lock(&session);
                let done = reply_on(&mut session, request, max_tokens, &stopper, &tx);
                let _ = tx.send(Msg::Done(done));
            })
            .map_err(|e| ArborError::new_err(format!("starting a thread: {e}")))?;
        Ok(Reply {
            pieces: Mutex::new(Some(rx)),
            stop,
            finished: Mutex::new(None),
        })
    }
}

/// Runs one reply on `session`, sending its pieces.
fn reply_on(
    session: &mut arbor::Session,
    request: Request,
    max_tokens: usize,
    stop: &Stop,
    tx: &mpsc::Sender<Msg>,
) -> arbor::Result<arbor::Reply> {
    session.set_max_tokens(max_tokens)?;
    let mut stream = match &request {
        Request::Text(prompt) => session.generate(prompt)?,
        Request::Chat(messages) => session.chat(messages)?,
    };
    stop.attach(stream.cancel_handle());
    for piece in &mut stream {
        // Python stopped listening: the flag is set, the pieces go nowhere.
        let _ = tx.send(Msg::Piece(piece?));
    }
    stream.finish()
}

/// A reply as it is generated: iterate it for text pieces; `finish()`
/// waits for the end and gives the text, token ids and statistics.
#[pyclass(module = "arbor_llm")]
struct Reply {
    /// Taken out while a piece is awaited without the GIL.
    pieces: Mutex<Option<mpsc::Receiver<Msg>>>,
    stop: Arc<Stop>,
    /// The outcome, once received.
    finished: Mutex<Option<Result<arbor::Reply, String>>>,
}

impl Reply {
    /// The next piece, or `None` at the end (the outcome kept).
    fn next_piece(&self, py: Python<'_>) -> PyResult<Option<String>> {
        if lock(&self.finished).is_some() {
            return Ok(None);
        }
        // The lock is not held without the GIL: another thread reading the
        // same reply meanwhile gets an error, not a deadlock.
        let taken = lock(&self.pieces).take();
        let rx =
            taken.ok_or_else(|| ArborError::new_err("another thread is reading this reply"))?;
        let (msg, rx) = py.detach(move || (rx.recv(), rx));
        *lock(&self.pieces) = Some(rx);
        match msg {
            Ok(Msg::Piece(p)) => Ok(Some(p)),
            Ok(Msg::Done(outcome)) => {
                let kept = outcome.map_err(|e| e.to_string());
                *lock(&self.finished) = Some(kept);
                Ok(None)
            }
            Err(_) => Err(ArborError::new_err(
                "the reply's thread ended without a result",
            )),
        }
    }
}

#[pymethods]
impl Reply {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        match self.next_piece(py)? {
            Some(p) => Ok(Some(p)),
            None => match &*lock(&self.finished) {
                Some(Err(e)) => Err(ArborError::new_err(e.clone())),
                _ => Ok(None),
            },
        }
    }

    /// Stops the reply within one forward pass; it keeps its text so far.
    fn cancel(&self) {
        self.stop.request();
    }

    /// Waits for the end; returns `{"text", "tokens", "stats"}`.
    fn finish<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        while self.next_piece(py)?.is_some() {}
        let finished = lock(&self.finished);
        let reply = match finished.as_ref() {
            Some(Ok(r)) => r,
            Some(Err(e)) => return Err(ArborError::new_err(e.clone())),
            None => return Err(ArborError::new_err("the reply has no result")),
        };
        let s = &reply.stats;
        let stats = PyDict::new(py);
        stats.set_item("prompt_tokens", s.prompt_tokens)?;
        stats.set_item("generated_tokens", s.generated_tokens)?;
        stats.set_item("prefill_seconds", s.prefill_seconds)?;
        stats.set_item("decode_seconds", s.decode_seconds)?;
        stats.set_item("tokens_per_second", s.tokens_per_second)?;
        stats.set_item("tokens_per_pass", s.tokens_per_pass)?;
        stats.set_item("streamed_bytes", s.streamed_bytes)?;
        stats.set_item("peak_memory", s.peak_memory)?;
        stats.set_item("stop", stop_name(s.stop))?;
        let out = PyDict::new(py);
        out.set_item("text", &reply.text)?;
        out.set_item("tokens", &reply.tokens)?;
        out.set_item("stats", stats)?;
        Ok(out)
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        self.stop.request();
    }
}

fn stop_name(s: arbor::StopReason) -> &'static str {
    match s {
        arbor::StopReason::MaxTokens => "max_tokens",
        arbor::StopReason::StopToken => "stop_token",
        arbor::StopReason::ContextFull => "context_full",
        arbor::StopReason::Cancelled => "cancelled",
    }
}

#[pymodule]
fn arbor_llm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_class::<Reply>()?;
    m.add("ArborError", m.py().get_type::<ArborError>())?;
    m.add(
        "InvalidOptionError",
        m.py().get_type::<InvalidOptionError>(),
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

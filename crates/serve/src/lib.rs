//! `arbor serve`: an OpenAI-compatible HTTP server over one engine run.
//!
//! The models load once, into a [`Run`] that one worker thread owns
//! ([`worker`]); requests wait for it in a bounded FIFO (full: 429 with
//! `Retry-After`), each with a deadline that counts its wait. Handlers
//! ([`routes`]) check and tokenize a request, queue it and turn what the
//! worker sends back into an OpenAI response or server-sent events. A client
//! that disconnects, or a request past its deadline, stops its generation
//! within one pass. A request that extends the last one's conversation
//! reuses its keys and values (the run's prompt cache). SIGTERM or Ctrl-C
//! stops accepting connections and lets the requests in flight finish.

pub mod api;
pub mod client;
pub mod clock;
pub mod error;
pub mod metrics;
mod routes;
pub mod stops;
pub mod worker;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arbor_engine::{Run, Tokenizer};
use tokio::sync::{mpsc, oneshot};

pub use clock::Clock;
pub use error::ApiError;
pub use metrics::Metrics;

/// How the server listens and admits requests.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeOptions {
    pub host: String,
    /// 0 picks a free port (tests).
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` when set; without it any key
    /// (or none) is accepted.
    pub api_key: Option<String>,
    /// Requests that may wait for the engine.
    pub queue: usize,
    /// Per request, queue wait included.
    pub timeout: Duration,
    /// Largest request body, bytes.
    pub body_limit: usize,
    /// The model id `/v1/models` lists and requests must name (defaults to
    /// the target file's stem).
    pub model_id: Option<String>,
    /// An elastic target's objective tables: requests may then carry an
    /// `arbor.slo` (without them such requests are refused).
    pub slo: Option<arbor_engine::slo::SloTables>,
    /// What deadlines are read from: the system clock, or a test's.
    pub clock: Clock,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            queue: 16,
            timeout: Duration::from_secs(300),
            body_limit: 1 << 20,
            model_id: None,
            slo: None,
            clock: Clock::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Engine(#[from] arbor_engine::EngineError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A running server (see [`start`]).
pub struct Server {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServeError>>>,
}

impl Server {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting connections, lets requests in flight finish, and
    /// waits for the server and its worker to end.
    pub fn shutdown(mut self) -> Result<(), ServeError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), ServeError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(ServeError::Invalid("the server thread panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Binds and serves `run` on threads of its own; returns once it listens.
pub fn start(run: Run, options: ServeOptions) -> Result<Server, ServeError> {
    let (tx, rx) = oneshot::channel();
    let (addr, thread) = launch(run, options, async {
        let _ = rx.await;
    })?;
    Ok(Server {
        addr,
        shutdown: Some(tx),
        thread: Some(thread),
    })
}

/// Serves `run` until SIGTERM or Ctrl-C, then lets requests in flight
/// finish; `ready` hears the address once it listens.
pub fn serve_until_signal(
    run: Run,
    options: ServeOptions,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let (addr, thread) = launch(run, options, shutdown_signal())?;
    ready(addr);
    thread
        .join()
        .map_err(|_| ServeError::Invalid("the server thread panicked".into()))?
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

type Launched = (SocketAddr, std::thread::JoinHandle<Result<(), ServeError>>);

/// Binds (in the caller, so a taken port is its error), then runs the
/// worker and the HTTP server on threads until `stop` completes.
fn launch(
    mut run: Run,
    options: ServeOptions,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Launched, ServeError> {
    if options.queue == 0 {
        return Err(ServeError::Invalid("--queue must be at least 1".into()));
    }
    let at = format!("{}:{}", options.host, options.port);
    let listener = std::net::TcpListener::bind(&at).map_err(|source| ServeError::Bind {
        addr: at.clone(),
        source,
    })?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let metrics = Arc::new(Metrics::default());
    // The handlers' own tokenizer (the worker's is inside the run).
    let file = arbor_gguf::GgufFile::open(run.engine().path())
        .map_err(|e| ServeError::Engine(e.into()))?;
    let tokenizer =
        Tokenizer::from_gguf(file.header()).map_err(|e| ServeError::Engine(e.into()))?;
    drop(file);
    // A conversation's next turn prefills only its new tokens.
    run.set_prompt_cache(true);
    let (jobs, queue) = mpsc::channel(options.queue);
    let slo = options.slo.clone();
    let state = routes::State::new(&run, &options, jobs, Arc::new(tokenizer), metrics.clone());
    let worker = std::thread::Builder::new()
        .name("arbor-serve-worker".into())
        .spawn(move || worker::run_worker(run, queue, metrics, slo))?;
    let app = routes::router(state, options.body_limit);
    let thread = std::thread::Builder::new()
        .name("arbor-serve".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                axum::serve(listener, app)
                    .with_graceful_shutdown(stop)
                    .await
            })?;
            // The router (and with it the queue's senders) is gone: the
            // worker finishes its job and ends.
            worker
                .join()
                .map_err(|_| ServeError::Invalid("the worker thread panicked".into()))
        })?;
    Ok((addr, thread))
}

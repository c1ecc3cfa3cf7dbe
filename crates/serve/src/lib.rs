//! `arbor serve`: an OpenAI-compatible HTTP server over one engine run.
//!
//! The server binds first, then one worker thread loads the models into a
//! [`Run`] it owns ([`worker`]; `/health` says `loading` meanwhile, and
//! requests get 503). A generation that panics fails its request with a
//! 500 and the worker loads the run again. Requests wait for the worker in
//! a bounded FIFO (full: 429 with `Retry-After`), each with a deadline that
//! counts its wait. Handlers
//! (`routes`) check and tokenize a request, queue it and turn what the
//! worker sends back into an OpenAI response or server-sent events. A client
//! that disconnects, or a request past its deadline, stops its generation
//! within one pass. A request that extends the last one's conversation
//! reuses its keys and values (the run's prompt cache). SIGTERM or Ctrl-C
//! stops accepting connections and lets the requests in flight finish; a
//! second one exits at once.

pub mod api;
pub mod client;
pub mod clock;
pub mod error;
pub mod fields;
pub mod metrics;
mod respond;
mod routes;
pub mod scoring;
pub mod slots;
pub mod status;
pub mod stops;
mod structured;
pub mod tools;
pub mod worker;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arbor_engine::Run;
use arbor_engine::slo::SloTables;
use tokio::sync::{mpsc, oneshot};

/// The axum this crate's router is made with (see [`embed`]).
pub use axum;
pub use clock::Clock;
pub use error::ApiError;
pub use metrics::Metrics;
pub use status::Phase;

/// How the server listens and admits requests.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeOptions {
    pub host: String,
    /// 0 picks a free port (tests).
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` when set (compared in
    /// constant time); without it any key (or none) is accepted.
    pub api_key: Option<String>,
    /// The one web origin browsers may call the server from (CORS); `None`:
    /// no cross-origin access.
    pub cors: Option<String>,
    /// Special-token text inside chat messages becomes the special tokens
    /// (only for servers whose every user may write the system prompt);
    /// off: it is encoded as the characters it is.
    pub special_tokens_in_content: bool,
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
    /// Tests only: a request whose body holds this text makes its
    /// generation panic at its first token.
    #[doc(hidden)]
    pub fault_trigger: Option<String>,
    /// Requests served at once, their target passes batched (see
    /// [`slots`]); 1 serves one at a time.
    pub slots: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            cors: None,
            special_tokens_in_content: false,
            queue: 16,
            timeout: Duration::from_secs(300),
            body_limit: 1 << 20,
            model_id: None,
            slo: None,
            clock: Clock::default(),
            fault_trigger: None,
            slots: 1,
        }
    }
}

/// What a server serves: the run, and an elastic target's objective
/// tables (else [`ServeOptions::slo`]'s).
pub struct Served {
    pub run: Run,
    pub slo: Option<SloTables>,
}

impl From<Run> for Served {
    fn from(run: Run) -> Self {
        Self { run, slo: None }
    }
}

/// Opens the run to serve; called once at start and again after a
/// generation panics. The error is shown in `/health` and in 503s.
pub type Loader = Box<dyn FnMut() -> Result<Served, String> + Send>;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    /// The run could not be loaded (or reloaded after a panic).
    #[error("loading the model: {0}")]
    Load(String),
    #[error(transparent)]
    Engine(#[from] arbor_engine::EngineError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A running server (see [`start`]).
pub struct Server {
    addr: SocketAddr,
    status: Arc<status::Status>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServeError>>>,
}

impl Server {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the first load ends: `Ready`, or `Failed` with why.
    pub fn wait_loaded(&self) -> Phase {
        self.status.wait_loaded()
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

/// Binds and serves `run` on threads of its own; returns once it listens
/// and the run is in place. It cannot be reloaded: a generation that panics
/// leaves this server failed (use [`start_with`] to reload).
pub fn start(run: Run, options: ServeOptions) -> Result<Server, ServeError> {
    let server = start_with(loaded(run), options)?;
    server.wait_loaded();
    Ok(server)
}

/// A loader that hands over a run opened already, once: a generation that
/// panics leaves the server failed.
pub fn loaded(run: Run) -> Loader {
    let mut once = Some(run);
    Box::new(move || {
        (once.take().map(Served::from))
            .ok_or_else(|| "this server was given a loaded run and cannot load it again".into())
    })
}

/// Binds, then loads on the worker thread with `load`; returns once it
/// listens (see [`Server::wait_loaded`]).
pub fn start_with(load: Loader, options: ServeOptions) -> Result<Server, ServeError> {
    let (tx, rx) = oneshot::channel();
    let (addr, status, thread) = launch(load, options, async {
        let _ = rx.await;
    })?;
    Ok(Server {
        addr,
        status,
        shutdown: Some(tx),
        thread: Some(thread),
    })
}

/// Serves what `load` opens until SIGTERM or Ctrl-C, then lets requests in
/// flight finish; a second signal calls `exit` (the CLI exits the process
/// there). `ready` hears the address once it listens (before the load).
pub fn serve_until_signal(
    load: Loader,
    options: ServeOptions,
    ready: impl FnOnce(SocketAddr),
    exit: impl FnOnce() + Send + 'static,
) -> Result<(), ServeError> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("arbor-serve-signals".into())
        .spawn(move || forward_signals(tx))?;
    serve_until(load, options, rx, ready, exit)
}

/// [`serve_until_signal`] with the signals as a channel: the first message
/// starts a graceful shutdown, the second calls `exit`.
pub fn serve_until(
    load: Loader,
    options: ServeOptions,
    mut signals: mpsc::UnboundedReceiver<()>,
    ready: impl FnOnce(SocketAddr),
    exit: impl FnOnce() + Send + 'static,
) -> Result<(), ServeError> {
    let (first_tx, first_rx) = oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("arbor-serve-stop".into())
        .spawn(move || {
            if signals.blocking_recv().is_none() {
                return;
            }
            let _ = first_tx.send(());
            if signals.blocking_recv().is_some() {
                exit();
            }
        })?;
    // A model that cannot be loaded stops the server too: nothing would
    // ever be served.
    let (failed_tx, failed_rx) = oneshot::channel::<()>();
    let stop = async {
        tokio::select! {
            _ = first_rx => {}
            _ = failed_rx => {}
        }
    };
    let (addr, status, thread) = launch(load, options, stop)?;
    {
        let status = status.clone();
        std::thread::Builder::new()
            .name("arbor-serve-watch".into())
            .spawn(move || {
                status.wait_failed();
                let _ = failed_tx.send(());
            })?;
    }
    ready(addr);
    thread
        .join()
        .map_err(|_| ServeError::Invalid("the server thread panicked".into()))??;
    match status.phase() {
        Phase::Failed(why) => Err(ServeError::Load(why)),
        _ => Ok(()),
    }
}

/// Sends one message per SIGTERM or Ctrl-C, for as long as anyone listens.
fn forward_signals(tx: mpsc::UnboundedSender<()>) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    runtime.block_on(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return;
            };
            loop {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                if tx.send(()).is_err() {
                    return;
                }
            }
        }
        #[cfg(not(unix))]
        loop {
            if tokio::signal::ctrl_c().await.is_err() || tx.send(()).is_err() {
                return;
            }
        }
    });
}

type Launched = (
    SocketAddr,
    Arc<status::Status>,
    std::thread::JoinHandle<Result<(), ServeError>>,
);

/// The routes of the server and the worker behind them, to serve inside an
/// axum application of one's own (nested under a prefix, say, beside other
/// routes): [`embed`] makes them.
pub struct Worker {
    status: Arc<status::Status>,
    thread: std::thread::JoinHandle<()>,
}

impl Worker {
    /// Blocks until the first load ends: `Ready`, or `Failed` with why.
    pub fn wait_loaded(&self) -> Phase {
        self.status.wait_loaded()
    }

    /// Waits for the worker to end, which it does once every copy of its
    /// router is dropped and the job in hand is done.
    pub fn join(self) -> Result<(), ServeError> {
        (self.thread.join()).map_err(|_| ServeError::Invalid("the worker thread panicked".into()))
    }
}

/// The server's routes (`/v1/chat/completions`, `/v1/completions`,
/// `/health`, `/metrics`, …) as an [`axum::Router`] with no listener, and
/// the worker thread that loads the run with `load` and serves the routes'
/// requests. `host` and `port` of `options` are not used.
pub fn embed(load: Loader, options: ServeOptions) -> Result<(axum::Router, Worker), ServeError> {
    if options.queue == 0 {
        return Err(ServeError::Invalid("--queue must be at least 1".into()));
    }
    let metrics = Arc::new(Metrics::default());
    let status = Arc::new(status::Status::default());
    let (jobs, queue) = mpsc::channel(options.queue);
    let app = routes::router(&options, jobs, metrics.clone(), status.clone())?;
    let thread = {
        let status = status.clone();
        std::thread::Builder::new()
            .name("arbor-serve-worker".into())
            .spawn(move || match options.slots {
                0 | 1 => worker::run_worker(load, queue, metrics, status, options),
                n => slots::run_slots(load, queue, metrics, status, options, n),
            })?
    };
    Ok((app, Worker { status, thread }))
}

/// Binds (in the caller, so a taken port is its error), then runs the
/// worker (which loads the run) and the HTTP server on threads until
/// `stop` completes.
fn launch(
    load: Loader,
    options: ServeOptions,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Launched, ServeError> {
    let at = format!("{}:{}", options.host, options.port);
    let listener = std::net::TcpListener::bind(&at).map_err(|source| ServeError::Bind {
        addr: at.clone(),
        source,
    })?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let (app, worker) = embed(load, options)?;
    let status = worker.status.clone();
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
            worker.join()
        })?;
    Ok((addr, status, thread))
}

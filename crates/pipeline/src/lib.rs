//! Decoder layers that do not fit the memory budget, streamed from disk.
//!
//! [`plan`] splits a budget between what must stay in memory (everything but
//! the decoder layers: the draft, the head, KV caches, the runtime itself),
//! the layers that also fit, and a bounded streaming reserve. The layers left
//! over are spread evenly through the stack, so the loader always has some
//! resident layers' compute to hide the next read behind.
//!
//! A [`Streamer`] is the decoder's [`LayerSource`] for those layers. It reads
//! a layer's tensors with direct IO (nothing lands in the page cache, which a
//! memory limit would count and then evict), builds the backend weights, and
//! lends them for one forward pass; every byte it holds is reserved on a
//! [`Ledger`] first, so it cannot exceed its share of the budget.
//! - [`Mode::OnDemand`] loads each layer when the forward pass asks for it
//!   (compute waits for every read);
//! - [`Mode::Pipelined`] runs a loader thread that keeps up to `depth`
//!   layers loaded ahead, in the order forward passes use them, wrapping
//!   round to the first streamed layer: the next pass's first layers load
//!   while this pass finishes and while the draft model runs, so a
//!   verification starts as soon as its first streamed layer is in.
//!
//! A [`Monitor`] reports bytes read, IO, build and wait time, whether the
//! compute thread is waiting for a layer right now (so the draft may use the
//! idle CPU), and an optional trace of those intervals.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use arbor_model::decoder::{LayerSource, LayerWeights, Lease, TensorSpec, held_bytes};
use arbor_model::{ModelError, Result};
use arbor_paging::{AlignedBuf, DirectReader, Ledger, PagingError, Reservation};
use arbor_tensor::Backend;
use crossbeam_channel::{Receiver, Sender, bounded};

mod plan;
pub use plan::{LayerCost, Plan, plan};

/// How streamed layers are loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// When the forward pass reaches the layer; compute waits for each read.
    OnDemand,
    /// By a loader thread, up to `depth` layers ahead of the forward pass.
    Pipelined { depth: usize },
}

/// What the streamer has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StreamStats {
    /// Layers loaded.
    pub layers: u64,
    /// Bytes read from the file.
    pub bytes: u64,
    /// Seconds spent reading.
    pub io_secs: f64,
    /// Seconds spent turning read bytes into backend weights.
    pub build_secs: f64,
    /// Seconds the forward pass spent waiting for a layer.
    pub wait_secs: f64,
}

/// One interval of streaming work, in seconds since the monitor's epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    pub kind: SpanKind,
    pub layer: usize,
    pub start: f64,
    pub end: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Io,
    Build,
    Wait,
}

#[derive(Default)]
struct Shared {
    stats: Mutex<StreamStats>,
    waiting: AtomicBool,
    trace: Mutex<Option<(Instant, Vec<Span>)>>,
}

/// A handle on a streamer's statistics, usable from any thread.
#[derive(Clone, Default)]
pub struct Monitor(Arc<Shared>);

impl Monitor {
    pub fn stats(&self) -> StreamStats {
        *self.0.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the forward pass is blocked waiting for a layer now.
    pub fn waiting(&self) -> bool {
        self.0.waiting.load(Ordering::Acquire)
    }

    /// Starts recording spans, timed from `epoch`.
    pub fn record_from(&self, epoch: Instant) {
        *self.0.trace.lock().unwrap_or_else(|e| e.into_inner()) = Some((epoch, Vec::new()));
    }

    /// The spans recorded so far (recording goes on).
    pub fn spans(&self) -> Vec<Span> {
        match &*self.0.trace.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((_, spans)) => spans.clone(),
            None => Vec::new(),
        }
    }

    fn add(&self, f: impl FnOnce(&mut StreamStats)) {
        f(&mut self.0.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn span(&self, kind: SpanKind, layer: usize, start: Instant, end: Instant) {
        if let Some((epoch, spans)) = &mut *self.0.trace.lock().unwrap_or_else(|e| e.into_inner()) {
            spans.push(Span {
                kind,
                layer,
                start: start.saturating_duration_since(*epoch).as_secs_f64(),
                end: end.saturating_duration_since(*epoch).as_secs_f64(),
            });
        }
    }
}

fn paging(e: PagingError) -> ModelError {
    ModelError::Paging(e)
}

/// Bytes of read buffers a streamer needs for any of `layers` (one buffer
/// per tensor position, as large as that tensor's aligned span in any layer).
pub fn read_buffer_bytes(layers: &[&[TensorSpec]]) -> u64 {
    buffer_caps(layers).iter().map(|&c| c as u64).sum()
}

fn buffer_caps(layers: &[&[TensorSpec]]) -> Vec<usize> {
    let width = layers.iter().map(|s| s.len()).max().unwrap_or(0);
    (0..width)
        .map(|i| {
            layers
                .iter()
                .filter_map(|s| s.get(i))
                .map(|s| DirectReader::span(s.offset, s.len).max(arbor_paging::ALIGN))
                .max()
                .unwrap_or(0)
        })
        .collect()
}

/// Reads and builds layers: the part shared by both modes.
struct Loader<B: Backend> {
    backend: B,
    reader: DirectReader,
    ledger: Arc<Ledger>,
    /// One buffer per tensor position, reused from layer to layer.
    bufs: Vec<AlignedBuf>,
    /// Holds the buffers' bytes on the ledger.
    bufs_held: Reservation,
    monitor: Monitor,
}

impl<B: Backend> Loader<B> {
    fn new(
        backend: B,
        path: &Path,
        layers: &[(usize, Vec<TensorSpec>)],
        ledger: Arc<Ledger>,
        monitor: Monitor,
    ) -> Result<Self> {
        let reader = DirectReader::open(path).map_err(paging)?;
        let specs: Vec<&[TensorSpec]> = layers.iter().map(|(_, s)| s.as_slice()).collect();
        let caps = buffer_caps(&specs);
        let total: usize = caps.iter().sum();
        let held = ledger
            .reserve(total as u64, "read buffers for streamed layers")
            .map_err(paging)?;
        Ok(Self {
            backend,
            reader,
            ledger,
            bufs: caps.into_iter().map(AlignedBuf::new).collect(),
            bufs_held: held,
            monitor,
        })
    }

    fn load(&mut self, layer: usize, specs: &[TensorSpec]) -> Result<Lease<B>> {
        let held = held_bytes(&self.backend, specs);
        // The read buffers are held for good: a layer that does not fit
        // beside them would wait forever.
        let room = self.ledger.budget() - self.bufs_held.bytes();
        if held > room {
            return Err(paging(PagingError::OverBudget {
                what: format!("streamed layer {layer}"),
                needed: held,
                available: room,
                budget: self.ledger.budget(),
            }));
        }
        let reservation = self
            .ledger
            .reserve_blocking(held, &format!("streamed layer {layer}"))
            .map_err(paging)?;
        let t0 = Instant::now();
        let mut read = 0u64;
        // Where each tensor's bytes landed in its buffer (direct reads keep
        // the offset within the page; buffered ones start at 0).
        let mut starts = Vec::with_capacity(specs.len());
        for (s, buf) in specs.iter().zip(self.bufs.iter_mut()) {
            let base = buf.as_slice().as_ptr() as usize;
            let got = self
                .reader
                .read_into(s.offset, s.len, buf)
                .map_err(paging)?;
            starts.push(got.as_ptr() as usize - base);
            read += s.len as u64;
        }
        let t1 = Instant::now();
        let slices: Vec<&[u8]> = specs
            .iter()
            .zip(&self.bufs)
            .zip(&starts)
            .map(|((s, buf), &at)| &buf.as_slice()[at..at + s.len])
            .collect();
        let weights = LayerWeights::from_bytes(&self.backend, specs, &slices)?;
        let t2 = Instant::now();
        self.monitor.add(|st| {
            st.layers += 1;
            st.bytes += read;
            st.io_secs += (t1 - t0).as_secs_f64();
            st.build_secs += (t2 - t1).as_secs_f64();
        });
        self.monitor.span(SpanKind::Io, layer, t0, t1);
        self.monitor.span(SpanKind::Build, layer, t1, t2);
        Ok(Lease {
            weights,
            hold: Box::new(reservation),
        })
    }
}

enum Inner<B: Backend> {
    OnDemand {
        loader: Loader<B>,
        layers: Vec<(usize, Vec<TensorSpec>)>,
    },
    Pipelined {
        streamed: Vec<usize>,
        rx: Receiver<Result<(usize, Lease<B>)>>,
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    },
}

/// Streams the layers a decoder does not hold; see the crate docs.
pub struct Streamer<B: Backend> {
    inner: Inner<B>,
    monitor: Monitor,
}

impl<B: Backend + Clone> Streamer<B> {
    /// A streamer for `layers` (layer index and tensors, in forward order)
    /// of the GGUF file at `path`, holding at most what `ledger` allows.
    pub fn new(
        backend: B,
        path: &Path,
        layers: Vec<(usize, Vec<TensorSpec>)>,
        ledger: Arc<Ledger>,
        mode: Mode,
    ) -> Result<Self> {
        let monitor = Monitor::default();
        let mut loader = Loader::new(backend, path, &layers, ledger, monitor.clone())?;
        let inner = match mode {
            Mode::OnDemand => Inner::OnDemand { loader, layers },
            Mode::Pipelined { depth } => {
                let streamed = layers.iter().map(|(l, _)| *l).collect();
                let (tx, rx) = bounded(depth.max(1));
                let stop = Arc::new(AtomicBool::new(false));
                let flag = stop.clone();
                let thread = std::thread::Builder::new()
                    .name("arbor-loader".into())
                    .spawn(move || run_loader(&mut loader, &layers, &tx, &flag))
                    .map_err(|e| ModelError::Invalid(format!("cannot start the loader: {e}")))?;
                Inner::Pipelined {
                    streamed,
                    rx,
                    stop,
                    thread: Some(thread),
                }
            }
        };
        Ok(Self { inner, monitor })
    }
}

impl<B: Backend> Streamer<B> {
    pub fn monitor(&self) -> Monitor {
        self.monitor.clone()
    }
}

/// The loader thread: loads the streamed layers round and round, as far
/// ahead as the channel and the ledger let it, until stopped or an error.
fn run_loader<B: Backend>(
    loader: &mut Loader<B>,
    layers: &[(usize, Vec<TensorSpec>)],
    tx: &Sender<Result<(usize, Lease<B>)>>,
    stop: &AtomicBool,
) {
    if layers.is_empty() {
        return;
    }
    for (layer, specs) in layers.iter().cycle() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let item = loader.load(*layer, specs).map(|lease| (*layer, lease));
        let failed = item.is_err();
        if tx.send(item).is_err() || failed {
            return;
        }
    }
}

impl<B: Backend> LayerSource<B> for Streamer<B> {
    fn layer(&mut self, layer: usize) -> Result<Lease<B>> {
        let not_streamed = || ModelError::Input(format!("layer {layer} is not streamed"));
        let t0 = Instant::now();
        self.monitor.0.waiting.store(true, Ordering::Release);
        let lease = match &mut self.inner {
            Inner::OnDemand { loader, layers } => match layers.iter().find(|(l, _)| *l == layer) {
                Some((_, specs)) => loader.load(layer, specs),
                None => Err(not_streamed()),
            },
            Inner::Pipelined { streamed, .. } if !streamed.contains(&layer) => Err(not_streamed()),
            // Layers arrive in forward order; after an interrupted pass the
            // ones it did not use are skipped.
            Inner::Pipelined { rx, .. } => loop {
                match rx.recv() {
                    Ok(Ok((l, lease))) if l == layer => break Ok(lease),
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => break Err(e),
                    Err(_) => {
                        break Err(ModelError::Invalid(
                            "the layer loader stopped after an earlier error".into(),
                        ));
                    }
                }
            },
        };
        self.monitor.0.waiting.store(false, Ordering::Release);
        let t1 = Instant::now();
        self.monitor
            .add(|st| st.wait_secs += (t1 - t0).as_secs_f64());
        self.monitor.span(SpanKind::Wait, layer, t0, t1);
        lease
    }
}

impl<B: Backend> Drop for Streamer<B> {
    fn drop(&mut self) {
        if let Inner::Pipelined {
            rx, stop, thread, ..
        } = &mut self.inner
        {
            stop.store(true, Ordering::Release);
            // Dropping what is queued frees its reservations, so a loader
            // blocked on the ledger wakes, and its next send fails.
            while rx.try_recv().is_ok() {}
            let (_, dead) = bounded(0);
            *rx = dead;
            if let Some(t) = thread.take() {
                let _ = t.join();
            }
        }
    }
}

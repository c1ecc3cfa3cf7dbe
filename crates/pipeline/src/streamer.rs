//! The [`Streamer`]: a decoder's [`LayerSource`] for the layers it does not
//! hold, read from the GGUF file with direct IO, built on the backend and
//! lent for one forward pass, every byte reserved on a [`Ledger`] first.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use arbor_model::{
    LayerSource, LayerWeights, Layout, Lease, Mlp, ModelError, Result, SuffixLease, TensorEntry,
    WeightWait, copied_bytes, held_bytes, is_suffix,
};
use arbor_paging::{AlignedBuf, DirectReader, Ledger, PagingError, Reservation};
use arbor_tensor::{Backend, SharedBytes};
use crossbeam_channel::{Receiver, Sender, bounded};

use crate::buffers::{BufSet, LentBytes, Loan, buffer_caps, buffer_sets_for, keeps_in_place};
use crate::{HostTier, Mode, Monitor, SpanKind, paging};

/// A layer's bytes, read and waiting to be built: where each tensor's
/// bytes start in its buffer (direct reads keep the offset within the page,
/// buffered ones start at 0).
struct ReadLayer {
    layer: usize,
    set: BufSet,
    starts: Vec<usize>,
}

/// Reads layers' tensors from the file, or copies those the host tier
/// holds.
struct Reader {
    file: DirectReader,
    host: HostTier,
    monitor: Monitor,
}

impl Reader {
    /// Reads `layer` into `set`; where each tensor's bytes start.
    fn read(
        &mut self,
        layer: usize,
        entries: &[TensorEntry],
        set: &mut BufSet,
    ) -> Result<Vec<usize>> {
        if let Some(bytes) = self.host.copy_into(layer, &mut set.0) {
            self.monitor.add(|st| st.host_bytes += bytes);
            return Ok(vec![0; entries.len()]);
        }
        let t0 = Instant::now();
        let mut read = 0u64;
        let mut starts = Vec::with_capacity(entries.len());
        for (s, buf) in entries.iter().zip(set.0.iter_mut()) {
            let base = buf.as_slice().as_ptr() as usize;
            let got = self.file.read_into(s.offset, s.len, buf).map_err(paging)?;
            starts.push(got.as_ptr() as usize - base);
            read += s.len as u64;
        }
        let t1 = Instant::now();
        self.monitor.add(|st| {
            st.bytes += read;
            st.io_secs += (t1 - t0).as_secs_f64();
        });
        self.monitor.span(SpanKind::Io, layer, t0, t1);
        Ok(starts)
    }
}

/// Turns read bytes into backend weights, each reserved on the ledger first.
struct Builder<B: Backend> {
    backend: B,
    ledger: Arc<Ledger>,
    /// The ledger's room for built layers (the read buffers are held for
    /// good: a layer that does not fit beside them would wait forever).
    room: u64,
    monitor: Monitor,
    /// Whether pipelined layers keep their weights in the read buffers
    /// (see [`keeps_in_place`]).
    in_place: bool,
}

impl<B: Backend> Builder<B> {
    /// Builds a layer in its read buffers, which go back to `free` once
    /// the layer is dropped (at once where nothing was kept in them).
    fn build_lent(
        &self,
        layer: usize,
        entries: &[TensorEntry],
        set: BufSet,
        starts: &[usize],
        free: &Sender<BufSet>,
    ) -> Result<Built<B>> {
        let lent = Arc::new(Loan::new(set, free.clone()));
        let keep = entries
            .iter()
            .zip(starts)
            .enumerate()
            .map(|(buf, (s, &at))| {
                let owner = Arc::new(LentBytes {
                    set: lent.clone(),
                    buf,
                });
                SharedBytes::new(owner, at..at + s.len).ok_or_else(|| {
                    ModelError::Invalid(format!("`{}`: read past its buffer", s.name))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        drop(lent);
        self.build_from(layer, entries, Bytes::Kept(&keep))
    }

    fn build(
        &self,
        layer: usize,
        entries: &[TensorEntry],
        set: &BufSet,
        starts: &[usize],
    ) -> Result<Built<B>> {
        let slices: Vec<&[u8]> = entries
            .iter()
            .zip(&set.0)
            .zip(starts)
            .map(|((s, buf), &at)| &buf.as_slice()[at..at + s.len])
            .collect();
        self.build_from(layer, entries, Bytes::Copied(&slices))
    }

    fn build_from(&self, layer: usize, entries: &[TensorEntry], bytes: Bytes) -> Result<Built<B>> {
        let held = match bytes {
            Bytes::Kept(_) => copied_bytes(&self.backend, entries),
            Bytes::Copied(_) => held_bytes(&self.backend, entries),
        };
        if held > self.room {
            return Err(paging(PagingError::OverBudget {
                what: format!("streamed layer {layer}"),
                needed: held,
                available: self.room,
                budget: self.ledger.budget(),
            }));
        }
        let reservation = self
            .ledger
            .reserve_blocking(held, &format!("streamed layer {layer}"))
            .map_err(paging)?;
        let t0 = Instant::now();
        let b = &self.backend;
        let built = match (is_suffix(entries), bytes) {
            (true, Bytes::Copied(s)) => Lent::Suffix(Mlp::suffix_from_bytes(b, entries, s, true)?),
            (true, Bytes::Kept(k)) => Lent::Suffix(Mlp::suffix_from_shared(b, entries, k)?),
            (false, Bytes::Copied(s)) => {
                Lent::Layer(LayerWeights::from_bytes(b, entries, s, true)?)
            }
            (false, Bytes::Kept(k)) => Lent::Layer(LayerWeights::from_shared(b, entries, k)?),
        };
        let t1 = Instant::now();
        self.monitor.add(|st| {
            st.layers += 1;
            st.build_secs += (t1 - t0).as_secs_f64();
        });
        self.monitor.span(SpanKind::Build, layer, t0, t1);
        let hold = Box::new(reservation);
        Ok(match built {
            Lent::Layer(weights) => Built::Layer(Lease { weights, hold }),
            Lent::Suffix(mlp) => Built::Suffix(SuffixLease { mlp, hold }),
        })
    }
}

/// A layer's bytes for the builder: slices to copy from, or lent bytes
/// its weights may keep.
#[derive(Clone, Copy)]
enum Bytes<'a> {
    Copied(&'a [&'a [u8]]),
    Kept(&'a [SharedBytes]),
}

enum Lent<B: Backend> {
    Layer(LayerWeights<B>),
    Suffix(Mlp<B>),
}

/// What the builder lends: a whole layer, or a split layer's streamed part.
enum Built<B: Backend> {
    Layer(Lease<B>),
    Suffix(SuffixLease<B>),
}

enum Inner<B: Backend> {
    OnDemand {
        reader: Reader,
        builder: Builder<B>,
        set: BufSet,
        layers: Vec<(usize, Vec<TensorEntry>)>,
        /// Holds the read buffers' bytes on the ledger.
        _buffers: Reservation,
    },
    Pipelined {
        streamed: Vec<usize>,
        rx: Receiver<Result<(usize, Built<B>)>>,
        stop: Arc<AtomicBool>,
        threads: Vec<JoinHandle<()>>,
    },
}

/// Streams the layers a decoder does not hold; see the crate docs.
pub struct Streamer<B: Backend> {
    inner: Inner<B>,
    monitor: Monitor,
    /// Told when a forward pass starts and stops waiting for a layer.
    waits: Option<std::sync::mpsc::Sender<WeightWait>>,
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| ModelError::Invalid(format!("cannot start the {name} thread: {e}")))
}

impl<B: Backend + Clone> Streamer<B> {
    /// A streamer for `layers` (indices into [`Layout::layers`], in forward
    /// order) of the GGUF file at `path`, whose layout is `layout`, holding
    /// at most what `ledger` allows.
    pub fn new(
        backend: B,
        path: &Path,
        layout: &Layout,
        layers: &[usize],
        ledger: Arc<Ledger>,
        mode: Mode,
    ) -> Result<Self> {
        if let Some(l) = layers.iter().find(|&&l| l >= layout.layers.len()) {
            return Err(ModelError::Input(format!(
                "layer {l} of {} layers cannot be streamed",
                layout.layers.len()
            )));
        }
        let layers: Vec<(usize, Vec<TensorEntry>)> = layers
            .iter()
            .map(|&l| (l, layout.layers[l].clone()))
            .collect();
        Self::with_units(backend, path, layers, ledger, mode)
    }

    /// A streamer for explicit units, in forward order: each a layer index
    /// and the entries to read for it — a whole layer's, or a split
    /// layer's streamed part ([`Layout::split_entries`]).
    pub fn with_units(
        backend: B,
        path: &Path,
        layers: Vec<(usize, Vec<TensorEntry>)>,
        ledger: Arc<Ledger>,
        mode: Mode,
    ) -> Result<Self> {
        let file = DirectReader::open(path).map_err(paging)?;
        Self::with_reader(backend, file, layers, ledger, mode)
    }

    /// [`with_units`](Self::with_units) reading through `file` (e.g. a
    /// [`DirectReader::cached`] one, for weights kept in host memory).
    pub fn with_reader(
        backend: B,
        file: DirectReader,
        layers: Vec<(usize, Vec<TensorEntry>)>,
        ledger: Arc<Ledger>,
        mode: Mode,
    ) -> Result<Self> {
        Self::with_host_tier(backend, file, HostTier::default(), layers, ledger, mode)
    }

    /// [`with_reader`](Self::with_reader), copying the layers `host` holds
    /// instead of reading them from `file`.
    pub fn with_host_tier(
        backend: B,
        file: DirectReader,
        host: HostTier,
        layers: Vec<(usize, Vec<TensorEntry>)>,
        ledger: Arc<Ledger>,
        mode: Mode,
    ) -> Result<Self> {
        let monitor = Monitor::default();
        let entries: Vec<&[TensorEntry]> = layers.iter().map(|(_, s)| s.as_slice()).collect();
        let caps = buffer_caps(&entries);
        let in_place = keeps_in_place(&backend, mode, &entries);
        let sets = buffer_sets_for(mode, in_place);
        let set_bytes: u64 = caps.iter().map(|&c| c as u64).sum();
        let buffers = ledger
            .reserve(set_bytes * sets, "read buffers for streamed layers")
            .map_err(paging)?;
        let new_set = || BufSet(caps.iter().map(|&c| AlignedBuf::new(c)).collect());
        let reader = Reader {
            file,
            host,
            monitor: monitor.clone(),
        };
        let builder = Builder {
            backend,
            room: ledger.budget() - buffers.bytes(),
            ledger,
            monitor: monitor.clone(),
            in_place,
        };
        let inner = match mode {
            Mode::OnDemand => Inner::OnDemand {
                reader,
                builder,
                set: new_set(),
                layers,
                _buffers: buffers,
            },
            Mode::Pipelined { depth } => {
                let streamed = layers.iter().map(|(l, _)| *l).collect();
                let (tx, rx) = bounded(depth.max(1));
                let (free_tx, free_rx) = bounded(sets as usize);
                for _ in 0..sets {
                    free_tx.send(new_set()).expect("room for every set");
                }
                let (read_tx, read_rx) = bounded(1);
                let stop = Arc::new(AtomicBool::new(false));
                let layers = Arc::new(layers);
                let (flag, order) = (stop.clone(), layers.clone());
                let read_thread = spawn("arbor-reader", move || {
                    run_reader(reader, &order, &free_rx, &read_tx, &flag)
                })?;
                let flag = stop.clone();
                let build_thread = spawn("arbor-builder", move || {
                    // The buffers' reservation lives as long as the buffers.
                    let _buffers = buffers;
                    run_builder(&builder, &layers, &read_rx, &free_tx, &tx, &flag)
                })?;
                Inner::Pipelined {
                    streamed,
                    rx,
                    stop,
                    threads: vec![read_thread, build_thread],
                }
            }
        };
        Ok(Self {
            inner,
            monitor,
            waits: None,
        })
    }
}

impl<B: Backend> Streamer<B> {
    pub fn monitor(&self) -> Monitor {
        self.monitor.clone()
    }
}

/// The reader thread: reads the streamed layers round and round into free
/// buffer sets, until stopped, an error, or the builder is gone.
fn run_reader(
    mut reader: Reader,
    layers: &[(usize, Vec<TensorEntry>)],
    free: &Receiver<BufSet>,
    out: &Sender<Result<ReadLayer>>,
    stop: &AtomicBool,
) {
    if layers.is_empty() {
        return;
    }
    for (layer, entries) in layers.iter().cycle() {
        let Ok(mut set) = free.recv() else { return };
        if stop.load(Ordering::Acquire) {
            return;
        }
        let item = reader
            .read(*layer, entries, &mut set)
            .map(|starts| ReadLayer {
                layer: *layer,
                set,
                starts,
            });
        let failed = item.is_err();
        if out.send(item).is_err() || failed {
            return;
        }
    }
}

/// The builder thread: builds what the reader read, in order, as far ahead
/// as the channel and the ledger let it, handing each buffer set back.
fn run_builder<B: Backend>(
    builder: &Builder<B>,
    layers: &[(usize, Vec<TensorEntry>)],
    read: &Receiver<Result<ReadLayer>>,
    free: &Sender<BufSet>,
    out: &Sender<Result<(usize, Built<B>)>>,
    stop: &AtomicBool,
) {
    while let Ok(item) = read.recv() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let built = item.and_then(|r| {
            let entries = &layers
                .iter()
                .find(|(l, _)| *l == r.layer)
                .expect("the reader reads listed layers")
                .1;
            let lease = match builder.in_place {
                true => builder.build_lent(r.layer, entries, r.set, &r.starts, free),
                false => {
                    let lease = builder.build(r.layer, entries, &r.set, &r.starts);
                    let _ = free.send(r.set);
                    lease
                }
            };
            lease.map(|lease| (r.layer, lease))
        });
        let failed = built.is_err();
        if out.send(built).is_err() || failed {
            return;
        }
    }
}

impl<B: Backend> LayerSource<B> for Streamer<B> {
    fn layer(&mut self, layer: usize) -> Result<Lease<B>> {
        match self.take(layer)? {
            Built::Layer(lease) => Ok(lease),
            Built::Suffix(_) => Err(ModelError::Input(format!(
                "layer {layer} is split: its source lends only the rest of its MLP"
            ))),
        }
    }

    fn mlp_suffix(&mut self, layer: usize) -> Result<SuffixLease<B>> {
        match self.take(layer)? {
            Built::Suffix(lease) => Ok(lease),
            Built::Layer(_) => Err(ModelError::Input(format!(
                "layer {layer} is streamed whole, not split"
            ))),
        }
    }

    fn notify_waits(&mut self, tx: Option<std::sync::mpsc::Sender<WeightWait>>) {
        self.waits = tx;
    }
}

impl<B: Backend> Streamer<B> {
    /// What the source lends for `layer`, waiting until it is built.
    fn take(&mut self, layer: usize) -> Result<Built<B>> {
        let Self {
            inner,
            monitor,
            waits,
        } = self;
        let not_streamed = || ModelError::Input(format!("layer {layer} is not streamed"));
        let t0 = Instant::now();
        // Whether the pass had to wait (a pipelined layer already loaded
        // is taken without waiting).
        let mut waited = false;
        let lease = match inner {
            Inner::OnDemand {
                reader,
                builder,
                set,
                layers,
                ..
            } => match layers.iter().find(|(l, _)| *l == layer) {
                Some((_, entries)) => {
                    waited = true;
                    monitor.set_waiting(waits, true);
                    reader
                        .read(layer, entries, set)
                        .and_then(|starts| builder.build(layer, entries, set, &starts))
                }
                None => Err(not_streamed()),
            },
            Inner::Pipelined { streamed, .. } if !streamed.contains(&layer) => Err(not_streamed()),
            // Layers arrive in forward order; after an interrupted pass the
            // ones it did not use are skipped.
            Inner::Pipelined { rx, .. } => loop {
                let got = rx.try_recv().or_else(|_| {
                    if !waited {
                        waited = true;
                        monitor.set_waiting(waits, true);
                    }
                    rx.recv()
                });
                match got {
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
        if waited {
            monitor.set_waiting(waits, false);
            let t1 = Instant::now();
            monitor.add(|st| st.wait_secs += (t1 - t0).as_secs_f64());
            monitor.span(SpanKind::Wait, layer, t0, t1);
        }
        lease
    }
}

impl<B: Backend> Drop for Streamer<B> {
    fn drop(&mut self) {
        if let Inner::Pipelined {
            rx, stop, threads, ..
        } = &mut self.inner
        {
            stop.store(true, Ordering::Release);
            // Dropping what is queued frees its reservations, so a builder
            // blocked on the ledger wakes, and its next send fails; then the
            // reader finds no free buffers or no builder and stops too.
            while rx.try_recv().is_ok() {}
            let (_, dead) = bounded(0);
            *rx = dead;
            for t in threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

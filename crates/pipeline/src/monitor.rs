//! What streaming has done: counters, the forward pass's waits, and an
//! optional trace of IO, build and wait intervals.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arbor_model::WeightWait;

/// What the streamer has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StreamStats {
    /// Layers loaded.
    pub layers: u64,
    /// Bytes read from the file.
    pub bytes: u64,
    /// Bytes copied from the host tier instead ([`crate::HostTier`]).
    pub host_bytes: u64,
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

    pub(crate) fn add(&self, f: impl FnOnce(&mut StreamStats)) {
        f(&mut self.0.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub(crate) fn span(&self, kind: SpanKind, layer: usize, start: Instant, end: Instant) {
        if let Some((epoch, spans)) = &mut *self.0.trace.lock().unwrap_or_else(|e| e.into_inner()) {
            spans.push(Span {
                kind,
                layer,
                start: start.saturating_duration_since(*epoch).as_secs_f64(),
                end: end.saturating_duration_since(*epoch).as_secs_f64(),
            });
        }
    }

    /// Marks the forward pass as waiting for a layer (or not) and tells
    /// whoever listens to waits.
    pub(crate) fn set_waiting(
        &self,
        waits: &Option<std::sync::mpsc::Sender<WeightWait>>,
        on: bool,
    ) {
        self.0.waiting.store(on, Ordering::Release);
        if let Some(tx) = waits {
            let _ = tx.send(if on {
                WeightWait::Waiting
            } else {
                WeightWait::Resumed
            });
        }
    }
}

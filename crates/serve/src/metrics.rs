//! Counters the server keeps and `/metrics` shows in Prometheus' text
//! format.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// What the server has done so far.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub rejected: AtomicU64,
    pub cancelled: AtomicU64,
    /// Requests waiting for the engine.
    pub queued: AtomicUsize,
    /// Generations running (0 or 1, or up to the slots).
    pub busy: AtomicUsize,
    /// With slots: target passes run, and the requests they carried.
    pub batched_passes: AtomicU64,
    pub batched_sequences: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Target passes after the prefill (verifications and plain steps).
    pub passes: AtomicU64,
    pub streamed_bytes: AtomicU64,
    /// The last generation's decode speed and tokens per pass.
    pub last: Mutex<(f64, f64)>,
    /// Requests served with a latency objective, and those that met it
    /// (measured).
    pub slo_requests: AtomicU64,
    pub slo_met: AtomicU64,
    /// Generations that panicked (each followed by an engine rebuild).
    pub panics: AtomicU64,
    /// Seconds from a request's arrival to its first confirmed text.
    pub ttft: Histogram,
    /// Seconds per output token after the first, per request.
    pub tpot: Histogram,
    /// Seconds a request waited in the queue.
    pub queue_wait: Histogram,
}

/// Upper bounds of the latency buckets, seconds.
const LATENCY: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// A Prometheus histogram over `LATENCY`'s buckets (a handful of
/// counters; written here rather than pulling a metrics stack in).
#[derive(Debug)]
pub struct Histogram {
    counts: Mutex<(Vec<u64>, f64)>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: Mutex::new((vec![0; LATENCY.len() + 1], 0.0)),
        }
    }
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let bucket = LATENCY.partition_point(|&le| le < seconds);
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.0[bucket] += 1;
        c.1 += seconds;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .iter()
            .sum()
    }

    /// The histogram's lines in the text format (cumulative buckets).
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let (counts, sum) = self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let _ = writeln!(out, "# HELP arbor_{name} {help}");
        let _ = writeln!(out, "# TYPE arbor_{name} histogram");
        let mut total = 0;
        for (i, n) in counts.iter().enumerate() {
            total += n;
            let le = LATENCY.get(i).map_or("+Inf".into(), |b| b.to_string());
            let _ = writeln!(out, "arbor_{name}_bucket{{le=\"{le}\"}} {total}");
        }
        let _ = writeln!(out, "arbor_{name}_sum {sum:.6}");
        let _ = writeln!(out, "arbor_{name}_count {total}");
    }
}

impl Metrics {
    /// The text `/metrics` returns; `resident` is the bytes of target
    /// weights the engine holds (under a memory budget; 0 otherwise).
    pub fn render(&self, resident: u64) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (tok_s, per_pass) = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        let generated = get(&self.generated_tokens);
        let passes = get(&self.passes);
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP arbor_{name} {help}");
            let _ = writeln!(out, "# TYPE arbor_{name} {kind}");
            let _ = writeln!(out, "arbor_{name} {value}");
        };
        metric(
            "requests_total",
            "counter",
            "Generation requests accepted.",
            get(&self.requests).to_string(),
        );
        metric(
            "request_errors_total",
            "counter",
            "Requests that ended in an error.",
            get(&self.errors).to_string(),
        );
        metric(
            "requests_rejected_total",
            "counter",
            "Requests refused with 429 (queue full).",
            get(&self.rejected).to_string(),
        );
        metric(
            "requests_cancelled_total",
            "counter",
            "Generations stopped because the client left.",
            get(&self.cancelled).to_string(),
        );
        metric(
            "slo_requests_total",
            "counter",
            "Requests served with a latency objective.",
            get(&self.slo_requests).to_string(),
        );
        metric(
            "slo_met_total",
            "counter",
            "Requests whose measured latency met their objective.",
            get(&self.slo_met).to_string(),
        );
        metric(
            "queue_depth",
            "gauge",
            "Requests waiting for the engine.",
            self.queued.load(Ordering::Relaxed).to_string(),
        );
        metric(
            "busy",
            "gauge",
            "Generations running (with --slots, up to the slots).",
            self.busy.load(Ordering::Relaxed).to_string(),
        );
        metric(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens processed.",
            get(&self.prompt_tokens).to_string(),
        );
        metric(
            "generated_tokens_total",
            "counter",
            "Tokens generated.",
            generated.to_string(),
        );
        metric(
            "target_passes_total",
            "counter",
            "Target forward passes after the prefill.",
            passes.to_string(),
        );
        metric(
            "decode_tokens_per_second",
            "gauge",
            "Decode speed of the last generation.",
            format!("{tok_s:.3}"),
        );
        metric(
            "accepted_tokens_per_pass",
            "gauge",
            "Tokens per target pass of the last generation (1 for plain decoding).",
            format!("{per_pass:.3}"),
        );
        metric(
            "resident_weight_bytes",
            "gauge",
            "Target weight bytes held in memory under a budget (0 without one).",
            resident.to_string(),
        );
        metric(
            "streamed_bytes_total",
            "counter",
            "Weight bytes streamed from disk.",
            get(&self.streamed_bytes).to_string(),
        );
        metric(
            "batched_passes_total",
            "counter",
            "With slots: target passes over the running requests.",
            get(&self.batched_passes).to_string(),
        );
        metric(
            "batched_sequences_total",
            "counter",
            "With slots: requests those passes carried (over passes: requests per pass).",
            get(&self.batched_sequences).to_string(),
        );
        metric(
            "worker_panics_total",
            "counter",
            "Generations that panicked; each rebuilt the engine.",
            get(&self.panics).to_string(),
        );
        self.ttft.render(
            &mut out,
            "time_to_first_token_seconds",
            "From a request's arrival to its first confirmed text.",
        );
        self.tpot.render(
            &mut out,
            "time_per_output_token_seconds",
            "Per output token after the first, one observation per request.",
        );
        self.queue_wait.render(
            &mut out,
            "queue_wait_seconds",
            "Time a request waited for the engine.",
        );
        out
    }
}

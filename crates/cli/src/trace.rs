//! The execution trace of one generation as a timeline PNG: the draft's
//! tree growth (G) and provisional steps (P), the target's verification
//! passes (V) and plain steps, and the layer loader's reads and builds with
//! the time the target waited for them, as in the EdgeLLM paper's
//! execution trace.

use std::path::Path;

use anyhow::Result;
use arbor_engine::{Generation, Phase, SpanKind};
use arbor_plot::{Segment, Timeline};

/// One generation's spans, in seconds since decoding started.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Trace {
    /// (lane, label, start, end)
    pub segments: Vec<(usize, String, f64, f64)>,
    /// When the prefill ended; the drawing starts there.
    pub decode_start: f64,
}

/// Labels in the order they get colours: the ones every trace has first,
/// so a trace without plain steps or provisional steps keeps the others'
/// colours.
const LABELS: [&str; 7] = [
    "V: target verifies",
    "G: draft grows the tree",
    "wait",
    "read",
    "build",
    "T: plain target step",
    "P: provisional draft step",
];

const LANES: [&str; 5] = [
    "draft model",
    "target model",
    "target waits for weights",
    "loader: disk reads",
    "loader: weight builds",
];

impl Trace {
    pub fn of(g: &Generation) -> Self {
        let mut segments = Vec::new();
        let mut decode_start = 0f64;
        for s in &g.trace {
            let (lane, label) = match s.phase {
                Phase::Prefill => {
                    decode_start = decode_start.max(s.end);
                    continue;
                }
                Phase::Draft => (0, "G: draft grows the tree"),
                Phase::Provisional => (0, "P: provisional draft step"),
                Phase::Verify => (1, "V: target verifies"),
                Phase::Step => (1, "T: plain target step"),
            };
            segments.push((lane, label.to_string(), s.start, s.end));
        }
        for s in &g.weight_spans {
            let (lane, label) = match s.kind {
                SpanKind::Wait => (2, "wait"),
                SpanKind::Io => (3, "read"),
                SpanKind::Build => (4, "build"),
            };
            segments.push((lane, label.to_string(), s.start, s.end));
        }
        segments.sort_by_key(|s| LABELS.iter().position(|l| *l == s.1));
        Self {
            segments,
            decode_start,
        }
    }

    /// Draws the first `rounds` target passes (verifications and plain
    /// steps) after the prefill and what ran beside them.
    pub fn draw(&self, title: &str, rounds: usize, path: &Path) -> Result<()> {
        let mut passes: Vec<&(usize, String, f64, f64)> =
            self.segments.iter().filter(|s| s.0 == 1).collect();
        passes.sort_by(|a, b| a.2.total_cmp(&b.2));
        if passes.is_empty() {
            anyhow::bail!("the generation made no target pass after the prefill to draw");
        }
        let start = self.decode_start;
        let end = passes
            .get(rounds.saturating_sub(1))
            .or(passes.last())
            .map_or(f64::INFINITY, |s| s.3);
        let segments = self
            .segments
            .iter()
            .filter(|s| s.3 > start && s.2 < end)
            .map(|s| Segment {
                lane: s.0,
                start: s.2.max(start) - start,
                end: s.3.min(end) - start,
                label: s.1.clone(),
            })
            .collect();
        let t = Timeline {
            title: title.to_string(),
            lanes: LANES.iter().map(|s| s.to_string()).collect(),
            segments,
            x_label: "seconds after the prefill".into(),
        };
        arbor_plot::timeline(&t, path)?;
        Ok(())
    }
}

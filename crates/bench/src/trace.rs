//! The execution trace of one generation ([`arbor_engine::Trace`]) as a
//! timeline PNG: the draft's tree growth (G) and provisional steps (P), the
//! target's verification passes (V) and plain steps, and the layer
//! loader's reads and builds with the time the target waited for them.

use std::path::Path;

use anyhow::Result;
use arbor_engine::{Activity, Trace};
use arbor_plot::{Segment, Timeline};

/// Draws the first `rounds` target passes (verifications and plain steps)
/// after the prefill and what ran beside them.
pub fn draw(trace: &Trace, title: &str, rounds: usize, path: &Path) -> Result<()> {
    let passes = trace.target_passes();
    if passes.is_empty() {
        anyhow::bail!("the generation made no target pass after the prefill to draw");
    }
    let start = trace.decode_start;
    let end = passes
        .get(rounds.saturating_sub(1))
        .or(passes.last())
        .map_or(f64::INFINITY, |s| s.end);
    let segments = (trace.segments.iter())
        .filter(|s| s.end > start && s.start < end)
        .map(|s| Segment {
            lane: s.activity.lane(),
            start: s.start.max(start) - start,
            end: s.end.min(end) - start,
            label: s.activity.label().to_string(),
        })
        .collect();
    let t = Timeline {
        title: title.to_string(),
        lanes: Activity::LANES.iter().map(|s| s.to_string()).collect(),
        segments,
        x_label: "seconds after the prefill".into(),
    };
    arbor_plot::timeline(&t, path)?;
    Ok(())
}

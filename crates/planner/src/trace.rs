//! One generation's execution trace: what the decoding loop did (draft
//! growth, provisional draft steps, verifications, plain target steps) and
//! what the layer streamer did beside it (reads, builds, the target's
//! waits), on one clock, as in the EdgeLLM paper's execution trace.

use arbor_pipeline::{Span, SpanKind};
use arbor_speculative::{Phase, PhaseSpan};

/// What a trace segment shows; each has its lane in a timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Activity {
    /// The target verifies draft tokens (V).
    Verify,
    /// The draft grows a tree or chain (G).
    Grow,
    /// The target waits for streamed weights.
    Wait,
    /// The loader reads weights from disk.
    Read,
    /// The loader turns read bytes into backend weights.
    Build,
    /// A plain one-token target pass (T).
    Step,
    /// A draft step while the target waited for weights (P).
    Provisional,
}

impl Activity {
    /// In colour order: the activities every trace has come first, so a
    /// trace without plain or provisional steps keeps the others' colours.
    pub const ALL: [Activity; 7] = [
        Self::Verify,
        Self::Grow,
        Self::Wait,
        Self::Read,
        Self::Build,
        Self::Step,
        Self::Provisional,
    ];
    /// Lane names, indexed by [`Activity::lane`].
    pub const LANES: [&'static str; 5] = [
        "draft model",
        "target model",
        "target waits for weights",
        "loader: disk reads",
        "loader: weight builds",
    ];

    pub fn lane(self) -> usize {
        match self {
            Self::Grow | Self::Provisional => 0,
            Self::Verify | Self::Step => 1,
            Self::Wait => 2,
            Self::Read => 3,
            Self::Build => 4,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Verify => "V: target verifies",
            Self::Grow => "G: draft grows the tree",
            Self::Wait => "wait",
            Self::Read => "read",
            Self::Build => "build",
            Self::Step => "T: plain target step",
            Self::Provisional => "P: provisional draft step",
        }
    }

    /// Whether this is a target forward pass.
    pub fn is_target_pass(self) -> bool {
        self.lane() == 1
    }
}

/// One interval, in seconds since decoding started.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Segment {
    pub activity: Activity,
    pub start: f64,
    pub end: f64,
    /// Tokens a model pass fed (0 for the streamer's spans).
    #[serde(default)]
    pub tokens: usize,
}

/// A generation's trace.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Trace {
    /// Ordered by activity (colour order), then by time.
    pub segments: Vec<Segment>,
    /// When the prefill ended.
    pub decode_start: f64,
}

impl Trace {
    /// Merges the decoding loop's phases with the streamer's spans (both
    /// in seconds since decoding started).
    pub fn new(phases: &[PhaseSpan], weights: &[Span]) -> Self {
        let mut segments = Vec::new();
        let mut decode_start = 0f64;
        for s in phases {
            let activity = match s.phase {
                Phase::Prefill => {
                    decode_start = decode_start.max(s.end);
                    continue;
                }
                Phase::Draft => Activity::Grow,
                Phase::Provisional => Activity::Provisional,
                Phase::Verify => Activity::Verify,
                Phase::Step => Activity::Step,
            };
            segments.push(Segment {
                activity,
                start: s.start,
                end: s.end,
                tokens: s.tokens,
            });
        }
        for s in weights {
            let activity = match s.kind {
                SpanKind::Wait => Activity::Wait,
                SpanKind::Io => Activity::Read,
                SpanKind::Build => Activity::Build,
            };
            segments.push(Segment {
                activity,
                start: s.start,
                end: s.end,
                tokens: 0,
            });
        }
        segments.sort_by(|a, b| {
            let rank = |s: &Segment| Activity::ALL.iter().position(|x| *x == s.activity);
            rank(a).cmp(&rank(b)).then(a.start.total_cmp(&b.start))
        });
        Self {
            segments,
            decode_start,
        }
    }

    /// Target passes after the prefill, in time order.
    pub fn target_passes(&self) -> Vec<Segment> {
        let mut passes: Vec<Segment> = self
            .segments
            .iter()
            .filter(|s| s.activity.is_target_pass())
            .copied()
            .collect();
        passes.sort_by(|a, b| a.start.total_cmp(&b.start));
        passes
    }

    pub fn any(&self, activity: Activity) -> bool {
        self.segments.iter().any(|s| s.activity == activity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_phases_and_weight_spans() {
        let phases = [
            PhaseSpan {
                phase: Phase::Prefill,
                start: 0.0,
                end: 1.0,
                tokens: 9,
            },
            PhaseSpan {
                phase: Phase::Step,
                start: 2.0,
                end: 2.5,
                tokens: 1,
            },
            PhaseSpan {
                phase: Phase::Verify,
                start: 1.2,
                end: 1.9,
                tokens: 5,
            },
        ];
        let weights = [Span {
            kind: SpanKind::Io,
            layer: 3,
            start: 1.3,
            end: 1.4,
        }];
        let t = Trace::new(&phases, &weights);
        assert_eq!(t.decode_start, 1.0);
        let order: Vec<Activity> = t.segments.iter().map(|s| s.activity).collect();
        assert_eq!(order, [Activity::Verify, Activity::Read, Activity::Step]);
        let passes = t.target_passes();
        assert_eq!(passes.len(), 2);
        assert!(passes[0].start < passes[1].start);
        assert_eq!((passes[0].tokens, passes[1].tokens), (5, 1));
        assert!(t.any(Activity::Read) && !t.any(Activity::Grow));
    }
}

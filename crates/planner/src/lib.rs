//! The planner: what a run should do on this device, and the measured
//! facts it decides with. [`auto`] estimates each draft source's tokens
//! per second under a memory budget from a device profile (a latency curve
//! `L_fp(n)`, the disk's direct-read bandwidth, the bytes a pass reads);
//! [`sources`] holds each source's measured acceptance and turns the
//! winner into a strategy; [`ProfileStore`] caches the facts under
//! `$ARBOR_HOME/profiles/` and heals stale curves ([`Drift`]), and
//! [`compute`] scales the target's curve by what streamed passes computed
//! (read from a generation's [`Trace`]: the decoding loop's phases and the
//! weight streamer's spans on one clock);
//! [`rates`] keeps what each source's decoding measured under a budget,
//! which `auto` plans with where it exists; [`storage`] finds the read
//! limit a process's cgroup puts on its model's disk, which keeps each
//! storage regime's streaming figures apart; [`upload`] keeps how fast a
//! GPU backend takes in streamed layers, which prices a pass under a GPU's
//! budget;
//! [`slo`]
//! measures the device profile and quality table that latency objectives
//! are served from; [`eval`] scores a model against text (perplexity,
//! greedy agreement). It loads no model file: the engine hands it models
//! (any [`arbor_model::LanguageModel`]) and file facts.

pub mod acceptance;
pub mod auto;
pub mod choice;
pub mod compute;
pub mod curve;
pub mod disk;
pub mod eval;
pub mod profiles;
pub mod rates;
pub mod slo;
pub mod sources;
pub mod storage;
pub mod trace;
pub mod upload;

use arbor_speculative::LatencyProfile;

pub use acceptance::{AcceptanceRecord, source_key};
pub use compute::StreamComputeRecord;
pub use disk::DiskRecord;
pub use eval::{greedy_agreement, perplexity};
pub use profiles::{Drift, LatencyRecord, ProfileStore, now_utc, stem};
pub use rates::{Rate, RateRecord, strategy_key};
pub use trace::{Activity, Segment, Trace};
pub use upload::{UploadRecord, pass_io_secs};

/// Why a measurement or a plan failed.
#[derive(Debug, thiserror::Error)]
pub enum PlannerError {
    #[error(transparent)]
    Model(#[from] arbor_model::ModelError),
    #[error(transparent)]
    Slo(#[from] arbor_slo::SloError),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = PlannerError> = std::result::Result<T, E>;

/// The latency curves trees are sized with, as the run sees them.
#[derive(Debug, Clone)]
pub struct Profiles {
    /// The target's curve: with every layer resident, or (when no cached
    /// one existed and the run streams) as measured while streaming.
    pub target: LatencyProfile,
    pub draft: Option<LatencyProfile>,
    /// Seconds each target pass spends bringing in streamed layers (the
    /// plan's bytes per pass at the measured disk bandwidth, or under a
    /// GPU's budget its uploads' and disk reads' slower; 0 without a
    /// budget: [`pass_io_secs`]).
    pub io_per_pass: f64,
    /// Seconds of those reads no compute can hide: with pipelined
    /// streaming the first streamed layer's read (the others overlap the
    /// layers computed before them); without, all of them.
    pub io_exposed: f64,
}

impl Profiles {
    /// The target's curve as a pass under this run's budget costs it: the
    /// compute of `n` tokens and the reads overlap except for the exposed
    /// part, so a pass costs its reads until the tokens' compute outgrows
    /// them — the flat stretch where large trees are nearly free.
    pub fn target_under_budget(&self) -> LatencyProfile {
        let (io, exposed) = (self.io_per_pass, self.io_exposed);
        LatencyProfile {
            points: (self.target.points.iter())
                .map(|&(n, s)| (n, s.max(io - exposed) + exposed))
                .collect(),
        }
    }
}

//! What serving latency objectives needs, and where it is kept: the
//! tables a run measures once (device profile, quality table, scorer),
//! the files they are cached in, and the report of one served request.

use std::path::{Path, PathBuf};

use arbor_slo::{Choice, DeviceProfile, Latency, QualityTable, Scorer, Slo};

use crate::profiles::{ProfileStore, stem};

/// Prompt lengths a device profile measures prefill at.
pub const PROFILE_LENGTHS: [usize; 5] = [32, 64, 128, 256, 512];
/// Greedy steps a device profile times per level.
pub const PROFILE_DECODE: usize = 16;
/// The device profile takes the median of this many runs per point.
pub const PROFILE_REPS: usize = 3;
/// Share of the objective the decision plans to use: predictions are
/// medians of a noisy machine, so it leaves this much room.
pub const HEADROOM: f64 = 0.95;

/// What a run needs to serve objectives.
#[derive(Debug, Clone, PartialEq)]
pub struct SloTables {
    pub profile: DeviceProfile,
    pub quality: QualityTable,
    pub scorer: Scorer,
}

/// Calibration material for tables that are not cached yet.
pub struct Calibration<'a> {
    /// Prompts the quality table is measured on.
    pub prompts: &'a [String],
    /// Text the bigram scorer counts (Brown by default).
    pub text: &'a str,
    /// Answer tokens per prompt.
    pub answer_tokens: usize,
    /// The original model the elastic file was built from: the device
    /// profile measures it too, as the latency objectives are fractions
    /// of. `None`: the elastic file's full level stands in.
    pub reference: Option<&'a Path>,
}

/// Where a model's objective tables live in the profile store.
pub struct SloFiles {
    pub profile: PathBuf,
    pub quality: PathBuf,
    pub bigram: PathBuf,
}

impl SloFiles {
    pub fn new(store: &ProfileStore, model: &Path, kernels: &str, threads: usize) -> Self {
        let s = stem(model);
        Self {
            profile: store
                .dir()
                .join(format!("slo-device-{s}-{kernels}-t{threads}.json")),
            quality: store.dir().join(format!("slo-quality-{s}.json")),
            bigram: store.dir().join(format!("slo-bigram-{s}.bin")),
        }
    }
}

/// How one request with an objective was served.
#[derive(Debug, Clone)]
pub struct SloReport {
    pub slo: Slo,
    pub choice: Choice,
    /// Measured: scoring, switching and prefill to the first token; the
    /// decode's time per token after it.
    pub measured: Latency,
    /// The full model's predicted latency for this prompt: what the
    /// objective's fractions are fractions of.
    pub full: Latency,
    pub switch_secs: f64,
    pub score_secs: f64,
}

impl SloReport {
    /// Measured latency as fractions of the full model's.
    pub fn fractions(&self) -> (f64, f64) {
        (
            self.measured.ttft / self.full.ttft,
            self.measured.tpot / self.full.tpot,
        )
    }

    /// Whether the measured latency met the objective (a request that made
    /// fewer than two tokens has no time per token to miss).
    pub fn met(&self) -> bool {
        let (t, p) = self.fractions();
        t <= self.slo.ttft + 1e-9 && (p <= self.slo.tpot + 1e-9 || self.measured.tpot == 0.0)
    }

    /// `slo ttft=0.5 tpot=0.8 -> model 0.6, prompt 0.8: met` or
    /// `: missed (why)`.
    pub fn line(&self) -> String {
        let (t, p) = self.fractions();
        let head = format!(
            "slo ttft={} tpot={} -> {}",
            self.slo.ttft, self.slo.tpot, self.choice.pair
        );
        if self.met() {
            return format!("{head}: met (ttft {t:.2}, tpot {p:.2} of the full model's)");
        }
        let mut why = Vec::new();
        if !self.choice.met {
            why.push("no pair was predicted to meet it, so the fastest ran".to_string());
        }
        if t > self.slo.ttft {
            why.push(format!("ttft {t:.2} > {}", self.slo.ttft));
        }
        if p > self.slo.tpot {
            why.push(format!("tpot {p:.2} > {}", self.slo.tpot));
        }
        format!("{head}: missed ({})", why.join("; "))
    }
}

/// A cached table, if the file holds one.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

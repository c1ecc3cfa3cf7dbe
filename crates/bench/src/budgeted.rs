//! What every row of the memory-budget benchmark shares, arbor's
//! ([`crate::budget`]) and the peers' ([`crate::peer`]): the row itself,
//! the limits of the cgroup it runs in, the peak that measured it, and the
//! storage state it starts from.

use std::path::Path;

use anyhow::{Context, Result};

use crate::cgroup::{Group, Limits, ReadCap};

/// One strategy under one budget.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct BudgetRow {
    pub strategy: String,
    pub budget_bytes: u64,
    pub prompts: usize,
    pub identical: usize,
    pub tok_s: f64,
    pub speedup_vs_autoregressive: f64,
    /// The cgroup's peak usage (v2 `memory.peak`, v1
    /// `memory.max_usage_in_bytes`) when run in one and readable, else the
    /// process's peak RSS; `peak_source` says which (`cgroup v2`,
    /// `cgroup v1`, `rss (unconfined)`, `rss (cgroup v2 has no memory.peak)`).
    pub peak_bytes: u64,
    pub peak_source: String,
    /// The process's own peak RSS (its mapped file pages included, shared
    /// or not): what its memory plan counts as held.
    #[serde(default)]
    pub rss_peak_bytes: u64,
    /// Killed by the OOM killer (or any signal).
    pub killed: bool,
    pub streamed_gib_per_100: f64,
    pub mean_accepted: f64,
    /// Time split over the decode phase, seconds.
    pub draft_secs: f64,
    pub target_compute_secs: f64,
    pub target_io_secs: f64,
    pub provisional_secs: f64,
    /// Draft tokens made while the target waited for weights, and how many
    /// of them the target accepted later.
    #[serde(default)]
    pub provisional_tokens: usize,
    #[serde(default)]
    pub provisional_accepted: usize,
    pub decode_secs: f64,
    pub generated: usize,
    /// Target passes after the prefill, and the draft tokens (or ppd
    /// candidates) they verified: two runs of one source that accept the
    /// same but compute differently show here whether their trees differed.
    #[serde(default)]
    pub passes: usize,
    #[serde(default)]
    pub draft_tokens: usize,
    /// Another engine's row (llama.cpp): run on fewer prompts and tokens,
    /// outputs not compared; `mean_accepted` is its acceptance rate.
    #[serde(default)]
    pub peer: bool,
}

/// A group's limits: `memory` bytes, and reads of the device holding
/// `file` capped at `read_limit` bytes/s.
pub fn limits(file: &Path, memory: Option<u64>, read_limit: Option<u64>) -> Result<Limits> {
    let reads = read_limit
        .map(|bps| ReadCap::of_file(file, bps))
        .transpose()
        .with_context(|| format!("finding the block device of {}", file.display()))?;
    Ok(Limits { memory, reads })
}

/// A finished row's peak and what measured it: the group's peak where it
/// can be read, else `rss` (the process's own peak RSS), saying why.
pub fn measured_peak(group: Option<&Group>, rss: u64) -> (u64, String) {
    match group.map(|g| (g.version(), g.peak())) {
        Some((v, Some(peak))) => (peak, v.to_string()),
        Some((v, None)) => (rss, format!("rss ({v} has no {})", v.peak_file())),
        None => (rss, "rss (unconfined)".into()),
    }
}

/// Reads `file` whole with direct IO. Storage below the page cache (a
/// hypervisor's cache here) keeps what was read recently, so a row that
/// streams other layers than the row before it would read colder; every
/// budgeted row starts after this, from the same storage state.
pub fn settle_storage(file: &Path) -> Result<()> {
    let reader = arbor_paging::DirectReader::open(file)?;
    reader.read_through(reader.len(), 16 << 20)?;
    Ok(())
}

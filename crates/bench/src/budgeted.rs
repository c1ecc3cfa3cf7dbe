//! What every row of the memory-budget benchmark shares, arbor's
//! ([`crate::budget`]) and the peers' ([`crate::peer`]): the row itself,
//! the limits of the cgroup it runs in, the peak that measured it, and the
//! storage state it starts from.

use std::path::Path;

use anyhow::{Context, Result, bail};

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

/// The `part`-th (from 0) of `parts` contiguous shares of `items`, in
/// order; shares differ in length by at most one, and some are empty when
/// there are fewer items than parts.
pub fn share<T>(items: &[T], part: usize, parts: usize) -> &[T] {
    let parts = parts.max(1);
    let at = |p: usize| (items.len() * p.min(parts)) / parts;
    &items[at(part)..at(part + 1)]
}

/// `--part K/N`: the K-th (from 0) of N rounds.
pub fn parse_part(text: &str) -> Result<(usize, usize)> {
    let parsed = text
        .split_once('/')
        .and_then(|(k, n)| Some((k.parse::<usize>().ok()?, n.parse::<usize>().ok()?)));
    match parsed {
        Some((k, n)) if k < n => Ok((k, n)),
        _ => bail!("--part takes K/N with K < N, not `{text}`"),
    }
}

impl BudgetRow {
    /// Folds `more`, this row run again on further prompts (a later round
    /// of `--rounds`), into it: counts and seconds add up, the rates are
    /// recomputed from the sums, the peak is the higher one. A round that
    /// did not finish leaves its note in `peak_source`.
    pub fn absorb(&mut self, more: &BudgetRow) {
        let weigh = |a: f64, wa: f64, b: f64, wb: f64| match wa + wb > 0.0 {
            true => (a * wa + b * wb) / (wa + wb),
            false => 0.0,
        };
        // Trees' tokens per pass weigh by passes; a peer's acceptance rate
        // (no passes counted) by prompts.
        let (wa, wb) = match self.passes + more.passes {
            0 => (self.prompts, more.prompts),
            _ => (self.passes, more.passes),
        };
        self.mean_accepted = weigh(self.mean_accepted, wa as f64, more.mean_accepted, wb as f64);
        self.streamed_gib_per_100 = weigh(
            self.streamed_gib_per_100,
            self.generated as f64,
            more.streamed_gib_per_100,
            more.generated as f64,
        );
        self.prompts += more.prompts;
        self.identical += more.identical;
        self.generated += more.generated;
        self.decode_secs += more.decode_secs;
        self.draft_secs += more.draft_secs;
        self.target_compute_secs += more.target_compute_secs;
        self.target_io_secs += more.target_io_secs;
        self.provisional_secs += more.provisional_secs;
        self.provisional_tokens += more.provisional_tokens;
        self.provisional_accepted += more.provisional_accepted;
        self.passes += more.passes;
        self.draft_tokens += more.draft_tokens;
        self.tok_s = self.generated as f64 / self.decode_secs.max(1e-9);
        self.rss_peak_bytes = self.rss_peak_bytes.max(more.rss_peak_bytes);
        // A failed round's note stays, whichever round failed.
        let failed = |r: &BudgetRow| r.peak_source.contains("did not finish");
        if failed(more) || (!failed(self) && more.peak_bytes > self.peak_bytes) {
            self.peak_source = more.peak_source.clone();
        }
        self.peak_bytes = self.peak_bytes.max(more.peak_bytes);
        self.killed |= more.killed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_the_items_once_in_order() {
        let items: Vec<usize> = (0..8).collect();
        for parts in 1..=11 {
            let joined: Vec<usize> = (0..parts)
                .flat_map(|p| share(&items, p, parts).to_vec())
                .collect();
            assert_eq!(joined, items, "{parts} parts");
            let lens: Vec<usize> = (0..parts).map(|p| share(&items, p, parts).len()).collect();
            let (lo, hi) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
            assert!(hi - lo <= 1, "{lens:?}");
        }
        assert_eq!(share(&items, 1, 4), &[2, 3]);
        assert!(share(&items, 9, 4).is_empty());
        assert!(share(&[0u8; 0], 0, 3).is_empty());
        assert_eq!(parse_part("1/4").unwrap(), (1, 4));
        for bad in ["4/4", "1", "a/2", "1/", "-1/2"] {
            assert!(parse_part(bad).is_err(), "{bad}");
        }
    }

    fn round(
        prompts: usize,
        generated: usize,
        secs: f64,
        passes: usize,
        accepted: f64,
    ) -> BudgetRow {
        BudgetRow {
            strategy: "auto".into(),
            prompts,
            identical: prompts,
            generated,
            decode_secs: secs,
            tok_s: generated as f64 / secs,
            passes,
            mean_accepted: accepted,
            streamed_gib_per_100: 50.0,
            peak_bytes: 100,
            peak_source: "cgroup v1".into(),
            ..BudgetRow::default()
        }
    }

    #[test]
    fn rounds_add_up_to_one_row() {
        // 4 prompts: 200 tokens in 100 s over 50 passes at 4 a pass, then
        // 2 prompts: 300 tokens in 50 s over 50 passes at 6 a pass.
        let mut row = round(4, 200, 100.0, 50, 4.0);
        let mut more = round(2, 300, 50.0, 50, 6.0);
        more.streamed_gib_per_100 = 20.0;
        more.peak_bytes = 120;
        more.peak_source = "cgroup v1 (later)".into();
        row.absorb(&more);
        assert_eq!(
            (row.prompts, row.identical, row.generated, row.passes),
            (6, 6, 500, 100)
        );
        // The rate of the sums, not the mean of the rates (2.0 and 6.0).
        assert!((row.tok_s - 500.0 / 150.0).abs() < 1e-9, "{}", row.tok_s);
        assert!((row.mean_accepted - 5.0).abs() < 1e-9);
        assert!((row.streamed_gib_per_100 - (50.0 * 200.0 + 20.0 * 300.0) / 500.0).abs() < 1e-9);
        assert_eq!(
            (row.peak_bytes, row.peak_source.as_str()),
            (120, "cgroup v1 (later)")
        );
        // A round that failed says so, and a lower peak does not replace
        // the higher one.
        let mut failed = BudgetRow {
            peak_bytes: 10,
            peak_source: "did not finish (signal: 9)".into(),
            killed: true,
            ..BudgetRow::default()
        };
        failed.strategy = "auto".into();
        row.absorb(&failed);
        assert!(row.killed && row.peak_source.contains("did not finish"));
        assert_eq!(row.peak_bytes, 120);
        // A later round with a higher peak keeps the failure's note.
        let mut higher = round(1, 10, 5.0, 5, 2.0);
        higher.peak_bytes = 200;
        row.absorb(&higher);
        assert_eq!(row.peak_bytes, 200);
        assert!(
            row.peak_source.contains("did not finish"),
            "{}",
            row.peak_source
        );
        // Peers count no passes: their acceptance rates weigh by prompts.
        let mut peer = BudgetRow {
            prompts: 1,
            mean_accepted: 0.2,
            ..BudgetRow::default()
        };
        peer.absorb(&BudgetRow {
            prompts: 3,
            mean_accepted: 0.6,
            ..BudgetRow::default()
        });
        assert!((peer.mean_accepted - 0.5).abs() < 1e-9);
    }
}

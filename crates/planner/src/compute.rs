//! How long a target's passes compute while its layers stream, against
//! its resident curve `L_fp(n)`. A streamed layer runs other kernels (its
//! GGUF rows, not the interleaved layout) and shares the cores with the
//! loader's threads, so a pass of many rows computes slower than the
//! resident curve says: PPD's passes of ~40 rows took 1.3–1.4× of it on
//! our 2-core VMs, and `auto` rated PPD 1.5× too fast. Runs that stream
//! record, by row count, the compute they saw (a pass's time less its
//! waits for weights) and what the curve predicted; `auto` scales the curve
//! by their ratio when it plans a budget that streams.

use std::path::{Path, PathBuf};

use arbor_speculative::LatencyProfile;

use crate::ProfileStore;
use crate::Result;
use crate::acceptance::KEEP;
use crate::profiles::{now_utc, stem};

/// Upper row counts of the buckets passes are counted in (the last one
/// takes every larger pass).
pub const BUCKETS: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
/// Seconds of predicted compute a bucket needs before its ratio is used.
pub const MIN_SECS: f64 = 1.0;
/// The ratio is held to this range (either way) against outliers.
pub const MAX_FACTOR: f64 = 4.0;

/// The bucket a pass of `rows` rows is counted in.
pub fn bucket(rows: usize) -> usize {
    BUCKETS
        .iter()
        .position(|&b| rows <= b)
        .unwrap_or(BUCKETS.len() - 1)
}

/// One target's streamed compute, as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StreamComputeRecord {
    pub target: String,
    /// UTC time of the last generation folded in.
    pub updated: String,
    pub generations: u64,
    /// Per bucket: seconds the passes computed, fading.
    pub observed: Vec<f64>,
    /// Per bucket: seconds the resident curve predicted for them.
    pub predicted: Vec<f64>,
}

impl StreamComputeRecord {
    fn new(target: &Path) -> Self {
        Self {
            target: stem(target),
            updated: String::new(),
            generations: 0,
            observed: vec![0.0; BUCKETS.len()],
            predicted: vec![0.0; BUCKETS.len()],
        }
    }

    /// Folds one generation's passes in: `(rows, computed secs, predicted
    /// secs)` each; what was there before keeps [`KEEP`] of its weight.
    pub fn fold(&mut self, passes: &[(usize, f64, f64)]) {
        for (o, p) in self.observed.iter_mut().zip(&mut self.predicted) {
            *o *= KEEP;
            *p *= KEEP;
        }
        for &(rows, computed, predicted) in passes {
            if computed.is_finite() && predicted.is_finite() && predicted > 0.0 {
                let b = bucket(rows);
                self.observed[b] += computed.max(0.0);
                self.predicted[b] += predicted;
            }
        }
        self.generations += 1;
    }

    /// How much slower than the resident curve a pass of `rows` rows
    /// computes while streaming: its bucket's ratio, else the nearest
    /// counted bucket's (the smaller on a tie), else 1.
    pub fn factor(&self, rows: usize) -> f64 {
        let b = bucket(rows) as isize;
        let counted = |i: isize| -> Option<f64> {
            let i = usize::try_from(i).ok()?;
            let (o, p) = (*self.observed.get(i)?, *self.predicted.get(i)?);
            (p >= MIN_SECS).then(|| (o / p).clamp(1.0 / MAX_FACTOR, MAX_FACTOR))
        };
        (0..BUCKETS.len() as isize)
            .find_map(|d| counted(b - d).or_else(|| counted(b + d)))
            .unwrap_or(1.0)
    }

    /// `curve` with every point scaled by its row count's factor.
    pub fn apply(&self, curve: &LatencyProfile) -> LatencyProfile {
        LatencyProfile {
            points: (curve.points.iter())
                .map(|&(n, secs)| (n, secs * self.factor(n)))
                .collect(),
        }
    }

    fn fits(&self) -> bool {
        self.observed.len() == BUCKETS.len() && self.predicted.len() == BUCKETS.len()
    }
}

impl ProfileStore {
    fn stream_compute_path(&self, target: &Path) -> PathBuf {
        self.dir()
            .join(format!("stream-compute-{}.json", stem(target)))
    }

    /// What streamed runs of `target` computed against its resident curve.
    pub fn stream_compute(&self, target: &Path) -> Option<StreamComputeRecord> {
        let text = std::fs::read_to_string(self.stream_compute_path(target)).ok()?;
        serde_json::from_str::<StreamComputeRecord>(&text)
            .ok()
            .filter(StreamComputeRecord::fits)
    }

    /// Folds a streamed generation's target passes into `target`'s record
    /// (see [`StreamComputeRecord::fold`]; no passes: no write).
    pub fn observe_stream_compute(
        &self,
        target: &Path,
        passes: &[(usize, f64, f64)],
    ) -> Result<()> {
        if passes.is_empty() {
            return Ok(());
        }
        let mut record = self
            .stream_compute(target)
            .unwrap_or_else(|| StreamComputeRecord::new(target));
        record.fold(passes);
        record.updated = now_utc();
        self.write(&self.stream_compute_path(target), &record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_their_row_counts() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 0);
        assert_eq!(bucket(3), 2);
        assert_eq!(bucket(40), 6);
        assert_eq!(bucket(1000), BUCKETS.len() - 1);
    }

    #[test]
    fn a_counted_bucket_scales_the_curve_and_its_neighbours_follow() {
        let mut r = StreamComputeRecord::new(Path::new("t.gguf"));
        assert_eq!(r.factor(40), 1.0, "nothing counted: the curve as it is");
        // 40-row passes computed 1.4x their prediction; 12-row ones 1.0x,
        // but too few seconds of them to count.
        r.fold(&[(40, 1.4, 1.0), (40, 0.7, 0.5), (12, 0.2, 0.2)]);
        assert!((r.factor(40) - 1.4).abs() < 1e-9);
        assert!((r.factor(33) - 1.4).abs() < 1e-9);
        assert!(
            (r.factor(1) - 1.4).abs() < 1e-9,
            "the nearest counted bucket"
        );
        let curve = LatencyProfile {
            points: vec![(1, 0.1), (64, 0.5)],
        };
        let scaled = r.apply(&curve);
        assert!((scaled.at(64) - 0.7).abs() < 1e-9);
        // Later generations outweigh older ones as they fade.
        for _ in 0..40 {
            r.fold(&[(40, 1.0, 1.0), (2, 1.0, 1.0)]);
        }
        assert!((r.factor(40) - 1.0).abs() < 0.01, "{}", r.factor(40));
        assert!((r.factor(2) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn outliers_are_held_to_the_range() {
        let mut r = StreamComputeRecord::new(Path::new("t.gguf"));
        r.fold(&[(8, 100.0, 2.0), (8, f64::NAN, 1.0), (8, 1.0, 0.0)]);
        assert_eq!(r.factor(8), MAX_FACTOR);
    }

    #[test]
    fn the_store_folds_and_reads_back() {
        let dir = std::env::temp_dir().join(format!("arbor-stream-compute-{}", std::process::id()));
        let store = ProfileStore::new(dir.clone());
        let target = Path::new("/models/t.gguf");
        assert!(store.stream_compute(target).is_none());
        store.observe_stream_compute(target, &[]).unwrap();
        assert!(store.stream_compute(target).is_none(), "no passes: no file");
        store
            .observe_stream_compute(target, &[(32, 3.0, 2.0)])
            .unwrap();
        let r = store.stream_compute(target).unwrap();
        assert_eq!(r.generations, 1);
        assert!((r.factor(32) - 1.5).abs() < 1e-9);
        // A record of another shape is not used.
        std::fs::write(
            dir.join("stream-compute-t.json"),
            r#"{"target":"t","updated":"","generations":1,"observed":[1.0],"predicted":[1.0]}"#,
        )
        .unwrap();
        assert!(store.stream_compute(target).is_none());
        std::fs::remove_dir_all(dir).ok();
    }
}

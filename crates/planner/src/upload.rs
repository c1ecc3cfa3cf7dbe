//! How fast a backend takes in streamed layers: under a GPU's memory
//! budget a pass uploads every layer the GPU does not hold (the file's
//! bytes in, the device's weights out), so that rate, not the disk's,
//! prices its passes. Cached per backend under `$ARBOR_HOME/profiles/`:
//! a probe's figure first (building one layer a few times), then what
//! generations under a GPU budget achieved.

use std::path::PathBuf;

use crate::profiles::now_utc;
use crate::{ProfileStore, Result};

/// A backend's upload rate, as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UploadRecord {
    /// The backend's kernels ([`ProfileStore::upload_path`]'s key).
    pub kernels: String,
    /// The rate to plan with: the probe's until generations measured one,
    /// then a running average of theirs.
    pub bytes_per_sec: f64,
    /// What the probe measured.
    pub probed: f64,
    /// Generations folded in since the probe.
    pub generations: u64,
    pub measured: String,
}

/// Generations that built less than this are too short to tell.
const MIN_OBSERVED: u64 = 16 << 20;

impl UploadRecord {
    /// A record of a probe that built `bytes` in `secs`.
    pub fn probe(kernels: &str, bytes: u64, secs: f64) -> Self {
        let rate = bytes as f64 / secs.max(1e-9);
        Self {
            kernels: kernels.into(),
            bytes_per_sec: rate,
            probed: rate,
            generations: 0,
            measured: now_utc(),
        }
    }

    /// Folds in a generation that built `bytes` in `secs`: the first
    /// replaces the probe's figure, later ones average with it (a running
    /// average over at most 8, so the figure follows a changed machine).
    pub fn observe(&mut self, bytes: u64, secs: f64) {
        if bytes < MIN_OBSERVED || secs <= 0.0 {
            return;
        }
        let rate = bytes as f64 / secs;
        let n = self.generations.min(7) as f64;
        self.bytes_per_sec = (self.bytes_per_sec * n + rate) / (n + 1.0);
        self.generations += 1;
        self.measured = now_utc();
    }
}

/// Seconds a pass spends bringing in its streamed layers: `upload` bytes
/// copied to the device at `upload_bw` (none without a GPU budget) and
/// `disk` of them read from the disk at `disk_bw`, the reader, the
/// uploads and the compute running side by side, so the slower of the two
/// bounds the pass.
pub fn pass_io_secs(upload: u64, upload_bw: Option<f64>, disk: u64, disk_bw: f64) -> f64 {
    let up = upload_bw.map_or(0.0, |bw| upload as f64 / bw.max(1.0));
    let read = disk as f64 / disk_bw.max(1.0);
    up.max(read)
}

impl ProfileStore {
    /// Where the upload rate of the backend with `kernels` is kept.
    pub fn upload_path(&self, kernels: &str) -> PathBuf {
        self.dir().join(format!("upload-{kernels}.json"))
    }

    /// The stored upload rate of the backend with `kernels`, if any.
    pub fn cached_upload(&self, kernels: &str) -> Option<UploadRecord> {
        let text = std::fs::read_to_string(self.upload_path(kernels)).ok()?;
        serde_json::from_str::<UploadRecord>(&text)
            .ok()
            .filter(|r| r.bytes_per_sec > 0.0)
    }

    /// The stored upload rate, or `probe`'s (bytes built, seconds) stored
    /// now and announced.
    pub fn upload(
        &self,
        kernels: &str,
        probe: impl FnOnce() -> Result<(u64, f64)>,
    ) -> Result<(UploadRecord, Option<String>)> {
        if let Some(r) = self.cached_upload(kernels) {
            return Ok((r, None));
        }
        let (bytes, secs) = probe()?;
        let record = UploadRecord::probe(kernels, bytes, secs);
        let what = format!(
            "measured uploading streamed layers to the {kernels} device: {:.2} GB/s",
            record.bytes_per_sec / 1e9
        );
        let note = self.saved(&self.upload_path(kernels), &record, &what);
        Ok((record, Some(note)))
    }

    /// Folds what a generation under a GPU budget built (`bytes` in `secs`
    /// of building) into the backend's record, where one exists.
    pub fn observe_upload(&self, kernels: &str, bytes: u64, secs: f64) -> Result<()> {
        let Some(mut record) = self.cached_upload(kernels) else {
            return Ok(());
        };
        record.observe(bytes, secs);
        self.write(&self.upload_path(kernels), &record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_replace_then_average_the_probe() {
        let mut r = UploadRecord::probe("wgpu", 2_000_000_000, 1.0);
        assert_eq!(r.bytes_per_sec, 2e9);
        r.observe(1 << 20, 1.0);
        assert_eq!(r.generations, 0, "too short to tell");
        r.observe(1_000_000_000, 1.0);
        assert_eq!(
            r.bytes_per_sec, 1e9,
            "the first generation replaces the probe"
        );
        r.observe(3_000_000_000, 1.0);
        assert_eq!(r.bytes_per_sec, 2e9);
        for _ in 0..60 {
            r.observe(500_000_000, 1.0);
        }
        assert!(
            (r.bytes_per_sec - 0.5e9).abs() < 0.05e9,
            "{}",
            r.bytes_per_sec
        );
        assert_eq!(r.probed, 2e9);
    }

    #[test]
    fn the_slower_of_uploads_and_disk_reads_bounds_a_pass() {
        const GB: u64 = 1_000_000_000;
        // A host budget: the disk alone.
        assert_eq!(pass_io_secs(0, None, 2 * GB, 1e9), 2.0);
        // A GPU's: everything streamed is uploaded; only what host memory
        // does not hold is read from the disk.
        assert_eq!(pass_io_secs(3 * GB, Some(6e9), 0, 1e9), 0.5);
        assert_eq!(pass_io_secs(3 * GB, Some(6e9), GB, 1e9), 1.0);
        assert_eq!(pass_io_secs(3 * GB, Some(1e9), GB, 2e9), 3.0);
    }

    #[test]
    fn the_store_probes_once_and_learns_from_generations() {
        let dir = std::env::temp_dir().join(format!("arbor-upload-{}", std::process::id()));
        let store = ProfileStore::new(dir.clone());
        let mut probes = 0;
        let (r, note) = store
            .upload("wgpu", || {
                probes += 1;
                Ok((1 << 30, 0.5))
            })
            .unwrap();
        assert!(note.is_some_and(|n| n.contains("GB/s")));
        assert!((r.bytes_per_sec - 2.147e9).abs() < 1e7);
        let (again, note) = store.upload("wgpu", || unreachable!()).unwrap();
        assert_eq!((again, note, probes), (r, None, 1));
        store.observe_upload("wgpu", 1 << 30, 2.0).unwrap();
        let learned = store.cached_upload("wgpu").unwrap();
        assert_eq!(learned.generations, 1);
        assert!((learned.bytes_per_sec - 0.537e9).abs() < 1e7);
        assert!(store.cached_upload("candle").is_none());
        store.observe_upload("candle", 1 << 30, 2.0).unwrap();
        assert!(
            store.cached_upload("candle").is_none(),
            "no probe, no record"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}

//! The disk's read bandwidth, cached under `$ARBOR_HOME/profiles/` per
//! device and storage regime: what a probe of direct reads measured once,
//! and what streamed generations achieved by working set since, which is
//! what plans use where it exists.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::profiles::now_utc;
use crate::{PlannerError, ProfileStore, Result};

/// Direct-read bandwidth assumed where none could be measured (reads that
/// fell back to the page cache measure memory, not the disk): this
/// machine kind's cold disk.
pub const ASSUMED_DISK_BYTES_PER_SEC: f64 = 0.9e9;

/// The disk's direct-read bandwidth, as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DiskRecord {
    /// The file that was read (a model's GGUF).
    pub file: String,
    pub bytes: u64,
    pub bytes_per_sec: f64,
    /// Whether the reads bypassed the page cache (`O_DIRECT`); a buffered
    /// fallback measures the cache, not the disk.
    pub direct: bool,
    pub measured: String,
    /// Bandwidth of reading the first half of that span again: streaming
    /// re-reads the same layers on every pass, which storage below the page
    /// cache (a drive's or a hypervisor's cache) may serve faster than a
    /// first read (on this project's VMs ~1.8 GB/s against ~0.8 cold).
    #[serde(default)]
    pub repeat_bytes_per_sec: Option<f64>,
    /// What streamed generations achieved, by bytes read per pass: the
    /// same layers are read on every pass, and a working set small enough
    /// for a cache below the page cache (a drive's, a hypervisor's) streams
    /// faster than one that is not (on this project's VMs ~2.2 GB/s at
    /// 430 MiB per pass, ~0.9 GB/s at 750 MiB).
    #[serde(default)]
    pub streamed: Vec<Streamed>,
}

/// Read bandwidth observed while streaming `read_per_pass` bytes per pass
/// (a running average over generations).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Streamed {
    pub read_per_pass: u64,
    pub bytes_per_sec: f64,
}

/// Observations closer than this in bytes per pass are one working set.
const SAME_WORKING_SET: u64 = 48 << 20;

impl DiskRecord {
    /// The bandwidth to plan streamed passes with: the measured one when
    /// the reads bypassed the page cache, else [`ASSUMED_DISK_BYTES_PER_SEC`].
    pub fn planning_bytes_per_sec(&self) -> f64 {
        if self.direct {
            self.bytes_per_sec
        } else {
            ASSUMED_DISK_BYTES_PER_SEC
        }
    }

    /// The bandwidth streamed passes see in steady state, when every pass
    /// reads the same layers: the repeated reads' figure when measured.
    pub fn streaming_bytes_per_sec(&self) -> f64 {
        match self.repeat_bytes_per_sec {
            Some(r) if self.direct => r.max(self.bytes_per_sec),
            _ => self.planning_bytes_per_sec(),
        }
    }

    /// The bandwidth the probe suggests for a working set of `read` bytes
    /// per pass: it read `bytes` once and its first half again, so a set
    /// no larger than that half streams at the repeated reads' rate, one as
    /// large as the whole span or larger at the first read's, and one in
    /// between at a rate between them. (Planning every set at the repeated
    /// rate rated the drafts that stream the most bytes too fast: on our
    /// VMs the probe's 256 MiB re-read ran at 1.98 GB/s, passes reading
    /// 645–760 MiB streamed at 1.37–1.55.)
    pub fn probe_bytes_per_sec(&self, read: u64) -> f64 {
        let (first, again) = (
            self.planning_bytes_per_sec(),
            self.streaming_bytes_per_sec(),
        );
        let (half, whole) = (self.bytes / 2, self.bytes);
        if read <= half || whole <= half {
            again
        } else if read >= whole {
            first
        } else {
            let t = (read - half) as f64 / (whole - half) as f64;
            again + t * (first - again)
        }
    }

    /// The bandwidth a pass reading `read` bytes should expect: what a
    /// streamed generation of about that working set achieved; between two
    /// observed sizes, interpolated; below them, the smallest one's; above
    /// them, the largest one's or what the probe suggests for the size
    /// ([`Self::probe_bytes_per_sec`]), whichever is less; with nothing
    /// observed, the probe's.
    pub fn bandwidth_for(&self, read: u64) -> f64 {
        let probe = self.probe_bytes_per_sec(read);
        let mut seen = self.streamed.clone();
        seen.sort_by_key(|o| o.read_per_pass);
        if let Some(o) = seen
            .iter()
            .find(|o| o.read_per_pass.abs_diff(read) <= SAME_WORKING_SET)
        {
            return o.bytes_per_sec;
        }
        let below = seen.iter().rev().find(|o| o.read_per_pass < read);
        let above = seen.iter().find(|o| o.read_per_pass > read);
        match (below, above) {
            (Some(b), Some(a)) => {
                let t =
                    (read - b.read_per_pass) as f64 / (a.read_per_pass - b.read_per_pass) as f64;
                b.bytes_per_sec + t * (a.bytes_per_sec - b.bytes_per_sec)
            }
            (None, Some(a)) => a.bytes_per_sec,
            (Some(b), None) => b.bytes_per_sec.min(probe),
            (None, None) => probe,
        }
    }

    /// Folds a bandwidth seen while streaming `read_per_pass` bytes per
    /// pass into the observation of that working set.
    pub fn observe(&mut self, read_per_pass: u64, bytes_per_sec: f64) {
        match (self.streamed.iter_mut())
            .find(|o| o.read_per_pass.abs_diff(read_per_pass) <= SAME_WORKING_SET)
        {
            Some(o) => o.bytes_per_sec = 0.7 * o.bytes_per_sec + 0.3 * bytes_per_sec,
            None => self.streamed.push(Streamed {
                read_per_pass,
                bytes_per_sec,
            }),
        }
    }
}

impl ProfileStore {
    /// The file holding the bandwidth of the disk that holds `file`, as
    /// this process reads it: a read limit on it ([`crate::storage`]) is a
    /// disk of its own.
    pub fn disk_path(&self, file: &Path) -> PathBuf {
        let regime = crate::storage::regime_tag(crate::storage::read_limit(file));
        self.dir()
            .join(format!("disk-{}{regime}.json", device_id(file)))
    }

    pub fn cached_disk(&self, file: &Path) -> Option<DiskRecord> {
        disk_at(&self.disk_path(file))
    }

    /// The bandwidth of the disk holding `file`: cached, or (when missing
    /// or `refresh`) measured now and stored; with a note as
    /// [`ProfileStore::latency`].
    pub fn disk(&self, file: &Path, refresh: bool) -> Result<(DiskRecord, Option<String>)> {
        let path = self.disk_path(file);
        if !refresh && let Some(d) = disk_at(&path) {
            return Ok((d, None));
        }
        let record = measure_disk(file)?;
        let what = format!(
            "measured the disk's read bandwidth: {:.2} GB/s, {:.2} GB/s reading the same span again",
            record.bytes_per_sec / 1e9,
            record.streaming_bytes_per_sec() / 1e9
        );
        let note = self.saved(&path, &record, &what);
        Ok((record, Some(note)))
    }

    /// Folds what a streamed generation read (`bytes` in `secs` of reading,
    /// `read_per_pass` bytes each pass) into the record of the disk holding
    /// `file` (a running average per working set; generations that read
    /// under 64 MiB are too short to tell).
    pub fn observe_streaming(
        &self,
        file: &Path,
        read_per_pass: u64,
        bytes: u64,
        secs: f64,
    ) -> Result<()> {
        if bytes < (64 << 20) || secs <= 0.0 || read_per_pass == 0 {
            return Ok(());
        }
        let path = self.disk_path(file);
        let Some(mut record) = disk_at(&path) else {
            return Ok(());
        };
        record.observe(read_per_pass, bytes as f64 / secs);
        self.write(&path, &record)
    }
}

/// The disk record stored at `path`, if it holds a measured one.
fn disk_at(path: &Path) -> Option<DiskRecord> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str::<DiskRecord>(&text)
        .ok()
        .filter(|d| d.bytes_per_sec > 0.0)
}

/// Reads up to 512 MiB of `file` with direct IO in 16 MiB requests (a
/// streamed layer's size).
fn measure_disk(file: &Path) -> Result<DiskRecord> {
    let reader = arbor_paging::DirectReader::open(file).map_err(io_error)?;
    const CHUNK: usize = 16 << 20;
    let total = reader.len().min(512 << 20);
    let start = Instant::now();
    reader.read_through(total, CHUNK).map_err(io_error)?;
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let again = total / 2;
    let start = Instant::now();
    reader.read_through(again, CHUNK).map_err(io_error)?;
    let repeat = again as f64 / start.elapsed().as_secs_f64().max(1e-9);
    let record = DiskRecord {
        file: file.display().to_string(),
        bytes: total,
        bytes_per_sec: total as f64 / secs,
        direct: reader.is_direct(),
        measured: now_utc(),
        repeat_bytes_per_sec: Some(repeat),
        streamed: Vec::new(),
    };
    Ok(record)
}

fn io_error(e: impl std::fmt::Display) -> PlannerError {
    PlannerError::Invalid(format!("measuring the disk: {e}"))
}

/// The filesystem device of `file` (Unix), so each disk keeps its figure.
fn device_id(file: &Path) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::metadata(file) {
            return format!("{:x}", m.dev());
        }
    }
    "default".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_bandwidth_follows_the_working_set() {
        const MIB: u64 = 1 << 20;
        let mut d = DiskRecord {
            file: "m.gguf".into(),
            bytes: 512 * MIB,
            bytes_per_sec: 0.9e9,
            direct: true,
            measured: now_utc(),
            repeat_bytes_per_sec: None,
            streamed: Vec::new(),
        };
        assert_eq!(
            d.bandwidth_for(400 * MIB),
            0.9e9,
            "nothing seen: direct reads"
        );
        d.observe(430 * MIB, 2.2e9);
        d.observe(440 * MIB, 2.2e9);
        assert_eq!(d.streamed.len(), 1, "one working set");
        assert_eq!(
            d.bandwidth_for(300 * MIB),
            2.2e9,
            "smaller sets stream at least as fast"
        );
        assert_eq!(
            d.bandwidth_for(900 * MIB),
            0.9e9,
            "larger than any seen: direct reads"
        );
        d.observe(750 * MIB, 0.8e9);
        let mid = d.bandwidth_for(590 * MIB);
        assert!(mid < 2.2e9 && mid > 0.8e9, "{mid}");
        d.observe(750 * MIB, 1.8e9);
        assert!(
            (d.bandwidth_for(750 * MIB) - 1.1e9).abs() < 1e3,
            "a running average"
        );
    }

    #[test]
    fn the_probe_rates_a_working_set_by_its_size() {
        const MIB: u64 = 1 << 20;
        let d = DiskRecord {
            file: "m.gguf".into(),
            bytes: 512 * MIB,
            bytes_per_sec: 1.4e9,
            direct: true,
            measured: now_utc(),
            repeat_bytes_per_sec: Some(2.0e9),
            streamed: Vec::new(),
        };
        // Within the half it read again: the repeated rate.
        assert_eq!(d.bandwidth_for(200 * MIB), 2.0e9);
        assert_eq!(d.bandwidth_for(256 * MIB), 2.0e9);
        // As large as its whole span or larger: the first read's.
        assert_eq!(d.bandwidth_for(512 * MIB), 1.4e9);
        assert_eq!(d.bandwidth_for(750 * MIB), 1.4e9);
        // Between: between, falling with the size.
        let (a, b) = (d.bandwidth_for(320 * MIB), d.bandwidth_for(450 * MIB));
        assert!(2.0e9 > a && a > b && b > 1.4e9, "{a} {b}");
        assert!((d.bandwidth_for(384 * MIB) - 1.7e9).abs() < 1.0);
        // A set larger than any seen streams no faster than the largest
        // seen, nor than the probe suggests for its size.
        let mut seen = d.clone();
        seen.observe(300 * MIB, 1.8e9);
        assert_eq!(seen.bandwidth_for(750 * MIB), 1.4e9);
        seen.observe(300 * MIB, 0.2e9); // a running average: 1.32 GB/s
        assert!(seen.bandwidth_for(750 * MIB) < 1.4e9);
        // Buffered probes measured the page cache: the assumed figure.
        let buffered = DiskRecord {
            direct: false,
            ..d.clone()
        };
        assert_eq!(
            buffered.bandwidth_for(100 * MIB),
            ASSUMED_DISK_BYTES_PER_SEC
        );
    }
}

//! Measured machine facts, cached under `$ARBOR_HOME/profiles/`: each
//! model's forward latency `L_fp(n)` for the kernels and thread count in
//! use, and the disk's direct-read bandwidth. `arbor profile` measures them
//! on request; a run measures what is missing once. Latency curves heal: a
//! run whose observed passes disagree with the curve for a sustained
//! stretch re-measures it ([`Drift`]).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Instant;

use arbor_model::{LanguageModel, Mask};
use arbor_speculative::{LatencyProfile, PROFILE_SIZES};

use crate::{PlannerError, Result};

/// Repetitions per measured size; each point is their minimum, the time a
/// pass takes when nothing else holds the cores.
pub const REPETITIONS: usize = 3;
/// Repetitions of each size when a curve is sampled from two layers: each
/// costs little, and their difference's noise is multiplied by the layers.
pub const SAMPLE_REPETITIONS: usize = 7;
/// Cached tokens before each measured pass.
const PREFIX: usize = 128;
/// Direct-read bandwidth assumed where none could be measured (reads that
/// fell back to the page cache measure memory, not the disk): this
/// machine kind's cold disk.
pub const ASSUMED_DISK_BYTES_PER_SEC: f64 = 0.9e9;

/// A latency curve as stored: the points and what they were measured with.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencyRecord {
    pub model: String,
    /// Kernel id of the backend (`BackendKind::kernels` in the engine).
    pub kernels: String,
    pub threads: usize,
    pub repetitions: usize,
    /// UTC date and time of the measurement.
    pub measured: String,
    pub points: Vec<(usize, f64)>,
    /// How the curve was taken when not on the whole model resident
    /// (`sampled`: from its first layers, see [`sampled_points`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

impl LatencyRecord {
    pub fn profile(&self) -> LatencyProfile {
        LatencyProfile {
            points: self.points.clone(),
        }
    }
}

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
}

impl DiskRecord {
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

/// Where profiles live: `$ARBOR_HOME/profiles/` unless given.
#[derive(Debug, Clone)]
pub struct ProfileStore {
    dir: PathBuf,
}

impl Default for ProfileStore {
    fn default() -> Self {
        Self::new(arbor_fetch::arbor_home().join("profiles"))
    }
}

impl ProfileStore {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file holding `model`'s curve for these kernels and threads.
    pub fn latency_path(&self, model: &Path, kernels: &str, threads: usize) -> PathBuf {
        self.dir
            .join(format!("{}-{kernels}-t{threads}.json", stem(model)))
    }

    /// The cached curve of `model`, if one was measured with these
    /// kernels and threads.
    pub fn cached_latency(
        &self,
        model: &Path,
        kernels: &str,
        threads: usize,
    ) -> Option<LatencyRecord> {
        let text = std::fs::read_to_string(self.latency_path(model, kernels, threads)).ok()?;
        serde_json::from_str::<LatencyRecord>(&text)
            .ok()
            .filter(|r| r.kernels == kernels && r.threads == threads)
            .filter(|r| !r.points.is_empty() && r.points.windows(2).all(|w| w[0].0 < w[1].0))
    }

    /// `model`'s curve for these kernels and this process's threads: the
    /// cached one, or (when missing or `refresh`) measured now on `model`
    /// and stored when `save`. The note says what was measured and where
    /// it went (a cache that cannot be written is not an error).
    pub fn latency(
        &self,
        path: &Path,
        kernels: &str,
        model: &mut dyn LanguageModel,
        refresh: bool,
        save: bool,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(LatencyRecord, Option<String>)> {
        let threads = rayon::current_num_threads();
        if !refresh && let Some(r) = self.cached_latency(path, kernels, threads) {
            return Ok((r, None));
        }
        let points = measure_points(model, &PROFILE_SIZES, REPETITIONS, progress)?;
        let record = LatencyRecord {
            model: stem(path),
            kernels: kernels.to_string(),
            threads,
            repetitions: REPETITIONS,
            measured: now_utc(),
            points,
            method: None,
        };
        let file = self.latency_path(path, kernels, threads);
        let what = format!("measured forward latency L_fp(n) of {}", stem(path));
        let note = if save {
            self.saved(&file, &record, &what)
        } else {
            format!("{what} (not cached)")
        };
        Ok((record, Some(note)))
    }

    /// `path`'s curve sampled from its first layers ([`sampled_points`]:
    /// `one` runs its first layer, `two` its first two, `scale` is the
    /// bytes of every layer after the first over the second's), stored
    /// like a measured one; the note says so.
    pub fn sampled_latency(
        &self,
        path: &Path,
        kernels: &str,
        one: &mut dyn LanguageModel,
        two: &mut dyn LanguageModel,
        scale: f64,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(LatencyRecord, String)> {
        let points = sampled_points(one, two, scale, progress)?;
        let record = LatencyRecord {
            model: stem(path),
            kernels: kernels.to_string(),
            threads: rayon::current_num_threads(),
            repetitions: SAMPLE_REPETITIONS,
            measured: now_utc(),
            points,
            method: Some("sampled".into()),
        };
        let what = format!(
            "sampled the forward latency L_fp(n) of {} from its first two layers",
            stem(path)
        );
        let note = self.saved(
            &self.latency_path(path, kernels, record.threads),
            &record,
            &what,
        );
        Ok((record, note))
    }

    /// The file holding the bandwidth of the disk that holds `file`, as
    /// this process reads it: a read limit on it ([`crate::storage`]) is a
    /// disk of its own.
    pub fn disk_path(&self, file: &Path) -> PathBuf {
        let regime = crate::storage::regime_tag(crate::storage::read_limit(file));
        self.dir
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

    /// Stores `value` and says so (or why not) after `what`.
    pub fn saved<T: serde::Serialize>(&self, path: &Path, value: &T, what: &str) -> String {
        match self.write(path, value) {
            Ok(()) => format!("{what} (cached in {})", path.display()),
            Err(e) => format!("{what}, but could not cache it: {e}"),
        }
    }

    pub(crate) fn write<T: serde::Serialize>(&self, path: &Path, value: &T) -> Result<()> {
        let text = serde_json::to_string_pretty(value)
            .map_err(|e| PlannerError::Invalid(format!("profile: {e}")))?;
        std::fs::create_dir_all(&self.dir)
            .and_then(|()| std::fs::write(path, text))
            .map_err(|e| PlannerError::Invalid(format!("writing {}: {e}", path.display())))
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

pub fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
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

/// Times forward passes of `n` new tokens (logits for every row, as a
/// verification needs) after [`PREFIX`] cached tokens for every size, the
/// minimum of `reps` runs each. The model's cache is emptied afterwards.
fn measure_points(
    model: &mut dyn LanguageModel,
    sizes: &[usize],
    reps: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<(usize, f64)>> {
    let vocab = model.config().vocab_size as u32;
    let token = |i: usize| (100 + i as u32 * 7) % vocab.max(1);
    let prompt: Vec<u32> = (0..PREFIX).map(token).collect();
    model.truncate_cache(0)?;
    model.step(&prompt)?;
    let base = model.cache_len();
    let mut points = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        let tokens: Vec<u32> = (0..n).map(|i| token(base + i)).collect();
        let positions: Vec<u32> = (base..base + n).map(|p| p as u32).collect();
        let rows: Vec<usize> = (0..n).collect();
        let mask = Mask::causal(base, n);
        let mut best = f64::INFINITY;
        for _ in 0..reps.max(1) {
            let start = Instant::now();
            model.forward(&tokens, &positions, &mask, &rows)?;
            best = best.min(start.elapsed().as_secs_f64());
            model.truncate_cache(base)?;
        }
        points.push((n, best));
        progress(k + 1, sizes.len());
    }
    model.truncate_cache(0)?;
    Ok(points)
}

/// A model's `L_fp(n)` without holding all of it: `one` runs its first
/// layer (and everything outside the layers), `two` its first two; the
/// second layer's cost is their difference, and every later layer costs
/// it scaled by its bytes (`scale`: all layers after the first over the
/// second's). What a run under a budget too small for the whole model
/// plans with until a resident measurement replaces it. The difference of
/// two timings, multiplied by the layers, is noisy (the 1.5B gave 63 ms
/// for one row and 19 ms for three): more repetitions, and the curve is
/// made non-decreasing ([`crate::curve::monotone`]).
pub fn sampled_points(
    one: &mut dyn LanguageModel,
    two: &mut dyn LanguageModel,
    scale: f64,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<(usize, f64)>> {
    let n = PROFILE_SIZES.len();
    let a = measure_points(one, &PROFILE_SIZES, SAMPLE_REPETITIONS, &mut |k, _| {
        progress(k, 2 * n)
    })?;
    let b = measure_points(two, &PROFILE_SIZES, SAMPLE_REPETITIONS, &mut |k, _| {
        progress(n + k, 2 * n)
    })?;
    let points: Vec<(usize, f64)> = (a.iter().zip(&b))
        .map(|(&(size, one), &(_, two))| (size, one + (two - one).max(0.0) * scale))
        .collect();
    Ok(crate::curve::monotone(&points))
}

/// Watches observed pass times against a latency curve. A curve measured
/// while something else held the cores (or before a kernel or clock
/// change) predicts the wrong costs, and every tree sized from it is the
/// wrong size; once the median ratio of the last [`Drift::STRETCH`]
/// passes leaves `[1 / (1 + MARGIN), 1 + MARGIN]`, the curve is stale.
#[derive(Debug, Clone, Default)]
pub struct Drift {
    ratios: VecDeque<f64>,
}

impl Drift {
    /// Relative disagreement tolerated.
    pub const MARGIN: f64 = 0.3;
    /// Passes in the sliding window whose median ratio is judged.
    pub const STRETCH: usize = 16;

    /// Records one pass that took `observed` seconds where the curve
    /// predicted `predicted`.
    pub fn observe(&mut self, observed: f64, predicted: f64) {
        if !(observed > 0.0 && predicted > 0.0) {
            return;
        }
        if self.ratios.len() == Self::STRETCH {
            self.ratios.pop_front();
        }
        self.ratios.push_back(observed / predicted);
    }

    /// The median observed/predicted ratio of the last stretch, when the
    /// stretch is complete and outside the margin.
    pub fn stale(&self) -> Option<f64> {
        if self.ratios.len() < Self::STRETCH {
            return None;
        }
        let mut r: Vec<f64> = self.ratios.iter().copied().collect();
        r.sort_by(f64::total_cmp);
        let median = r[r.len() / 2];
        let hi = 1.0 + Self::MARGIN;
        (median > hi || median < 1.0 / hi).then_some(median)
    }

    pub fn reset(&mut self) {
        self.ratios.clear();
    }
}

/// Now, as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn now_utc() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_needs_a_sustained_stretch() {
        let mut d = Drift::default();
        for _ in 0..Drift::STRETCH - 1 {
            d.observe(0.05, 0.09);
        }
        assert_eq!(d.stale(), None, "not yet a full stretch");
        d.observe(0.05, 0.09);
        let r = d.stale().expect("passes 45% faster than the curve");
        assert!((r - 0.05 / 0.09).abs() < 1e-9);
        // A few outliers inside an agreeing stretch change nothing.
        let mut d = Drift::default();
        for i in 0..40 {
            d.observe(if i % 5 == 0 { 0.2 } else { 0.051 }, 0.05);
        }
        assert_eq!(d.stale(), None);
        d.reset();
        assert_eq!(d.stale(), None);
    }

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

    #[test]
    fn dates() {
        let now = now_utc();
        assert_eq!(now.len(), 20, "{now}");
        let parsed: jiff::Timestamp = now.parse().expect("RFC 3339");
        assert_eq!(parsed.subsec_nanosecond(), 0, "{now}");
        assert!(parsed.as_second() > 1_700_000_000, "{now}");
    }

    #[test]
    fn records_round_trip_and_reject_others() {
        let dir = std::env::temp_dir().join(format!("arbor-profiles-{}", std::process::id()));
        let store = ProfileStore::new(dir.clone());
        let model = Path::new("/models/m.gguf");
        let record = LatencyRecord {
            model: "m".into(),
            kernels: "k1".into(),
            threads: 2,
            repetitions: 3,
            measured: now_utc(),
            points: vec![(1, 0.05), (2, 0.07)],
            method: None,
        };
        store
            .write(&store.latency_path(model, "k1", 2), &record)
            .unwrap();
        assert_eq!(store.cached_latency(model, "k1", 2), Some(record));
        assert_eq!(store.cached_latency(model, "k2", 2), None);
        // A file of the old format (points only) is measured again.
        std::fs::write(store.latency_path(model, "k1", 4), "{\"points\":[[1,0.1]]}").unwrap();
        assert_eq!(store.cached_latency(model, "k1", 4), None);
        std::fs::remove_dir_all(dir).ok();
    }
}

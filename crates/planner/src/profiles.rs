//! Measured machine facts, cached under `$ARBOR_HOME/profiles/`: each
//! model's forward latency `L_fp(n)` for the kernels and thread count in
//! use (the disk's bandwidth is [`crate::disk`]'s). `arbor profile` measures them
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

pub fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
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

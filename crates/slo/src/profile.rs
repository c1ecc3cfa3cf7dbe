//! What a device takes per elastic level: prefill time by prompt length
//! and time per output token, measured once (ELMS footnote 6: a one-shot
//! profile guided by TTFT ∝ prompt length × model size, TPOT ∝ model size)
//! and interpolated for any (model level, prompt length).

use serde::{Deserialize, Serialize};

use crate::{Result, SloError, check_ascending};

/// The middle of `v` (the upper of the two middle values): what a profile
/// and a bench take of several runs on a noisy machine. `v` holds at
/// least one value.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One elastic level's measured latency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelLatency {
    pub level: f64,
    /// `(prompt tokens, seconds)` from an empty cache to the first token's
    /// logits, ascending in tokens.
    pub prefill: Vec<(usize, f64)>,
    /// Seconds per decoded token.
    pub tpot: f64,
}

/// Predicted or measured latency of one request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Seconds to the first token.
    pub ttft: f64,
    /// Seconds per output token after it.
    pub tpot: f64,
}

/// A device's latency for every level of one elastic model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceProfile {
    /// The elastic model file's name.
    pub model: String,
    pub kernels: String,
    pub threads: usize,
    /// When it was measured (UTC).
    pub measured: String,
    /// Ascending levels, the last 1 (the full model).
    pub levels: Vec<LevelLatency>,
    /// Seconds the prompt scorer takes per prompt token (paid only when a
    /// prompt level below 1 is chosen).
    pub scorer_per_token: f64,
    /// The original (unelastified) model's latency, measured the same way
    /// (its `level` is 1): what objectives are fractions of (ELMS §3.1).
    /// `None`: the full level is the reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<LevelLatency>,
}

impl DeviceProfile {
    /// Checks levels ascend to 1 and every curve is usable.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| SloError::Profile(format!("{}: {m}", self.model));
        let levels: Vec<f64> = self.levels.iter().map(|l| l.level).collect();
        check_ascending("levels", &levels).map_err(bad)?;
        for l in self.levels.iter().chain(&self.reference) {
            if l.prefill.is_empty() {
                return Err(bad(format!("level {} has no prefill points", l.level)));
            }
            let ok_points = l.prefill.windows(2).all(|w| w[0].0 < w[1].0)
                && l.prefill
                    .iter()
                    .all(|&(n, t)| n > 0 && t.is_finite() && t > 0.0);
            if !ok_points {
                return Err(bad(format!(
                    "level {}'s prefill points are not ascending positive lengths with positive times",
                    l.level
                )));
            }
            if !(l.tpot.is_finite() && l.tpot > 0.0) {
                return Err(bad(format!("level {} has tpot {}", l.level, l.tpot)));
            }
        }
        if !(self.scorer_per_token.is_finite() && self.scorer_per_token >= 0.0) {
            return Err(bad(format!("scorer cost {}", self.scorer_per_token)));
        }
        Ok(())
    }

    pub fn level_values(&self) -> Vec<f64> {
        self.levels.iter().map(|l| l.level).collect()
    }

    /// The profiled level `level` runs at: the highest at or below it (an
    /// elastic model rounds an unlisted level down the same way).
    fn at(&self, level: f64) -> &LevelLatency {
        let i = self.levels.iter().rposition(|l| l.level <= level + 1e-9);
        &self.levels[i.unwrap_or(0)]
    }

    /// Predicted seconds to prefill `tokens` at `level`.
    pub fn prefill(&self, level: f64, tokens: usize) -> f64 {
        interpolate(&self.at(level).prefill, tokens)
    }

    pub fn tpot(&self, level: f64) -> f64 {
        self.at(level).tpot
    }

    /// Predicted latency of a request of `prompt` tokens served at `level`
    /// after keeping `kept` of them (`kept < prompt` pays the scorer).
    pub fn predict(&self, level: f64, prompt: usize, kept: usize) -> Latency {
        let scorer = if kept < prompt {
            self.scorer_per_token * prompt as f64
        } else {
            0.0
        };
        Latency {
            ttft: scorer + self.prefill(level, kept),
            tpot: self.tpot(level),
        }
    }

    /// The full model's latency for a prompt of `prompt` tokens: what an
    /// SLO's fractions are fractions of — the original model's where the
    /// profile measured it, else the full level's.
    pub fn full(&self, prompt: usize) -> Latency {
        match &self.reference {
            Some(r) => Latency {
                ttft: interpolate(&r.prefill, prompt),
                tpot: r.tpot,
            },
            None => self.predict(1.0, prompt, prompt),
        }
    }
}

/// Piecewise-linear through `points`, extended along the end segments
/// (prefill is close to affine in length at these sizes), never below a
/// tenth of the smallest measured time.
fn interpolate(points: &[(usize, f64)], n: usize) -> f64 {
    let floor = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min) * 0.1;
    let x = n as f64;
    let line = |a: (usize, f64), b: (usize, f64)| {
        let (x0, x1) = (a.0 as f64, b.0 as f64);
        a.1 + (b.1 - a.1) * (x - x0) / (x1 - x0)
    };
    let t = match points {
        [] => return 0.0,
        [only] => only.1 * x / only.0 as f64,
        _ => {
            let i = points.partition_point(|p| p.0 <= n);
            let i = i.clamp(1, points.len() - 1);
            line(points[i - 1], points[i])
        }
    };
    t.max(floor)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A device where a level's prefill is `0.01 + level × n / 1000` s and
    /// its tpot `0.02 + 0.03 × level` s (a fixed output-head share).
    pub(crate) fn linear_profile(levels: &[f64]) -> DeviceProfile {
        DeviceProfile {
            model: "m.elastic.gguf".into(),
            kernels: "test".into(),
            threads: 2,
            measured: "now".into(),
            levels: (levels.iter())
                .map(|&level| LevelLatency {
                    level,
                    prefill: [32, 128, 512]
                        .map(|n| (n, 0.01 + level * n as f64 / 1000.0))
                        .to_vec(),
                    tpot: 0.02 + 0.03 * level,
                })
                .collect(),
            scorer_per_token: 1e-6,
            reference: None,
        }
    }

    #[test]
    fn predictions_interpolate_and_extend_the_measured_curve() {
        let p = linear_profile(&[0.5, 1.0]);
        p.validate().unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(p.prefill(1.0, 128), 0.138));
        assert!(close(p.prefill(1.0, 256), 0.266));
        assert!(close(p.prefill(1.0, 1024), 1.034));
        assert!(close(p.prefill(0.5, 16), 0.018));
        // Unlisted levels round down; below the lowest, the lowest.
        assert!(close(p.prefill(0.7, 128), p.prefill(0.5, 128)));
        assert!(close(p.tpot(0.3), p.tpot(0.5)));
        // Kept tokens below the prompt pay the scorer on every prompt token.
        let l = p.predict(0.5, 512, 128);
        assert!(close(l.ttft, 512e-6 + p.prefill(0.5, 128)));
        assert!(close(p.full(100).ttft, p.prefill(1.0, 100)));
        // Far below the first point the floor holds.
        assert!(p.prefill(1.0, 1) > 0.0);
        // A measured original model is the reference instead.
        let mut r = p.clone();
        r.reference = Some(LevelLatency {
            level: 1.0,
            prefill: vec![(32, 0.02), (512, 0.26)],
            tpot: 0.04,
        });
        r.validate().unwrap();
        assert!(close(r.full(272).ttft, 0.14) && close(r.full(272).tpot, 0.04));
        assert!(close(r.predict(1.0, 272, 272).ttft, p.full(272).ttft));
        r.reference.as_mut().unwrap().tpot = f64::NAN;
        assert!(r.validate().is_err());
    }

    #[test]
    fn broken_profiles_are_refused() {
        let mut p = linear_profile(&[0.5, 1.0]);
        p.levels[0].prefill[1].1 = f64::NAN;
        assert!(p.validate().is_err());
        let mut p = linear_profile(&[0.5, 1.0]);
        p.levels[1].prefill.swap(0, 1);
        assert!(p.validate().is_err());
        let mut p = linear_profile(&[0.5, 1.0]);
        p.levels[1].tpot = 0.0;
        assert!(p.validate().is_err());
        assert!(linear_profile(&[0.5, 0.8]).validate().is_err());
        let mut p = linear_profile(&[0.5, 1.0]);
        p.levels[0].prefill.clear();
        assert!(p.validate().unwrap_err().to_string().contains("no prefill"));
    }
}

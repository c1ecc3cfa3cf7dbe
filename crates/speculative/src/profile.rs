//! The target's forward latency as a function of the number of new tokens,
//! `L_fp(n)` (measured and cached by the engine's profile store), and the
//! tree size it makes worth verifying.

/// Token counts a profile measures; others are interpolated.
pub const PROFILE_SIZES: [usize; 15] = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64];

/// Measured forward latencies `(new tokens, seconds)`, ascending in `n`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencyProfile {
    pub points: Vec<(usize, f64)>,
}

impl LatencyProfile {
    /// `L_fp(n)`, linearly interpolated (and extrapolated past the ends).
    pub fn at(&self, n: usize) -> f64 {
        let p = &self.points;
        match p.len() {
            0 => return 0.0,
            1 => return p[0].1 * n as f64 / p[0].0.max(1) as f64,
            _ => {}
        }
        let i = p
            .windows(2)
            .position(|w| n <= w[1].0)
            .unwrap_or(p.len() - 2);
        let ((n0, l0), (n1, l1)) = (p[i], p[i + 1]);
        let slope = (l1 - l0) / (n1 as f64 - n0 as f64);
        (l0 + slope * (n as f64 - n0 as f64)).max(p[0].1 * 0.5)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn from_json(s: &str) -> Option<Self> {
        serde_json::from_str::<Self>(s)
            .ok()
            .filter(|p| !p.points.is_empty() && p.points.windows(2).all(|w| w[0].0 < w[1].0))
    }
}

/// The verification size worth paying for: with cumulative confidences
/// `cums` (descending; `τ(n) = 1 + Σ cums[..n]` expected tokens) and the
/// latency profile, the `n` maximising `τ(n) / L_fp(n + 1)` (the root is
/// fed with the tree). Returns `(n, τ(n) / L_fp(n + 1))`.
pub fn best_size(cums: &[f32], profile: &LatencyProfile) -> (usize, f64) {
    let mut best = (0, 1.0 / profile.at(1));
    let mut tau = 1.0f64;
    for (i, &c) in cums.iter().enumerate() {
        tau += c as f64;
        let rate = tau / profile.at(i + 2);
        if rate > best.1 {
            best = (i + 1, rate);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolation_and_best_size() {
        let p = LatencyProfile {
            points: vec![(1, 0.04), (2, 0.045), (4, 0.05), (16, 0.12)],
        };
        assert!((p.at(3) - 0.0475).abs() < 1e-9);
        assert!((p.at(10) - 0.085).abs() < 1e-9);
        assert!(p.at(32) > p.at(16));
        // Confident nodes are worth verifying while they are cheap.
        let (n, _) = best_size(&[0.9, 0.8, 0.7, 0.05, 0.04], &p);
        assert_eq!(n, 3);
        // Hopeless drafts: verify nothing (plain decoding is better).
        let (n, rate) = best_size(&[0.01, 0.01], &p);
        assert_eq!(n, 0);
        assert!((rate - 25.0).abs() < 1e-9);
        assert_eq!(LatencyProfile::from_json(&p.to_json()), Some(p));
        assert_eq!(LatencyProfile::from_json("{\"points\":[]}"), None);
    }
}

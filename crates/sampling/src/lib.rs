//! Choosing the next token from a row of logits.
//!
//! Temperature 0 is greedy (the first maximum, as llama.cpp picks). Above
//! 0 the filters run in llama.cpp's order — top-k, top-p, min-p — on the
//! temperature-scaled distribution, then one draw from a seeded generator,
//! so a seed reproduces a run exactly.

mod shape;

pub use shape::{Both, Scored, ShapeError, Shaping};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    #[error("top-p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("min-p must be in [0, 1), got {0}")]
    MinP(f32),
    #[error("no logits to sample from")]
    Empty,
}

/// A rule on which tokens may come next (a grammar, a JSON schema) or on
/// how likely they are (penalties, biases: [`Shaping`]), applied
/// to the target's logits at every position a token is chosen from, so a
/// constrained speculative decode gives exactly the constrained one-token
/// decode's output. Methods take `&self` (implementations lock what they
/// change), so the rule can travel in a `Copy` control block.
pub trait Constraint: Sync {
    /// Sets to −∞ the logits of tokens that may not follow the committed
    /// tokens and then `path` (tokens not yet committed: a draft tree's
    /// path to the row), or shifts them. A `path` the rule does not allow
    /// leaves the row as it is (no verdict can reach it).
    fn mask(&self, path: &[u32], logits: &mut [f32]) -> Result<(), String>;

    /// `tokens` were committed (never a stop token).
    fn commit(&self, tokens: &[u32]) -> Result<(), String>;
}

/// Sampling settings. `top_k = 0` means no top-k filter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    /// Greedy.
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p < 1.0) {
            return Err(SamplingError::MinP(self.min_p));
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// SplitMix64: tiny, fast, and good enough to draw tokens.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Index of the first largest value (NaNs never win).
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// The `k` highest logits with their token ids, highest first (ties:
/// lower id first; NaN never chosen).
pub fn top_logits(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return top;
    }
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        if top.len() < k || l > top[top.len() - 1].1 {
            let at = top.partition_point(|&(_, v)| v >= l);
            top.insert(at, (i as u32, l));
            top.truncate(k);
        }
    }
    top
}

/// Softmax of `logits / temperature` (temperature > 0).
pub fn softmax(logits: &[f32], temperature: f32) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut p: Vec<f32> = logits
        .iter()
        .map(|&l| ((l - max) / temperature).exp())
        .collect();
    let sum: f32 = p.iter().sum();
    p.iter_mut().for_each(|v| *v /= sum);
    p
}

/// The candidates left after top-k, top-p and min-p, as `(token, prob)`
/// sorted by falling probability, renormalised.
pub fn filtered(logits: &[f32], params: &SamplingParams) -> Vec<(u32, f32)> {
    let probs = softmax(logits, params.temperature.max(f32::MIN_POSITIVE));
    let mut cand: Vec<(u32, f32)> = probs
        .into_iter()
        .enumerate()
        .map(|(i, p)| (i as u32, p))
        .collect();
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if params.top_k > 0 {
        cand.truncate(params.top_k);
    }
    if params.top_p < 1.0 {
        let mut cum = 0.0;
        let keep = cand
            .iter()
            .position(|&(_, p)| {
                cum += p;
                cum >= params.top_p
            })
            .map_or(cand.len(), |i| i + 1);
        cand.truncate(keep);
    }
    if params.min_p > 0.0 {
        let floor = cand[0].1 * params.min_p;
        cand.retain(|&(_, p)| p >= floor);
    }
    let sum: f32 = cand.iter().map(|c| c.1).sum();
    cand.iter_mut().for_each(|c| c.1 /= sum);
    cand
}

/// Picks tokens under one set of parameters with its own generator.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        Ok(Self {
            rng: Rng::new(params.seed),
            params,
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        if self.params.is_greedy() {
            return argmax(logits).ok_or(SamplingError::Empty);
        }
        if logits.is_empty() {
            return Err(SamplingError::Empty);
        }
        let cand = filtered(logits, &self.params);
        let r = self.rng.next_f64() as f32;
        let mut cum = 0.0;
        for &(t, p) in &cand {
            cum += p;
            if r < cum {
                return Ok(t);
            }
        }
        Ok(cand.last().expect("filters keep at least one token").0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32) -> SamplingParams {
        SamplingParams {
            temperature: t,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(params(0.0)).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]).unwrap(), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0]), Some(1));
        assert_eq!(s.sample(&[]), Err(SamplingError::Empty));
    }

    #[test]
    fn out_of_range_settings_are_refused() {
        assert!(Sampler::new(params(-1.0)).is_err());
        assert!(Sampler::new(params(f32::NAN)).is_err());
        assert!(
            Sampler::new(SamplingParams {
                top_p: 0.0,
                ..params(1.0)
            })
            .is_err()
        );
        assert!(
            Sampler::new(SamplingParams {
                min_p: 1.0,
                ..params(1.0)
            })
            .is_err()
        );
    }

    #[test]
    fn filters_cut_the_tail() {
        let logits = [(0.5f32).ln(), (0.3f32).ln(), (0.15f32).ln(), (0.05f32).ln()];
        let top_k = filtered(
            &logits,
            &SamplingParams {
                top_k: 2,
                ..params(1.0)
            },
        );
        assert_eq!(top_k.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1]);
        assert!((top_k[0].1 - 0.625).abs() < 1e-5);
        let top_p = filtered(
            &logits,
            &SamplingParams {
                top_p: 0.8,
                ..params(1.0)
            },
        );
        assert_eq!(top_p.len(), 2);
        let min_p = filtered(
            &logits,
            &SamplingParams {
                min_p: 0.2,
                ..params(1.0)
            },
        );
        assert_eq!(min_p.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn sampling_follows_the_distribution_and_the_seed() {
        let logits = [(0.6f32).ln(), (0.3f32).ln(), (0.1f32).ln()];
        let mut s = Sampler::new(SamplingParams {
            seed: 7,
            ..params(1.0)
        })
        .unwrap();
        let n = 20_000;
        let mut counts = [0usize; 3];
        for _ in 0..n {
            counts[s.sample(&logits).unwrap() as usize] += 1;
        }
        for (c, p) in counts.iter().zip([0.6, 0.3, 0.1]) {
            let f = *c as f64 / n as f64;
            // 5 standard deviations of a binomial proportion.
            assert!(
                (f - p).abs() < 5.0 * (p * (1.0 - p) / n as f64).sqrt(),
                "{counts:?}"
            );
        }
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams {
                seed,
                ..params(0.8)
            })
            .unwrap();
            (0..50)
                .map(|_| s.sample(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }
}

//! AdamW and a cosine learning-rate schedule over one host vector (the
//! prompt tokens are a few thousand values, so their update runs on the
//! host; the state is plain vectors a checkpoint can hold).

use crate::{Result, TrainError};

/// AdamW's settings (the thesis' recipe: no weight decay, gradients
/// clipped to norm 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// Gradients with a larger L2 norm are scaled down to it (0: no clip).
    pub clip_norm: f32,
}

impl Default for AdamW {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            clip_norm: 1.0,
        }
    }
}

/// AdamW's moments and step count for one parameter vector.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AdamState {
    pub m: Vec<f32>,
    pub v: Vec<f32>,
    pub step: u64,
}

impl AdamW {
    /// One update of `params` by `grad` at learning rate `lr`. A gradient
    /// of another length, or with a value that is not finite, is refused
    /// and changes nothing.
    pub fn step(
        &self,
        params: &mut [f32],
        grad: &[f32],
        lr: f32,
        state: &mut AdamState,
    ) -> Result<()> {
        if params.len() != grad.len() {
            return Err(TrainError::Input(format!(
                "a gradient of {} values for {} parameters",
                grad.len(),
                params.len()
            )));
        }
        if grad.iter().any(|g| !g.is_finite()) {
            return Err(TrainError::Input("a gradient that is not finite".into()));
        }
        if state.m.len() != params.len() {
            state.m = vec![0.0; params.len()];
            state.v = vec![0.0; params.len()];
            state.step = 0;
        }
        let norm = grad.iter().map(|g| g * g).sum::<f32>().sqrt();
        let scale = if self.clip_norm > 0.0 && norm > self.clip_norm {
            self.clip_norm / norm
        } else {
            1.0
        };
        state.step += 1;
        let t = state.step as i32;
        let (c1, c2) = (1.0 - self.beta1.powi(t), 1.0 - self.beta2.powi(t));
        for i in 0..params.len() {
            let g = grad[i] * scale;
            state.m[i] = self.beta1 * state.m[i] + (1.0 - self.beta1) * g;
            state.v[i] = self.beta2 * state.v[i] + (1.0 - self.beta2) * g * g;
            let update = (state.m[i] / c1) / ((state.v[i] / c2).sqrt() + self.eps);
            params[i] -= lr * (update + self.weight_decay * params[i]);
        }
        Ok(())
    }
}

/// Cosine decay from `peak` at step 0 to 0 at `total` steps, no warm-up.
pub fn cosine_lr(peak: f32, step: u64, total: u64) -> f32 {
    if total == 0 {
        return 0.0;
    }
    cosine_at(peak, step as f64 / total as f64)
}

/// Cosine decay from `peak` at `fraction` 0 of the run to 0 at 1 (a run
/// budgeted in time as well as in steps).
pub fn cosine_at(peak: f32, fraction: f64) -> f32 {
    if fraction.is_nan() || fraction >= 1.0 {
        return 0.0;
    }
    let x = fraction.max(0.0);
    (peak as f64 * 0.5 * (1.0 + (std::f64::consts::PI * x).cos())) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_falls_from_peak_to_zero() {
        assert_eq!(cosine_lr(0.01, 0, 100), 0.01);
        assert!((cosine_lr(0.01, 50, 100) - 0.005).abs() < 1e-7);
        assert!(cosine_lr(0.01, 99, 100) < 1e-5);
        assert_eq!(cosine_lr(0.01, 100, 100), 0.0);
        assert_eq!(cosine_lr(0.01, 3, 0), 0.0);
    }

    #[test]
    fn the_first_step_moves_each_value_by_the_learning_rate_against_its_gradient() {
        // Adam's first step is lr · sign(g) (bias-corrected moments).
        let mut p = vec![1.0, -2.0, 0.5];
        let mut s = AdamState::default();
        AdamW::default()
            .step(&mut p, &[0.3, -0.2, 0.0], 0.1, &mut s)
            .unwrap();
        assert!((p[0] - 0.9).abs() < 1e-5 && (p[1] + 1.9).abs() < 1e-5);
        assert_eq!(p[2], 0.5);
        assert_eq!(s.step, 1);
    }

    #[test]
    fn it_minimises_a_quadratic_and_clips_large_gradients() {
        // f(x) = Σ (x_i − c_i)²: AdamW reaches the minimum.
        let c = [3.0f32, -1.0, 0.25];
        let mut x = vec![0.0f32; 3];
        let mut s = AdamState::default();
        let opt = AdamW::default();
        for step in 0..400 {
            let g: Vec<f32> = x.iter().zip(&c).map(|(x, c)| 2.0 * (x - c)).collect();
            opt.step(&mut x, &g, cosine_lr(0.1, step, 400), &mut s)
                .unwrap();
        }
        for (x, c) in x.iter().zip(&c) {
            assert!((x - c).abs() < 0.02, "{x} against {c}");
        }
        // A huge gradient moves the first step no further than a small one.
        let (mut a, mut b) = (vec![0.0f32], vec![0.0f32]);
        let (mut sa, mut sb) = (AdamState::default(), AdamState::default());
        opt.step(&mut a, &[1e6], 0.1, &mut sa).unwrap();
        opt.step(&mut b, &[0.5], 0.1, &mut sb).unwrap();
        assert!((a[0] - b[0]).abs() < 1e-5);
        assert!(sa.m[0] <= 0.1 + 1e-6, "clipped before the moments");
        // Bad gradients change nothing.
        let before = (a.clone(), sa.clone());
        assert!(opt.step(&mut a, &[f32::NAN], 0.1, &mut sa).is_err());
        assert!(opt.step(&mut a, &[1.0, 2.0], 0.1, &mut sa).is_err());
        assert_eq!((a, sa), before);
    }
}

//! The self-adaptive verification threshold α (LLMCad's fallback).

/// Verify when the tree's best cumulative confidence drops below α. After
/// a verification that accepted the whole best-matching branch, α halves
/// (trust the draft for longer); after one with errors it grows to
/// `α / T_c^((N_all − N_correct) / N_all)` (verify sooner).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fallback {
    alpha: f32,
}

impl Fallback {
    /// α stays within these bounds so one very good or very bad round
    /// cannot pin it.
    pub const MIN: f32 = 1e-4;
    pub const MAX: f32 = 0.95;

    pub fn new(alpha: f32) -> Self {
        Self {
            alpha: alpha.clamp(Self::MIN, Self::MAX),
        }
    }

    pub fn alpha(&self) -> f32 {
        self.alpha
    }

    /// True when a tree whose best branch has confidence `best` should be
    /// verified now.
    pub fn should_verify(&self, best: f32) -> bool {
        best < self.alpha
    }

    /// Updates α after a verification: the best-matching branch had
    /// `n_all` draft tokens of which the first `n_correct` were accepted,
    /// and the tree's confidence was `t_c` when verification started.
    pub fn update(&mut self, n_all: usize, n_correct: usize, t_c: f32) {
        if n_all == 0 {
            return;
        }
        if n_correct >= n_all {
            self.alpha *= 0.5;
        } else {
            let wrong = (n_all - n_correct) as f32 / n_all as f32;
            let t_c = t_c.clamp(1e-6, 1.0);
            self.alpha /= t_c.powf(wrong);
        }
        self.alpha = self.alpha.clamp(Self::MIN, Self::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpha_halves_on_success_and_rises_with_errors() {
        let mut f = Fallback::new(0.01);
        assert!(f.should_verify(0.005));
        assert!(!f.should_verify(0.02));
        f.update(4, 4, 0.2);
        assert!((f.alpha() - 0.005).abs() < 1e-7);
        // Half the branch wrong at T_c = 0.04: α / 0.04^0.5 = α * 5.
        f.update(6, 3, 0.04);
        assert!((f.alpha() - 0.025).abs() < 1e-6);
        // All wrong: α / T_c.
        f.update(2, 0, 0.5);
        assert!((f.alpha() - 0.05).abs() < 1e-6);
        // No draft tokens: unchanged.
        f.update(0, 0, 0.5);
        assert!((f.alpha() - 0.05).abs() < 1e-6);
    }

    #[test]
    fn alpha_stays_in_bounds() {
        let mut f = Fallback::new(0.5);
        for _ in 0..10 {
            f.update(5, 0, 1e-9);
        }
        assert_eq!(f.alpha(), Fallback::MAX);
        for _ in 0..100 {
            f.update(5, 5, 0.5);
        }
        assert_eq!(f.alpha(), Fallback::MIN);
    }
}

//! Rules that change the target's logits before a token is chosen, beside
//! the filters of [`crate::filtered`]: OpenAI's presence and frequency
//! penalties and `logit_bias`. They implement [`Constraint`], so the
//! decoding loop applies them to every row a token is chosen from (a tree
//! row sees the committed tokens and its own path), and a speculative
//! decode under them gives the same tokens as a one-token decode under
//! them; [`Both`] puts two rules (a grammar and these) on one decode.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::Constraint;

/// Why a shaping setting was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShapeError {
    #[error("`{0}` must be a number in [-2, 2], got {1}")]
    Penalty(&'static str, f32),
    #[error("a logit bias must be in [-100, 100], got {1} for token {0}")]
    Bias(u32, f32),
    #[error("logit bias names token {0}; the vocabulary has {1}")]
    Token(u32, usize),
}

/// Penalties on tokens already generated and fixed biases per token.
///
/// For a row, the logit of token `t` becomes
/// `l[t] + bias[t] − frequency · n(t) − presence · [n(t) > 0]`, where
/// `n(t)` counts `t` among the generated tokens before that row (the
/// prompt does not count, as in OpenAI's definition).
#[derive(Debug, Default)]
pub struct Shaping {
    presence: f32,
    frequency: f32,
    bias: Vec<(u32, f32)>,
    counts: Mutex<HashMap<u32, u32>>,
}

impl Shaping {
    /// Checks the ranges OpenAI allows: penalties in [−2, 2], biases in
    /// [−100, 100] on tokens below `vocab`.
    pub fn new(
        presence: f32,
        frequency: f32,
        bias: &[(u32, f32)],
        vocab: usize,
    ) -> Result<Self, ShapeError> {
        for (name, v) in [
            ("presence_penalty", presence),
            ("frequency_penalty", frequency),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(ShapeError::Penalty(name, v));
            }
        }
        for &(t, b) in bias {
            if t as usize >= vocab {
                return Err(ShapeError::Token(t, vocab));
            }
            if !(-100.0..=100.0).contains(&b) {
                return Err(ShapeError::Bias(t, b));
            }
        }
        Ok(Self {
            presence,
            frequency,
            bias: bias.to_vec(),
            counts: Mutex::default(),
        })
    }

    /// Whether the rule leaves every row as it is.
    pub fn is_neutral(&self) -> bool {
        self.presence == 0.0 && self.frequency == 0.0 && self.bias.iter().all(|b| b.1 == 0.0)
    }

    fn penalise(&self, logits: &mut [f32], token: u32, n: u32) {
        if let Some(l) = logits.get_mut(token as usize)
            && n > 0
        {
            *l -= self.frequency * n as f32 + self.presence;
        }
    }
}

impl Constraint for Shaping {
    fn mask(&self, path: &[u32], logits: &mut [f32]) -> Result<(), String> {
        for &(t, b) in &self.bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
        if self.presence == 0.0 && self.frequency == 0.0 {
            return Ok(());
        }
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        // Tokens on the path add to the committed counts.
        let mut on_path: HashMap<u32, u32> = HashMap::new();
        for &t in path {
            *on_path.entry(t).or_default() += 1;
        }
        for (&t, &n) in counts.iter() {
            let extra = on_path.remove(&t).unwrap_or(0);
            self.penalise(logits, t, n + extra);
        }
        for (t, n) in on_path {
            self.penalise(logits, t, n);
        }
        Ok(())
    }

    fn commit(&self, tokens: &[u32]) -> Result<(), String> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        for &t in tokens {
            *counts.entry(t).or_default() += 1;
        }
        Ok(())
    }
}

/// Two rules on one decode: `first` shapes a row, then `second`.
pub struct Both<'a>(pub &'a dyn Constraint, pub &'a dyn Constraint);

impl Constraint for Both<'_> {
    fn mask(&self, path: &[u32], logits: &mut [f32]) -> Result<(), String> {
        self.0.mask(path, logits)?;
        self.1.mask(path, logits)
    }

    fn commit(&self, tokens: &[u32]) -> Result<(), String> {
        self.0.commit(tokens)?;
        self.1.commit(tokens)
    }
}

/// A chosen token's log-probability and the most probable alternatives,
/// from the row it was chosen from (after every rule on the decode, at
/// temperature 1, before the sampling filters).
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub token: u32,
    pub logprob: f32,
    /// The `n` most probable tokens, most probable first (ties: lower id).
    pub top: Vec<(u32, f32)>,
}

impl Scored {
    /// Scores `token` in `logits` with its `top` best alternatives.
    pub fn new(logits: &[f32], token: u32, top: usize) -> Self {
        let max = logits
            .iter()
            .copied()
            .filter(|l| !l.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits
            .iter()
            .filter(|l| !l.is_nan())
            .map(|&l| f64::from(l - max).exp())
            .sum();
        let log_z = max + sum.ln() as f32;
        let lp = |l: f32| l - log_z;
        // −∞ (a token a rule ruled out) is never an alternative.
        let best = crate::top_logits(logits, top)
            .into_iter()
            .filter(|&(_, l)| l != f32::NEG_INFINITY);
        Self {
            token,
            logprob: logits
                .get(token as usize)
                .map_or(f32::NEG_INFINITY, |&l| lp(l)),
            top: best.map(|(t, l)| (t, lp(l))).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_count_committed_tokens_and_the_path() {
        let s = Shaping::new(0.5, 1.0, &[], 4).unwrap();
        s.commit(&[1, 1, 2]).unwrap();
        let mut row = [0.0f32; 4];
        s.mask(&[2, 3], &mut row).unwrap();
        // 1: twice committed; 2: once + once on the path; 3: on the path.
        assert_eq!(row, [0.0, -2.5, -2.5, -1.5]);
        // The path is not remembered.
        let mut row = [0.0f32; 4];
        s.mask(&[], &mut row).unwrap();
        assert_eq!(row, [0.0, -2.5, -1.5, 0.0]);
    }

    #[test]
    fn biases_add_and_settings_are_checked() {
        let s = Shaping::new(0.0, 0.0, &[(2, 5.0), (0, -100.0)], 3).unwrap();
        let mut row = [1.0f32; 3];
        s.mask(&[0], &mut row).unwrap();
        assert_eq!(row, [-99.0, 1.0, 6.0]);
        assert!(!s.is_neutral());
        assert!(Shaping::new(0.0, 0.0, &[], 3).unwrap().is_neutral());
        assert_eq!(
            Shaping::new(2.5, 0.0, &[], 3).unwrap_err(),
            ShapeError::Penalty("presence_penalty", 2.5)
        );
        assert_eq!(
            Shaping::new(0.0, 0.0, &[(3, 1.0)], 3).unwrap_err(),
            ShapeError::Token(3, 3)
        );
        assert_eq!(
            Shaping::new(0.0, 0.0, &[(0, 101.0)], 3).unwrap_err(),
            ShapeError::Bias(0, 101.0)
        );
    }

    #[test]
    fn both_applies_each_rule() {
        let a = Shaping::new(0.0, 1.0, &[(0, 1.0)], 3).unwrap();
        let b = Shaping::new(0.0, 0.0, &[(1, -1.0)], 3).unwrap();
        let both = Both(&a, &b);
        both.commit(&[2]).unwrap();
        let mut row = [0.0f32; 3];
        both.mask(&[], &mut row).unwrap();
        assert_eq!(row, [1.0, -1.0, -1.0]);
    }

    #[test]
    fn scores_are_log_softmax() {
        let row = [
            (0.5f32).ln(),
            (0.25f32).ln(),
            (0.25f32).ln(),
            f32::NEG_INFINITY,
        ];
        let s = Scored::new(&row, 1, 2);
        assert!((s.logprob - (0.25f32).ln()).abs() < 1e-6);
        assert_eq!(s.top.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 1]);
        assert!((s.top[0].1 - (0.5f32).ln()).abs() < 1e-6);
        assert_eq!(Scored::new(&row, 3, 0).logprob, f32::NEG_INFINITY);
        assert!(Scored::new(&row, 0, 9).top.len() == 3, "−∞ is never listed");
    }
}

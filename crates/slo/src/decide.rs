//! The per-request decision: among the (model level, prompt level) pairs
//! whose predicted latency meets the objective, the one the quality table
//! rates highest; where none does, the fastest pair (said so), or a
//! refusal.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{DeviceProfile, Latency, QualityTable, Result, Slo, SloError, prompt};

/// An elastic model level and a prompt level.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pair {
    pub model: f64,
    pub prompt: f64,
}

impl Pair {
    pub const FULL: Pair = Pair {
        model: 1.0,
        prompt: 1.0,
    };
}

impl fmt::Display for Pair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "model {}, prompt {}", self.model, self.prompt)
    }
}

/// What to do when no pair is predicted to meet the objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMiss {
    /// Serve with the fastest pair and report the miss.
    #[default]
    Fastest,
    /// Refuse the request ([`SloError::Unmet`]).
    Refuse,
}

/// The pair chosen for one request and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub pair: Pair,
    /// Prompt tokens kept (of `prompt_tokens`).
    pub kept: usize,
    pub prompt_tokens: usize,
    pub predicted: Latency,
    /// The objective in seconds: its fractions of the full model's latency.
    pub budget: Latency,
    pub quality: f64,
    /// Whether the prediction meets the budget (with the headroom asked).
    pub met: bool,
}

impl Choice {
    /// `ttft` and `tpot` of the prediction as fractions of the full model's.
    pub fn predicted_fractions(&self, slo: &Slo) -> (f64, f64) {
        (
            self.predicted.ttft / self.budget.ttft * slo.ttft,
            self.predicted.tpot / self.budget.tpot * slo.tpot,
        )
    }
}

/// Chooses the pair for a request of `prompt_tokens` tokens, `protected`
/// of which the prompt level never drops. A pair meets the objective when
/// its predicted latency is within `headroom` (≤ 1; 1 is the objective
/// itself) of the budget; the full pair always qualifies at a full
/// objective. Pairs range over the quality table's levels.
pub fn decide(
    profile: &DeviceProfile,
    table: &QualityTable,
    slo: &Slo,
    prompt_tokens: usize,
    protected: usize,
    headroom: f64,
    on_miss: OnMiss,
) -> Result<Choice> {
    if !(headroom > 0.0 && headroom <= 1.0) {
        return Err(SloError::Profile(format!(
            "headroom {headroom} outside (0, 1]"
        )));
    }
    let full = profile.full(prompt_tokens);
    let budget = Latency {
        ttft: full.ttft * slo.ttft,
        tpot: full.tpot * slo.tpot,
    };
    let mut best: Option<Choice> = None;
    let mut fastest: Option<(f64, Choice)> = None;
    for &model in &table.model_levels {
        for &level in &table.prompt_levels {
            let kept = prompt::kept_len(prompt_tokens, protected, level);
            let predicted = profile.predict(model, prompt_tokens, kept);
            let strain = (predicted.ttft / budget.ttft).max(predicted.tpot / budget.tpot);
            let full_pair = model == 1.0 && level == 1.0;
            let met = strain <= headroom + 1e-12 || (full_pair && strain <= 1.0 + 1e-12);
            let choice = Choice {
                pair: Pair {
                    model,
                    prompt: level,
                },
                kept,
                prompt_tokens,
                predicted,
                budget,
                quality: table.get(model, level),
                met,
            };
            let cost = |c: &Choice| c.predicted.ttft / budget.ttft + c.predicted.tpot / budget.tpot;
            if met
                && best.as_ref().is_none_or(|b| {
                    choice.quality > b.quality
                        || (choice.quality == b.quality && cost(&choice) < cost(b))
                })
            {
                best = Some(choice.clone());
            }
            if fastest
                .as_ref()
                .is_none_or(|(s, f)| strain < *s || (strain == *s && choice.quality > f.quality))
            {
                fastest = Some((strain, choice));
            }
        }
    }
    if let Some(b) = best {
        return Ok(b);
    }
    let (_, f) = fastest.ok_or_else(|| SloError::Quality("no levels".into()))?;
    match on_miss {
        OnMiss::Fastest => Ok(f),
        OnMiss::Refuse => Err(SloError::Unmet {
            slo: *slo,
            fastest: f.pair,
            ttft: f.predicted.ttft / full.ttft,
            tpot: f.predicted.tpot / full.tpot,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::tests::linear_profile;
    use crate::quality::tests::product_table;
    use proptest::prelude::*;

    const LEVELS: [f64; 5] = [0.2, 0.4, 0.6, 0.8, 1.0];

    fn setup() -> (DeviceProfile, QualityTable) {
        (
            linear_profile(&LEVELS),
            product_table(&LEVELS, &crate::PROMPT_LEVELS),
        )
    }

    #[test]
    fn a_full_objective_gets_the_full_pair() {
        let (p, t) = setup();
        let c = decide(&p, &t, &Slo::FULL, 300, 20, 1.0, OnMiss::Refuse).unwrap();
        assert_eq!(c.pair, Pair::FULL);
        assert!(c.met);
        assert_eq!(c.kept, 300);
    }

    #[test]
    fn a_tight_objective_trades_quality_for_speed() {
        let (p, t) = setup();
        let slo = Slo::new(0.5, 0.8).unwrap();
        let c = decide(&p, &t, &slo, 400, 20, 1.0, OnMiss::Refuse).unwrap();
        assert!(c.met);
        assert!(c.predicted.ttft <= c.budget.ttft && c.predicted.tpot <= c.budget.tpot);
        assert!(c.pair != Pair::FULL);
        // No pair that meets it is rated higher.
        for &m in &LEVELS {
            for &l in &crate::PROMPT_LEVELS {
                let kept = prompt::kept_len(400, 20, l);
                let pr = p.predict(m, 400, kept);
                if pr.ttft <= c.budget.ttft && pr.tpot <= c.budget.tpot {
                    assert!(t.get(m, l) <= c.quality + 1e-12, "{m} {l}");
                }
            }
        }
    }

    #[test]
    fn an_unmeetable_objective_gets_the_fastest_pair_or_a_refusal() {
        let (p, t) = setup();
        // tpot floor: 0.02 + 0.03 × 0.2 = 0.026 of 0.05 (0.52): 0.3 is out of reach.
        let slo = Slo::new(0.9, 0.3).unwrap();
        let c = decide(&p, &t, &slo, 200, 10, 1.0, OnMiss::Fastest).unwrap();
        assert!(!c.met);
        assert_eq!(c.pair.model, 0.2);
        let e = decide(&p, &t, &slo, 200, 10, 1.0, OnMiss::Refuse).unwrap_err();
        assert!(matches!(e, SloError::Unmet { .. }), "{e}");
        assert!(e.to_string().contains("model 0.2"));
    }

    #[test]
    fn headroom_only_tightens() {
        let (p, t) = setup();
        let slo = Slo::new(0.6, 0.9).unwrap();
        let loose = decide(&p, &t, &slo, 300, 20, 1.0, OnMiss::Fastest).unwrap();
        let tight = decide(&p, &t, &slo, 300, 20, 0.8, OnMiss::Fastest).unwrap();
        assert!(tight.quality <= loose.quality);
        assert!(decide(&p, &t, &slo, 300, 20, 0.0, OnMiss::Fastest).is_err());
    }

    proptest! {
        #[test]
        fn a_met_choice_is_predicted_within_its_budget(
            ttft in 0.05f64..=1.0, tpot in 0.05f64..=1.0,
            len in 1usize..2000, protected in 0usize..50,
        ) {
            let (p, t) = setup();
            let slo = Slo::new(ttft, tpot).unwrap();
            let c = decide(&p, &t, &slo, len, protected, 1.0, OnMiss::Fastest).unwrap();
            if c.met {
                prop_assert!(c.predicted.ttft <= c.budget.ttft * (1.0 + 1e-9));
                prop_assert!(c.predicted.tpot <= c.budget.tpot * (1.0 + 1e-9));
            }
            prop_assert!(c.kept <= len);
        }
    }
}

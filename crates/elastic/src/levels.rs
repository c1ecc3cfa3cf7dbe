//! What each layer keeps at each level.

use arbor_model::{Config, Cut};

use crate::{ElasticError, Result};

/// The cuts of `levels` (ascending fractions in `(0, 1]`; 1 is added if
/// missing): anchor layers keep everything; every other layer keeps that
/// share of its head runs in each KV group (at least one run) and of its
/// neurons, rounded to multiples of `neuron_step` (at least one step).
/// Levels whose rounded counts equal the level below's are refused: they
/// would be the same model twice.
pub fn cuts(
    c: &Config,
    head_run: usize,
    anchors: &[usize],
    levels: &[f64],
    neuron_step: usize,
) -> Result<(Vec<f64>, Vec<Vec<Cut>>)> {
    let mut levels = levels.to_vec();
    if let Some(&bad) = levels.iter().find(|&&l| !(l > 0.0 && l <= 1.0)) {
        return Err(ElasticError::Input(format!(
            "level {bad} is outside (0, 1]"
        )));
    }
    levels.sort_by(f64::total_cmp);
    levels.dedup();
    if levels.last() != Some(&1.0) {
        levels.push(1.0);
    }
    let (kv, n, ffn) = (c.heads.n_kv_heads, c.heads.n_heads, c.ffn_hidden);
    let runs = n / kv / head_run;
    if neuron_step == 0 || !ffn.is_multiple_of(neuron_step) {
        return Err(ElasticError::Input(format!(
            "{ffn} neurons do not split into steps of {neuron_step}"
        )));
    }
    let steps = ffn / neuron_step;
    let share =
        |level: f64, units: usize| ((level * units as f64).round() as usize).clamp(1, units);
    let whole = Cut {
        heads: n,
        neurons: ffn,
    };
    let all: Vec<Vec<Cut>> = (levels.iter())
        .map(|&l| {
            (0..c.n_layers)
                .map(|i| match anchors.contains(&i) || l == 1.0 {
                    true => whole,
                    false => Cut {
                        heads: share(l, runs) * head_run * kv,
                        neurons: share(l, steps) * neuron_step,
                    },
                })
                .collect()
        })
        .collect();
    if let Some(w) = all.windows(2).position(|w| w[0] == w[1]) {
        return Err(ElasticError::Input(format!(
            "levels {} and {} keep the same units ({runs} head runs per KV head and {steps} \
             neuron steps per layer): drop one",
            levels[w],
            levels[w + 1]
        )));
    }
    Ok((levels, all))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor_tensor::{Heads, Rope, RopeStyle};

    fn config() -> Config {
        Config {
            architecture: "qwen2".into(),
            vocab_size: 10,
            hidden: 896,
            ffn_hidden: 4864,
            n_layers: 3,
            heads: Heads::grouped(14, 2, 64),
            rms_eps: 1e-6,
            rope: Rope {
                style: RopeStyle::Halves,
                theta: 1e6,
                head_dim: 64,
            },
            context_length: 64,
        }
    }

    #[test]
    fn non_anchor_layers_keep_their_share_anchors_keep_all() {
        let (levels, cuts) = cuts(&config(), 1, &[0], &[0.5, 0.2], 32).unwrap();
        assert_eq!(levels, vec![0.2, 0.5, 1.0]);
        // 7 heads per KV head: round(0.5 * 7) = 4 → 8 heads; 152 steps of 32.
        assert_eq!(
            cuts[1][1],
            Cut {
                heads: 8,
                neurons: 76 * 32
            }
        );
        assert_eq!(
            cuts[0][2],
            Cut {
                heads: 2,
                neurons: 30 * 32
            }
        );
        assert_eq!(
            cuts[0][0],
            Cut {
                heads: 14,
                neurons: 4864
            }
        );
        assert!(cuts[2].iter().all(|c| *c
            == Cut {
                heads: 14,
                neurons: 4864
            }));
    }

    #[test]
    fn bad_levels_are_refused() {
        let c = config();
        assert!(cuts(&c, 1, &[], &[0.0], 32).is_err());
        assert!(cuts(&c, 1, &[], &[1.5], 32).is_err());
        assert!(cuts(&c, 1, &[], &[0.5], 100).is_err());
        // 0.50 and 0.51 round to the same counts.
        let e = cuts(&c, 1, &[], &[0.5, 0.501], 32).unwrap_err();
        assert!(e.to_string().contains("same units"), "{e}");
    }
}

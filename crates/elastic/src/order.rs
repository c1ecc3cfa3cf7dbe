//! How a layer's units are ranked, and the order they are stored in.

use arbor_gguf::{GgufFile, dequantize};
use arbor_model::{Config, Layout, TensorEntry};

use crate::{ElasticError, Result};

/// A score per query head and per MLP neuron of every layer, in file
/// order. A unit's rank follows `|Σ score|` over its heads (the signed
/// first-order sums of `arbor-train`'s importance add before the absolute
/// value is taken; magnitudes are never negative).
#[derive(Debug, Clone, PartialEq)]
pub struct Scores {
    pub heads: Vec<Vec<f64>>,
    pub neurons: Vec<Vec<f64>>,
}

impl Scores {
    /// Checks the shape against a model's config.
    pub fn check(&self, c: &Config) -> Result<()> {
        let fits = self.heads.len() == c.n_layers
            && self.neurons.len() == c.n_layers
            && self.heads.iter().all(|h| h.len() == c.heads.n_heads)
            && self.neurons.iter().all(|n| n.len() == c.ffn_hidden);
        match fits {
            true => Ok(()),
            false => Err(ElasticError::Input(format!(
                "scores for another model (this one has {} layers of {} heads and {} neurons)",
                c.n_layers, c.heads.n_heads, c.ffn_hidden
            ))),
        }
    }
}

/// What ranks the units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// By the given scores (importance).
    Importance,
    /// By the squared magnitude of each unit's weights
    /// ([`magnitude_scores`]).
    Magnitude,
    /// As the file stores them: prefixes without reordering.
    File,
}

impl Order {
    pub fn name(self) -> &'static str {
        match self {
            Order::Importance => "importance",
            Order::Magnitude => "magnitude",
            Order::File => "file",
        }
    }
}

impl std::str::FromStr for Order {
    type Err = ElasticError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "importance" => Ok(Order::Importance),
            "magnitude" => Ok(Order::Magnitude),
            "file" => Ok(Order::File),
            _ => Err(ElasticError::Input(format!(
                "unknown order `{s}` (importance, magnitude or file)"
            ))),
        }
    }
}

/// Indices `0..n` by `|score|`, largest first (ties: lower index first);
/// `None` keeps file order.
fn ranked(scores: Option<&[f64]>, n: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    if let Some(s) = scores {
        idx.sort_by(|&a, &b| s[b].abs().total_cmp(&s[a].abs()).then(a.cmp(&b)));
    }
    idx
}

/// The stored order of a layer's query heads (`order[p]` is the file's
/// head stored at position `p`): within each KV head's group, runs of
/// `run` adjacent heads ranked by their summed scores (file order without
/// scores), then interleaved — round `r` holds every group's `r`-th run,
/// group by group (see `HeadOrder::Interleaved`).
pub fn head_order(c: &Config, run: usize, scores: Option<&[f64]>) -> Vec<usize> {
    let (kv, group) = (c.heads.n_kv_heads, c.heads.n_heads / c.heads.n_kv_heads);
    let units = group / run;
    let ranks: Vec<Vec<usize>> = (0..kv)
        .map(|g| {
            let unit_scores: Option<Vec<f64>> = scores.map(|s| {
                (0..units)
                    .map(|u| (0..run).map(|j| s[g * group + u * run + j]).sum())
                    .collect()
            });
            ranked(unit_scores.as_deref(), units)
        })
        .collect();
    let mut order = Vec::with_capacity(c.heads.n_heads);
    for r in 0..units {
        for (g, rank) in ranks.iter().enumerate() {
            order.extend((0..run).map(|j| g * group + rank[r] * run + j));
        }
    }
    order
}

/// The stored order of a layer's neurons (`order[p]` is the file's
/// neuron stored at position `p`), most important first.
pub fn neuron_order(c: &Config, scores: Option<&[f64]>) -> Vec<usize> {
    ranked(scores, c.ffn_hidden)
}

/// Each unit's squared weight magnitude: a head's query rows and output
/// columns, a neuron's gate and up rows and down column (the magnitude
/// baseline's scores).
pub fn magnitude_scores(file: &GgufFile, layout: &Layout) -> Result<Scores> {
    let c = &layout.config;
    let d = c.heads.head_dim;
    let mut heads = Vec::with_capacity(c.n_layers);
    let mut neurons = Vec::with_capacity(c.n_layers);
    for entries in &layout.layers {
        let values = |suffix: &str| -> Result<(Vec<f32>, &TensorEntry)> {
            let e = (entries.iter())
                .find(|e| e.name.ends_with(suffix))
                .ok_or_else(|| ElasticError::Input(format!("a layer has no `{suffix}`")))?;
            let (_, bytes) = file.tensor(&e.name)?;
            Ok((dequantize(e.ty, bytes, e.rows * e.cols)?, e))
        };
        // Sums of squares of each row and of each column.
        let rows = |(v, e): &(Vec<f32>, &TensorEntry)| -> Vec<f64> {
            (v.chunks_exact(e.cols))
                .map(|r| r.iter().map(|&x| (x * x) as f64).sum())
                .collect()
        };
        let cols = |(v, e): &(Vec<f32>, &TensorEntry)| -> Vec<f64> {
            let mut out = vec![0.0; e.cols];
            for r in v.chunks_exact(e.cols) {
                out.iter_mut()
                    .zip(r)
                    .for_each(|(o, &x)| *o += (x * x) as f64);
            }
            out
        };
        let (q, o) = (
            rows(&values("attn_q.weight")?),
            cols(&values("attn_output.weight")?),
        );
        heads.push(
            (0..c.heads.n_heads)
                .map(|h| (h * d..(h + 1) * d).map(|i| q[i] + o[i]).sum())
                .collect(),
        );
        let (gate, up) = (
            rows(&values("ffn_gate.weight")?),
            rows(&values("ffn_up.weight")?),
        );
        let down = cols(&values("ffn_down.weight")?);
        neurons.push(
            (0..c.ffn_hidden)
                .map(|n| gate[n] + up[n] + down[n])
                .collect(),
        );
    }
    Ok(Scores { heads, neurons })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor_tensor::{Heads, Rope, RopeStyle};

    fn config(n_heads: usize, kv: usize) -> Config {
        Config {
            architecture: "llama".into(),
            vocab_size: 10,
            hidden: n_heads * 8,
            ffn_hidden: 16,
            n_layers: 1,
            heads: Heads::grouped(n_heads, kv, 8),
            rms_eps: 1e-5,
            rope: Rope {
                style: RopeStyle::Interleaved,
                theta: 1e4,
                head_dim: 8,
            },
            context_length: 64,
        }
    }

    #[test]
    fn heads_rank_within_their_group_and_interleave() {
        let c = config(6, 2);
        // Group 0 = heads 0..3, group 1 = heads 3..6.
        let s = [0.1, -0.9, 0.5, 0.2, 0.3, -0.8];
        assert_eq!(head_order(&c, 1, Some(&s)), vec![1, 5, 2, 4, 0, 3]);
        assert_eq!(head_order(&c, 1, None), vec![0, 3, 1, 4, 2, 5]);
    }

    #[test]
    fn runs_of_heads_move_together_ranked_by_their_sum() {
        let c = config(8, 2);
        // Group 0 runs: (0,1) sum 0.2, (2,3) sum 1.0; group 1: (4,5) 0.9, (6,7) -0.1.
        let s = [0.3, -0.1, 0.5, 0.5, 0.4, 0.5, -0.2, 0.1];
        assert_eq!(head_order(&c, 2, Some(&s)), vec![2, 3, 4, 5, 0, 1, 6, 7]);
    }

    #[test]
    fn neurons_rank_by_absolute_score_ties_by_index() {
        let mut c = config(2, 1);
        c.ffn_hidden = 4;
        assert_eq!(
            neuron_order(&c, Some(&[0.5, -2.0, 0.5, 1.0])),
            vec![1, 3, 0, 2]
        );
    }
}

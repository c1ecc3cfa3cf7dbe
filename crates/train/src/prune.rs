//! Sub-models by masking: which units a level keeps, and the probes that
//! zero the others (a unit whose probes are zero contributes nothing: its
//! query rows, attention output columns, gate/up outputs and down input
//! are zero). This evaluates an ordering before any file is rebuilt.
//!
//! A level keeps that fraction of every non-anchor layer's query heads and
//! neurons (anchor layers stay whole); heads are kept equally within each
//! KV group, since the heads of a group share one key and value head.

use arbor_backend_burn::{BurnBackend, BurnTensor};
use arbor_model::{Config, Probes};
use arbor_tensor::Backend;

use crate::{ImportanceFile, Result, TrainError};

/// How units are ranked within a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// By |importance|, most important first.
    Importance,
    /// As the file stores them (prefixes without reordering).
    File,
    /// Neurons by |importance| across all non-anchor layers at once (a
    /// layer whose neurons matter less gives up more of them; the level is
    /// then the share kept overall); heads as [`Order::Importance`].
    Global,
}

/// The units one layer keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct Keep {
    pub heads: Vec<bool>,
    pub neurons: Vec<bool>,
}

/// The first `n` of `len` units in `order`'s ranking of `scores`.
fn first(scores: &[f64], n: usize, order: Order) -> Vec<bool> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    if order == Order::Importance {
        idx.sort_by(|&a, &b| scores[b].abs().total_cmp(&scores[a].abs()).then(a.cmp(&b)));
    }
    let mut keep = vec![false; scores.len()];
    idx.iter().take(n).for_each(|&i| keep[i] = true);
    keep
}

/// What each layer keeps at `level` (a fraction in `(0, 1]`) with the
/// costliest `anchors` layers whole.
pub fn keep_at(
    f: &ImportanceFile,
    c: &Config,
    level: f64,
    anchors: usize,
    order: Order,
) -> Result<Vec<Keep>> {
    let imp = &f.importance;
    if !(level > 0.0 && level <= 1.0) {
        return Err(TrainError::Input(format!("level {level} is not in (0, 1]")));
    }
    if imp.heads.len() != c.n_layers
        || f.layer_costs.len() != c.n_layers
        || imp.heads.iter().any(|h| h.len() != c.heads.n_heads)
        || imp.neurons.iter().any(|n| n.len() != c.ffn_hidden)
    {
        return Err(TrainError::Input(
            "the importance file is for another model".into(),
        ));
    }
    let mut by_cost: Vec<usize> = (0..c.n_layers).collect();
    by_cost.sort_by(|&a, &b| f.layer_costs[b].total_cmp(&f.layer_costs[a]));
    let anchor: Vec<usize> = by_cost.into_iter().take(anchors).collect();
    let group = c.heads.n_heads / c.heads.n_kv_heads.max(1);
    let per_group = ((group as f64 * level).round() as usize).clamp(1, group);
    let neurons = ((c.ffn_hidden as f64 * level).round() as usize).clamp(1, c.ffn_hidden);
    // Across layers: the |importance| a neuron needs to be kept.
    let bar = if order == Order::Global {
        let mut all: Vec<f64> = (0..c.n_layers)
            .filter(|l| !anchor.contains(l))
            .flat_map(|l| imp.neurons[l].iter().map(|x| x.abs()))
            .collect();
        all.sort_by(|a, b| b.total_cmp(a));
        let n = ((all.len() as f64 * level).round() as usize).clamp(1, all.len().max(1));
        all.get(n - 1).copied().unwrap_or(0.0)
    } else {
        0.0
    };
    let within = if order == Order::File {
        Order::File
    } else {
        Order::Importance
    };
    Ok((0..c.n_layers)
        .map(|l| {
            if anchor.contains(&l) {
                return Keep {
                    heads: vec![true; c.heads.n_heads],
                    neurons: vec![true; c.ffn_hidden],
                };
            }
            let heads = imp.heads[l]
                .chunks(group)
                .flat_map(|g| first(g, per_group, within))
                .collect();
            let neurons = match order {
                // At least one neuron per layer.
                Order::Global => {
                    let mut keep: Vec<bool> =
                        imp.neurons[l].iter().map(|x| x.abs() >= bar).collect();
                    if !keep.contains(&true) {
                        keep = first(&imp.neurons[l], 1, Order::Importance);
                    }
                    keep
                }
                _ => first(&imp.neurons[l], neurons, order),
            };
            Keep { heads, neurons }
        })
        .collect())
}

/// Probes that zero every unit `keep` drops.
pub fn masks(b: &BurnBackend, c: &Config, keep: &[Keep]) -> Result<Vec<Probes<BurnTensor>>> {
    let hd = c.heads.head_dim;
    keep.iter()
        .map(|k| {
            let heads: Vec<f32> = (k.heads.iter())
                .flat_map(|&on| std::iter::repeat_n(if on { 1.0 } else { 0.0 }, hd))
                .collect();
            let neurons: Vec<f32> = (k.neurons.iter())
                .map(|&on| if on { 1.0 } else { 0.0 })
                .collect();
            let t = |v: &[f32]| b.tensor(v, 1, v.len());
            Ok(Probes {
                q: t(&heads)?,
                attn: t(&heads)?,
                gate: t(&neurons)?,
                up: t(&neurons)?,
                down: t(&neurons)?,
            })
        })
        .collect()
}

//! The residency plan of an elastic target whose lower level drafts for it
//! under a memory budget: a layer is either resident whole or split — its
//! prefix at the draft's level held (the draft runs it), the rest of its
//! MLP streamed for the target's passes (see [`arbor_model::split`]). A
//! layer is never streamed whole: the draft would have nothing to run.

use arbor_paging::{PagingError, format_bytes};

use crate::Plan;
use crate::plan::spread;

/// What one layer costs whole and, where it can be split at the plan's
/// level, split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitCost {
    /// Bytes the whole layer holds.
    pub whole: u64,
    /// `(held prefix, held suffix once built, suffix bytes read)`; `None`
    /// for a layer the level keeps whole (an anchor).
    pub split: Option<(u64, u64, u64)>,
}

/// Plans `layers` at elastic level index `level` under `budget`, `fixed`
/// bytes being taken by everything else, the streamer holding up to
/// `slots` built suffixes and `buffers` bytes of read buffers. Splits as
/// few layers as fit, spread through the stack; fails with the minimum
/// budget when splitting every layer that can be split does not fit.
pub fn split_plan(
    budget: u64,
    fixed: u64,
    level: usize,
    layers: &[SplitCost],
    slots: usize,
    buffers: u64,
) -> Result<Plan, PagingError> {
    let n = layers.len();
    let can: Vec<usize> = (0..n).filter(|&i| layers[i].split.is_some()).collect();
    let slots = slots.max(1);
    let plan_for = |count: usize| {
        let mut split = vec![false; n];
        for j in spread(can.len(), count) {
            split[can[j]] = true;
        }
        let parts = |i: usize| layers[i].split.expect("only splittable layers are split");
        let resident_bytes: u64 = (0..n)
            .map(|i| match split[i] {
                true => parts(i).0,
                false => layers[i].whole,
            })
            .sum();
        let max_suffix = (0..n).filter(|&i| split[i]).map(|i| parts(i).1).max();
        let reserve = match max_suffix {
            Some(m) => slots as u64 * m + buffers,
            None => 0,
        };
        Plan {
            budget,
            fixed,
            resident: split.iter().map(|s| !s).collect(),
            resident_bytes,
            slots: if count == 0 { 0 } else { slots },
            stream_reserve: reserve,
            read_per_pass: (0..n).filter(|&i| split[i]).map(|i| parts(i).2).sum(),
            split: Some((level, split)),
            head_read: 0,
            head_held: (0, 0),
            head_approx: 0,
        }
    };
    for count in 0..=can.len() {
        let p = plan_for(count);
        if fixed + p.stream_reserve + p.resident_bytes <= budget {
            return Ok(p);
        }
    }
    // Splitting more layers saves held bytes but can widen the reserve:
    // the least any plan needs.
    let need = |p: &Plan| fixed + p.stream_reserve + p.resident_bytes;
    let all = (0..=can.len())
        .map(plan_for)
        .min_by_key(need)
        .expect("at least the plan that splits nothing");
    let minimum = need(&all);
    Err(PagingError::TooSmall {
        budget,
        minimum,
        detail: format!(
            "{} outside the decoder layers, at least {} of layers held with layers split at the \
             draft's level, and a streaming reserve of {}: choose a lower elastic level",
            format_bytes(fixed),
            format_bytes(all.resident_bytes),
            format_bytes(all.stream_reserve),
        ),
    })
}

/// The split plan of `layout` at level index `level`: each layer's costs
/// and its two entry lists (held, streamed) where it splits.
pub(crate) fn split_costs<B: arbor_tensor::Backend>(
    backend: &B,
    layout: &arbor_model::Layout,
    level: usize,
) -> arbor_model::Result<Vec<(SplitCost, Option<Vec<arbor_model::TensorEntry>>)>> {
    use arbor_model::{ModelError, held_bytes};
    let e = layout
        .elastic
        .as_ref()
        .ok_or_else(|| ModelError::Input("only an elastic model's layers can be split".into()))?;
    let cuts = e
        .cuts
        .get(level)
        .ok_or_else(|| ModelError::Input(format!("level index {level} of {}", e.levels.len())))?;
    let ff = layout.config.ffn_hidden;
    (0..layout.layers.len())
        .map(|i| {
            let whole = held_bytes(backend, &layout.layers[i]);
            let neurons = cuts[i].neurons;
            if neurons == ff {
                return Ok((SplitCost { whole, split: None }, None));
            }
            let (hold, stream) = layout.split_entries(i, neurons).ok_or_else(|| {
                ModelError::Invalid(format!(
                    "layer {i} has no stored down segment ending at neuron {neurons}: \
                     rebuild the elastic file with `arbor elastic build`"
                ))
            })?;
            let read = stream.iter().map(|t| t.len as u64).sum();
            let split = (
                held_bytes(backend, &hold),
                held_bytes(backend, &stream),
                read,
            );
            Ok((
                SplitCost {
                    whole,
                    split: Some(split),
                },
                Some(stream),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers() -> Vec<SplitCost> {
        (0..6)
            .map(|i| SplitCost {
                whole: 100,
                split: (i != 0 && i != 5).then_some((40, 30, 55)),
            })
            .collect()
    }

    #[test]
    fn splits_as_few_layers_as_fit_and_never_anchors() {
        let ls = layers();
        let roomy = split_plan(10_000, 1_000, 3, &ls, 2, 10).unwrap();
        assert_eq!(roomy.streamed(), 0);
        assert_eq!(roomy.read_per_pass, 0);
        // Whole: 600. One split: 5 × 100 + 40 held, 2 × 30 + 10 reserve =
        // 610, more than none; two: 4 × 100 + 2 × 40 + 70 = 550, the first
        // count that fits 550.
        let p = split_plan(1_000 + 550, 1_000, 3, &ls, 2, 10).unwrap();
        let (level, split) = p.split.clone().unwrap();
        assert_eq!(level, 3);
        assert_eq!(split.iter().filter(|&&s| s).count(), 2);
        assert!(!split[0] && !split[5]);
        assert_eq!(p.read_per_pass, 110);
        assert!(p.fixed + p.stream_reserve + p.resident_bytes <= p.budget);
    }

    #[test]
    fn too_small_when_every_split_does_not_fit() {
        let ls = layers();
        let min = 1_000 + 2 * 100 + 4 * 40 + 2 * 30 + 10;
        assert!(split_plan(min, 1_000, 1, &ls, 2, 10).is_ok());
        let err = split_plan(min - 1, 1_000, 1, &ls, 2, 10).unwrap_err();
        assert!(matches!(err, PagingError::TooSmall { minimum, .. } if minimum == min));
    }
}

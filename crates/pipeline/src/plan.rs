//! Which layers stay in memory under a budget.

use arbor_paging::{PagingError, format_bytes};

/// What one decoder layer costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerCost {
    /// Bytes its weights hold once built.
    pub held: u64,
    /// Bytes it holds beside its read buffers when streamed: `held`, or
    /// less where the backend keeps weights in the buffers (see
    /// [`crate::keeps_in_place`]).
    pub copied: u64,
    /// Bytes read from the file to build it.
    pub read: u64,
}

/// A split of the memory budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub budget: u64,
    /// Everything that is not a decoder layer.
    pub fixed: u64,
    /// One flag per layer.
    pub resident: Vec<bool>,
    /// Bytes of the resident layers.
    pub resident_bytes: u64,
    /// Built layers the streamer may hold at once (0: nothing is streamed).
    pub slots: usize,
    /// The streamer's share: `slots` of the largest streamed layer plus its
    /// read buffers.
    pub stream_reserve: u64,
    /// Bytes read from disk per forward pass.
    pub read_per_pass: u64,
    /// Layers that are split (see [`crate::split_plan`]): their prefix at
    /// this elastic level index is held and the rest of their MLP streams.
    /// Split layers are not `resident`.
    pub split: Option<(usize, Vec<bool>)>,
    /// Bytes of the output head read per pass (in `read_per_pass`) when
    /// the budget cannot hold it (see [`crate::DiskHead`]); 0 when held.
    pub head_read: u64,
    /// Of a head that is read per pass, the first rows held instead (what
    /// the budget has left once whole layers are planned), and the bytes
    /// they take; `(0, 0)` when the head is held whole or read whole.
    pub head_held: (usize, u64),
    /// Bytes of a streamed float head's held low-bit copy, which passes
    /// read for their argmax instead of the head (0: none; see
    /// [`arbor_model::certified`]). Such a head is not read per pass:
    /// `head_read` is 0.
    pub head_approx: u64,
}

impl Plan {
    pub fn streamed(&self) -> usize {
        self.resident.iter().filter(|r| !**r).count()
    }
}

/// Layer indices to stream when `count` of `n` layers are streamed: spread
/// evenly, so resident layers' compute sits between consecutive reads.
pub(crate) fn spread(n: usize, count: usize) -> Vec<usize> {
    (0..count).map(|j| (2 * j + 1) * n / (2 * count)).collect()
}

/// Plans the residency of `layers` under `budget`, `fixed` bytes being
/// taken by everything else, the streamer holding up to `slots` built
/// layers and `buffers` bytes of read buffers (see
/// [`crate::read_buffer_bytes`]). Streams as few layers as possible; fails
/// with the minimum budget when even streaming every layer does not fit.
pub fn plan(
    budget: u64,
    fixed: u64,
    layers: &[LayerCost],
    slots: usize,
    buffers: u64,
) -> Result<Plan, PagingError> {
    let n = layers.len();
    let all: u64 = layers.iter().map(|l| l.held).sum();
    if fixed + all <= budget {
        return Ok(Plan {
            budget,
            fixed,
            resident: vec![true; n],
            resident_bytes: all,
            slots: 0,
            stream_reserve: 0,
            read_per_pass: 0,
            split: None,
            head_read: 0,
            head_held: (0, 0),
            head_approx: 0,
        });
    }
    let slots = slots.max(1);
    for count in 1..=n {
        let streamed = spread(n, count);
        let mut resident = vec![true; n];
        for &i in &streamed {
            resident[i] = false;
        }
        let max_held = streamed
            .iter()
            .map(|&i| layers[i].copied)
            .max()
            .unwrap_or(0);
        let reserve = slots as u64 * max_held + buffers;
        let resident_bytes: u64 = (0..n)
            .filter(|&i| resident[i])
            .map(|i| layers[i].held)
            .sum();
        if fixed + reserve + resident_bytes <= budget {
            return Ok(Plan {
                budget,
                fixed,
                resident,
                resident_bytes,
                slots,
                stream_reserve: reserve,
                read_per_pass: streamed.iter().map(|&i| layers[i].read).sum(),
                split: None,
                head_read: 0,
                head_held: (0, 0),
                head_approx: 0,
            });
        }
    }
    let max_held = layers.iter().map(|l| l.copied).max().unwrap_or(0);
    let minimum = fixed + slots as u64 * max_held + buffers;
    Err(PagingError::TooSmall {
        budget,
        minimum,
        detail: format!(
            "{} outside the decoder layers, plus {slots} streamed layer(s) of up to {} and their read buffers",
            format_bytes(fixed),
            format_bytes(max_held)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(n: usize) -> Vec<LayerCost> {
        (0..n)
            .map(|i| LayerCost {
                held: 100 + i as u64,
                copied: 100 + i as u64,
                read: 80,
            })
            .collect()
    }

    #[test]
    fn everything_resident_when_it_fits() {
        let p = plan(10_000, 1_000, &layers(8), 2, 90).unwrap();
        assert!(p.resident.iter().all(|&r| r));
        assert_eq!((p.slots, p.stream_reserve, p.read_per_pass), (0, 0, 0));
    }

    #[test]
    fn streams_as_few_layers_as_fit_and_stays_within_budget() {
        let ls = layers(10);
        for budget in [300_000u64, 600_000, 700_000] {
            let fixed = budget - 280_000;
            let p = plan(budget, fixed, &ls, 2, 90).unwrap();
            assert!(p.fixed + p.stream_reserve + p.resident_bytes <= budget);
            // One more resident layer would not have fitted.
            if p.streamed() > 1 {
                let fewer = spread(10, p.streamed() - 1);
                let bytes: u64 = (0..10)
                    .filter(|i| !fewer.contains(i))
                    .map(|i| ls[i].held)
                    .sum();
                assert!(p.fixed + p.stream_reserve + bytes > budget);
            }
        }
    }

    #[test]
    fn layers_kept_in_their_buffers_reserve_only_their_copies() {
        // Ten layers of 100 bytes; three sets of buffers when kept in
        // place, two sets and two built copies when not.
        let copied = |c: u64| -> Vec<LayerCost> {
            (0..10)
                .map(|_| LayerCost {
                    held: 100,
                    copied: c,
                    read: 100,
                })
                .collect()
        };
        // 1,010 - 300: 310 beside two copies (3 layers), 402 beside three
        // sets (4 layers).
        let budget = 1_010;
        let copies = plan(budget, 300, &copied(100), 2, 2 * 100).unwrap();
        let kept = plan(budget, 300, &copied(4), 2, 3 * 100).unwrap();
        assert_eq!(copies.stream_reserve, 400);
        assert_eq!(kept.stream_reserve, 2 * 4 + 300);
        assert_eq!(kept.streamed() + 1, copies.streamed());
        assert!(kept.fixed + kept.stream_reserve + kept.resident_bytes <= budget);
    }

    #[test]
    fn streamed_layers_are_spread() {
        assert_eq!(spread(28, 4), vec![3, 10, 17, 24]);
        assert_eq!(spread(10, 10), (0..10).collect::<Vec<_>>());
        assert_eq!(spread(5, 1), vec![2]);
    }

    #[test]
    fn too_small_says_the_minimum() {
        let err = plan(4_200, 4_000, &layers(4), 2, 90).unwrap_err();
        let PagingError::TooSmall { minimum, .. } = err else {
            panic!("expected TooSmall, got {err:?}");
        };
        assert_eq!(minimum, 4_000 + 2 * 103 + 90);
        assert!(plan(minimum, 4_000, &layers(4), 2, 90).is_ok());
        assert!(plan(minimum - 1, 4_000, &layers(4), 2, 90).is_err());
    }
}

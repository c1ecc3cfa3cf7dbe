//! Paired serving for `bench slo`. Every (family, scorer, pair) some policy
//! chose on a prompt is served in rounds beside the original model on the
//! same prompt — reference, two pairs, reference, two pairs, … reference —
//! and each run is held against the mean of the reference runs on either
//! side of it, so a slow spell of this noisy host slows a pair and its
//! reference alike. The median of those ratios over the rounds says
//! whether an objective was met; the order of the pairs turns from round
//! to round.

use anyhow::Result;
use arbor_engine::slo::Served;
use arbor_slo::median;

/// Pairs served between two reference runs.
const BETWEEN: usize = 2;

/// One served item, measured against the reference.
#[derive(Debug, Clone)]
pub(super) struct Measured {
    /// The run with the median TTFT (its switching and scoring times),
    /// with the median TPOT: absolute figures, for prediction errors.
    pub served: Served,
    /// Median over rounds of TTFT over the reference's TTFT beside it.
    pub ttft_ratio: f64,
    /// The same for the time per output token.
    pub tpot_ratio: f64,
}

/// `items` (by index) served `reps` rounds around the reference, after one
/// reference run that warms caches: `serve(None)` serves the reference,
/// `serve(Some(i))` item `i`. Returns the reference's median run and each
/// item's measurement.
pub(super) fn rounds(
    items: usize,
    reps: usize,
    serve: &mut dyn FnMut(Option<usize>) -> Result<Served>,
) -> Result<(Served, Vec<Measured>)> {
    serve(None)?;
    let mut refs: Vec<Served> = Vec::new();
    // Per item, per round: the run and the reference beside it.
    let mut runs: Vec<Vec<(Served, f64, f64)>> = vec![Vec::new(); items];
    for r in 0..reps {
        let order: Vec<usize> = (0..items)
            .map(|k| (k + r * items / reps.max(1)) % items)
            .collect();
        let mut before = serve(None)?;
        refs.push(before.clone());
        for chunk in order.chunks(BETWEEN) {
            let served: Vec<(usize, Served)> = (chunk.iter())
                .map(|&i| Ok((i, serve(Some(i))?)))
                .collect::<Result<_>>()?;
            let after = serve(None)?;
            refs.push(after.clone());
            let ttft = (before.ttft + after.ttft) / 2.0;
            let tpot = (before.tpot + after.tpot) / 2.0;
            for (i, s) in served {
                runs[i].push((s, ttft, tpot));
            }
            before = after;
        }
    }
    let reference = median_run(refs);
    let measured = (runs.into_iter())
        .map(|r| {
            let ttft_ratio = median(r.iter().map(|(s, t, _)| s.ttft / t).collect());
            let tpot_ratio = median(r.iter().map(|(s, _, p)| s.tpot / p).collect());
            Measured {
                served: median_run(r.into_iter().map(|(s, _, _)| s).collect()),
                ttft_ratio,
                tpot_ratio,
            }
        })
        .collect();
    Ok((reference, measured))
}

/// The run with the median TTFT, carrying the median TPOT.
fn median_run(mut runs: Vec<Served>) -> Served {
    let tpot = median(runs.iter().map(|r| r.tpot).collect());
    runs.sort_by(|a, b| a.ttft.total_cmp(&b.ttft));
    let mut m = runs.swap_remove(runs.len() / 2);
    m.tpot = tpot;
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ttft: f64, tpot: f64) -> Served {
        Served {
            ttft,
            tpot,
            switch_secs: 0.0,
            score_secs: 0.0,
            tokens: Vec::new(),
        }
    }

    /// A host that slows down halfway: each item's ratio stays its own,
    /// whichever half of the rounds it was served in, and every item is
    /// served once per round between two reference runs.
    #[test]
    fn ratios_follow_the_reference_beside_each_run() {
        // Item i costs (1 + i / 10) of the reference.
        let (items, reps) = (5, 3);
        let mut calls: Vec<Option<usize>> = Vec::new();
        let mut serve = |i: Option<usize>| -> Result<Served> {
            let slow = if calls.len() > 12 { 2.0 } else { 1.0 };
            calls.push(i);
            let cost = i.map_or(1.0, |i| 1.0 + i as f64 / 10.0);
            Ok(run(cost * slow, 0.5 * cost * slow))
        };
        let (reference, measured) = rounds(items, reps, &mut serve).unwrap();
        assert_eq!(measured.len(), items);
        for (i, m) in measured.iter().enumerate() {
            let want = 1.0 + i as f64 / 10.0;
            // A run beside a step in speed sees half of it: the median of
            // three rounds does not.
            assert!(
                (m.ttft_ratio - want).abs() < 1e-9,
                "item {i}: {}",
                m.ttft_ratio
            );
            assert!(
                (m.tpot_ratio - want).abs() < 1e-9,
                "item {i}: {}",
                m.tpot_ratio
            );
        }
        assert!(reference.ttft == 1.0 || reference.ttft == 2.0);
        let served = |i: usize| calls.iter().filter(|&&c| c == Some(i)).count();
        assert!((0..items).all(|i| served(i) == reps));
        // Warm-up, then per round a reference before and after every two items.
        assert_eq!(
            calls.iter().filter(|c| c.is_none()).count(),
            1 + reps * (1 + items.div_ceil(2))
        );
        assert!(calls.windows(3).all(|w| w.iter().any(|c| c.is_none())));
    }
}

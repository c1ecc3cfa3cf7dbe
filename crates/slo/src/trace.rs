//! Request traces as ELMS §5.2 builds them: six apps with the objectives
//! of its Table 3, requests split among them by a skew α
//! (`Num(i) ∝ e^{α·i}`, `i` from the tightest objective, 1, to the most
//! relaxed, 6: α > 0 leans to relaxed objectives), shuffled, with Poisson
//! arrival times.

use arbor_sampling::Rng;
use serde::Serialize;

use crate::{Result, Slo, SloError};

/// An app of the trace and the objective all its requests carry.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct App {
    pub name: &'static str,
    pub slo: Slo,
}

const fn app(name: &'static str, ttft: f64, tpot: f64) -> App {
    App {
        name,
        slo: Slo { ttft, tpot },
    }
}

/// ELMS Table 3, from the most relaxed objective to the tightest.
pub const TRACE_APPS: [App; 6] = [
    app("Rewind", 1.0, 1.0),
    app("GMail", 0.8, 0.9),
    app("Octopus", 0.6, 0.8),
    app("Shortcuts", 0.4, 0.7),
    app("Gboard", 0.2, 0.6),
    app("XiaoAi", 0.2, 0.5),
];

/// One request: its app (an index of [`TRACE_APPS`]), when it arrives
/// (seconds from the trace's start) and which prompt of the pool it asks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Request {
    pub app: usize,
    pub arrival: f64,
    pub prompt: usize,
}

/// Requests per app for `n` requests at skew `alpha` (largest remainders,
/// so they add up to `n`), in [`TRACE_APPS`]' order.
pub fn app_counts(n: usize, alpha: f64) -> [usize; 6] {
    // SLO level i = 1 is the tightest app, the last of TRACE_APPS.
    let weight = |app: usize| (alpha * (TRACE_APPS.len() - app) as f64).exp();
    let sum: f64 = (0..6).map(weight).sum();
    let exact: Vec<f64> = (0..6).map(|a| n as f64 * weight(a) / sum).collect();
    let mut counts = [0usize; 6];
    for (c, e) in counts.iter_mut().zip(&exact) {
        *c = e.floor() as usize;
    }
    let mut order: Vec<usize> = (0..6).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    let short = n - counts.iter().sum::<usize>();
    for &a in &order[..short] {
        counts[a] += 1;
    }
    counts
}

/// A trace of `n` requests at skew `alpha`, arriving at `rate` per second
/// on average, each asking one of `prompts` prompts (drawn without
/// repeats until the pool is used up), from `seed`.
pub fn draw_trace(
    n: usize,
    alpha: f64,
    rate: f64,
    prompts: usize,
    seed: u64,
) -> Result<Vec<Request>> {
    if n == 0 || prompts == 0 {
        return Err(SloError::Trace("a trace needs requests and prompts".into()));
    }
    if !(rate.is_finite() && rate > 0.0 && alpha.is_finite()) {
        return Err(SloError::Trace(format!(
            "rate {rate} and skew {alpha} must be finite, the rate positive"
        )));
    }
    let mut rng = Rng::new(seed);
    let mut apps: Vec<usize> = (app_counts(n, alpha).iter().enumerate())
        .flat_map(|(a, &c)| std::iter::repeat_n(a, c))
        .collect();
    shuffle(&mut apps, &mut rng);
    let mut pool: Vec<usize> = Vec::new();
    let mut clock = 0.0;
    Ok(apps
        .into_iter()
        .map(|app| {
            if pool.is_empty() {
                pool = (0..prompts).collect();
                shuffle(&mut pool, &mut rng);
            }
            // Exponential gaps: a Poisson process of the given rate.
            clock += -(1.0 - rng.next_f64()).ln() / rate;
            Request {
                app,
                arrival: clock,
                prompt: pool.pop().unwrap_or(0),
            }
        })
        .collect())
}

fn shuffle<T>(items: &mut [T], rng: &mut Rng) {
    for i in (1..items.len()).rev() {
        items.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skew_leans_toward_relaxed_or_tight_objectives() {
        assert_eq!(app_counts(60, 0.0), [10; 6]);
        let relaxed = app_counts(600, 0.25);
        // ELMS's formula at α = 0.25: 170.8 for the most relaxed, 48.9 for the tightest.
        assert_eq!(relaxed.iter().sum::<usize>(), 600);
        assert!((170..=171).contains(&relaxed[0]) && (48..=49).contains(&relaxed[5]));
        assert!(relaxed.windows(2).all(|w| w[0] >= w[1]));
        let mut tight = app_counts(600, -0.25);
        tight.reverse();
        assert_eq!(tight, relaxed);
        assert_eq!(app_counts(7, 0.25).iter().sum::<usize>(), 7);
    }

    #[test]
    fn traces_arrive_in_order_and_use_the_pool_evenly() {
        let t = draw_trace(60, -0.25, 0.5, 20, 7).unwrap();
        assert_eq!(t.len(), 60);
        assert!(t.windows(2).all(|w| w[0].arrival < w[1].arrival));
        let mut per_prompt = [0; 20];
        for r in &t {
            per_prompt[r.prompt] += 1;
        }
        assert_eq!(per_prompt, [3; 20]);
        let mut per_app = [0; 6];
        for r in &t {
            per_app[r.app] += 1;
        }
        assert_eq!(per_app, app_counts(60, -0.25));
        // Mean gap near 1 / rate.
        let mean = t.last().unwrap().arrival / 60.0;
        assert!((1.0..4.0).contains(&mean), "{mean}");
        assert_eq!(draw_trace(60, -0.25, 0.5, 20, 7).unwrap(), t);
        assert!(draw_trace(0, 0.0, 1.0, 1, 1).is_err());
        assert!(draw_trace(5, 0.0, 0.0, 1, 1).is_err());
    }
}

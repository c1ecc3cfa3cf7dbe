//! What each draft source achieved, measured whole: tokens per second of
//! decoding under one budget, as generations ran it. The estimates in
//! [`crate::auto`] are a model (acceptance, `L_fp(n)`, bandwidth, overlap)
//! and on our 2-core VMs they missed the measured rate by up to 25% under
//! 800 MiB (ppd rated 5.67 tok/s ran 5.01, a slim tree rated 4.95 ran 6.03:
//! the model ranked them the wrong way round). A rate that runs measured
//! for a source, strategy and budget is what the next plan should expect
//! of it: once a source has decoded [`MIN_TOKENS`] tokens there, `auto`
//! plans with the measured rate and says so; the model stands for the
//! sources and budgets nothing measured yet.

use std::path::{Path, PathBuf};

use crate::ProfileStore;
use crate::Result;
use crate::acceptance::KEEP;
use crate::profiles::{now_utc, stem};

/// Decoded tokens (fading) a rate needs before it replaces the model's
/// estimate: two generations of 128 tokens.
pub const MIN_TOKENS: f64 = 256.0;

/// The source a run without a draft (plain decoding) is counted under.
pub const NO_SOURCE: &str = "none";

/// One source's decoding as measured under one budget.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rate {
    /// The source ([`crate::source_key`], or [`NO_SOURCE`]: `ppd`, `lookup`, a
    /// draft's stem).
    pub source: String,
    /// The strategy that ran it ([`strategy_key`]: `ppd`,
    /// `tree-no-fallback branch 0.050`, …).
    pub strategy: String,
    /// Tokens decoded and the seconds they took (prefill excluded), fading.
    pub tokens: f64,
    pub secs: f64,
    pub generations: u64,
    pub updated: String,
}

impl Rate {
    pub fn tok_s(&self) -> f64 {
        self.tokens / self.secs.max(f64::MIN_POSITIVE)
    }
}

/// Every source's measured rate for one target, kernels and budget.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RateRecord {
    pub target: String,
    /// The key the rates were measured under
    /// ([`crate::choice::choice_key`]: budget and sequences).
    pub key: String,
    pub rates: Vec<Rate>,
}

impl RateRecord {
    /// Folds one generation in: `tokens` decoded in `secs` by `source`
    /// under `strategy`; what that source had keeps [`KEEP`] of its weight.
    pub fn fold(&mut self, source: &str, strategy: &str, tokens: usize, secs: f64) {
        if tokens == 0 || !(secs.is_finite() && secs > 0.0) {
            return;
        }
        let at =
            match (self.rates.iter()).position(|r| r.source == source && r.strategy == strategy) {
                Some(at) => at,
                None => {
                    self.rates.push(Rate {
                        source: source.into(),
                        strategy: strategy.into(),
                        tokens: 0.0,
                        secs: 0.0,
                        generations: 0,
                        updated: String::new(),
                    });
                    self.rates.len() - 1
                }
            };
        let r = &mut self.rates[at];
        r.tokens = r.tokens * KEEP + tokens as f64;
        r.secs = r.secs * KEEP + secs;
        r.generations += 1;
        r.updated = now_utc();
    }

    /// The rate `source` measured under `strategy`, once it has decoded
    /// [`MIN_TOKENS`] tokens.
    pub fn measured(&self, source: &str, strategy: &str) -> Option<&Rate> {
        (self.rates.iter()).find(|r| {
            r.source == source && r.strategy == strategy && r.tokens >= MIN_TOKENS && r.secs > 0.0
        })
    }
}

/// The name a strategy's rate is kept under: its canonical name, and the
/// branch threshold when a run set one (`auto` opens a model draft's
/// streaming tree at 0.05: its rate is not that of the same tree at the
/// default, measured 6.50 against 5.28 tok/s with the slim 0.5B under
/// 800 MiB in one run).
pub fn strategy_key(name: &str, branch_threshold: Option<f32>) -> String {
    match branch_threshold {
        Some(t) => format!("{name} branch {t:.3}"),
        None => name.to_string(),
    }
}

impl ProfileStore {
    fn rates_path(&self, target: &Path, kernels: &str, threads: usize, key: &str) -> PathBuf {
        self.dir().join(format!(
            "rates-{}-{kernels}-t{threads}-{key}.json",
            stem(target)
        ))
    }

    /// The rates measured for `target` with these kernels and threads
    /// under `key` (empty when none were).
    pub fn rates(&self, target: &Path, kernels: &str, threads: usize, key: &str) -> RateRecord {
        std::fs::read_to_string(self.rates_path(target, kernels, threads, key))
            .ok()
            .and_then(|t| serde_json::from_str::<RateRecord>(&t).ok())
            .filter(|r| r.key == key)
            .unwrap_or_else(|| RateRecord {
                target: stem(target),
                key: key.into(),
                rates: Vec::new(),
            })
    }

    /// Folds a generation's decoding into the rates under `key` (see
    /// [`RateRecord::fold`]).
    #[allow(clippy::too_many_arguments)]
    pub fn observe_rate(
        &self,
        target: &Path,
        kernels: &str,
        threads: usize,
        key: &str,
        source: &str,
        strategy: &str,
        tokens: usize,
        secs: f64,
    ) -> Result<()> {
        let mut record = self.rates(target, kernels, threads, key);
        record.fold(source, strategy, tokens, secs);
        self.write(&self.rates_path(target, kernels, threads, key), &record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_counts_once_it_has_decoded_enough_and_fades() {
        let mut r = RateRecord::default();
        r.fold("ppd", "ppd", 128, 25.6);
        assert!(r.measured("ppd", "ppd").is_none(), "128 tokens: too few");
        r.fold("ppd", "ppd", 128, 25.6);
        r.fold("ppd", "ppd", 128, 25.6);
        let m = r.measured("ppd", "ppd").expect("enough tokens");
        assert!((m.tok_s() - 5.0).abs() < 1e-9, "{}", m.tok_s());
        assert_eq!(m.generations, 3);
        // Another strategy of the same source is another rate.
        assert!(r.measured("ppd", "tree").is_none());
        // Newer generations weigh more: twice as fast from now on.
        for _ in 0..40 {
            r.fold("ppd", "ppd", 128, 12.8);
        }
        let m = r.measured("ppd", "ppd").unwrap();
        assert!(m.tok_s() > 9.9 && m.tok_s() < 10.0, "{}", m.tok_s());
        // Nothing decoded, or no time: nothing folded.
        r.fold("none", "autoregressive", 0, 1.0);
        r.fold("none", "autoregressive", 10, 0.0);
        assert_eq!(r.rates.len(), 1);
    }

    #[test]
    fn a_branch_threshold_set_is_part_of_the_key() {
        assert_eq!(strategy_key("ppd", None), "ppd");
        assert_eq!(
            strategy_key("tree-no-fallback", Some(0.05)),
            "tree-no-fallback branch 0.050"
        );
        assert_ne!(
            strategy_key("tree-no-fallback", Some(0.05)),
            strategy_key("tree-no-fallback", None)
        );
    }

    #[test]
    fn rates_are_kept_per_target_kernels_and_budget() {
        let dir = std::env::temp_dir().join(format!("arbor-rates-{}", std::process::id()));
        let store = ProfileStore::new(dir.clone());
        let t = Path::new("/m/t.gguf");
        for _ in 0..3 {
            store
                .observe_rate(
                    t,
                    "k",
                    2,
                    "800MiB-s1",
                    "slim",
                    "tree-no-fallback",
                    128,
                    20.0,
                )
                .unwrap();
        }
        let got = store.rates(t, "k", 2, "800MiB-s1");
        let m = got.measured("slim", "tree-no-fallback").unwrap();
        assert!((m.tok_s() - 6.4).abs() < 1e-9);
        assert!(store.rates(t, "k", 2, "900MiB-s1").rates.is_empty());
        assert!(store.rates(t, "other", 2, "800MiB-s1").rates.is_empty());
        assert!(store.rates(t, "k", 4, "800MiB-s1").rates.is_empty());
        std::fs::remove_dir_all(dir).ok();
    }
}

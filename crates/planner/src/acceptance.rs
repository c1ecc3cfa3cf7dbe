//! What each draft source's guesses are worth with a target, as runs
//! counted them ([`arbor_speculative::Acceptance`]): cached under
//! `$ARBOR_HOME/profiles/` per target and source, folded in after every
//! generation that drafted, older runs fading, and read back by `auto` as
//! an accuracy table (top-k by depth) leaning on the source's prior until
//! runs outweigh it.

use std::path::{Path, PathBuf};

use arbor_ppd::Accuracy;
use arbor_speculative::Acceptance;

use crate::profiles::{now_utc, stem};
use crate::{ProfileStore, Result};

/// How much the counts so far keep when a generation's are folded in:
/// about the last ten generations count.
pub const KEEP: f64 = 0.9;
/// Verified trees a prior weighs as (per depth and rank): a generation of
/// ~50 verifications moves an estimate a fair way, a few runs settle it.
pub const PRIOR_WEIGHT: f64 = 40.0;

/// A source's counts with one target, as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AcceptanceRecord {
    pub target: String,
    /// The source's key ([`source_key`]).
    pub source: String,
    /// UTC time of the last generation folded in.
    pub updated: String,
    /// Generations folded in.
    pub generations: u64,
    pub counts: Acceptance,
}

impl AcceptanceRecord {
    /// The accuracy table to plan with: these counts over `prior`.
    pub fn accuracy(&self, prior: &Accuracy) -> Accuracy {
        self.counts.accuracy(prior, PRIOR_WEIGHT)
    }
}

/// The key a draft source is stored under: `lookup`, `self`, `ppd`,
/// `elastic:0.5`, or a draft model's file stem; characters a file name
/// should not hold become `_`.
pub fn source_key(source: &str) -> String {
    let name = match Path::new(source).extension().is_some_and(|e| e == "gguf") {
        true => stem(Path::new(source)),
        false => source.to_string(),
    };
    name.chars()
        .map(
            |c| match c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':') {
                true => c,
                false => '_',
            },
        )
        .collect()
}

impl ProfileStore {
    /// The file holding `source`'s counts with `target`.
    pub fn acceptance_path(&self, target: &Path, source: &str) -> PathBuf {
        let key = source_key(source).replace(':', "_");
        self.dir()
            .join(format!("acceptance-{}-{key}.json", stem(target)))
    }

    /// `source`'s counts with `target`, when runs have counted any.
    pub fn cached_acceptance(&self, target: &Path, source: &str) -> Option<AcceptanceRecord> {
        let text = std::fs::read_to_string(self.acceptance_path(target, source)).ok()?;
        serde_json::from_str::<AcceptanceRecord>(&text)
            .ok()
            .filter(|r| r.counts == fits(&r.counts))
    }

    /// The accuracy table of `source` with `target`: the counted one over
    /// `prior`, or `prior` itself; and how many trees were counted.
    pub fn accuracy(&self, target: &Path, source: &str, prior: &Accuracy) -> (Accuracy, f64) {
        match self.cached_acceptance(target, source) {
            Some(r) => (r.accuracy(prior), r.counts.trees()),
            None => (prior.clone(), 0.0),
        }
    }

    /// Folds a generation's counts into `source`'s record with `target`
    /// (nothing to fold: no write).
    pub fn observe_acceptance(
        &self,
        target: &Path,
        source: &str,
        counts: &Acceptance,
    ) -> Result<()> {
        if counts.trees() == 0.0 {
            return Ok(());
        }
        let mut record = self
            .cached_acceptance(target, source)
            .unwrap_or(AcceptanceRecord {
                target: stem(target),
                source: source_key(source),
                updated: String::new(),
                generations: 0,
                counts: Acceptance::default(),
            });
        record.counts.merge(counts, KEEP);
        record.generations += 1;
        record.updated = now_utc();
        self.write(&self.acceptance_path(target, source), &record)
    }
}

/// `counts` if its shape is this build's, else an empty count (a record
/// of another shape is counted again).
fn fits(counts: &Acceptance) -> Acceptance {
    let want = Acceptance::default();
    let same = |a: &Vec<Vec<f64>>, b: &Vec<Vec<f64>>| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.len() == y.len())
    };
    if same(&counts.hits, &want.hits) && same(&counts.offered, &want.offered) {
        counts.clone()
    } else {
        want
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_fold_in_and_heal_the_prior() {
        let dir = std::env::temp_dir().join(format!("arbor-acceptance-{}", std::process::id()));
        let store = ProfileStore::new(dir.clone());
        let target = Path::new("/models/t.gguf");
        let prior = Accuracy::new(vec![vec![0.7, 0.8]]).unwrap();
        assert_eq!(
            store.accuracy(target, "lookup", &prior),
            (prior.clone(), 0.0)
        );
        // A source that the target never follows.
        let mut misses = Acceptance::default();
        misses.offered[0][0] = 50.0;
        misses.offered[0][1] = 50.0;
        for _ in 0..20 {
            store.observe_acceptance(target, "lookup", &misses).unwrap();
        }
        let (acc, trees) = store.accuracy(target, "lookup", &prior);
        assert!(trees > 300.0 && trees < 500.0, "fading counts: {trees}");
        assert!(acc.top(1, 1) < 0.1, "healed: {}", acc.top(1, 1));
        let record = store.cached_acceptance(target, "lookup").unwrap();
        assert_eq!(record.generations, 20);
        // Other sources and targets are other files.
        assert!(store.cached_acceptance(target, "self").is_none());
        assert!(
            store
                .cached_acceptance(Path::new("/m/u.gguf"), "lookup")
                .is_none()
        );
        // Nothing counted: nothing written.
        store
            .observe_acceptance(target, "self", &Acceptance::default())
            .unwrap();
        assert!(!store.acceptance_path(target, "self").exists());
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn keys_name_sources_safely() {
        assert_eq!(
            source_key("/home/x/slim/q-k32768-q5_0.gguf"),
            "q-k32768-q5_0"
        );
        assert_eq!(source_key("elastic:0.5"), "elastic:0.5");
        assert_eq!(source_key("a b/c"), "a_b_c");
        let store = ProfileStore::new("/p".into());
        let path = store.acceptance_path(Path::new("/m/t.gguf"), "elastic:0.5");
        assert_eq!(path, Path::new("/p/acceptance-t-elastic_0.5.json"));
    }
}

//! What `auto` chose last time under the same budget, so that it does
//! not flip between sources whose estimates differ by less than the
//! estimates can tell apart: a source chosen before keeps its place while
//! its estimate stays within [`STICKY_MARGIN`] of the best.

use std::path::{Path, PathBuf};

use crate::ProfileStore;
use crate::auto::Estimate;
use crate::profiles::{now_utc, stem};

/// How far below the best estimate the previous choice may fall and still
/// be kept.
pub const STICKY_MARGIN: f64 = 0.05;

/// The source `auto` last opened with for one target and budget.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChoiceRecord {
    pub target: String,
    /// The key the choice was made under ([`choice_key`]).
    pub key: String,
    /// The chosen source's label (`none`, `lookup`, `ppd`, a draft's, …).
    pub label: String,
    pub tok_s: f64,
    pub chosen: String,
}

/// The key of a choice: the budget (MiB, or `none`), the sequences a
/// pass carries, and under a budget the storage's read limit
/// ([`crate::storage`]: `read_limit`, bytes per second), which decides
/// what streaming costs.
pub fn choice_key(budget: Option<u64>, sequences: usize, read_limit: Option<u64>) -> String {
    let regime = crate::storage::regime_tag(budget.and(read_limit));
    let budget = budget.map_or("none".to_string(), |b| format!("{}MiB", b >> 20));
    format!("{budget}-s{sequences}{regime}")
}

impl ProfileStore {
    fn choice_path(&self, target: &Path, key: &str) -> PathBuf {
        self.dir()
            .join(format!("choice-{}-{key}.json", stem(target)))
    }

    /// The choice `auto` made last for `target` under `key`.
    pub fn previous_choice(&self, target: &Path, key: &str) -> Option<ChoiceRecord> {
        let text = std::fs::read_to_string(self.choice_path(target, key)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Remembers `best` as the choice for `target` under `key` (a cache
    /// that cannot be written costs nothing but the memory of it).
    pub fn remember_choice(&self, target: &Path, key: &str, best: &Estimate) {
        let record = ChoiceRecord {
            target: stem(target),
            key: key.to_string(),
            label: best.candidate.label.clone(),
            tok_s: best.tok_s,
            chosen: now_utc(),
        };
        let _ = self.write(&self.choice_path(target, key), &record);
    }
}

/// Moves the estimate labelled `previous` to the front of `estimates`
/// (best first) when it still fits and is within [`STICKY_MARGIN`] of the
/// best; whether it did.
pub fn keep_previous(estimates: &mut [Estimate], previous: Option<&str>) -> bool {
    let (Some(label), Some(best)) = (previous, estimates.first().map(|e| e.tok_s)) else {
        return false;
    };
    let Some(at) = estimates.iter().position(|e| e.candidate.label == label) else {
        return false;
    };
    let e = &estimates[at];
    if at == 0 || e.read_per_pass.is_none() || e.tok_s < best * (1.0 - STICKY_MARGIN) {
        return false;
    }
    estimates[..=at].rotate_right(1);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::Candidate;

    fn estimate(label: &str, tok_s: f64) -> Estimate {
        Estimate {
            candidate: Candidate {
                draft: None,
                label: label.into(),
                memory: 0,
                step_secs: 0.0,
                accuracy: crate::sources::lookup_prior(),
                measured: 0.0,
                ppd: None,
            },
            read_per_pass: Some(1),
            depth: 0,
            tokens_per_pass: 1.0,
            tok_s,
            model_tok_s: tok_s,
            measured: None,
        }
    }

    #[test]
    fn a_previous_choice_stays_while_it_is_within_the_margin() {
        let labels = |e: &[Estimate]| {
            e.iter()
                .map(|e| e.candidate.label.clone())
                .collect::<Vec<_>>()
        };
        let mut e = vec![
            estimate("slim", 5.74),
            estimate("ppd", 5.70),
            estimate("none", 3.4),
        ];
        assert!(keep_previous(&mut e, Some("ppd")));
        assert_eq!(labels(&e), ["ppd", "slim", "none"]);
        // Far below the best, or gone, or first already: unchanged.
        let mut e = vec![estimate("slim", 5.74), estimate("none", 3.4)];
        assert!(!keep_previous(&mut e, Some("none")));
        assert!(!keep_previous(&mut e, Some("self")));
        assert!(!keep_previous(&mut e, Some("slim")));
        assert!(!keep_previous(&mut e, None));
        assert_eq!(labels(&e), ["slim", "none"]);
    }

    #[test]
    fn choices_are_kept_per_target_and_key() {
        let dir = std::env::temp_dir().join(format!("arbor-choice-{}", std::process::id()));
        let store = ProfileStore::new(dir.clone());
        let t = Path::new("/m/t.gguf");
        let key = choice_key(Some(800 << 20), 1, None);
        assert_eq!(key, "800MiB-s1");
        // A read limit is another regime; without a budget nothing streams.
        let capped = choice_key(Some(800 << 20), 1, Some(500_000_000));
        assert_eq!(capped, "800MiB-s1-r500MBps");
        assert_eq!(choice_key(None, 1, Some(500_000_000)), "none-s1");
        store.remember_choice(t, &capped, &estimate("slim", 3.1));
        assert!(store.previous_choice(t, &key).is_none());
        store.remember_choice(t, &key, &estimate("ppd", 5.7));
        assert_eq!(store.previous_choice(t, &key).unwrap().label, "ppd");
        assert!(
            store
                .previous_choice(t, &choice_key(None, 1, None))
                .is_none()
        );
        assert_eq!(store.previous_choice(t, &capped).unwrap().label, "slim");
        std::fs::remove_dir_all(dir).ok();
    }
}

//! Per-request latency objectives — the service half of ELMS — in the
//! parts that touch no tensors.
//!
//! A request's [`Slo`] asks for a time to first token and a time per
//! output token as fractions of what the full model takes on this device
//! for a prompt of its length. A request is served by a *pair*: an elastic
//! model level (a prefix of every layer's importance-ordered units) and a
//! prompt level (the share of its scoreable prompt tokens kept, the
//! least informative dropped). A [`DeviceProfile`], measured once,
//! predicts any pair's latency; a [`QualityTable`], measured once
//! offline, says how close each pair's answers stay to the full model's;
//! [`decide()`] picks the pair that meets the objective with the highest
//! quality, or the fastest one when none does. [`prompt`] chooses the
//! tokens a prompt level keeps from per-token scores, [`Bigram`] scores
//! tokens by their self-information under a count-based bigram model, and
//! [`trace`] draws the request traces of ELMS's evaluation.

pub mod decide;
pub mod profile;
pub mod prompt;
pub mod quality;
pub mod scorer;
pub mod trace;

use std::fmt;
use std::str::FromStr;

pub use decide::{Choice, OnMiss, Pair, decide};
pub use profile::{DeviceProfile, Latency, LevelLatency, median};
pub use prompt::{PROMPT_LEVELS, keep, kept_len, protected_mask};
pub use quality::QualityTable;
pub use scorer::{Bigram, Scorer};
pub use trace::{App, Request, TRACE_APPS, draw_trace};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SloError {
    #[error(
        "bad SLO `{text}`: {why} (write e.g. ttft=0.5,tpot=0.8: fractions in (0, 1] of the full model's latency)"
    )]
    Parse { text: String, why: String },
    #[error("bad device profile: {0}")]
    Profile(String),
    #[error("bad quality table: {0}")]
    Quality(String),
    #[error("bad prompt selection: {0}")]
    Prompt(String),
    #[error("bad scorer file: {0}")]
    Scorer(String),
    #[error("bad trace request: {0}")]
    Trace(String),
    #[error(
        "no (model level, prompt level) pair meets {slo} for this request: the fastest, \
         {fastest}, is predicted at ttft {ttft:.2} / tpot {tpot:.2} of the full model's"
    )]
    Unmet {
        slo: Slo,
        fastest: Pair,
        ttft: f64,
        tpot: f64,
    },
}

pub type Result<T, E = SloError> = std::result::Result<T, E>;

/// A latency objective ⟨ζ_TTFT, ζ_TPOT⟩: the time to first token and the
/// time per output token allowed, each as a fraction of the full model's on
/// this device for the request's prompt length (1 is the full model).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Slo {
    pub ttft: f64,
    pub tpot: f64,
}

impl Slo {
    /// The full model's own latency: always met by the full pair.
    pub const FULL: Slo = Slo {
        ttft: 1.0,
        tpot: 1.0,
    };

    /// An objective with both fractions in (0, 1].
    pub fn new(ttft: f64, tpot: f64) -> Result<Self> {
        let slo = Slo { ttft, tpot };
        for (name, v) in [("ttft", ttft), ("tpot", tpot)] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(SloError::Parse {
                    text: slo.to_string(),
                    why: format!("{name} {v} is outside (0, 1]"),
                });
            }
        }
        Ok(slo)
    }
}

impl fmt::Display for Slo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ttft={} tpot={}", self.ttft, self.tpot)
    }
}

impl FromStr for Slo {
    type Err = SloError;

    /// `ttft=0.5,tpot=0.8`; a part left out is 1 (the full model's).
    fn from_str(text: &str) -> Result<Self> {
        let bad = |why: String| SloError::Parse {
            text: text.to_string(),
            why,
        };
        let (mut ttft, mut tpot) = (None, None);
        for part in text.split([',', ' ']).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("`{part}` is not key=value")))?;
            let value: f64 = value
                .trim()
                .parse()
                .map_err(|_| bad(format!("`{value}` is not a number")))?;
            let slot = match key.trim() {
                "ttft" => &mut ttft,
                "tpot" => &mut tpot,
                other => return Err(bad(format!("unknown key `{other}` (ttft, tpot)"))),
            };
            if slot.replace(value).is_some() {
                return Err(bad(format!("`{key}` given twice")));
            }
        }
        if ttft.is_none() && tpot.is_none() {
            return Err(bad("neither ttft nor tpot given".into()));
        }
        Slo::new(ttft.unwrap_or(1.0), tpot.unwrap_or(1.0)).map_err(|e| match e {
            SloError::Parse { why, .. } => bad(why),
            e => e,
        })
    }
}

/// Checks `xs` are levels: ascending, in (0, 1], ending at 1.
pub(crate) fn check_ascending(what: &str, xs: &[f64]) -> Result<(), String> {
    if xs.is_empty() {
        return Err(format!("no {what}"));
    }
    if let Some(w) = xs
        .windows(2)
        .find(|w| w[0].partial_cmp(&w[1]) != Some(std::cmp::Ordering::Less))
    {
        return Err(format!("{what} not ascending ({} then {})", w[0], w[1]));
    }
    if let Some(&x) = xs.iter().find(|&&x| !(x > 0.0 && x <= 1.0)) {
        return Err(format!("{what} {x} outside (0, 1]"));
    }
    if xs.last() != Some(&1.0) {
        return Err(format!("{what} must end at 1 (the full one)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slos_parse_and_default_to_the_full_model() {
        assert_eq!(
            "ttft=0.5,tpot=0.8".parse::<Slo>().unwrap(),
            Slo::new(0.5, 0.8).unwrap()
        );
        assert_eq!(
            "tpot=0.7".parse::<Slo>().unwrap(),
            Slo::new(1.0, 0.7).unwrap()
        );
        assert_eq!(" ttft=0.2, tpot=1".parse::<Slo>().unwrap().ttft, 0.2);
        assert_eq!("ttft=0.2 tpot=0.9".parse::<Slo>().unwrap().tpot, 0.9);
        assert_eq!(Slo::new(0.5, 0.8).unwrap().to_string(), "ttft=0.5 tpot=0.8");
    }

    #[test]
    fn bad_slos_are_refused_with_the_reason() {
        for (text, why) in [
            ("ttft=0", "outside (0, 1]"),
            ("ttft=1.5", "outside (0, 1]"),
            ("tpot=-1", "outside (0, 1]"),
            ("ttft=NaN", "outside (0, 1]"),
            ("ttft=fast", "not a number"),
            ("latency=0.5", "unknown key"),
            ("ttft=0.5,ttft=0.6", "given twice"),
            ("0.5", "not key=value"),
            ("", "neither"),
        ] {
            let e = text.parse::<Slo>().unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn ascending_levels_are_checked() {
        assert!(check_ascending("levels", &[0.2, 0.5, 1.0]).is_ok());
        assert!(check_ascending("levels", &[0.5, 0.2, 1.0]).is_err());
        assert!(check_ascending("levels", &[0.5, 0.5, 1.0]).is_err());
        assert!(check_ascending("levels", &[0.2, 0.5]).is_err());
        assert!(check_ascending("levels", &[0.0, 1.0]).is_err());
        assert!(check_ascending("levels", &[]).is_err());
    }
}

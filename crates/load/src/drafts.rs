//! Where a run's draft comes from. `draft` in the run config names a model
//! (a GGUF path or a registered short name; a slim GGUF is widened to the
//! target's vocabulary when it loads), or one of the sources that hold no
//! weights of their own:
//!
//! - `lookup`: prompt lookup, n-grams copied from the prompt and the text
//!   so far ([`arbor_drafts::PromptLookup`]);
//! - `self`: the target's resident layers, skipping those streamed from
//!   disk ([`arbor_model::Decoder::self_draft`]); it needs a memory budget
//!   that streams some layers (otherwise it would be the target itself);
//! - `elastic:LEVEL`: a lower level of an elastic target (`arbor elastic
//!   build`), sharing its weights ([`arbor_model::Decoder::elastic_draft`]).

use std::path::PathBuf;

use arbor_speculative::LatencyProfile;

use crate::Result;
use crate::events::{OpenEvent, resolve_or_fetch};

/// A run's draft source.
#[derive(Debug, Clone, PartialEq)]
pub enum DraftSource {
    /// A draft model file (full or slim).
    Model(PathBuf),
    /// Prompt lookup.
    Lookup,
    /// The target's resident layers.
    SelfLayers,
    /// A level of an elastic target.
    Elastic(f64),
}

impl DraftSource {
    /// The name of prompt lookup in `draft`.
    pub const LOOKUP: &str = "lookup";
    /// The name of the self draft in `draft`.
    pub const SELF: &str = "self";
    /// The prefix of an elastic draft in `draft` (`elastic:0.5`).
    pub const ELASTIC: &str = "elastic:";

    /// The source `name` stands for; a model name is resolved (and fetched
    /// when it is a registered model that is missing).
    pub fn resolve(name: &str, progress: &mut dyn FnMut(OpenEvent<'_>)) -> Result<Self> {
        if let Some(level) = name.strip_prefix(Self::ELASTIC) {
            return match level.parse::<f64>() {
                Ok(l) if l > 0.0 && l <= 1.0 => Ok(Self::Elastic(l)),
                _ => Err(crate::EngineError::Invalid(format!(
                    "draft `{name}`: an elastic draft's level is a fraction in (0, 1], e.g. \
                     elastic:0.5"
                ))),
            };
        }
        Ok(match name {
            Self::LOOKUP | "prompt-lookup" => Self::Lookup,
            Self::SELF => Self::SelfLayers,
            model => Self::Model(resolve_or_fetch(model, progress)?),
        })
    }

    /// The name its guesses are counted under with a target
    /// ([`arbor_planner::source_key`] of `lookup`, `self`, `elastic:L` or
    /// the model's file).
    pub fn key(&self) -> String {
        arbor_planner::source_key(&match self {
            Self::Model(path) => path.display().to_string(),
            Self::Lookup => Self::LOOKUP.into(),
            Self::SelfLayers => Self::SELF.into(),
            Self::Elastic(level) => format!("{}{level}", Self::ELASTIC),
        })
    }

    /// The latency curve of a source without a file of its own: prompt
    /// lookup costs next to nothing; a self or elastic draft costs the
    /// target's curve scaled by `running`, the share of the target's
    /// layer weights it multiplies.
    pub fn derived_profile(&self, target: &LatencyProfile, running: f64) -> Option<LatencyProfile> {
        match self {
            Self::Model(_) => None,
            Self::Lookup => Some(LatencyProfile {
                points: vec![(1, 20e-6), (64, 400e-6)],
            }),
            Self::SelfLayers | Self::Elastic(_) => Some(LatencyProfile {
                points: target
                    .points
                    .iter()
                    .map(|&(n, s)| (n, s * running))
                    .collect(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_to_sources() {
        let none = &mut |_: OpenEvent<'_>| {};
        assert_eq!(
            DraftSource::resolve("lookup", none).unwrap(),
            DraftSource::Lookup
        );
        assert_eq!(
            DraftSource::resolve("prompt-lookup", none).unwrap(),
            DraftSource::Lookup
        );
        assert_eq!(
            DraftSource::resolve("self", none).unwrap(),
            DraftSource::SelfLayers
        );
        assert_eq!(
            DraftSource::resolve("elastic:0.5", none).unwrap(),
            DraftSource::Elastic(0.5)
        );
        for bad in ["elastic:0", "elastic:1.5", "elastic:half", "elastic:"] {
            let e = DraftSource::resolve(bad, none).unwrap_err().to_string();
            assert!(e.contains("(0, 1]"), "{bad}: {e}");
        }
        assert!(DraftSource::resolve("/no/such/model.gguf", none).is_err());
    }

    #[test]
    fn a_self_draft_costs_its_share_of_the_target() {
        let t = LatencyProfile {
            points: vec![(1, 0.030), (8, 0.100)],
        };
        let p = DraftSource::SelfLayers.derived_profile(&t, 0.5).unwrap();
        assert!((p.at(1) - 0.015).abs() < 1e-9);
        assert!(DraftSource::Lookup.derived_profile(&t, 0.5).unwrap().at(1) < 1e-3);
        assert!(
            DraftSource::Model("x".into())
                .derived_profile(&t, 0.5)
                .is_none()
        );
    }
}

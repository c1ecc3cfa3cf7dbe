//! Strategies as users name them: a [`Decoding`] (the rounds the loop
//! runs) plus a [`Streaming`] mode (how layers outside a memory budget are
//! read), with one naming rule for both directions.

use std::fmt;
use std::str::FromStr;

use crate::{MAX_DRAFT_TOKENS, PpdConfig, Result, SpecError, TreeConfig};

/// How tokens are produced (the rounds the decoding loop runs).
#[derive(Debug, Clone, PartialEq)]
pub enum Decoding {
    /// The target alone, one token per pass.
    Autoregressive,
    /// The draft proposes `gamma` tokens one after another; the target
    /// checks them in one pass.
    Chain { gamma: usize },
    /// An adaptive token tree sized by confidence and latency profiles.
    Tree(TreeConfig),
    /// A fixed `width` × `depth` tree.
    StaticTree { width: usize, depth: usize },
    /// Parallel prompt decoding: no draft; prompt tokens guess ahead.
    Ppd(PpdConfig),
}

/// How target layers that do not fit a memory budget are read (ignored
/// without a budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streaming {
    /// Each layer is read when the pass reaches it.
    OnDemand,
    /// The next layers are read while the current one computes.
    Pipelined,
}

impl Streaming {
    /// The name suffix marking this mode when it is not the default.
    fn suffix(self) -> &'static str {
        match self {
            Streaming::OnDemand => "-on-demand",
            Streaming::Pipelined => "-pipelined",
        }
    }
}

/// A strategy as users name it: the decoding plus the streaming mode.
#[derive(Debug, Clone, PartialEq)]
pub struct Strategy {
    pub decoding: Decoding,
    pub streaming: Streaming,
}

/// Chain length of `chain` by name.
const DEFAULT_GAMMA: usize = 5;

impl Decoding {
    /// Most rows of logits one draft pass returns: chains feed the draft
    /// one node at a time, greedy trees several branches' leaves at once,
    /// a static tree a level at once.
    pub fn max_draft_rows(&self) -> usize {
        match self {
            Decoding::Autoregressive | Decoding::Ppd(_) => 0,
            Decoding::Chain { .. } => 1,
            Decoding::Tree(_) => crate::rounds::GROWTH_BATCH,
            Decoding::StaticTree { width, depth } => {
                width.saturating_pow(*depth as u32).min(MAX_DRAFT_TOKENS)
            }
        }
    }

    /// Most rows of logits one target pass returns: the draft tokens one
    /// verification carries and the root (1 for one-token decoding).
    pub fn max_rows(&self) -> usize {
        let draft = match self {
            Decoding::Autoregressive => 0,
            Decoding::Chain { gamma } => *gamma,
            Decoding::Tree(c) => c.max_nodes,
            Decoding::StaticTree { width, depth } => width.saturating_mul(*depth),
            // The committed token, the candidates and one node's prompt
            // rows (a model that cannot keep its last pass returns all
            // rows, up to `max_rows`).
            Decoding::Ppd(c) => return crate::ppd_logit_rows(c.max_rows),
        };
        draft.min(MAX_DRAFT_TOKENS) + 1
    }

    /// The streaming mode this decoding runs with unless told otherwise:
    /// one-token passes gain nothing from reading ahead, verification
    /// passes do.
    pub fn default_streaming(&self) -> Streaming {
        match self {
            Decoding::Autoregressive => Streaming::OnDemand,
            _ => Streaming::Pipelined,
        }
    }

    /// The name of this decoding (a strategy's name without its streaming
    /// suffix).
    pub fn base_name(&self) -> &'static str {
        match self {
            Decoding::Autoregressive => "autoregressive",
            Decoding::Chain { .. } => "chain",
            Decoding::Tree(c) if c.draft_prompts.is_some() => "tree-ppd",
            Decoding::Tree(c) if c.provisional => "tree-provisional",
            Decoding::Tree(c) if !c.fallback => "tree-no-fallback",
            Decoding::Tree(_) => "tree",
            Decoding::StaticTree { .. } => "static-tree",
            Decoding::Ppd(_) => "ppd",
        }
    }

    /// A decoding by base name (or the alias `ar`), with default settings.
    fn from_base_name(name: &str) -> Option<Self> {
        Some(match name {
            "autoregressive" | "ar" => Decoding::Autoregressive,
            "chain" => Decoding::Chain {
                gamma: DEFAULT_GAMMA,
            },
            "tree" => Decoding::Tree(TreeConfig::default()),
            "tree-provisional" => Decoding::Tree(TreeConfig {
                provisional: true,
                ..TreeConfig::default()
            }),
            "tree-no-fallback" => Decoding::Tree(TreeConfig {
                fallback: false,
                ..TreeConfig::default()
            }),
            "tree-ppd" => Decoding::Tree(TreeConfig {
                draft_prompts: Some(crate::DraftPrompts::default()),
                ..TreeConfig::default()
            }),
            "static-tree" => Decoding::StaticTree { width: 2, depth: 4 },
            "ppd" => Decoding::Ppd(crate::PpdConfig::default()),
            _ => return None,
        })
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(SpecError::Invalid(m.to_string()));
        match self {
            Decoding::Chain { gamma } if *gamma == 0 || *gamma > MAX_DRAFT_TOKENS => {
                bad("chain length (gamma) must be 1..=63")
            }
            Decoding::StaticTree { width, depth }
                if *width == 0 || *depth == 0 || width.pow((*depth).min(8) as u32) > 4096 =>
            {
                bad("static tree width and depth must be >= 1 and the tree at most 4096 nodes")
            }
            Decoding::Tree(c) if c.max_nodes == 0 || c.max_nodes > MAX_DRAFT_TOKENS => {
                bad("tree max_nodes must be 1..=63")
            }
            Decoding::Ppd(c) if c.max_rows == 0 || c.max_rows > MAX_DRAFT_TOKENS + 1 => {
                bad("ppd rows per pass must be 1..=64")
            }
            Decoding::Tree(c) if !(c.alpha > 0.0 && c.alpha < 1.0) => {
                bad("alpha must be in (0, 1)")
            }
            Decoding::Tree(c)
                if !(c.grow.branch_threshold > 0.0 && c.grow.branch_threshold <= 1.0) =>
            {
                bad("branch threshold must be in (0, 1]")
            }
            _ => Ok(()),
        }
    }
}

impl Strategy {
    /// Every canonical name, in help order.
    pub const NAMES: &'static [&'static str] = &[
        "autoregressive",
        "autoregressive-pipelined",
        "chain",
        "tree",
        "tree-provisional",
        "tree-no-fallback",
        "tree-ppd",
        "static-tree",
        "ppd",
    ];

    /// The names for help and error messages: "a, b, … or z".
    pub fn help() -> String {
        let (last, rest) = Self::NAMES.split_last().expect("names");
        format!("{} or {last}", rest.join(", "))
    }

    /// `decoding` with its default streaming mode.
    pub fn new(decoding: Decoding) -> Self {
        let streaming = decoding.default_streaming();
        Self {
            decoding,
            streaming,
        }
    }

    pub fn needs_draft(&self) -> bool {
        !matches!(self.decoding, Decoding::Autoregressive | Decoding::Ppd(_))
    }

    /// Whether the strategy sizes its trees from latency profiles (every
    /// tree variant, and PPD's candidate trees).
    pub fn sized_by_profile(&self) -> bool {
        matches!(self.decoding, Decoding::Tree(_) | Decoding::Ppd(_))
    }

    /// The canonical name: the decoding's base name, followed by
    /// `-pipelined` or `-on-demand` when the streaming mode is not the
    /// decoding's default. Parses back to the same decoding kind and mode.
    pub fn name(&self) -> String {
        let base = self.decoding.base_name();
        if self.streaming == self.decoding.default_streaming() {
            base.to_string()
        } else {
            format!("{base}{}", self.streaming.suffix())
        }
    }
}

impl FromStr for Strategy {
    type Err = SpecError;

    /// A strategy by name with default settings: a base name (or `ar`),
    /// optionally followed by `-pipelined` or `-on-demand`.
    fn from_str(name: &str) -> Result<Self> {
        let suffixed = [Streaming::Pipelined, Streaming::OnDemand]
            .into_iter()
            .find_map(|s| Some((name.strip_suffix(s.suffix())?, Some(s))));
        let (base, streaming) = suffixed.unwrap_or((name, None));
        let parsed = Decoding::from_base_name(base).map(|decoding| Strategy {
            streaming: streaming.unwrap_or_else(|| decoding.default_streaming()),
            decoding,
        });
        parsed.ok_or_else(|| {
            SpecError::Invalid(format!(
                "unknown strategy `{name}` (choose {})",
                Self::help()
            ))
        })
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl From<Decoding> for Strategy {
    fn from(decoding: Decoding) -> Self {
        Self::new(decoding)
    }
}

impl Default for Strategy {
    fn default() -> Self {
        Self::new(Decoding::Autoregressive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_round_trips() {
        for &name in Strategy::NAMES {
            let s: Strategy = name.parse().unwrap();
            assert_eq!(s.name(), name);
            assert_eq!(s.to_string(), name);
        }
    }

    #[test]
    fn names_carry_the_streaming_mode_off_its_default() {
        let s: Strategy = "chain-on-demand".parse().unwrap();
        assert_eq!(s.decoding, Decoding::Chain { gamma: 5 });
        assert_eq!(s.streaming, Streaming::OnDemand);
        assert_eq!(s.name(), "chain-on-demand");
        let s: Strategy = "autoregressive-pipelined".parse().unwrap();
        assert_eq!(
            (s.decoding.clone(), s.streaming),
            (Decoding::Autoregressive, Streaming::Pipelined)
        );
        // The default mode spelled out parses and prints without a suffix.
        let s: Strategy = "tree-pipelined".parse().unwrap();
        assert_eq!(s, Strategy::new(Decoding::Tree(TreeConfig::default())));
        assert_eq!(s.name(), "tree");
        let s = Strategy {
            decoding: Decoding::Tree(TreeConfig {
                fallback: false,
                ..TreeConfig::default()
            }),
            streaming: Streaming::OnDemand,
        };
        assert_eq!(s.name(), "tree-no-fallback-on-demand");
        assert_eq!(s.name().parse::<Strategy>().unwrap(), s);
    }

    #[test]
    fn a_tree_s_draft_rows_cover_branches_grown_together() {
        // The memory plan sizes the draft's logit scratch by these rows.
        let tree = Decoding::Tree(TreeConfig::default());
        let chain = Decoding::Chain { gamma: 5 };
        assert_eq!(tree.max_draft_rows(), crate::rounds::GROWTH_BATCH);
        assert_eq!(chain.max_draft_rows(), 1);
        assert!(tree.max_draft_rows() > chain.max_draft_rows());
    }

    #[test]
    fn today_s_names_parse() {
        let ar: Strategy = "ar".parse().unwrap();
        assert_eq!(ar, Strategy::default());
        assert_eq!(ar.name(), "autoregressive");
        for name in [
            "autoregressive",
            "autoregressive-pipelined",
            "chain",
            "tree",
            "tree-provisional",
            "tree-no-fallback",
            "static-tree",
            "ppd",
            "ppd-on-demand",
        ] {
            assert_eq!(name.parse::<Strategy>().unwrap().name(), name);
        }
        let ppd: Strategy = "ppd".parse().unwrap();
        assert!(!ppd.needs_draft() && ppd.sized_by_profile());
        let tree: Strategy = "tree-provisional".parse().unwrap();
        assert!(tree.needs_draft() && tree.sized_by_profile());
        assert!(matches!(&tree.decoding, Decoding::Tree(c) if c.provisional && c.fallback));
        let s: Strategy = "static-tree".parse().unwrap();
        assert_eq!(s.decoding, Decoding::StaticTree { width: 2, depth: 4 });
        assert!(s.needs_draft() && !s.sized_by_profile());
        assert!(!Strategy::default().needs_draft());
        assert_eq!(
            Strategy::from(Decoding::Chain { gamma: 3 }).streaming,
            Streaming::Pipelined
        );
    }

    #[test]
    fn unknown_names_list_the_names() {
        let help = Strategy::help();
        assert_eq!(
            help,
            "autoregressive, autoregressive-pipelined, chain, tree, tree-provisional, \
             tree-no-fallback, tree-ppd, static-tree or ppd"
        );
        for bad in [
            "beam",
            "",
            "-pipelined",
            "chain-pipelined-pipelined",
            "Tree",
        ] {
            let err = bad.parse::<Strategy>().unwrap_err().to_string();
            assert!(err.contains(&help), "{err}");
            assert!(err.contains(&format!("`{bad}`")), "{err}");
        }
    }
}

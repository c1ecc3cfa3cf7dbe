//! Flags shared by the commands that open runs with a speculative
//! strategy, and what they become in an [`arbor_engine::RunConfig`].

use arbor_engine::Tuning;

/// Flags that shape the speculative strategies (`generate`, `bench spec`).
/// Unset flags keep the device config's value, else the strategy's default.
#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct TuningArgs {
    /// Draft tokens per verification for `chain` [default: 5].
    #[cfg_attr(feature = "clap", arg(long))]
    pub gamma: Option<usize>,
    /// Initial verification threshold α of `tree` [default: 0.01].
    #[cfg_attr(feature = "clap", arg(long))]
    pub alpha: Option<f32>,
    /// Most draft tokens one `tree` verification may carry [default: 32];
    /// for `ppd`, the most rows of a pass, candidates and prompt tokens
    /// [default: 48].
    #[cfg_attr(feature = "clap", arg(long))]
    pub max_tree: Option<usize>,
    /// Draft probability above which a candidate opens a branch (`tree`)
    /// [default: 0.3].
    #[cfg_attr(feature = "clap", arg(long))]
    pub branch_threshold: Option<f32>,
    /// `exact` (lossless) or `typical` (typical acceptance) [default: exact].
    #[cfg_attr(feature = "clap", arg(long))]
    pub verify: Option<String>,
    /// Do not size trees with the measured latency profiles.
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_profile: bool,
    /// Under a memory budget, cost passes as reads added to compute (the
    /// ablation of IO-aware tree sizing).
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_io_aware: bool,
    /// Under a memory budget too small for a float output head, read the
    /// head every pass rather than holding its Q8_0 copy for greedy
    /// passes' argmax (the ablation of the certified head).
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_approx_head: bool,
}

impl TuningArgs {
    /// These settings as the engine's [`Tuning`].
    pub fn tuning(&self) -> Tuning {
        Tuning {
            gamma: self.gamma,
            alpha: self.alpha,
            max_tree: self.max_tree,
            branch_threshold: self.branch_threshold,
            verify: self.verify.clone(),
            no_profile: self.no_profile.then_some(true),
            io_aware: self.no_io_aware.then_some(false),
            approx_head: self.no_approx_head.then_some(false),
        }
    }
}

//! Flags shared by the commands that open runs, and what they become in a
//! [`RunConfig`].

use arbor_engine::Tuning;
use clap::Args;

/// Flags that shape the speculative strategies (`generate`, `bench spec`).
/// Unset flags keep the device config's value, else the strategy's default.
#[derive(Args, Debug, Clone, Default)]
pub struct TuningArgs {
    /// Draft tokens per verification for `chain` [default: 5].
    #[arg(long)]
    pub gamma: Option<usize>,
    /// Initial verification threshold α of `tree` [default: 0.01].
    #[arg(long)]
    pub alpha: Option<f32>,
    /// Most draft tokens one `tree` verification may carry [default: 32];
    /// for `ppd`, the most rows of a pass, candidates and prompt tokens
    /// [default: 48].
    #[arg(long)]
    pub max_tree: Option<usize>,
    /// Draft probability above which a candidate opens a branch (`tree`)
    /// [default: 0.3].
    #[arg(long)]
    pub branch_threshold: Option<f32>,
    /// `exact` (lossless) or `typical` (typical acceptance) [default: exact].
    #[arg(long)]
    pub verify: Option<String>,
    /// Do not size trees with the measured latency profiles.
    #[arg(long)]
    pub no_profile: bool,
    /// Under a memory budget, cost passes as reads added to compute (the
    /// ablation of IO-aware tree sizing).
    #[arg(long)]
    pub no_io_aware: bool,
}

impl TuningArgs {
    pub fn tuning(&self) -> Tuning {
        Tuning {
            gamma: self.gamma,
            alpha: self.alpha,
            max_tree: self.max_tree,
            branch_threshold: self.branch_threshold,
            verify: self.verify.clone(),
            no_profile: self.no_profile.then_some(true),
            io_aware: self.no_io_aware.then_some(false),
        }
    }
}

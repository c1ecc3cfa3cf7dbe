//! The run configuration: one serde type that a device config in
//! `configs/`, a command line or a server request produces,
//! and that the engine's `Engine::open` turns into a ready run.

use arbor_sampling::SamplingParams;
use arbor_speculative::{Decoding, Strategy, Typical, Verification};

use crate::{EngineError, Result};

/// The model a run uses when none is named.
pub const DEFAULT_TARGET: &str = "qwen2.5-coder-1.5b";
/// The draft that pairs with the default target.
pub const DEFAULT_DRAFT: &str = "qwen2.5-coder-0.5b";
/// New tokens a generation stops at when neither it nor its run sets a
/// limit.
pub const DEFAULT_MAX_TOKENS: usize = 128;

/// Everything that opens a run. Every field has a default, so a device
/// config may set only `backend` and `threads`; later sources (flags, a
/// request) override earlier ones field by field with [`RunConfig::merge`].
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Target model: a GGUF path or a registered short name (fetched when
    /// missing). `None` is [`DEFAULT_TARGET`].
    pub target: Option<String>,
    /// Draft model for the speculative strategies (path or short name).
    pub draft: Option<String>,
    /// `candle`, `flex`, `ndarray` or `wgpu`; `None` is the first compiled in.
    pub backend: Option<String>,
    /// Worker threads of the CPU backends (process-wide: applied once, at
    /// start, by [`RunConfig::apply_threads`]).
    pub threads: Option<usize>,
    /// How KV caches are stored: `f16` (candle's default: exactly what its
    /// attention reads), `q8_0` (8-bit blocks, a quarter of f32's bytes,
    /// lossy) or `f32`; `None` is the backend's own choice.
    pub kv: Option<String>,
    /// Bytes for the whole process (`1.3GiB`, `900MiB`, a plain number).
    pub memory_budget: Option<String>,
    /// Bytes of GPU memory for the target (`--backend wgpu`): layers that
    /// do not fit stay in host memory (the page cache) and are copied to
    /// the GPU on every pass.
    pub gpu_memory_budget: Option<String>,
    /// A strategy name ([`Strategy::NAMES`]); `None` picks one from the
    /// draft and the budget.
    pub strategy: Option<String>,
    pub tuning: Tuning,
    pub sampling: Sampling,
    /// Most new tokens per generation.
    pub max_tokens: Option<usize>,
    /// The level an elastic target runs at (a fraction in `(0, 1]`; the
    /// nearest built level at or below it; see `arbor elastic build`).
    /// `None` is the whole model.
    pub level: Option<f64>,
    /// LoRA adapters recovering a level of an elastic target (`arbor elastic
    /// lora`); the target runs at their level unless `level` says otherwise,
    /// which must then be the same.
    pub lora: Option<String>,
    /// Longest prompt plus new tokens one generation may hold. Under a
    /// memory budget the KV caches are planned for it (a longer request is
    /// refused); `None` is `max_tokens` + [`PROMPT_ALLOWANCE`].
    pub context: Option<usize>,
    /// Sequences generated at once (a server's slots, their target passes
    /// batched): `auto` plans passes that carry every sequence's rows.
    /// `None` is 1.
    pub slots: Option<usize>,
}

fn parse_budget(b: &str) -> Result<u64> {
    arbor_paging::parse_bytes(b).map_err(|e| EngineError::Invalid(e.to_string()))
}

/// Prompt tokens a run under a memory budget plans for when no `context`
/// is set.
pub const PROMPT_ALLOWANCE: usize = 512;

/// Settings that shape the speculative strategies; `None` keeps each
/// strategy's default.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Tuning {
    /// Draft tokens per verification (`chain`).
    pub gamma: Option<usize>,
    /// Initial verification threshold α (`tree`).
    pub alpha: Option<f32>,
    /// Most draft tokens one tree verification carries (`ppd`: most rows
    /// of a pass).
    pub max_tree: Option<usize>,
    /// Draft probability above which a candidate opens a branch.
    pub branch_threshold: Option<f32>,
    /// `exact` (lossless) or `typical`.
    pub verify: Option<String>,
    /// Size trees without the measured latency profiles.
    pub no_profile: Option<bool>,
    /// Under a memory budget, cost a pipelined pass as its streamed reads
    /// overlapped with its compute (and let trees grow to what that cost
    /// pays for) rather than reads added to compute [default: true].
    pub io_aware: Option<bool>,
    /// Under a memory budget too small for the output head, hold a Q8_0
    /// copy of a float head for greedy passes' argmax instead of reading
    /// the head every pass [default: true].
    pub approx_head: Option<bool>,
}

/// Sampling settings; `None` fields are greedy defaults.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
}

/// `over.f.or(base.f)` for every field: the later source (`over`) wins
/// where it sets a field.
macro_rules! merge_fields {
    ($over:expr, $base:expr; $($f:ident),*) => {
        Self { $($f: $over.$f.or($base.$f)),* }
    };
}

impl RunConfig {
    /// Reads a device config (TOML with any of this type's fields).
    pub fn from_toml(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| EngineError::Invalid(format!("device config: {e}")))
    }

    /// `over`'s fields where set, else `self`'s.
    pub fn merge(self, over: RunConfig) -> Self {
        Self {
            target: over.target.or(self.target),
            draft: over.draft.or(self.draft),
            backend: over.backend.or(self.backend),
            threads: over.threads.or(self.threads),
            kv: over.kv.or(self.kv),
            memory_budget: over.memory_budget.or(self.memory_budget),
            gpu_memory_budget: over.gpu_memory_budget.or(self.gpu_memory_budget),
            strategy: over.strategy.or(self.strategy),
            tuning: self.tuning.merge(over.tuning),
            sampling: self.sampling.merge(over.sampling),
            max_tokens: over.max_tokens.or(self.max_tokens),
            level: over.level.or(self.level),
            lora: over.lora.or(self.lora),
            context: over.context.or(self.context),
            slots: over.slots.or(self.slots),
        }
    }

    /// The memory budget in bytes, if one is set: the process's, or the
    /// GPU's (see [`RunConfig::gpu_memory_budget`]; the process's is then
    /// [`RunConfig::host_budget_bytes`]).
    pub fn budget_bytes(&self) -> Result<Option<u64>> {
        match (&self.memory_budget, &self.gpu_memory_budget) {
            (host, Some(gpu)) => match self.backend.as_deref() {
                Some("wgpu") => {
                    host.as_deref().map(parse_budget).transpose()?;
                    Ok(Some(parse_budget(gpu)?))
                }
                _ => Err(EngineError::Invalid(
                    "--gpu-memory-budget needs --backend wgpu".into(),
                )),
            },
            (host, None) => host.as_deref().map(parse_budget).transpose(),
        }
    }

    /// Host memory's budget in bytes when the memory budget is a GPU's
    /// (both `--gpu-memory-budget` and `--memory-budget` given): streamed
    /// layers that fit it are held in host memory, the rest read from disk
    /// on every pass.
    pub fn host_budget_bytes(&self) -> Result<Option<u64>> {
        match (&self.memory_budget, &self.gpu_memory_budget) {
            (Some(host), Some(_)) => parse_budget(host).map(Some),
            _ => Ok(None),
        }
    }

    /// The key what `auto` chooses and learns under this config's budget
    /// is kept by ([`arbor_planner::choice::choice_key`]); a GPU's budget is
    /// told apart from a host's, and the host budget beside it named.
    pub fn budget_key(&self, target: &std::path::Path) -> Result<String> {
        let budget = self.budget_bytes()?;
        let slots = self.slots.unwrap_or(1);
        let key = arbor_planner::choice::choice_key(
            budget,
            slots,
            arbor_planner::storage::read_limit(target),
        );
        Ok(match (&self.gpu_memory_budget, self.host_budget_bytes()?) {
            (None, _) => key,
            (Some(_), None) => format!("gpu{key}"),
            (Some(_), Some(host)) => format!("gpu{key}-host{}MiB", host >> 20),
        })
    }

    /// The KV cache format asked for, if any (a typed error names the
    /// formats when it is none of them).
    pub fn kv_format(&self) -> Result<Option<arbor_tensor::KvFormat>> {
        self.kv
            .as_deref()
            .map(|k| {
                k.parse()
                    .map_err(|_| EngineError::Invalid(format!("--kv `{k}`: use f16, q8_0 or f32")))
            })
            .transpose()
    }

    /// Tokens (prompt + new) a run plans its KV caches for: `context`, or
    /// `max_tokens` (its default when unset) plus [`PROMPT_ALLOWANCE`].
    pub fn planned_context(&self) -> usize {
        self.context.unwrap_or_else(|| {
            let new = self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
            new + PROMPT_ALLOWANCE
        })
    }

    /// What a run of `strategy` under `bytes` plans its memory with: the
    /// strategy's streaming mode, this config's context, and the logit
    /// rows the strategy's target and draft passes return (for every
    /// slot: a batched pass returns each slot's rows, and each slot's
    /// draft fork its own).
    pub fn memory_options(&self, bytes: u64, strategy: &Strategy) -> arbor_pipeline::MemoryOptions {
        let pipelined = strategy.streaming == arbor_speculative::Streaming::Pipelined;
        let gpu = self.gpu_memory_budget.is_some();
        let slots = self.slots.unwrap_or(1).max(1);
        arbor_pipeline::MemoryOptions {
            context: self.planned_context(),
            logit_rows: strategy.decoding.max_rows() * slots,
            draft_logit_rows: strategy.decoding.max_draft_rows() * slots,
            // A GPU holds nothing of ours before the target (a draft model's
            // weights are added by the caller); streamed layers stay in
            // host memory.
            base: gpu.then_some(0),
            host_cache: gpu,
            host: (gpu
                .then(|| self.host_budget_bytes().ok().flatten())
                .flatten())
            .map(|budget| arbor_pipeline::HostBudget { budget, base: None }),
            sequences: slots,
            // Only one greedy sequence verified exactly reads its logits for
            // their argmax alone.
            approx_head: self.tuning.approx_head()
                && slots == 1
                && self.sampling.params().is_greedy()
                && matches!(self.tuning.verification(), Ok(Verification::Exact)),
            ..arbor_pipeline::MemoryOptions::new(bytes, pipelined)
        }
    }

    /// This config for a command that runs the target by itself (bench
    /// decode, perplexity, profile): no draft, no memory budget, plain
    /// autoregressive decoding, whatever the device config says.
    pub fn target_only(self) -> Self {
        Self {
            draft: None,
            memory_budget: None,
            gpu_memory_budget: None,
            strategy: Some("autoregressive".into()),
            ..self
        }
    }

    /// Sizes the process-wide worker pool of the CPU backends. Call once,
    /// before any model loads (candle reads `RAYON_NUM_THREADS` itself).
    pub fn apply_threads(&self) -> Result<()> {
        let Some(n) = self.threads else {
            return Ok(());
        };
        if n == 0 || n > 1024 {
            return Err(EngineError::Invalid(format!(
                "--threads (threads in a device config) must be between 1 and 1024, got {n}"
            )));
        }
        // SAFETY: documented to run before other threads read the
        // environment (at process start).
        unsafe { std::env::set_var("RAYON_NUM_THREADS", n.to_string()) };
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .map_err(|e| EngineError::Invalid(format!("configuring the thread pool: {e}")))
    }
}

impl Tuning {
    fn merge(self, over: Tuning) -> Self {
        merge_fields!(over, self; gamma, alpha, max_tree, branch_threshold, verify, no_profile, io_aware, approx_head)
    }

    /// Whether trees are sized with the measured latency profiles.
    pub fn profiled(&self) -> bool {
        !self.no_profile.unwrap_or(false)
    }

    /// Whether a streamed float head may be replaced by its Q8_0 copy.
    pub fn approx_head(&self) -> bool {
        self.approx_head.unwrap_or(true)
    }

    /// Whether streamed passes are costed with reads overlapping compute.
    pub fn io_aware(&self) -> bool {
        self.io_aware.unwrap_or(true)
    }

    pub fn verification(&self) -> Result<Verification> {
        Ok(match self.verify.as_deref().unwrap_or("exact") {
            "exact" => Verification::Exact,
            "typical" => Verification::Typical(Typical::default()),
            other => {
                return Err(EngineError::Invalid(format!(
                    "unknown verification `{other}` (choose exact or typical)"
                )));
            }
        })
    }

    /// `strategy` with these settings applied to its decoding.
    pub fn apply(&self, mut strategy: Strategy) -> Strategy {
        match &mut strategy.decoding {
            Decoding::Chain { gamma } => *gamma = self.gamma.unwrap_or(*gamma),
            Decoding::Tree(c) => {
                c.alpha = self.alpha.unwrap_or(c.alpha);
                c.max_nodes = self.max_tree.unwrap_or(c.max_nodes);
                c.grow.branch_threshold = self.branch_threshold.unwrap_or(c.grow.branch_threshold);
            }
            Decoding::Ppd(c) => c.max_rows = self.max_tree.unwrap_or(c.max_rows),
            Decoding::Autoregressive | Decoding::StaticTree { .. } => {}
        }
        strategy
    }
}

impl Sampling {
    fn merge(self, over: Sampling) -> Self {
        merge_fields!(over, self; temperature, top_k, top_p, min_p, seed)
    }

    pub fn params(&self) -> SamplingParams {
        let d = SamplingParams::default();
        SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.unwrap_or(d.top_k),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            seed: self.seed.unwrap_or(d.seed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_configs_parse_and_flags_win() {
        for name in ["cpu", "cpu-burn", "wgpu"] {
            let path = format!("{}/../../configs/{name}.toml", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap();
            let c = RunConfig::from_toml(&text).unwrap();
            assert!(c.backend.is_some(), "{name}");
        }
        let device =
            RunConfig::from_toml("backend = \"flex\"\nthreads = 2\n[tuning]\ngamma = 3").unwrap();
        let flags = RunConfig {
            backend: Some("candle".into()),
            tuning: Tuning {
                alpha: Some(0.2),
                ..Tuning::default()
            },
            ..RunConfig::default()
        };
        let c = device.merge(flags);
        assert_eq!(c.backend.as_deref(), Some("candle"));
        assert_eq!(c.threads, Some(2));
        assert_eq!((c.tuning.gamma, c.tuning.alpha), (Some(3), Some(0.2)));
        assert!(RunConfig::from_toml("bakend = \"candle\"").is_err());
        // A merged config written as a device config reads back the same
        // (the budget benchmark hands its children one this way).
        let text = toml::to_string(&c).unwrap();
        assert_eq!(RunConfig::from_toml(&text).unwrap(), c);
        let empty = toml::to_string(&RunConfig::default()).unwrap();
        assert_eq!(RunConfig::from_toml(&empty).unwrap(), RunConfig::default());
    }

    #[test]
    fn tuning_applies_to_its_strategy() {
        let t = Tuning {
            gamma: Some(7),
            max_tree: Some(9),
            ..Tuning::default()
        };
        let chain = t.apply("chain".parse().unwrap());
        assert_eq!(chain.decoding, Decoding::Chain { gamma: 7 });
        let Decoding::Tree(c) = t.apply("tree-provisional".parse().unwrap()).decoding else {
            panic!("a tree")
        };
        assert_eq!(c.max_nodes, 9);
        assert!(c.provisional);
        let Decoding::Ppd(p) = t.apply("ppd".parse().unwrap()).decoding else {
            panic!("ppd")
        };
        assert_eq!(p.max_rows, 9);
        assert!(
            Tuning {
                verify: Some("maybe".into()),
                ..Tuning::default()
            }
            .verification()
            .is_err()
        );
    }

    #[test]
    fn a_gpu_budget_needs_wgpu_and_keeps_streamed_layers_in_host_memory() {
        let gpu = RunConfig {
            backend: Some("wgpu".into()),
            gpu_memory_budget: Some("2GiB".into()),
            ..RunConfig::default()
        };
        assert_eq!(gpu.budget_bytes().unwrap(), Some(2 << 30));
        let o = gpu.memory_options(2 << 30, &Strategy::default());
        assert!(o.host_cache);
        assert_eq!(o.base, Some(0));
        let host = RunConfig {
            memory_budget: Some("900MiB".into()),
            ..RunConfig::default()
        };
        let o = host.memory_options(900 << 20, &Strategy::default());
        assert!(!o.host_cache);
        assert_eq!(o.base, None);
        assert_eq!(o.sequences, 1);
        let served = RunConfig {
            slots: Some(4),
            ..host.clone()
        };
        assert_eq!(
            served
                .memory_options(900 << 20, &Strategy::default())
                .sequences,
            4
        );
        for bad in [
            RunConfig {
                backend: Some("candle".into()),
                ..gpu.clone()
            },
            RunConfig {
                backend: None,
                ..gpu.clone()
            },
            RunConfig {
                gpu_memory_budget: Some("lots".into()),
                ..gpu.clone()
            },
            RunConfig {
                memory_budget: Some("lots".into()),
                ..gpu.clone()
            },
        ] {
            assert!(bad.budget_bytes().is_err(), "{bad:?}");
        }
        // Both: the GPU's plans the target, host memory's holds what of the
        // streamed layers it can and reads the rest from disk.
        let both = RunConfig {
            memory_budget: Some("1GiB".into()),
            ..gpu.clone()
        };
        assert_eq!(both.budget_bytes().unwrap(), Some(2 << 30));
        assert_eq!(both.host_budget_bytes().unwrap(), Some(1 << 30));
        assert_eq!(gpu.host_budget_bytes().unwrap(), None);
        assert_eq!(host.host_budget_bytes().unwrap(), None);
        let o = both.memory_options(2 << 30, &Strategy::default());
        assert_eq!(o.base, Some(0));
        assert_eq!(
            o.host,
            Some(arbor_pipeline::HostBudget {
                budget: 1 << 30,
                base: None
            })
        );
        assert_eq!(gpu.memory_options(2 << 30, &Strategy::default()).host, None);
        // Their learned figures are kept apart from a host budget's.
        let t = std::path::Path::new("/nonexistent/m.gguf");
        let keys = [&host, &gpu, &both].map(|c| c.budget_key(t).unwrap());
        assert_eq!(
            keys,
            ["900MiB-s1", "gpu2048MiB-s1", "gpu2048MiB-s1-host1024MiB"]
        );
    }
}

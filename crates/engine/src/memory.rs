//! Loading under a memory budget: the draft stays resident, the target's
//! layers stay resident while the budget allows, the rest are streamed from
//! disk on every forward pass (see `arbor-pipeline`).

use std::path::Path;

use arbor_gguf::GgufFile;
use arbor_model::{Config, Decoder, LanguageModel};
use arbor_paging::{Ledger, format_bytes};
use arbor_pipeline::{
    LayerCost, Mode, Monitor, Plan, Streamer, buffer_sets, plan, read_buffer_bytes,
};
use arbor_tensor::Backend;

use crate::Result;

/// How the target is loaded under a memory budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Bytes for the whole process: weights, KV caches, buffers, runtime.
    pub budget: u64,
    /// How streamed layers are loaded.
    pub mode: Mode,
    /// Longest sequence (prompt + generated tokens) the KV caches are
    /// planned for.
    pub context: usize,
    /// Bytes assumed held before the target loads (runtime, tokenizer,
    /// draft); `None` measures this process's resident memory. Set it when
    /// the process holds other things that the budget should not cover.
    pub base: Option<u64>,
}

impl MemoryOptions {
    pub fn new(budget: u64, pipelined: bool) -> Self {
        Self {
            budget,
            mode: if pipelined {
                Mode::Pipelined { depth: 1 }
            } else {
                Mode::OnDemand
            },
            context: 1024,
            base: None,
        }
    }

    fn slots(&self) -> usize {
        match self.mode {
            Mode::OnDemand => 1,
            Mode::Pipelined { depth } => depth + 1,
        }
    }
}

/// Where the budget went, and the streamer's statistics.
#[derive(Clone)]
pub struct MemoryReport {
    pub plan: Plan,
    /// What the process held before the target's weights were loaded
    /// (runtime, tokenizer, draft).
    pub base_bytes: u64,
    /// Bytes held by the target's resident weights.
    pub target_resident_bytes: u64,
    pub monitor: Option<Monitor>,
}

impl MemoryReport {
    pub fn summary(&self) -> String {
        let p = &self.plan;
        format!(
            "memory budget {}: {} before the target, {} of target weights resident ({} of {} layers), {} streaming reserve, {} read per forward pass",
            format_bytes(p.budget),
            format_bytes(self.base_bytes),
            format_bytes(self.target_resident_bytes),
            p.resident.len() - p.streamed(),
            p.resident.len(),
            format_bytes(p.stream_reserve),
            format_bytes(p.read_per_pass),
        )
    }
}

/// Resident memory of this process now (Linux; 0 elsewhere).
pub fn resident_now() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Bytes of KV cache per token (f32 keys and values, all layers).
fn kv_per_token(c: &Config) -> u64 {
    (c.n_layers * c.kv_dim() * 2 * 4) as u64
}

/// Slack for allocator fragmentation, thread stacks and per-pass
/// activations that are not counted one by one.
const SLACK: u64 = 48 << 20;

/// The residency plan for the target of `file` under `options`, given that
/// `draft` (if any) is already loaded, with the target's layer specs.
fn plan_target<B: Backend>(
    backend: &B,
    file: &GgufFile,
    draft: Option<&Config>,
    options: &MemoryOptions,
) -> Result<(Plan, Vec<Vec<arbor_model::TensorSpec>>, u64)> {
    let h = file.header();
    let c = Config::from_gguf(h)?;
    let specs: Vec<_> = (0..c.n_layers)
        .map(|i| c.layer_tensors(h, i))
        .collect::<Result<_, _>>()?;
    let costs: Vec<LayerCost> = specs
        .iter()
        .map(|s| LayerCost {
            held: arbor_model::decoder::held_bytes(backend, s),
            read: s.iter().map(|t| t.len as u64).sum(),
        })
        .collect();
    let head = match h.tensor("output.weight") {
        Ok(t) => backend.weight_bytes(t.ty, c.vocab_size, c.hidden),
        Err(_) => h.tensor("token_embd.weight")?.size,
    };
    // Logits (and their copies on the way out) for up to 64 rows.
    let scratch = 3 * 64 * c.vocab_size as u64 * 4;
    let kv = options.context as u64 * (kv_per_token(&c) + draft.map_or(0, kv_per_token));
    let base = options.base.unwrap_or_else(resident_now);
    let fixed = base + head + kv + scratch + SLACK;
    let refs: Vec<&[arbor_model::TensorSpec]> = specs.iter().map(|s| s.as_slice()).collect();
    let plan = plan(
        options.budget,
        fixed,
        &costs,
        options.slots(),
        read_buffer_bytes(&refs) * buffer_sets(options.mode),
    )
    .map_err(arbor_model::ModelError::from)?;
    Ok((plan, specs, base))
}

/// Whether the target of `file` would keep every layer resident under
/// `options` with nothing else loaded (no draft): then the fastest way to
/// run it is without one, since a draft's memory would push target layers
/// out to be read from disk on every pass.
pub(crate) fn target_fits<B: Backend>(
    backend: &B,
    file: &GgufFile,
    options: &MemoryOptions,
) -> Result<bool> {
    Ok(match plan_target(backend, file, None, options) {
        Ok((plan, _, _)) => plan.streamed() == 0,
        Err(crate::EngineError::Model(arbor_model::ModelError::Paging(
            arbor_paging::PagingError::TooSmall { .. },
        ))) => false,
        Err(e) => return Err(e),
    })
}

/// Loads the target of `file` under `options`, given that `draft` (if any)
/// is already loaded.
pub(crate) fn load_target<B: Backend + Clone>(
    backend: B,
    file: &GgufFile,
    path: &Path,
    draft: Option<&Config>,
    options: &MemoryOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Box<dyn LanguageModel>, MemoryReport)> {
    let (plan, specs, base) = plan_target(&backend, file, draft, options)?;
    let mut model = Decoder::load_partial(backend.clone(), file, &plan.resident, progress)?;
    let target_resident_bytes = model.resident_bytes();
    let mut monitor = None;
    if plan.streamed() > 0 {
        let streamed = specs
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !plan.resident[*i])
            .collect();
        let streamer = Streamer::new(
            backend,
            path,
            streamed,
            Ledger::new(plan.stream_reserve),
            options.mode,
        )?;
        monitor = Some(streamer.monitor());
        model.set_layer_source(Box::new(streamer));
    }
    Ok((
        Box::new(model),
        MemoryReport {
            plan,
            base_bytes: base,
            target_resident_bytes,
            monitor,
        },
    ))
}

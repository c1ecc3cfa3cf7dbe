//! Loading a target model under a memory budget: the target's layers stay
//! resident while the budget allows (after the draft, the head, the KV
//! caches, logit scratch and the runtime), the rest are streamed from disk
//! on every forward pass by a [`Streamer`]; an untied token embedding is
//! read row by row ([`DiskRows`]).

use arbor_gguf::GgufFile;
use arbor_model::{Config, Decoder, Layout, Result, RowSource, copied_bytes, held_bytes};
use arbor_paging::{Ledger, PagingError, format_bytes};
use arbor_tensor::{Backend, KvFormat};

use crate::{
    DiskHead, DiskRows, HostBudget, HostTier, LayerCost, Mode, Monitor, Plan, Streamer,
    buffer_sets, buffer_sets_for, keeps_in_place, paging, plan, read_buffer_bytes,
};

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
    /// Most rows of logits one target pass returns (1 for one-token
    /// decoding; a verified tree with its root).
    pub logit_rows: usize,
    /// Most rows of logits one draft pass returns.
    pub draft_logit_rows: usize,
    /// Bytes assumed held before the target loads (runtime, tokenizer,
    /// draft); `None` measures this process's resident memory. Set it when
    /// the process holds other things that the budget should not cover.
    pub base: Option<u64>,
    /// An elastic target that drafts for itself at this level index: its
    /// layers are resident or split at that level (see [`crate::split_plan`]),
    /// never streamed whole.
    pub split: Option<usize>,
    /// Read streamed layers through the page cache and leave them there:
    /// the budget is a GPU's, and host memory keeps the file (otherwise
    /// reads bypass or drop the cache, which a host budget would pay for).
    pub host_cache: bool,
    /// Under a GPU's budget, host memory's own (`--memory-budget` beside
    /// `--gpu-memory-budget`): streamed layers are read with direct IO,
    /// those that fit it once ([`crate::HostTier`]), the rest every pass.
    /// Takes the place of `host_cache`.
    pub host: Option<HostBudget>,
    /// Generations running at once over the target (a server's slots):
    /// each beyond the first adds [`SEQUENCE_SLACK`]. Their KV caches are
    /// in `context`, their logits in `logit_rows`.
    pub sequences: usize,
    /// A head read per pass may be replaced by a held Q8_0 copy that gives
    /// argmaxes (see [`arbor_model::certified`]): set where every pass's
    /// logits are read only for their argmax (greedy, exact verification,
    /// no constraint, one sequence). The plan takes it where it reads
    /// fewer bytes per pass.
    pub approx_head: bool,
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
            logit_rows: 64,
            draft_logit_rows: 64,
            base: None,
            split: None,
            host_cache: false,
            host: None,
            sequences: 1,
            approx_head: false,
        }
    }

    /// Built layers the streamer holds at once.
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
    /// How streamed layers are loaded.
    pub mode: Mode,
    /// Tokens (prompt + new) the KV caches were planned for.
    pub context: usize,
    /// Bytes a pass reads from the disk: the plan's `read_per_pass` but
    /// for what host memory serves (under a GPU's budget, the page cache
    /// or the host tier).
    pub disk_read_per_pass: u64,
    /// Streamed layers the host tier holds, and their file bytes (a GPU's
    /// budget with a host budget beside it).
    pub host_held: (usize, u64),
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
        ) + &match (p.head_read, p.head_held) {
            (0, _) if p.head_approx > 0 => format!(
                " (the output head is not read: a Q8_0 copy of it, {} held, gives greedy passes their argmax, and only the rows that may hold it are read)",
                format_bytes(p.head_approx)
            ),
            (0, _) => String::new(),
            (_, (0, _)) => " (the output head's included: it is read a slice at a time)".into(),
            (_, (rows, bytes)) => format!(
                " (the output head's included: it is read a slice at a time, but for its first {rows} rows, {} held)",
                format_bytes(bytes)
            ),
        } + &match self.host_held {
            (0, _) => String::new(),
            (layers, bytes) => format!(
                "; host memory holds {layers} streamed layers ({}), {} read from disk per pass",
                format_bytes(bytes),
                format_bytes(self.disk_read_per_pass)
            ),
        }
    }
}

/// The most memory this process has held resident so far (Linux's
/// `VmHWM`; `None` where the OS does not say).
pub fn peak_resident() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resident memory of this process now (Linux; 0 elsewhere).
pub fn resident_now() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Bytes of KV cache per token (keys and values, all layers) stored as
/// `format`.
fn kv_per_token(c: &Config, format: KvFormat) -> u64 {
    c.n_layers as u64 * 2 * format.row_bytes(c.kv_dim())
}

/// Bytes the KV caches of `c` hold for `context` tokens stored as `format`
/// ([`Backend::kv_format`]): caches grow in steps of
/// [`arbor_tensor::KV_STEP`] tokens.
pub fn kv_bytes(c: &Config, context: usize, format: KvFormat) -> u64 {
    let step = arbor_tensor::KV_STEP;
    (context.max(1).div_ceil(step) * step) as u64 * kv_per_token(c, format)
}

/// A draft's logits for `rows` rows: its head's output (handed to the loop
/// without a copy) and room for one more copy of them on the way (a slim
/// draft widening its rows to the vocabulary).
pub fn logit_scratch(c: &Config, rows: usize) -> u64 {
    2 * rows.max(1) as u64 * c.vocab_size as u64 * 4
}

/// The target's logits for passes of up to `rows` rows: the head's output,
/// handed to the decoding loop without a copy (and masked there in place
/// under a constraint), and a second copy only where one is made on the
/// way: an elastic head in frequency order put back in token order, or a
/// pass batching several sequences split into theirs. Measured: the F16
/// 1.5B's trees under 1130 MiB (33 rows, 19 MiB a copy) peaked more than
/// 100 MiB under their budget while the plan counted three copies where
/// the pass held at most two, one once the streamed head handed its rows
/// over.
pub fn target_logit_scratch(layout: &Layout, rows: usize, sequences: usize) -> u64 {
    let reordered = (layout.elastic.as_ref()).is_some_and(|e| e.vocab.is_some());
    let copies = 1 + u64::from(reordered || sequences > 1);
    copies * rows.max(1) as u64 * layout.config.vocab_size as u64 * 4
}

/// Slack for allocator fragmentation, thread stacks and per-pass
/// activations that are not counted one by one (measured: peaks stay
/// within it for every strategy on the 1.5B at 0.8–1.3 GiB).
pub const SLACK: u64 = 48 << 20;

/// What each generation beyond the first adds that is not counted one by
/// one: its thread's allocations (its logits and the sampler's copies, its
/// pass's rows) and the allocator's share of them. Measured: a server with
/// 8 slots over the 1.5B under 900 MiB peaked 42 MiB over its budget
/// without it, one slot 15–20 MiB under.
pub const SEQUENCE_SLACK: u64 = 8 << 20;

/// The residency plan for the target laid out as `layout` under `options`,
/// given that `draft` (if any) is already loaded, and the bytes held before
/// the target.
fn plan_target<B: Backend>(
    backend: &B,
    layout: &Layout,
    draft: Option<&Config>,
    options: &MemoryOptions,
) -> Result<(Plan, u64)> {
    let c = &layout.config;
    // As the streamer decides, layer by layer: a layer kept in its buffers
    // costs its copies beside them, one that is not its whole copy; any
    // kept layer means three buffer sets, whichever layers end up streamed.
    let kept: Vec<bool> = (layout.layers.iter())
        .map(|s| keeps_in_place(backend, options.mode, &[&s[..]]))
        .collect();
    let in_place = kept.contains(&true);
    let costs: Vec<LayerCost> = (layout.layers.iter().zip(&kept))
        .map(|(s, &kept)| LayerCost {
            held: held_bytes(backend, s),
            copied: match kept {
                true => copied_bytes(backend, s),
                false => held_bytes(backend, s),
            },
            read: s.iter().map(|t| t.len as u64).sum(),
        })
        .collect();
    let head = match &layout.head {
        Some(h) => backend.weight_bytes(h.ty, h.rows, h.cols),
        None => layout.embedding.len as u64,
    };
    let format = backend.kv_format();
    let kv = kv_bytes(c, options.context, format)
        + draft.map_or(0, |d| kv_bytes(d, options.context, format));
    let base = options.base.unwrap_or_else(resident_now);
    let logits = target_logit_scratch(layout, options.logit_rows, options.sequences)
        + draft.map_or(0, |d| logit_scratch(d, options.draft_logit_rows));
    let sequences = SEQUENCE_SLACK * options.sequences.max(1).saturating_sub(1) as u64;
    let fixed = base + head + kv + logits + SLACK + sequences;
    if let Some(level) = options.split {
        let costs = crate::split::split_costs(backend, layout, level)?;
        let lists: Vec<&[arbor_model::TensorEntry]> =
            costs.iter().filter_map(|(_, s)| s.as_deref()).collect();
        let buffers = crate::buffers::entry_buffer_bytes(&lists) * buffer_sets(options.mode);
        let costs: Vec<_> = costs.iter().map(|(c, _)| *c).collect();
        let plan = crate::split_plan(
            options.budget,
            fixed,
            level,
            &costs,
            options.slots(),
            buffers,
        )
        .map_err(paging)?;
        return Ok((plan, base));
    }
    let all: Vec<usize> = (0..layout.layers.len()).collect();
    let buffers = read_buffer_bytes(layout, &all) * buffer_sets_for(options.mode, in_place);
    let held = plan(options.budget, fixed, &costs, options.slots(), buffers);
    // A budget that cannot hold the head with the rest reads it a slice at
    // a time on every pass, as it would the same bytes of layers; what is
    // left once whole layers are planned holds its first slices.
    let entry = layout.head_tensor();
    let streamed = crate::head::streamed_head_bytes(backend, entry);
    let plan = match held {
        Err(PagingError::TooSmall { .. }) if streamed < head => {
            let fixed = fixed - head + streamed;
            let mut p =
                plan(options.budget, fixed, &costs, options.slots(), buffers).map_err(paging)?;
            let spare = options.budget - fixed - p.stream_reserve - p.resident_bytes;
            let slices = crate::head::slices_held(backend, entry, spare);
            let rows = slices * crate::head::slice_rows(entry);
            let held_bytes = slices as u64 * crate::head::slice_bytes(backend, entry);
            p.head_held = (rows, held_bytes);
            p.fixed = fixed + held_bytes;
            p.head_read = (entry.len - rows * crate::head::row_bytes(entry)) as u64;
            p.read_per_pass += p.head_read;
            p
        }
        other => other.map_err(paging)?,
    };
    // Even a budget that holds the head may do better holding its copy:
    // the bytes saved hold more layers.
    let plan = match options.approx_head && crate::head::approximable(entry.ty) && streamed < head {
        true => {
            let fixed = fixed - head + crate::head::fallback_head_bytes(backend, entry);
            with_approx_head(backend, entry, options, fixed, &costs, buffers, plan)?
        }
        false => plan,
    };
    Ok((plan, base))
}

/// The type of a float head's held copy. Q8_0: on the F16 1.5B, greedy
/// tree passes (20-30 rows) gathered 30-50 exact rows with it; a Q5_0
/// copy (83 MiB smaller) gathered 700-1,900, as many reads.
const APPROX_TYPE: arbor_gguf::GgmlType = arbor_gguf::GgmlType::Q8_0;

/// `other` (the head held, or read per pass), or the plan that holds the
/// head's Q8_0 copy instead (with the rows a pass gathers), whichever reads
/// fewer bytes per pass. `fixed` counts the small read buffers of the
/// passes that read the whole head ([`crate::head::fallback_head_bytes`]).
fn with_approx_head<B: Backend>(
    backend: &B,
    entry: &arbor_model::TensorEntry,
    options: &MemoryOptions,
    fixed: u64,
    costs: &[LayerCost],
    buffers: u64,
    other: Plan,
) -> Result<Plan> {
    let copy = arbor_model::certified::ApproxHead::<B>::bytes_for(
        backend,
        APPROX_TYPE,
        entry.rows,
        entry.cols,
    );
    // The gathered rows' bytes and their built weight.
    let most = arbor_model::certified::max_gathered(entry.rows);
    let gathered = 2 * (most * crate::head::row_bytes(entry)) as u64;
    let fixed = fixed + copy + gathered;
    let Ok(mut p) = plan(options.budget, fixed, costs, options.slots(), buffers) else {
        return Ok(other);
    };
    if p.read_per_pass >= other.read_per_pass {
        return Ok(other);
    }
    p.head_read = 0;
    p.head_held = (0, 0);
    p.head_approx = copy;
    Ok(p)
}

/// Whether the target of `file` would keep every layer resident under
/// `options` with nothing else loaded (no draft): then the fastest way to
/// run it is without one, since a draft's memory would push target layers
/// out to be read from disk on every pass.
pub fn target_fits<B: Backend>(
    backend: &B,
    file: &GgufFile,
    options: &MemoryOptions,
) -> Result<bool> {
    let layout = Layout::from_gguf(file.header())?;
    Ok(match plan_target(backend, &layout, None, options) {
        Ok((plan, _)) => plan.streamed() == 0 && plan.head_read == 0 && plan.head_approx == 0,
        Err(e) if matches!(e.source_as(), Some(PagingError::TooSmall { .. })) => false,
        Err(e) => return Err(e),
    })
}

/// The residency plan the target of `file` would get under `options` if
/// `extra` more bytes were held before it loads (a draft not loaded yet),
/// with a draft of config `draft` beside it; `None` when the target cannot
/// run there at all. What the `auto` strategy compares sources with.
pub fn plan_with<B: Backend>(
    backend: &B,
    file: &GgufFile,
    draft: Option<&Config>,
    extra: u64,
    options: &MemoryOptions,
) -> Result<Option<Plan>> {
    let layout = Layout::from_gguf(file.header())?;
    let options = MemoryOptions {
        base: Some(options.base.unwrap_or_else(resident_now) + extra),
        ..*options
    };
    match plan_target(backend, &layout, draft, &options) {
        Ok((plan, _)) => Ok(Some(plan)),
        Err(e) if matches!(e.source_as(), Some(PagingError::TooSmall { .. })) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Bytes the weights of `file` hold once loaded as a draft (every layer
/// and the head; an untied token table is read by rows and holds none).
pub fn model_bytes<B: Backend>(backend: &B, file: &GgufFile) -> Result<u64> {
    let layout = Layout::from_gguf(file.header())?;
    let layers: u64 = layout.layers.iter().map(|l| held_bytes(backend, l)).sum();
    let head = match &layout.head {
        Some(h) => backend.weight_bytes(h.ty, h.rows, h.cols),
        None => backend.weight_bytes(
            layout.embedding.ty,
            layout.embedding.rows,
            layout.embedding.cols,
        ),
    };
    Ok(layers + head)
}

/// The row source of `layout`'s token embedding when it is untied, or tied
/// to a head that is not held (a tied one with its head held is the head).
fn embedding_rows(
    file: &GgufFile,
    layout: &Layout,
    head_resident: bool,
) -> Result<Option<Box<dyn RowSource>>> {
    Ok(match layout.head.is_some() || !head_resident {
        true => Some(Box::new(DiskRows::open(file.path(), layout)?)),
        false => None,
    })
}

/// Loads every layer of `file` onto `backend`; an untied token embedding is
/// read from the file row by row as tokens need it.
pub fn load_resident<B: Backend>(
    backend: B,
    file: &GgufFile,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Decoder<B>> {
    let layout = Layout::from_gguf(file.header())?;
    let rows = embedding_rows(file, &layout, true)?;
    let resident = vec![true; layout.config.n_layers];
    Decoder::load_partial(backend, file, &layout, &resident, rows, progress)
}

/// Loads the target of `file` under `options`, given that `draft` (if any)
/// is already loaded: the layers the plan keeps resident are loaded, the
/// others are streamed from the file.
pub fn load_target<B: Backend + Clone>(
    backend: B,
    file: &GgufFile,
    draft: Option<&Config>,
    options: &MemoryOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Decoder<B>, MemoryReport)> {
    let layout = Layout::from_gguf(file.header())?;
    let (plan, base) = plan_target(&backend, &layout, draft, options)?;
    let head_resident = plan.head_read == 0 && plan.head_approx == 0;
    let rows = embedding_rows(file, &layout, head_resident)?;
    let mut model = Decoder::load_parts(
        backend.clone(),
        file,
        &layout,
        &plan.resident,
        head_resident,
        rows,
        progress,
    )?;
    let streamed: Vec<usize> = (0..plan.resident.len())
        .filter(|&i| !plan.resident[i])
        .collect();
    let mut units: Vec<(usize, Vec<arbor_model::TensorEntry>)> = streamed
        .iter()
        .map(|&i| (i, layout.layers[i].clone()))
        .collect();
    if let Some((level, _)) = &plan.split {
        model.split_layers(file, &layout, *level, &streamed)?;
        let costs = crate::split::split_costs(&backend, &layout, *level)?;
        for (i, entries) in &mut units {
            *entries = costs[*i].1.clone().ok_or_else(|| {
                arbor_model::ModelError::Invalid(format!("layer {i} cannot be split"))
            })?;
        }
    }
    let target_resident_bytes = model.resident_bytes();
    let host_cache = options.host_cache && options.host.is_none();
    let reader = || {
        match host_cache {
            true => arbor_paging::DirectReader::cached(file.path()),
            false => arbor_paging::DirectReader::open(file.path()),
        }
        .map_err(paging)
    };
    let tier = match &options.host {
        Some(host) => {
            let room = host.room_for(&backend, &layout, &streamed, options.mode)?;
            HostTier::load(&reader()?, &units, room)?
        }
        None => HostTier::default(),
    };
    let host_held = (tier.len(), tier.bytes());
    let disk_read_per_pass = match host_cache {
        true => 0,
        false => plan.read_per_pass - tier.bytes(),
    };
    let mut monitor = None;
    if plan.streamed() > 0 {
        let streamer = Streamer::with_host_tier(
            backend.clone(),
            reader()?,
            tier,
            units,
            Ledger::new(plan.stream_reserve),
            options.mode,
        )?;
        monitor = Some(streamer.monitor());
        model.set_layer_source(Box::new(streamer));
    }
    if !head_resident {
        let m = monitor.get_or_insert_with(Monitor::default).clone();
        let mut head = DiskHead::new(backend, reader()?, &layout, m);
        head.hold(plan.head_held.0 / crate::head::slice_rows(layout.head_tensor()).max(1))?;
        let approx = match plan.head_approx {
            0 => None,
            _ => {
                head.small_slices()?;
                Some(head.approx(APPROX_TYPE)?)
            }
        };
        model.set_head_source(Box::new(head))?;
        if let Some(approx) = approx {
            model.set_approx_head(approx)?;
        }
    }
    Ok((
        model,
        MemoryReport {
            plan,
            base_bytes: base,
            target_resident_bytes,
            mode: options.mode,
            context: options.context,
            disk_read_per_pass,
            host_held,
            monitor,
        },
    ))
}

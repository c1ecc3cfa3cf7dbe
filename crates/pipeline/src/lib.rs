//! Weight streaming: everything that reads a model's weights from disk
//! after loading, and the budget arithmetic that decides what is streamed.
//! `arbor-model` defines the sources a decoder borrows weights from
//! ([`LayerSource`](arbor_model::LayerSource),
//! [`RowSource`](arbor_model::RowSource)) and reads no files; this crate
//! implements them on the GGUF file.
//!
//! [`load_target`] loads a target under [`MemoryOptions`]: it sums what
//! must stay in memory (everything but the decoder layers: what the process
//! holds already, the draft included, the head, the KV caches, logit
//! scratch and some slack), and [`plan`] splits the budget between that, the layers that also
//! fit, and a bounded streaming reserve. The layers left over are spread
//! evenly through the stack, so the loader always has some resident layers'
//! compute to hide the next read behind. [`target_fits`] says whether
//! nothing would be streamed; [`load_resident`] loads every layer.
//!
//! A [`Streamer`] is the decoder's layer source for the streamed layers. It
//! reads a layer's tensors with direct IO (nothing lands in the page cache,
//! which a memory limit would count and then evict), builds the backend
//! weights, and lends them for one forward pass; every byte it holds is
//! reserved on a [`Ledger`](arbor_paging::Ledger) first, so it cannot exceed
//! its share of the budget. Where the backend keeps streamed weights in the
//! bytes they were read into ([`keeps_in_place`]), a pipelined streamer
//! builds nothing: it lends the read buffers themselves with the layer, and
//! gets them back when the pass drops it.
//! - [`Mode::OnDemand`] loads each layer when the forward pass asks for it
//!   (compute waits for every read);
//! - [`Mode::Pipelined`] runs a reader and a builder thread that keep up to
//!   `depth` layers loaded ahead, in the order forward passes use them,
//!   wrapping round to the first streamed layer: the next pass's first
//!   layers load while this pass finishes and while the draft model runs, so
//!   a verification starts as soon as its first streamed layer is in.
//!
//! [`DiskRows`] reads an untied token embedding's rows the same way, one
//! row per token, so the table (the size of two layers) never sits in
//! memory. Where the budget cannot hold the output head with the rest,
//! [`DiskHead`] reads it a slice of rows at a time on every pass, one slice
//! ahead of the multiply (and the embedding, tied or not, by rows).
//!
//! Under a GPU's budget with a host budget beside it ([`HostBudget`]), the
//! streamed layers that fit host memory are read once and kept there
//! ([`HostTier`]); the streamer copies them instead of reading the disk.
//!
//! A [`Monitor`] reports bytes read, IO, build and wait time, whether the
//! compute thread is waiting for a layer right now (so the draft may use the
//! idle CPU), and an optional trace of those intervals.
//!
//! Errors of the paging layer reach callers as
//! [`ModelError::Source`] carrying the
//! [`PagingError`]; [`ModelError::source_as`] gets it back.

use arbor_model::ModelError;
use arbor_paging::PagingError;

mod budget;
mod buffers;
mod head;
mod host;
mod monitor;
mod plan;
mod rows;
mod split;
mod streamer;

pub use budget::{
    MemoryOptions, MemoryReport, SEQUENCE_SLACK, SLACK, kv_bytes, load_resident, load_target,
    logit_scratch, model_bytes, peak_resident, plan_with, resident_now, target_fits,
    target_logit_scratch,
};
pub use buffers::{buffer_sets, buffer_sets_for, keeps_in_place, read_buffer_bytes};
pub use head::DiskHead;
pub use host::{HostBudget, HostTier, time_layer_builds};
pub use monitor::{Monitor, Span, SpanKind, StreamStats};
pub use plan::{LayerCost, Plan, plan};
pub use rows::DiskRows;
pub use split::{SplitCost, split_plan};
pub use streamer::Streamer;

/// How streamed layers are loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// When the forward pass reaches the layer; compute waits for each read.
    OnDemand,
    /// By a loader thread, up to `depth` layers ahead of the forward pass.
    Pipelined { depth: usize },
}

/// A paging error as the model's error for a failed weight source.
pub(crate) fn paging(e: PagingError) -> ModelError {
    ModelError::from_source(e)
}

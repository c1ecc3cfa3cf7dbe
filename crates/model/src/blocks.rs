//! What a decoder holds per layer, and where its token embedding comes
//! from: the pieces a [`crate::Decoder`], its self drafts, split layers
//! and slots share.

use std::sync::Arc;

use arbor_gguf::GgmlType;
use arbor_tensor::Backend;

use crate::{LayerWeights, RowSource};

/// The token embedding: a resident table (shared with self drafts), or rows
/// fetched from a [`RowSource`] as tokens need them.
pub(crate) enum Embedding<B: Backend> {
    Table(Arc<B::Weight>),
    Rows {
        source: Box<dyn RowSource>,
        ty: GgmlType,
        cols: usize,
    },
}

/// Where a layer's weights come from in a forward pass.
pub(crate) enum Block<B: Backend> {
    /// Held in memory, shared with any self draft.
    Resident(Arc<LayerWeights<B>>),
    /// Lent by the decoder's [`LayerSource`] for each pass.
    Streamed,
    /// Held up to `neurons` MLP neurons (an elastic level's prefix); the
    /// rest of the MLP is lent by the [`LayerSource`] for passes that run
    /// more (see [`crate::split`]).
    Split {
        prefix: Arc<LayerWeights<B>>,
        neurons: usize,
    },
    /// Not run: the residual stream passes through unchanged (a self
    /// draft's stand-in for the target's streamed layers). Has no KV cache.
    Skipped,
}

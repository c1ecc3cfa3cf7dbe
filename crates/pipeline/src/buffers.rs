//! The streamer's read buffers: how many bytes and sets it holds, and the
//! sets it lends with built layers whose weights stay in them.

use std::sync::Arc;

use arbor_model::{Layout, TensorEntry, is_suffix};
use arbor_paging::{AlignedBuf, DirectReader};
use arbor_tensor::{Backend, StableBytes};
use crossbeam_channel::Sender;

use crate::Mode;

/// Bytes of read buffers a streamer needs for any of `layers` (indices into
/// [`Layout::layers`]): one buffer per tensor position, as large as that
/// tensor's aligned span in any of them.
pub fn read_buffer_bytes(layout: &Layout, layers: &[usize]) -> u64 {
    let entries: Vec<&[TensorEntry]> = layers
        .iter()
        .map(|&l| layout.layers[l].as_slice())
        .collect();
    buffer_caps(&entries).iter().map(|&c| c as u64).sum()
}

/// Bytes of read buffers a streamer needs for any of these entry lists.
pub(crate) fn entry_buffer_bytes(lists: &[&[TensorEntry]]) -> u64 {
    buffer_caps(lists).iter().map(|&c| c as u64).sum()
}

pub(crate) fn buffer_caps(layers: &[&[TensorEntry]]) -> Vec<usize> {
    let width = layers.iter().map(|s| s.len()).max().unwrap_or(0);
    (0..width)
        .map(|i| {
            layers
                .iter()
                .filter_map(|s| s.get(i))
                .map(|s| DirectReader::span(s.offset, s.len).max(arbor_paging::ALIGN))
                .max()
                .unwrap_or(0)
        })
        .collect()
}

/// Read buffer sets a streamer in `mode` holds: one on demand; two when
/// pipelined, so the next layer is read while the last one is built.
pub fn buffer_sets(mode: Mode) -> u64 {
    buffer_sets_for(mode, false)
}

/// [`buffer_sets`], for layers whose weights stay in their read buffers
/// (`in_place`, see [`keeps_in_place`]) or not. A pipelined streamer that
/// keeps them lends each set with its layer: one set in the pass, `depth`
/// built and waiting, and one being read, `depth + 2` in all, in place of
/// two sets and `depth + 1` built copies.
pub fn buffer_sets_for(mode: Mode, in_place: bool) -> u64 {
    match (mode, in_place) {
        (Mode::OnDemand, _) => 1,
        (Mode::Pipelined { .. }, false) => 2,
        (Mode::Pipelined { depth }, true) => depth.max(1) as u64 + 2,
    }
}

/// Whether a streamer in `mode` of these units (entry lists, as
/// [`crate::Streamer::with_units`] takes) builds their weights in its read
/// buffers instead of copying them: it is pipelined, the backend keeps
/// some matrix of them in place ([`Backend::streams_in_place`]) and every
/// unit is a whole layer (a split layer's streamed part is copied, as its
/// plan counts it).
pub fn keeps_in_place<B: Backend>(backend: &B, mode: Mode, units: &[&[TensorEntry]]) -> bool {
    matches!(mode, Mode::Pipelined { .. })
        && !units.iter().any(|u| is_suffix(u))
        && units.iter().any(|u| {
            u.iter()
                .any(|e| e.rows > 1 && backend.streams_in_place(e.ty, e.rows, e.cols))
        })
}

/// One buffer per tensor position, reused from layer to layer.
pub(crate) struct BufSet(pub(crate) Vec<AlignedBuf>);

/// Something lent with a weight that keeps its bytes in it (a buffer set
/// with a built layer, a read buffer with a head slice): it goes back
/// through `back` when the last holder drops it.
pub(crate) struct Loan<T: Send> {
    pub(crate) item: Option<T>,
    pub(crate) back: Sender<T>,
}

impl<T: Send> Loan<T> {
    pub(crate) fn new(item: T, back: Sender<T>) -> Self {
        Self {
            item: Some(item),
            back,
        }
    }
}

impl<T: Send> Drop for Loan<T> {
    fn drop(&mut self) {
        if let Some(item) = self.item.take() {
            // A gone owner no longer needs it.
            let _ = self.back.send(item);
        }
    }
}

// SAFETY: the buffer is neither written nor moved while lent (it is only
// taken out in `drop`), and an `AlignedBuf`'s slice is its fixed heap
// allocation.
unsafe impl StableBytes for Loan<AlignedBuf> {
    fn bytes(&self) -> &[u8] {
        self.item.as_ref().map_or(&[], |b| b.as_slice())
    }
}

/// One tensor's bytes in a lent set.
pub(crate) struct LentBytes {
    pub(crate) set: Arc<Loan<BufSet>>,
    pub(crate) buf: usize,
}

// SAFETY: the set is neither written nor moved while lent (it is only
// taken out in `Loan::drop`, when no `LentBytes` is left), and an
// `AlignedBuf`'s slice is its fixed heap allocation.
unsafe impl StableBytes for LentBytes {
    fn bytes(&self) -> &[u8] {
        let set = self
            .set
            .item
            .as_ref()
            .expect("a lent set is held until dropped");
        set.0[self.buf].as_slice()
    }
}

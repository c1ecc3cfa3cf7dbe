//! The host tier of a GPU's budget. With `--gpu-memory-budget` alone the
//! layers that do not fit the GPU are read through the page cache and left
//! there: host memory keeps the whole file. With `--memory-budget` as well,
//! host memory has a budget of its own: the streamed layers whose file
//! bytes fit it are read once and held ([`HostTier`]), the others are read
//! from the disk with direct IO on every pass. Every pass uploads all of
//! them to the GPU either way.

use std::collections::HashMap;

use arbor_model::{Result, TensorEntry};
use arbor_paging::{AlignedBuf, DirectReader, PagingError};

use crate::{
    Mode, SLACK, buffer_sets_for, keeps_in_place, paging, read_buffer_bytes, resident_now,
};

/// Host memory for a run whose budget is a GPU's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostBudget {
    /// Bytes for the whole process in host memory.
    pub budget: u64,
    /// Bytes the process holds in host memory before streaming starts
    /// (runtime, tokenizer, the GPU driver's own); `None` measures it.
    pub base: Option<u64>,
}

impl HostBudget {
    /// What host memory must hold besides the tier: the process as it is,
    /// the streamer's read buffers (`buffers`), as much again for the
    /// uploads' staging copies, and [`SLACK`].
    pub fn fixed(&self, buffers: u64) -> u64 {
        self.base.unwrap_or_else(resident_now) + 2 * buffers + SLACK
    }

    /// Bytes left for held layers when `layers` of `layout` stream in
    /// `mode` on `backend` (their read buffers: more sets where the backend
    /// keeps the weights in them), or why the budget cannot stream at all.
    pub fn room_for<B: arbor_tensor::Backend>(
        &self,
        backend: &B,
        layout: &arbor_model::Layout,
        layers: &[usize],
        mode: Mode,
    ) -> Result<u64> {
        let lists: Vec<&[TensorEntry]> = layers.iter().map(|&l| &layout.layers[l][..]).collect();
        let in_place = keeps_in_place(backend, mode, &lists);
        self.room(read_buffer_bytes(layout, layers) * buffer_sets_for(mode, in_place))
    }

    /// Bytes left for held layers beside `buffers` bytes of read buffers,
    /// or why the budget cannot stream at all.
    pub fn room(&self, buffers: u64) -> Result<u64> {
        let fixed = self.fixed(buffers);
        self.budget.checked_sub(fixed).ok_or_else(|| {
            paging(PagingError::TooSmall {
                budget: self.budget,
                minimum: fixed,
                detail: "host memory under a GPU budget: the process, the streamed layers' \
                         read buffers and their upload copies"
                    .into(),
            })
        })
    }
}

/// Streamed layers' file bytes held in host memory, one buffer per tensor.
#[derive(Debug, Default)]
pub struct HostTier {
    layers: HashMap<usize, Vec<Vec<u8>>>,
    bytes: u64,
}

impl HostTier {
    /// Reads the first of `units` (layer and entries, in forward order)
    /// whose bytes fit `room`, in that order, from `file`.
    pub fn load(
        file: &DirectReader,
        units: &[(usize, Vec<TensorEntry>)],
        room: u64,
    ) -> Result<Self> {
        let mut tier = Self::default();
        let mut buf = AlignedBuf::new(arbor_paging::ALIGN);
        for (layer, entries) in units {
            let size: u64 = entries.iter().map(|e| e.len as u64).sum();
            if tier.bytes + size > room {
                break;
            }
            let tensors = (entries.iter())
                .map(|e| Ok(file.read_into(e.offset, e.len, &mut buf)?.to_vec()))
                .collect::<std::result::Result<Vec<_>, PagingError>>()
                .map_err(paging)?;
            tier.layers.insert(*layer, tensors);
            tier.bytes += size;
        }
        Ok(tier)
    }

    /// File bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Layers held.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Copies `layer`'s tensors to the start of `set`'s buffers (one per
    /// tensor, each at least that tensor's size); its bytes, or `None`
    /// where the layer is not held.
    pub(crate) fn copy_into(&self, layer: usize, set: &mut [AlignedBuf]) -> Option<u64> {
        let tensors = self.layers.get(&layer)?;
        let mut bytes = 0;
        for (t, buf) in tensors.iter().zip(set.iter_mut()) {
            buf.as_mut_slice()[..t.len()].copy_from_slice(t);
            bytes += t.len() as u64;
        }
        Some(bytes)
    }
}

/// Times building the largest layer of `file` on `backend` from bytes in
/// host memory, `times` over: what a pass under a GPU's budget pays for
/// each layer it streams (the upload, and on wgpu the blocks' packing).
/// The layer's bytes and the fastest build's seconds.
pub fn time_layer_builds<B: arbor_tensor::Backend>(
    backend: &B,
    file: &arbor_gguf::GgufFile,
    times: usize,
) -> Result<(u64, f64)> {
    let layout = arbor_model::Layout::from_gguf(file.header())?;
    let size = |l: &Vec<TensorEntry>| l.iter().map(|e| e.len as u64).sum::<u64>();
    let Some(entries) = layout.layers.iter().max_by_key(|l| size(l)) else {
        return Err(arbor_model::ModelError::Invalid(
            "the model has no layers".into(),
        ));
    };
    let reader = DirectReader::cached(file.path()).map_err(paging)?;
    let tier = HostTier::load(&reader, &[(0, entries.clone())], u64::MAX)?;
    let tensors = &tier.layers[&0];
    let slices: Vec<&[u8]> = tensors.iter().map(|t| t.as_slice()).collect();
    let mut best = f64::INFINITY;
    for _ in 0..times.max(1) {
        let t0 = std::time::Instant::now();
        let built = arbor_model::LayerWeights::from_bytes(backend, entries, &slices, true)?;
        best = best.min(t0.elapsed().as_secs_f64());
        drop(std::hint::black_box(built));
    }
    Ok((size(entries), best))
}

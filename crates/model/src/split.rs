//! Split layers: under a memory budget an elastic model keeps each layer's
//! prefix at one level resident — the part an elastic draft at that level
//! runs — and streams the rest of its MLP for the full model's passes.
//!
//! Gate and up are row units, so a level's neurons are their leading rows
//! and the rest is one contiguous range of the file. The down projection's
//! neurons are its columns; `arbor elastic build` stores them a second time
//! as column segments between consecutive levels
//! (`blk.N.ffn_down.weight.segK`, see [`Layout::down_segments`]); a split
//! layer holds and streams its down projection as those segments, so the
//! prefix and the suffix are each whole matrices that read contiguously
//! and load without a copy. Whole layers hold the whole matrix.
//!
//! A split layer's full pass computes the prefix's MLP and then the
//! suffix's. Gate and up rows are independent outputs; the down projection
//! sums over neurons, so every elastic layer — split or whole — sums it
//! segment by segment in level order: a split layer adds its segments'
//! products one at a time (`weights::down_sum`), a whole layer multiplies
//! its one matrix with [`Backend::matmul_sum`] over the same segments (one
//! pass where the backend fuses it), and the split layer's result is the
//! whole layer's bit for bit. (Summed in any other order the last bits
//! differ, and on a real model a last-bit difference can flip an
//! activation's 8-bit quantization in a later layer: the 0.5B's logits
//! moved by ~0.2 from one split layer.)

use std::sync::Arc;

use arbor_gguf::GgufFile;
use arbor_tensor::{Backend, SharedBytes};

use crate::blocks::Block;
use crate::weights::{Mlp, SEGMENT, check_ranges, kept_slices, weight};
use crate::{Decoder, LayerWeights, Layout, ModelError, Result, TensorEntry};

/// A split layer's streamed part, lent for one forward pass: the rows of
/// gate and up and the columns of down past the resident prefix.
pub struct SuffixLease<B: Backend> {
    pub mlp: Mlp<B>,
    pub hold: Box<dyn Send + Sync>,
}

/// The `rows` leading rows of a row-major matrix entry.
fn leading_rows(e: &TensorEntry, rows: usize) -> TensorEntry {
    let row_bytes = e.len / e.rows;
    TensorEntry {
        rows,
        len: rows * row_bytes,
        ..e.clone()
    }
}

/// The rows of a row-major matrix entry from `from` on.
fn rows_from(e: &TensorEntry, from: usize) -> TensorEntry {
    let row_bytes = e.len / e.rows;
    TensorEntry {
        rows: e.rows - from,
        offset: e.offset + (from * row_bytes) as u64,
        len: (e.rows - from) * row_bytes,
        ..e.clone()
    }
}

impl Layout {
    /// Where layer `layer` splits at `neurons` (a boundary of its stored
    /// down segments): the entries to hold (the layer with gate and up cut
    /// to their leading rows and down's leading segments in place of down)
    /// and the entries to stream (the rest of gate and up, then down's
    /// other segments). `None` when the layer has no segment boundary
    /// there.
    pub fn split_entries(
        &self,
        layer: usize,
        neurons: usize,
    ) -> Option<(Vec<TensorEntry>, Vec<TensorEntry>)> {
        let segs = self.down_segments.get(layer)?;
        let mut end = 0;
        let at = segs.iter().position(|s| {
            end += s.cols;
            end == neurons
        })?;
        if at + 1 == segs.len() {
            return None;
        }
        let find = |role: &str| {
            self.layers[layer]
                .iter()
                .find(|e| e.name.ends_with(role))
                .cloned()
        };
        let (gate, up) = (find("ffn_gate.weight")?, find("ffn_up.weight")?);
        let mut hold: Vec<TensorEntry> = self.layers[layer]
            .iter()
            .filter(|e| {
                !(e.name.ends_with("ffn_gate.weight")
                    || e.name.ends_with("ffn_up.weight")
                    || e.name.contains(".ffn_down.weight"))
            })
            .cloned()
            .collect();
        hold.push(leading_rows(&gate, neurons));
        hold.push(leading_rows(&up, neurons));
        hold.extend(segs[..=at].iter().cloned());
        let mut stream = vec![rows_from(&gate, neurons), rows_from(&up, neurons)];
        stream.extend(segs[at + 1..].iter().cloned());
        Some((hold, stream))
    }
}

impl<B: Backend> Mlp<B> {
    /// A split layer's streamed part from the bytes of
    /// [`Layout::split_entries`]' second list.
    pub fn suffix_from_bytes(
        backend: &B,
        entries: &[TensorEntry],
        bytes: &[&[u8]],
        streamed: bool,
    ) -> Result<Self> {
        Self::suffix_build(backend, entries, bytes, streamed, None)
    }

    /// [`Self::suffix_from_bytes`] for one pass, from bytes its weights
    /// may keep instead of copying (`keep[i]` for `entries[i]`).
    pub fn suffix_from_shared(
        backend: &B,
        entries: &[TensorEntry],
        keep: &[SharedBytes],
    ) -> Result<Self> {
        Self::suffix_build(backend, entries, &kept_slices(keep), true, Some(keep))
    }

    fn suffix_build(
        backend: &B,
        entries: &[TensorEntry],
        bytes: &[&[u8]],
        streamed: bool,
        keep: Option<&[SharedBytes]>,
    ) -> Result<Self> {
        check_ranges(entries, bytes, keep, "split-layer")?;
        let role = |r: &str| {
            (0..entries.len())
                .find(|&i| entries[i].name.ends_with(r))
                .ok_or_else(|| ModelError::Invalid(format!("split layer has no `{r}`")))
        };
        let matrix = |i: usize| {
            weight(
                backend,
                &entries[i],
                bytes[i],
                streamed,
                keep.map(|k| &k[i]),
            )
        };
        let down: Vec<B::Weight> = (0..entries.len())
            .filter(|&i| entries[i].name.contains(SEGMENT))
            .map(matrix)
            .collect::<Result<_>>()?;
        if down.is_empty() {
            return Err(ModelError::Invalid(
                "split layer has no down segments".into(),
            ));
        }
        Ok(Mlp {
            gate: matrix(role("ffn_gate.weight")?)?,
            up: matrix(role("ffn_up.weight")?)?,
            down,
        })
    }
}

/// Whether `entries` are a split layer's streamed part rather than a whole
/// layer.
pub fn is_suffix(entries: &[TensorEntry]) -> bool {
    entries.iter().any(|e| e.name.contains(SEGMENT))
        && !entries.iter().any(|e| e.name.ends_with("attn_norm.weight"))
}

impl<B: Backend> Decoder<B> {
    /// Makes the streamed layers listed in `layers` split ones: their
    /// prefix at elastic level `level` (an index into the file's levels)
    /// loaded from `file`, the rest lent by the layer source's
    /// [`LayerSource::mlp_suffix`](crate::LayerSource::mlp_suffix). Returns
    /// the bytes now held.
    pub fn split_layers(
        &mut self,
        file: &GgufFile,
        layout: &Layout,
        level: usize,
        layers: &[usize],
    ) -> Result<u64> {
        let e = self.elastic.clone().ok_or_else(|| {
            ModelError::Input("only an elastic model's layers can be split".into())
        })?;
        let cuts = e.cuts.get(level).ok_or_else(|| {
            ModelError::Input(format!("level index {level} of {}", e.levels.len()))
        })?;
        let mut held = 0;
        for &i in layers {
            if !matches!(self.blocks.get(i), Some(Block::Streamed)) {
                return Err(ModelError::Input(format!(
                    "layer {i} is not streamed: only a streamed layer can be split"
                )));
            }
            let neurons = cuts[i].neurons;
            let (hold, _) = layout.split_entries(i, neurons).ok_or_else(|| {
                ModelError::Invalid(format!(
                    "layer {i} has no stored down segment ending at neuron {neurons}: \
                     rebuild the elastic file with `arbor elastic build`"
                ))
            })?;
            let bytes: Vec<&[u8]> = hold
                .iter()
                .map(|t| {
                    file.bytes()
                        .get(t.offset as usize..t.offset as usize + t.len)
                        .ok_or_else(|| ModelError::Invalid(format!("`{}` is cut short", t.name)))
                })
                .collect::<Result<_>>()?;
            held += crate::held_bytes(&self.backend, &hold);
            let weights = LayerWeights::from_bytes(&self.backend, &hold, &bytes, false)?;
            self.blocks[i] = Block::Split {
                prefix: Arc::new(weights),
                neurons,
            };
        }
        self.resident_bytes += held;
        Ok(held)
    }
}

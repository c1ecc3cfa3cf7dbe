//! Split layers: under a memory budget an elastic model keeps each layer's
//! prefix at one level resident — the part an elastic draft at that level
//! runs — and streams the rest of its MLP for the full model's passes.
//!
//! Gate and up are row units, so a level's neurons are their leading rows
//! and the rest is one contiguous range of the file. The down projection's
//! neurons are its columns; `arbor elastic build` stores them a second time
//! as column segments between consecutive levels
//! (`blk.N.ffn_down.weight.segK`, see [`Layout::down_segments`]), so the
//! prefix and the suffix are each whole tensors that read contiguously, and
//! loading puts the segments of either side side by side again (a copy of
//! each row's blocks).
//!
//! A split layer's full pass computes the prefix's MLP and then the
//! suffix's. Gate and up rows are independent outputs; the down projection
//! sums over neurons, so every elastic layer — split or whole — sums it one
//! level segment at a time in level order (`down_sum` in the decoder), and
//! the split layer's result is the whole layer's bit for bit. (Summed in
//! any other order the last bits differ, and on a real model a last-bit
//! difference can flip an activation's 8-bit quantization in a later layer:
//! the 0.5B's logits moved by ~0.2 from one split layer.)

use std::sync::Arc;

use arbor_gguf::GgufFile;
use arbor_tensor::{Backend, WeightData};

use crate::decoder::Block;
use crate::weights::Mlp;
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
                !["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]
                    .iter()
                    .any(|r| e.name.ends_with(r))
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

/// Row-major matrix bytes of `segments` (column blocks of one matrix,
/// `bytes[i]` for `segments[i]`) side by side: one `[rows, Σ cols]` matrix.
pub fn join_columns(segments: &[TensorEntry], bytes: &[&[u8]]) -> Result<(TensorEntry, Vec<u8>)> {
    let first = segments
        .first()
        .ok_or_else(|| ModelError::Invalid("no column segments to join".into()))?;
    let rows = first.rows;
    if segments.iter().any(|s| s.rows != rows || s.ty != first.ty)
        || bytes.len() != segments.len()
        || segments.iter().zip(bytes).any(|(s, b)| b.len() != s.len)
    {
        return Err(ModelError::Invalid(format!(
            "column segments of `{}` do not match",
            first.name
        )));
    }
    let len: usize = segments.iter().map(|s| s.len).sum();
    let mut out = Vec::with_capacity(len);
    for r in 0..rows {
        for (s, b) in segments.iter().zip(bytes) {
            let rb = s.len / rows;
            out.extend_from_slice(&b[r * rb..(r + 1) * rb]);
        }
    }
    let name = first
        .name
        .rsplit_once(".seg")
        .map_or(&first.name[..], |(n, _)| n);
    let entry = TensorEntry {
        name: name.to_string(),
        cols: segments.iter().map(|s| s.cols).sum(),
        len,
        ..first.clone()
    };
    Ok((entry, out))
}

/// A split side's other entries and their bytes, then its joined down
/// projection and that matrix's bytes.
type Joined<'a> = (Vec<TensorEntry>, Vec<&'a [u8]>, TensorEntry, Vec<u8>);

/// The entries and bytes of a split side with its down segments joined
/// into one `ffn_down.weight` entry.
fn joined<'a>(entries: &[TensorEntry], bytes: &[&'a [u8]]) -> Result<Joined<'a>> {
    let (segs, rest): (Vec<_>, Vec<_>) = entries
        .iter()
        .zip(bytes)
        .partition(|(e, _)| e.name.contains(".ffn_down.weight.seg"));
    let seg_entries: Vec<TensorEntry> = segs.iter().map(|(e, _)| (*e).clone()).collect();
    let seg_bytes: Vec<&[u8]> = segs.iter().map(|(_, b)| **b).collect();
    let (down, data) = join_columns(&seg_entries, &seg_bytes)?;
    let (e, b) = rest.into_iter().map(|(e, b)| (e.clone(), *b)).unzip();
    Ok((e, b, down, data))
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
        let (rest, rest_bytes, down, down_bytes) = joined(entries, bytes)?;
        let matrix = |e: &TensorEntry, b: &[u8]| -> Result<B::Weight> {
            let w = WeightData {
                name: &e.name,
                ty: e.ty,
                rows: e.rows,
                cols: e.cols,
                bytes: b,
            };
            Ok(match streamed {
                true => backend.streamed_weight(w)?,
                false => backend.weight(w)?,
            })
        };
        let role = |r: &str| {
            rest.iter()
                .position(|e| e.name.ends_with(r))
                .ok_or_else(|| ModelError::Invalid(format!("split layer has no `{r}`")))
        };
        let (g, u) = (role("ffn_gate.weight")?, role("ffn_up.weight")?);
        Ok(Mlp {
            gate: matrix(&rest[g], rest_bytes[g])?,
            up: matrix(&rest[u], rest_bytes[u])?,
            down: matrix(&down, &down_bytes)?,
        })
    }
}

/// Whether `entries` are a split layer's streamed part rather than a whole
/// layer.
pub fn is_suffix(entries: &[TensorEntry]) -> bool {
    entries
        .iter()
        .any(|e| e.name.contains(".ffn_down.weight.seg"))
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
            let (mut rest, mut rest_bytes, down, down_bytes) = joined(&hold, &bytes)?;
            rest.push(down);
            rest_bytes.push(&down_bytes);
            held += crate::held_bytes(&self.backend, &rest);
            let weights = LayerWeights::from_bytes(&self.backend, &rest, &rest_bytes, false)?;
            self.blocks[i] = Block::Split {
                prefix: Arc::new(weights),
                neurons,
            };
        }
        self.resident_bytes += held;
        Ok(held)
    }
}

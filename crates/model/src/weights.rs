//! Decoder layer weights, and the traits through which a decoder gets the
//! weights it does not hold: [`LayerSource`] lends whole layers for one
//! forward pass, [`RowSource`] reads single rows of the token embedding,
//! [`HeadSource`] lends the output head a slice of rows at a time.
//! This crate reads no files itself; the disk implementations live in
//! `arbor-pipeline`.

use std::ops::Deref;

use arbor_tensor::{Backend, SharedBytes, WeightData};

use crate::{ModelError, Result, TensorEntry};

pub(crate) struct Attention<B: Backend> {
    pub(crate) q: B::Weight,
    pub(crate) k: B::Weight,
    pub(crate) v: B::Weight,
    pub(crate) q_bias: Option<B::Tensor>,
    pub(crate) k_bias: Option<B::Tensor>,
    pub(crate) v_bias: Option<B::Tensor>,
    pub(crate) o: B::Weight,
}

/// An MLP's weights (a whole layer's, or a split layer's streamed part).
pub struct Mlp<B: Backend> {
    pub(crate) gate: B::Weight,
    pub(crate) up: B::Weight,
    /// The down projection: one matrix (a whole layer's), or a split
    /// layer's held or lent column segments between levels, in order (see
    /// [`crate::split`]).
    pub(crate) down: Vec<B::Weight>,
}

/// The weights of one decoder layer.
pub struct LayerWeights<B: Backend> {
    pub(crate) attn_norm: B::Tensor,
    pub(crate) attn: Attention<B>,
    pub(crate) ffn_norm: B::Tensor,
    pub(crate) mlp: Mlp<B>,
}

/// A streamed layer's weights, lent for one forward pass. `hold` is dropped
/// with it (a memory reservation, a pipeline slot).
pub struct Lease<B: Backend> {
    pub weights: LayerWeights<B>,
    pub hold: Box<dyn Send + Sync>,
}

impl<B: Backend> Deref for Lease<B> {
    type Target = LayerWeights<B>;
    fn deref(&self) -> &LayerWeights<B> {
        &self.weights
    }
}

/// Where the weights of layers that are not resident come from. The decoder
/// asks for them in layer order during every forward pass.
pub trait LayerSource<B: Backend>: Send {
    /// The weights of layer `layer`, waiting until they are loaded.
    fn layer(&mut self, layer: usize) -> Result<Lease<B>>;

    /// The streamed part of split layer `layer` (see [`crate::split`]),
    /// waiting until it is loaded.
    fn mlp_suffix(&mut self, layer: usize) -> Result<crate::SuffixLease<B>> {
        Err(ModelError::Input(format!(
            "layer {layer} is split but its source streams no split layers"
        )))
    }

    /// Reports waits in [`layer`](Self::layer) to `tx` (see
    /// [`LanguageModel::notify_waits`](crate::LanguageModel::notify_waits)).
    fn notify_waits(&mut self, tx: Option<std::sync::mpsc::Sender<crate::WeightWait>>) {
        drop(tx);
    }
}

/// Where the rows of a token embedding that is not resident come from (an
/// untied embedding is only ever looked up, a few hundred bytes per token,
/// while the whole table is the size of two layers).
pub trait RowSource: Send {
    /// The bytes of row `row` as the file stores them (the embedding's
    /// [`TensorEntry::len`] divided by its rows), valid until the next call.
    fn row(&mut self, row: usize) -> Result<&[u8]>;

    /// A second, independent source of the same rows, for a model sharing
    /// this embedding (a self draft, run on another thread). Sources that
    /// cannot open a second handle say so with an error.
    fn try_clone(&self) -> Result<Box<dyn RowSource>> {
        Err(ModelError::Invalid(
            "this embedding row source cannot be opened twice".into(),
        ))
    }
}

/// Where the output head comes from when it is not resident (under a budget
/// too small for it: a 150k-row F16 head is 445 MiB). A pass multiplies the
/// head one slice of rows at a time; each slice's output columns are the
/// logits of those rows, and a backend's matmul gives an output column the
/// same bits whatever other rows the weight holds, so the logits equal a
/// resident head's.
pub trait HeadSource<B: Backend>: Send {
    /// Rows of the whole head.
    fn rows(&self) -> usize;
    /// Rows in each slice [`slice`](Self::slice) lends (the last may have
    /// fewer).
    fn slice_rows(&self) -> usize;
    /// Rows `first..first + rows` of the head as a weight, for one use:
    /// one the source holds for every pass, or one it has just read.
    fn slice(&mut self, first: usize, rows: usize) -> Result<HeadSlice<'_, B>>;
    /// The listed rows (increasing) as one weight, whose output columns
    /// are those rows' logits with the bits the whole head gives them;
    /// `None` where the source cannot gather rows.
    fn gather(&mut self, rows: &[usize]) -> Result<Option<B::Weight>> {
        let _ = rows;
        Ok(None)
    }
}

/// A slice of the output head lent by a [`HeadSource`]: held by the source
/// for every pass (the head's first rows, where the budget has room for
/// them) or read for this one.
pub enum HeadSlice<'a, B: Backend> {
    Held(&'a B::Weight),
    Read(B::Weight),
}

impl<B: Backend> Deref for HeadSlice<'_, B> {
    type Target = B::Weight;
    fn deref(&self) -> &B::Weight {
        match self {
            HeadSlice::Held(w) => w,
            HeadSlice::Read(w) => w,
        }
    }
}

impl<B: Backend> LayerWeights<B> {
    /// Builds a layer from its tensors' bytes (`bytes[i]` for `entries[i]`,
    /// one layer of [`Layout::layers`](crate::Layout::layers)); `streamed`
    /// for a layer built for one pass (see [`Backend::streamed_weight`]).
    pub fn from_bytes(
        backend: &B,
        entries: &[TensorEntry],
        bytes: &[&[u8]],
        streamed: bool,
    ) -> Result<Self> {
        Self::build(backend, entries, bytes, streamed, None)
    }

    /// A streamed layer built from bytes its weights may keep instead of
    /// copying (see [`Backend::streamed_weight_in`]): `keep[i]` for
    /// `entries[i]`.
    pub fn from_shared(backend: &B, entries: &[TensorEntry], keep: &[SharedBytes]) -> Result<Self> {
        Self::build(backend, entries, &kept_slices(keep), true, Some(keep))
    }

    fn build(
        backend: &B,
        entries: &[TensorEntry],
        bytes: &[&[u8]],
        streamed: bool,
        keep: Option<&[SharedBytes]>,
    ) -> Result<Self> {
        check_ranges(entries, bytes, keep, "layer")?;
        let at = |i: usize| (&entries[i], bytes[i], keep.map(|k| &k[i]));
        let find = |suffix: &str| {
            entries
                .iter()
                .position(|s| s.name.ends_with(suffix))
                .map(at)
        };
        let need = |suffix: &str| {
            find(suffix).ok_or_else(|| ModelError::Invalid(format!("layer has no `{suffix}`")))
        };
        let matrix = |suffix: &str| -> Result<B::Weight> {
            let (s, b, k) = need(suffix)?;
            weight(backend, s, b, streamed, k)
        };
        let vector = |suffix: &str| -> Result<Option<B::Tensor>> {
            let Some((s, b, _)) = find(suffix) else {
                return Ok(None);
            };
            if b.len() != s.len {
                return Err(ModelError::Invalid(format!("`{}`: short data", s.name)));
            }
            let data = arbor_gguf::dequantize(s.ty, b, s.cols)?;
            Ok(Some(backend.tensor(&data, 1, s.cols)?))
        };
        let required = |suffix: &str| -> Result<B::Tensor> {
            vector(suffix)?.ok_or_else(|| ModelError::Invalid(format!("layer has no `{suffix}`")))
        };
        Ok(Self {
            attn_norm: required("attn_norm.weight")?,
            attn: Attention {
                q: matrix("attn_q.weight")?,
                k: matrix("attn_k.weight")?,
                v: matrix("attn_v.weight")?,
                q_bias: vector("attn_q.bias")?,
                k_bias: vector("attn_k.bias")?,
                v_bias: vector("attn_v.bias")?,
                o: matrix("attn_output.weight")?,
            },
            ffn_norm: required("ffn_norm.weight")?,
            mlp: Mlp {
                gate: matrix("ffn_gate.weight")?,
                up: matrix("ffn_up.weight")?,
                down: match entries.iter().any(|e| e.name.contains(SEGMENT)) {
                    true => (0..entries.len())
                        .filter(|&i| entries[i].name.contains(SEGMENT))
                        .map(|i| {
                            let (e, b, k) = at(i);
                            weight(backend, e, b, streamed, k)
                        })
                        .collect::<Result<_>>()?,
                    false => vec![matrix("ffn_down.weight")?],
                },
            },
        })
    }
}

/// Errs unless there is one byte range (and one kept range, if any) per
/// entry of a `what` (a layer, a split layer's streamed part).
pub(crate) fn check_ranges(
    entries: &[TensorEntry],
    bytes: &[&[u8]],
    keep: Option<&[SharedBytes]>,
    what: &str,
) -> Result<()> {
    let n = entries.len();
    if bytes.len() == n && keep.is_none_or(|k| k.len() == n) {
        return Ok(());
    }
    Err(ModelError::Invalid(format!(
        "{} byte ranges ({} kept) for {n} {what} entries",
        bytes.len(),
        keep.map_or(0, |k| k.len())
    )))
}

/// The byte ranges of kept ones, for [`check_ranges`] and a backend that
/// copies.
pub(crate) fn kept_slices(keep: &[SharedBytes]) -> Vec<&[u8]> {
    keep.iter().map(|k| k.as_slice()).collect()
}

/// What names a down projection's column segment (`…ffn_down.weight.segK`).
pub(crate) const SEGMENT: &str = ".ffn_down.weight.seg";

/// The matrix of entry `e` from its bytes; `streamed` for one pass (see
/// [`Backend::streamed_weight`]), kept in `keep` where the backend can.
pub(crate) fn weight<B: Backend>(
    backend: &B,
    e: &TensorEntry,
    bytes: &[u8],
    streamed: bool,
    keep: Option<&SharedBytes>,
) -> Result<B::Weight> {
    let w = WeightData {
        name: &e.name,
        ty: e.ty,
        rows: e.rows,
        cols: e.cols,
        bytes,
    };
    Ok(match (streamed, keep) {
        (true, Some(k)) => backend.streamed_weight_in(w, k)?,
        (true, None) => backend.streamed_weight(w)?,
        (false, _) => backend.weight(w)?,
    })
}

/// Bytes a streamed layer holds beside its read buffers: what the backend
/// copies rather than keeps in place (norm vectors always; matrices of
/// types [`Backend::streams_in_place`] does not keep).
pub fn copied_bytes<B: Backend>(backend: &B, entries: &[TensorEntry]) -> u64 {
    entries
        .iter()
        .filter(|s| s.rows == 1 || !backend.streams_in_place(s.ty, s.rows, s.cols))
        .map(|s| held_bytes(backend, std::slice::from_ref(s)))
        .sum()
}

/// Bytes a layer holds once loaded on `backend`.
pub fn held_bytes<B: Backend>(backend: &B, entries: &[TensorEntry]) -> u64 {
    entries
        .iter()
        .map(|s| {
            if s.rows == 1 {
                (s.cols * 4) as u64
            } else {
                backend.weight_bytes(s.ty, s.rows, s.cols)
            }
        })
        .sum()
}

/// `acc +` the down projection of `act` over the neurons `range`, through
/// `segs`: the matrices holding the layer's neurons from `range.start` on,
/// in order (one matrix; an elastic file's segments between levels; a split
/// layer's held or lent ones). Column 0 of `act` is neuron `range.start`.
/// Each segment's product is added in turn, so a split layer — its held
/// segments, then its lent ones — gives the same bits as the whole layer.
pub(crate) fn down_sum<B: Backend>(
    b: &B,
    mut acc: Option<B::Tensor>,
    act: &B::Tensor,
    segs: &[B::Weight],
    d: usize,
    range: std::ops::Range<usize>,
) -> Result<B::Tensor> {
    let mut at = range.start;
    for w in segs {
        if at >= range.end {
            break;
        }
        let take = b.weight_shape(w).1.min(range.end - at);
        let narrowed;
        let x = match take == range.len() {
            true => act,
            false => {
                let from = at - range.start;
                narrowed = b.narrow_cols(act, from..from + take)?;
                &narrowed
            }
        };
        let product = part(b, x, w, d, take)?;
        acc = Some(match acc {
            Some(a) => b.add(&a, &product)?,
            None => product,
        });
        at += take;
    }
    match (acc, at == range.end) {
        (Some(acc), true) => Ok(acc),
        _ => Err(ModelError::Invalid(format!(
            "down projection segments hold neurons {}..{at}, not {range:?}",
            range.start
        ))),
    }
}

/// [`part`] plus `add` (a bias row or a residual): one matmul that adds
/// when the whole weight is multiplied (`Backend::matmul_add`), the same
/// values as adding afterwards.
pub(crate) fn part_add<B: Backend>(
    b: &B,
    x: &B::Tensor,
    w: &B::Weight,
    rows: usize,
    cols: usize,
    add: &B::Tensor,
) -> Result<B::Tensor> {
    Ok(match b.weight_shape(w) == (rows, cols) {
        true => b.matmul_add(x, w, add)?,
        false => b.add(&b.matmul_part(x, w, rows, 0..cols)?, add)?,
    })
}

/// `x` times the first `rows` outputs over the first `cols` inputs of
/// `w`: one matmul when that is the whole matrix, else the part in place.
pub(crate) fn part<B: Backend>(
    b: &B,
    x: &B::Tensor,
    w: &B::Weight,
    rows: usize,
    cols: usize,
) -> Result<B::Tensor> {
    Ok(match b.weight_shape(w) == (rows, cols) {
        true => b.matmul(x, w)?,
        false => b.matmul_part(x, w, rows, 0..cols)?,
    })
}

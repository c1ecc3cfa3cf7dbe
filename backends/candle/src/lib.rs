//! The CPU backend: activations are plain host `f32` matrices, weights stay
//! in their GGUF quantized blocks and every matmul runs on them. Nothing is
//! dequantized in full.
//!
//! Q5_0, Q8_0, Q4_K and Q6_K matrices run on our own kernels ([`qmm`], see
//! `docs/cpu-kernels.md`) wherever the CPU has AVX2, FMA and F16C: a token's
//! results never depend on the other tokens of its batch (speculative
//! decoding verifies many tokens at once and must reproduce one-token
//! decoding bit for bit), and they equal ggml's dot products bit for bit.
//!
//! Other types, other CPUs, and [`CandleBackend::with_candle_kernels`] use
//! candle-core's kernels. For those, Q5_0 matrices are repacked to Q8_0
//! when loaded: the same 32-element blocks and scale, with `q8 = q5 - 16`,
//! so the numbers are identical while candle's Q8_0 path is several times
//! faster than its Q5_0 one (at 34/22 of the bytes). Among candle's paths,
//! Q6_K never takes candle's repacked tile kernels (they round differently
//! with the batch size): we call its plain block matmul at every batch
//! size. Q4_K (and Q8_0 on VNNI CPUs) go through candle's tiles at every
//! batch size; we keep only the tiles and free the GGUF blocks (see
//! [`packed`]).
//!
//! Small ops (norms, RoPE, SwiGLU, attention) are written here over slices,
//! attention shares out its (query, head) pairs to candle's thread pool
//! where it is big enough to matter.

use std::borrow::Cow;

mod packed;
mod qmm;

use arbor_tensor::{Backend, Error, GgmlType, Heads, Mask, Result, Rope, WeightData, reference};
use candle_core::quantized::k_quants::{self, BlockQ6K};
use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor};
use half::slice::HalfFloatSliceExt;

const NAME: &str = "candle";

fn err(e: impl std::fmt::Display) -> Error {
    Error::Backend {
        backend: NAME,
        message: e.to_string(),
    }
}

fn shape_err(op: &'static str, detail: String) -> Error {
    Error::Shape { op, detail }
}

/// A row-major `f32` matrix on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub data: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
}

/// A weight matrix: GGUF blocks under our kernels ([`qmm`]), or candle's
/// quantized (or float) form.
pub struct CandleWeight {
    mm: Held,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    held: u64,
}

impl CandleWeight {
    /// The type the weight is held in (Q8_0 for a Q5_0 repacked for
    /// candle's kernels).
    pub fn held_as(&self) -> GgmlType {
        self.ty
    }

    /// Bytes the weight holds.
    pub fn held_bytes(&self) -> u64 {
        self.held
    }
}

enum Held {
    Own(qmm::QWeight),
    Candle(QMatMul),
}

/// The Q6_K blocks of a weight, borrowed from candle's storage, or `None`
/// for other types.
fn q6k_blocks(mm: &QMatMul) -> Option<&[BlockQ6K]> {
    let QMatMul::QTensor(qt) = mm else {
        return None;
    };
    if qt.dtype() != GgmlDType::Q6K {
        return None;
    }
    // On the CPU the data is borrowed from candle's `Vec<BlockQ6K>`.
    let Ok(Cow::Borrowed(bytes)) = qt.data() else {
        return None;
    };
    let size = std::mem::size_of::<BlockQ6K>();
    let aligned = (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<BlockQ6K>());
    if !aligned || !bytes.len().is_multiple_of(size) {
        return None;
    }
    // SAFETY: aligned and whole blocks (checked); BlockQ6K is a repr(C)
    // struct of byte arrays and an f16 with no padding (candle asserts its
    // size), so the bytes are valid blocks.
    Some(unsafe {
        std::slice::from_raw_parts(bytes.as_ptr() as *const BlockQ6K, bytes.len() / size)
    })
}

/// One layer's KV cache: `len` rows of `kv_dim` keys and values.
#[derive(Debug, Clone, Default)]
pub struct HostKv {
    k: Vec<f32>,
    v: Vec<f32>,
    kv_dim: usize,
    len: usize,
}

/// The candle CPU backend.
///
/// By default attention follows llama.cpp's CPU numerics: keys and values
/// are cached as f16, and the query and the attention weights are rounded
/// to f16 before their products (accumulation stays f32). Greedy outputs
/// then match llama.cpp's token for token where two candidates are within
/// a few hundredths of a logit, which f32 attention does not.
///
/// Q5_0, Q8_0, Q4_K and Q6_K matrices run on our own kernels
/// ([`qmm`]) where the CPU has AVX2, FMA and F16C; elsewhere, or with
/// [`CandleBackend::with_candle_kernels`] (or `ARBOR_CANDLE_KERNELS=1` in
/// the environment), on candle's.
#[derive(Debug, Clone)]
pub struct CandleBackend {
    f16_attention: bool,
    candle_kernels: bool,
}

impl Default for CandleBackend {
    fn default() -> Self {
        Self {
            f16_attention: true,
            candle_kernels: std::env::var("ARBOR_CANDLE_KERNELS").as_deref() == Ok("1"),
        }
    }
}

impl CandleBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// Attention entirely in f32 (slightly more precise, no longer
    /// llama.cpp's numerics).
    pub fn with_f32_attention() -> Self {
        Self {
            f16_attention: false,
            ..Self::default()
        }
    }

    /// Every matmul on candle-core's own kernels (the baseline ours are
    /// measured against).
    pub fn with_candle_kernels(self) -> Self {
        Self {
            candle_kernels: true,
            ..self
        }
    }

    /// This backend with the matmul kernels it runs here:
    /// `candle-qmm3-vnni`, `candle-qmm3-avx2` (ours, see [`qmm`]) or
    /// `candle` (candle-core's). Anything measured with one (latency
    /// profiles) is stale for another; the number changes when our kernels'
    /// speeds do.
    pub fn kernels(&self) -> &'static str {
        if self.candle_kernels || !qmm::available() {
            return NAME;
        }
        #[cfg(target_arch = "x86_64")]
        if qmm::vnni() {
            return "candle-qmm3-vnni";
        }
        "candle-qmm3-avx2"
    }

    /// Whether `ty` (as held) multiplies on our kernels.
    fn own_kernel(&self, ty: GgmlType) -> bool {
        !self.candle_kernels && qmm::Kind::of(ty).is_some() && qmm::available()
    }

    /// The type a weight of type `ty` is held in: candle's kernels get Q5_0
    /// repacked to Q8_0 (candle has no fast Q5_0 path).
    fn held_type(&self, ty: GgmlType) -> GgmlType {
        if ty == GgmlType::Q5_0 && !self.own_kernel(ty) {
            GgmlType::Q8_0
        } else {
            ty
        }
    }

    /// The type and bytes a weight is held in.
    fn held_form<'a>(&self, w: &WeightData<'a>) -> Result<(GgmlType, Cow<'a, [u8]>)> {
        Ok(match self.held_type(w.ty) {
            GgmlType::Q8_0 if w.ty == GgmlType::Q5_0 => (
                GgmlType::Q8_0,
                Cow::Owned(arbor_gguf::quant::repack_q5_0_to_q8_0(w.bytes)?),
            ),
            ty => (ty, Cow::Borrowed(w.bytes)),
        })
    }
}

fn candle_dtype(ty: GgmlType) -> GgmlDType {
    match ty {
        GgmlType::F32 => GgmlDType::F32,
        GgmlType::F16 => GgmlDType::F16,
        GgmlType::BF16 => GgmlDType::BF16,
        GgmlType::Q4_0 => GgmlDType::Q4_0,
        GgmlType::Q4_1 => GgmlDType::Q4_1,
        GgmlType::Q5_0 => GgmlDType::Q5_0,
        GgmlType::Q5_1 => GgmlDType::Q5_1,
        GgmlType::Q8_0 => GgmlDType::Q8_0,
        GgmlType::Q8_1 => GgmlDType::Q8_1,
        GgmlType::Q2_K => GgmlDType::Q2K,
        GgmlType::Q3_K => GgmlDType::Q3K,
        GgmlType::Q4_K => GgmlDType::Q4K,
        GgmlType::Q5_K => GgmlDType::Q5K,
        GgmlType::Q6_K => GgmlDType::Q6K,
        GgmlType::Q8_K => GgmlDType::Q8K,
    }
}

fn to_candle(x: &HostTensor) -> Result<Tensor> {
    Tensor::from_slice(&x.data, (x.rows, x.cols), &Device::Cpu).map_err(err)
}

fn from_candle(t: &Tensor) -> Result<HostTensor> {
    let (rows, cols) = t.dims2().map_err(err)?;
    let data = t
        .flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(err)?;
    Ok(HostTensor { data, rows, cols })
}

fn check_weight(w: &WeightData<'_>) -> Result<()> {
    let expected =
        w.ty.bytes_for((w.rows * w.cols) as u64)
            .filter(|&b| b == w.bytes.len() as u64);
    if expected.is_none() || !w.cols.is_multiple_of(w.ty.block_len()) {
        return Err(shape_err(
            "weight",
            format!(
                "`{}`: {} bytes of {} do not make a {}x{} matrix",
                w.name,
                w.bytes.len(),
                w.ty,
                w.rows,
                w.cols
            ),
        ));
    }
    Ok(())
}

/// Attention with fewer (query row × key × head) scores than this runs on
/// the calling thread.
const PARALLEL_ATTENTION_MIN: usize = 1 << 10;

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators so the compiler vectorises the loop.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

fn axpy(out: &mut [f32], w: f32, x: &[f32]) {
    for (o, v) in out.iter_mut().zip(x) {
        *o += w * v;
    }
}

impl Backend for CandleBackend {
    type Tensor = HostTensor;
    type Weight = CandleWeight;
    type Kv = HostKv;

    fn name(&self) -> &'static str {
        NAME
    }

    fn weight(&self, w: WeightData<'_>) -> Result<CandleWeight> {
        self.weight_with(w, true)
    }

    /// K-quant layers streamed under a memory budget keep their GGUF rows:
    /// interleaving them would cost more per pass than it saves.
    fn streamed_weight(&self, w: WeightData<'_>) -> Result<CandleWeight> {
        self.weight_with(w, false)
    }

    fn embedding_table(&self, w: WeightData<'_>) -> Result<CandleWeight> {
        check_weight(&w)?;
        // Our kernels' weights look rows up from their blocks (a tied table
        // is also the output head); candle's tiles cannot.
        if self.own_kernel(self.held_type(w.ty)) {
            return self.weight(w);
        }
        let (ty, bytes) = self.held_form(&w)?;
        self.plain_weight(ty, &w, bytes)
    }

    fn weight_bytes(&self, ty: GgmlType, rows: usize, cols: usize) -> u64 {
        let held = self.held_type(ty);
        // Our kernels hold the blocks; candle may hold tiles instead.
        let tiles = if self.own_kernel(held) {
            None
        } else {
            packed::tiles_for(candle_dtype(held), rows, cols)
        };
        tiles
            .map(|b| b as u64)
            .or_else(|| held.bytes_for((rows * cols) as u64))
            .unwrap_or(0)
    }

    fn tensor(&self, data: &[f32], rows: usize, cols: usize) -> Result<HostTensor> {
        if data.len() != rows * cols {
            return Err(shape_err(
                "tensor",
                format!("{} values for a {rows}x{cols} tensor", data.len()),
            ));
        }
        Ok(HostTensor {
            data: data.to_vec(),
            rows,
            cols,
        })
    }

    fn shape(&self, x: &HostTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn to_vec(&self, x: &HostTensor) -> Result<Vec<f32>> {
        Ok(x.data.clone())
    }

    fn embed(&self, table: &CandleWeight, ids: &[u32]) -> Result<HostTensor> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= table.rows) {
            return Err(shape_err(
                "embed",
                format!("token id {bad} is outside a vocabulary of {}", table.rows),
            ));
        }
        let mm = match &table.mm {
            Held::Candle(mm) => mm,
            Held::Own(q) => {
                let rows: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
                let data =
                    arbor_gguf::dequantize(table.ty, &q.gguf_rows(&rows), rows.len() * table.cols)
                        .map_err(err)?;
                return Ok(HostTensor {
                    data,
                    rows: ids.len(),
                    cols: table.cols,
                });
            }
        };
        let ids = Tensor::from_slice(ids, ids.len(), &Device::Cpu).map_err(err)?;
        from_candle(&mm.embedding(&ids).map_err(err)?)
    }

    fn matmul(&self, x: &HostTensor, w: &CandleWeight) -> Result<HostTensor> {
        if x.cols != w.cols {
            return Err(shape_err(
                "matmul",
                format!(
                    "x is [{}, {}], weight is [{}, {}]",
                    x.rows, x.cols, w.rows, w.cols
                ),
            ));
        }
        let mut data = vec![0f32; x.rows * w.rows];
        match &w.mm {
            Held::Own(q) => q.matmul(&x.data, x.rows, &mut data),
            Held::Candle(mm) => match q6k_blocks(mm) {
                Some(blocks) => {
                    k_quants::matmul((x.rows, x.cols, w.rows), &x.data, blocks, &mut data)
                        .map_err(err)?
                }
                None => return from_candle(&mm.forward(&to_candle(x)?).map_err(err)?),
            },
        }
        Ok(HostTensor {
            data,
            rows: x.rows,
            cols: w.rows,
        })
    }

    fn add(&self, a: &HostTensor, b: &HostTensor) -> Result<HostTensor> {
        if a.cols != b.cols || (b.rows != a.rows && b.rows != 1) {
            return Err(shape_err(
                "add",
                format!("[{}, {}] + [{}, {}]", a.rows, a.cols, b.rows, b.cols),
            ));
        }
        let mut out = a.clone();
        for (i, row) in out.data.chunks_exact_mut(a.cols).enumerate() {
            let brow = &b.data[(i % b.rows) * b.cols..][..b.cols];
            for (o, v) in row.iter_mut().zip(brow) {
                *o += v;
            }
        }
        Ok(out)
    }

    fn swiglu(&self, gate: &HostTensor, up: &HostTensor) -> Result<HostTensor> {
        if (gate.rows, gate.cols) != (up.rows, up.cols) {
            return Err(shape_err("swiglu", "gate and up differ in shape".into()));
        }
        let data = gate
            .data
            .iter()
            .zip(&up.data)
            .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        Ok(HostTensor { data, ..*gate })
    }

    fn rms_norm(&self, x: &HostTensor, weight: &HostTensor, eps: f32) -> Result<HostTensor> {
        if weight.data.len() != x.cols {
            return Err(shape_err(
                "rms_norm",
                format!(
                    "weight has {} values for {} columns",
                    weight.data.len(),
                    x.cols
                ),
            ));
        }
        let mut out = x.clone();
        for row in out.data.chunks_exact_mut(x.cols) {
            let ms = dot(row, row) / x.cols as f32;
            let scale = 1.0 / (ms + eps).sqrt();
            for (o, w) in row.iter_mut().zip(&weight.data) {
                *o *= scale * w;
            }
        }
        Ok(out)
    }

    fn rope(&self, x: &HostTensor, positions: &[u32], rope: &Rope) -> Result<HostTensor> {
        let d = rope.head_dim;
        if positions.len() != x.rows || d == 0 || !d.is_multiple_of(2) || !x.cols.is_multiple_of(d)
        {
            return Err(shape_err(
                "rope",
                format!(
                    "{} positions for [{}, {}] with head_dim {d}",
                    positions.len(),
                    x.rows,
                    x.cols
                ),
            ));
        }
        let mut out = x.clone();
        reference::rope(&mut out.data, x.cols, positions, rope);
        Ok(out)
    }

    fn select_rows(&self, x: &HostTensor, rows: &[usize]) -> Result<HostTensor> {
        let mut data = Vec::with_capacity(rows.len() * x.cols);
        for &r in rows {
            if r >= x.rows {
                return Err(shape_err("select_rows", format!("row {r} of {}", x.rows)));
            }
            data.extend_from_slice(&x.data[r * x.cols..][..x.cols]);
        }
        Ok(HostTensor {
            data,
            rows: rows.len(),
            cols: x.cols,
        })
    }

    fn kv_new(&self, heads: &Heads) -> Result<HostKv> {
        Ok(HostKv {
            kv_dim: heads.n_kv_heads * heads.head_dim,
            ..HostKv::default()
        })
    }

    fn kv_len(&self, kv: &HostKv) -> usize {
        kv.len
    }

    fn kv_append(&self, kv: &mut HostKv, k: &HostTensor, v: &HostTensor) -> Result<()> {
        if k.cols != kv.kv_dim || v.cols != kv.kv_dim || k.rows != v.rows {
            return Err(shape_err(
                "kv_append",
                format!(
                    "k [{}, {}], v [{}, {}] into a cache of width {}",
                    k.rows, k.cols, v.rows, v.cols, kv.kv_dim
                ),
            ));
        }
        kv.k.extend_from_slice(&self.round(&k.data));
        kv.v.extend_from_slice(&self.round(&v.data));
        kv.len += k.rows;
        Ok(())
    }

    fn kv_truncate(&self, kv: &mut HostKv, len: usize) -> Result<()> {
        if len > kv.len {
            return Err(shape_err(
                "kv_truncate",
                format!("to {len} of {} positions", kv.len),
            ));
        }
        kv.k.truncate(len * kv.kv_dim);
        kv.v.truncate(len * kv.kv_dim);
        kv.len = len;
        Ok(())
    }

    fn kv_keep(&self, kv: &mut HostKv, positions: &[usize]) -> Result<()> {
        if positions.windows(2).any(|w| w[0] >= w[1])
            || positions.last().is_some_and(|&p| p >= kv.len)
        {
            return Err(shape_err(
                "kv_keep",
                format!("positions must increase and stay below {}", kv.len),
            ));
        }
        let d = kv.kv_dim;
        // Positions increase, so each row moves down (or stays): copying in
        // order never overwrites a row still to be read.
        for (dst, &src) in positions.iter().enumerate() {
            kv.k.copy_within(src * d..(src + 1) * d, dst * d);
            kv.v.copy_within(src * d..(src + 1) * d, dst * d);
        }
        self.kv_truncate(kv, positions.len())
    }

    fn attention(&self, q: &HostTensor, kv: &HostKv, mask: &Mask, h: &Heads) -> Result<HostTensor> {
        let d = h.head_dim;
        if q.cols != h.n_heads * d
            || kv.kv_dim != h.n_kv_heads * d
            || !h.n_heads.is_multiple_of(h.n_kv_heads)
        {
            return Err(shape_err(
                "attention",
                format!("q [{}, {}] with heads {h:?}", q.rows, q.cols),
            ));
        }
        mask.validate(q.rows, kv.len)?;
        let q = HostTensor {
            data: self.round(&q.data).into_owned(),
            ..*q
        };
        let (n, t, kvd, group) = (q.rows, kv.len, kv.kv_dim, h.n_heads / h.n_kv_heads);
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0f32; n * q.cols];
        // One task per (query row, head): each writes its own slice of `out`.
        let one = |(task, o): (usize, &mut [f32])| {
            let (i, head) = (task / h.n_heads, task % h.n_heads);
            let kvh = head / group;
            let qi = &q.data[i * q.cols + head * d..][..d];
            let allowed = &mask.allowed[i * t..(i + 1) * t];
            let mut scores: Vec<(usize, f32)> = allowed
                .iter()
                .enumerate()
                .filter(|(_, a)| **a)
                .map(|(j, _)| (j, dot(qi, &kv.k[j * kvd + kvh * d..][..d]) * scale))
                .collect();
            let max = scores.iter().map(|s| s.1).fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                s.1 = (s.1 - max).exp();
                sum += s.1;
            }
            for (j, s) in scores {
                axpy(o, self.round_one(s / sum), &kv.v[j * kvd + kvh * d..][..d]);
            }
        };
        // On the matmuls' spinning pool: even one decode step's attention
        // (tens of microseconds per layer) outweighs its hand-off, and the
        // pool's other thread would otherwise spin idle meanwhile.
        if n * t * h.n_heads < PARALLEL_ATTENTION_MIN {
            out.chunks_mut(d).enumerate().for_each(one);
        } else {
            let at = qmm::SendPtr(out.as_mut_ptr());
            candle_core::utils::barrier_pool().execute_chunked(n * h.n_heads, |tasks| {
                for task in tasks {
                    // SAFETY: task `task` owns `out[task * d..][..d]`, and
                    // `out` outlives the pool call.
                    let o = unsafe { std::slice::from_raw_parts_mut(at.get().add(task * d), d) };
                    one((task, o));
                }
            });
        }
        Ok(HostTensor {
            data: out,
            rows: n,
            cols: q.cols,
        })
    }
}

impl CandleBackend {
    /// [`Backend::weight`], K-quant rows interleaved or not (see
    /// [`qmm::QWeight::with_layout`]).
    fn weight_with(&self, w: WeightData<'_>, interleave: bool) -> Result<CandleWeight> {
        check_weight(&w)?;
        let (ty, bytes) = self.held_form(&w)?;
        if self.own_kernel(ty)
            && let Some(q) = qmm::QWeight::with_layout(ty, w.rows, w.cols, &bytes, interleave)
        {
            return Ok(CandleWeight {
                held: q.held_bytes(),
                mm: Held::Own(q),
                ty,
                rows: w.rows,
                cols: w.cols,
            });
        }
        if let Some(mm) = packed::pack(candle_dtype(ty), w.rows, w.cols, &bytes).map_err(err)? {
            return Ok(CandleWeight {
                mm: Held::Candle(mm),
                ty,
                rows: w.rows,
                cols: w.cols,
                held: self.weight_bytes(w.ty, w.rows, w.cols),
            });
        }
        self.plain_weight(ty, &w, bytes)
    }

    /// A weight in candle's ordinary block storage.
    fn plain_weight(
        &self,
        ty: GgmlType,
        w: &WeightData<'_>,
        bytes: Cow<[u8]>,
    ) -> Result<CandleWeight> {
        let held = bytes.len() as u64;
        let storage = QStorage::from_data(bytes, &Device::Cpu, candle_dtype(ty)).map_err(err)?;
        let qt = QTensor::new(storage, (w.rows, w.cols)).map_err(err)?;
        let mm = QMatMul::from_qtensor(qt).map_err(err)?;
        Ok(CandleWeight {
            mm: Held::Candle(mm),
            ty,
            rows: w.rows,
            cols: w.cols,
            held,
        })
    }

    /// Values as the attention sees them: rounded to f16 (exactly
    /// representable in the f32 they are kept in) unless f32 attention was
    /// asked for.
    fn round<'a>(&self, x: &'a [f32]) -> Cow<'a, [f32]> {
        if !self.f16_attention {
            return Cow::Borrowed(x);
        }
        let mut h = vec![half::f16::ZERO; x.len()];
        h.convert_from_f32_slice(x);
        let mut out = vec![0f32; x.len()];
        h.convert_to_f32_slice(&mut out);
        Cow::Owned(out)
    }

    fn round_one(&self, x: f32) -> f32 {
        if self.f16_attention {
            half::f16::from_f32(x).to_f32()
        } else {
            x
        }
    }
}

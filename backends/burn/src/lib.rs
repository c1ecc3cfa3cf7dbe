//! [`arbor_tensor::Backend`] on burn 0.22 tensors.
//!
//! burn 0.22 picks the backend at run time from the [`Device`]: the same
//! code runs on `flex` (pure-Rust CPU), `ndarray` (CPU) and `wgpu` (GPU, or
//! Mesa's lavapipe without one); Cargo features of the same names decide
//! which are compiled in.
//!
//! On the CPU devices weights are dequantized to `f32` on load and stored
//! transposed (`[in, out]`), so a matmul is a plain `x · w`. On CubeCL
//! devices (wgpu, CUDA) quantized weights stay in their GGUF blocks and our
//! kernels multiply them (`cube`), so they take about their file size of
//! GPU memory. Every other op runs as burn tensor ops; only small per-call
//! tables (RoPE angles, the attention mask bias, index lists) are built on
//! the host and uploaded.
//!
//! burn checks shapes by panicking, so every op validates its inputs first
//! and reports mismatches as [`arbor_tensor::Error::Shape`].

use arbor_tensor::{GgmlType, HeadOrder, Heads, Mask, Result, Rope, RopeStyle, WeightData};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::{DType, Device, Tensor, s};
use devices::shape_err;

#[cfg(feature = "cube")]
mod cube;
mod devices;
mod weight;

pub use weight::BurnWeight;

#[cfg(not(any(feature = "flex", feature = "ndarray", feature = "wgpu")))]
compile_error!("arbor-backend-burn needs at least one of the features flex, ndarray, wgpu");

/// A backend running on one burn device.
#[derive(Clone, Debug)]
pub struct BurnBackend {
    device: Device,
    name: &'static str,
    /// Keep quantized weights in their GGUF blocks (CubeCL devices).
    #[cfg(feature = "cube")]
    blocks: bool,
    /// The largest device buffer one weight's blocks go in.
    #[cfg(feature = "cube")]
    max_buffer: usize,
    /// Uploads the layers of a pass share (RoPE angles, the mask).
    #[cfg(feature = "cube")]
    pass: std::sync::Arc<cube::PassCache>,
    resident: weight::Resident,
}

/// A 2-D `f32` activation matrix on the device.
#[derive(Clone, Debug)]
pub struct BurnTensor(Tensor<2>);

impl BurnTensor {
    /// The underlying burn tensor.
    pub fn inner(&self) -> &Tensor<2> {
        &self.0
    }

    /// Wraps a burn tensor (`[rows, cols]`, `f32`).
    pub fn from_inner(t: Tensor<2>) -> Self {
        Self(t)
    }
}

#[cfg(feature = "train")]
impl BurnBackend {
    /// A `[rows, cols]` tensor whose gradient a later `backward` keeps:
    /// what a pass computes from it is tracked, weights and caches stay
    /// constants.
    pub fn leaf(&self, data: &[f32], rows: usize, cols: usize) -> Result<BurnTensor> {
        let t = arbor_tensor::Backend::tensor(self, data, rows, cols)?;
        Ok(BurnTensor(t.0.autodiff().require_grad()))
    }

    /// The gradients of the single value in `loss` (`[1, 1]`) with respect
    /// to each of `leaves` from one backward pass (`None` for a leaf the
    /// loss does not depend on).
    pub fn gradients(
        &self,
        loss: &BurnTensor,
        leaves: &[&BurnTensor],
    ) -> Result<Vec<Option<Vec<f32>>>> {
        if loss.0.dims() != [1, 1] {
            return Err(shape_err(
                "gradient",
                format!("a loss of {:?}", loss.0.dims()),
            ));
        }
        if !loss.0.is_tracked() {
            return Err(self.err("the loss was computed from no tracked leaf"));
        }
        let grads = loss.0.backward();
        leaves
            .iter()
            .map(|leaf| match leaf.0.grad(&grads) {
                Some(g) => Ok(Some(g.try_to_vec_as::<f32>().map_err(|e| self.err(e))?)),
                None => Ok(None),
            })
            .collect()
    }

    /// The gradient of the single value in `loss` (`[1, 1]`) with respect
    /// to `leaf`, as host values (`None` when `loss` does not depend on
    /// it). The backward pass consumes `loss`'s graph: one call per loss.
    pub fn gradient(&self, loss: &BurnTensor, leaf: &BurnTensor) -> Result<Option<Vec<f32>>> {
        Ok(self.gradients(loss, &[leaf])?.pop().flatten())
    }
}

/// One layer's KV cache: K and V as `[n_kv_heads, capacity, head_dim]`
/// device buffers of which the first `len` positions are valid. Appends
/// write into spare capacity; when full the buffers double.
#[derive(Debug)]
pub struct BurnKv {
    k: Option<Tensor<3>>,
    v: Option<Tensor<3>>,
    len: usize,
    cap: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

impl arbor_tensor::Backend for BurnBackend {
    type Tensor = BurnTensor;
    type Weight = BurnWeight;
    type Kv = BurnKv;

    fn name(&self) -> &'static str {
        self.name
    }

    fn weight(&self, w: WeightData<'_>) -> Result<BurnWeight> {
        self.load_weight(w, true)
    }

    fn streamed_weight(&self, w: WeightData<'_>) -> Result<BurnWeight> {
        self.load_weight(w, false)
    }

    fn device_reserved_bytes(&self) -> Option<u64> {
        self.device_memory().map(|(reserved, _)| reserved)
    }

    fn weight_bytes(&self, ty: GgmlType, rows: usize, cols: usize) -> u64 {
        self.bytes_of_weight(ty, rows, cols)
    }

    fn tensor(&self, data: &[f32], rows: usize, cols: usize) -> Result<BurnTensor> {
        self.tensor_from_vec(data.to_vec(), rows, cols)
    }

    fn tensor_from_vec(&self, data: Vec<f32>, rows: usize, cols: usize) -> Result<BurnTensor> {
        if data.len() != rows * cols {
            return Err(shape_err(
                "tensor",
                format!("{} values for [{rows}, {cols}]", data.len()),
            ));
        }
        Ok(BurnTensor(self.upload(data, [rows, cols])))
    }

    fn shape(&self, x: &BurnTensor) -> (usize, usize) {
        let [r, c] = x.0.dims();
        (r, c)
    }

    fn to_vec(&self, x: &BurnTensor) -> Result<Vec<f32>> {
        x.0.try_to_vec_as::<f32>().map_err(|e| self.err(e))
    }

    fn embed(&self, table: &BurnWeight, ids: &[u32]) -> Result<BurnTensor> {
        self.weight_embed(table, ids)
    }

    fn matmul(&self, x: &BurnTensor, w: &BurnWeight) -> Result<BurnTensor> {
        let [_, k] = x.0.dims();
        let (rows, cols) = w.shape();
        if k != cols {
            return Err(shape_err(
                "matmul",
                format!("x {:?} times a [{rows}, {cols}] weight", x.0.dims()),
            ));
        }
        self.weight_matmul(x, w, rows, 0..cols, None)
    }

    fn matmul_add(&self, x: &BurnTensor, w: &BurnWeight, add: &BurnTensor) -> Result<BurnTensor> {
        let [n, k] = x.0.dims();
        let (rows, cols) = w.shape();
        let [ar, ac] = add.0.dims();
        if k != cols || ac != rows || (ar != 1 && ar != n) {
            return Err(shape_err(
                "matmul_add",
                format!(
                    "x {:?} times a [{rows}, {cols}] weight plus [{ar}, {ac}]",
                    x.0.dims()
                ),
            ));
        }
        self.weight_matmul(x, w, rows, 0..cols, Some(add))
    }

    fn narrow_cols(&self, x: &BurnTensor, cols: std::ops::Range<usize>) -> Result<BurnTensor> {
        let [n, c] = x.0.dims();
        if cols.start >= cols.end || cols.end > c {
            return Err(shape_err(
                "narrow_cols",
                format!("columns {cols:?} of [{n}, {c}]"),
            ));
        }
        Ok(BurnTensor(x.0.clone().slice(s![0..n, cols])))
    }

    fn weight_shape(&self, w: &BurnWeight) -> (usize, usize) {
        w.shape()
    }

    /// A slice of the weight (burn may copy a dense one; gradients flow
    /// through `x` as through [`arbor_tensor::Backend::matmul`]).
    fn matmul_part(
        &self,
        x: &BurnTensor,
        w: &BurnWeight,
        rows: usize,
        cols: std::ops::Range<usize>,
    ) -> Result<BurnTensor> {
        self.weight_matmul(x, w, rows, cols, None)
    }

    fn matmul_tensor(&self, x: &BurnTensor, m: &BurnTensor) -> Result<BurnTensor> {
        let ([xr, xc], [mr, mc]) = (x.0.dims(), m.0.dims());
        if xc != mr {
            return Err(shape_err(
                "matmul_tensor",
                format!("[{xr}, {xc}] · [{mr}, {mc}]"),
            ));
        }
        Ok(BurnTensor(x.0.clone().matmul(m.0.clone())))
    }

    fn add(&self, a: &BurnTensor, b: &BurnTensor) -> Result<BurnTensor> {
        let ([ar, ac], [br, bc]) = (a.0.dims(), b.0.dims());
        if ac != bc || (br != ar && br != 1) {
            return Err(shape_err("add", format!("[{ar}, {ac}] + [{br}, {bc}]")));
        }
        Ok(BurnTensor(a.0.clone() + b.0.clone()))
    }

    fn scale_cols(&self, x: &BurnTensor, s: &BurnTensor) -> Result<BurnTensor> {
        let ([_, xc], [sr, sc]) = (x.0.dims(), s.0.dims());
        if sr != 1 || sc != xc {
            return Err(shape_err(
                "scale_cols",
                format!("x {:?} by [{sr}, {sc}]", x.0.dims()),
            ));
        }
        Ok(BurnTensor(x.0.clone() * s.0.clone()))
    }

    fn swiglu(&self, gate: &BurnTensor, up: &BurnTensor) -> Result<BurnTensor> {
        Self::check_same("swiglu", &gate.0, &up.0)?;
        #[cfg(feature = "cube")]
        if self.own_kernels(&gate.0) && self.own_kernels(&up.0) {
            return Ok(BurnTensor(cube::swiglu(&gate.0, &up.0)?));
        }
        Ok(BurnTensor(silu(gate.0.clone()) * up.0.clone()))
    }

    fn rms_norm(&self, x: &BurnTensor, weight: &BurnTensor, eps: f32) -> Result<BurnTensor> {
        let ([_, c], [wr, wc]) = (x.0.dims(), weight.0.dims());
        if wr != 1 || wc != c {
            return Err(shape_err(
                "rms_norm",
                format!("x {:?} with weight [{wr}, {wc}]", x.0.dims()),
            ));
        }
        #[cfg(feature = "cube")]
        if self.own_kernels(&x.0) {
            return Ok(BurnTensor(cube::rms_norm(&x.0, &weight.0, eps)?));
        }
        let x = x.0.clone();
        let inv = x
            .clone()
            .square()
            .mean_dim(1)
            .add_scalar(eps)
            .sqrt()
            .recip();
        Ok(BurnTensor(x * inv * weight.0.clone()))
    }

    fn rope(&self, x: &BurnTensor, positions: &[u32], rope: &Rope) -> Result<BurnTensor> {
        let [n, c] = x.0.dims();
        let d = rope.head_dim;
        if d == 0 || !d.is_multiple_of(2) || !c.is_multiple_of(d) || positions.len() != n {
            return Err(shape_err(
                "rope",
                format!("x [{n}, {c}], head_dim {d}, {} positions", positions.len()),
            ));
        }
        #[cfg(feature = "cube")]
        if self.own_kernels(&x.0) {
            let y = cube::rope(&self.device, &self.pass, &x.0, positions, rope)?;
            return Ok(BurnTensor(y));
        }
        let (heads, half) = (c / d, d / 2);
        // Angles on the host, exactly as the reference computes them.
        let freqs = rope.inv_freq();
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for &p in positions {
            for f in &freqs {
                let (s, c) = (p as f32 * f).sin_cos();
                sin.push(s);
                cos.push(c);
            }
        }
        // Lay each head out as [.., 2, half] (halves) or [.., half, 2]
        // (interleaved pairs) and rotate the two parts.
        let (shape, cs_shape, pair_dim) = match rope.style {
            RopeStyle::Halves => ([n, heads, 2, half], [n, 1, 1, half], 2),
            RopeStyle::Interleaved => ([n, heads, half, 2], [n, 1, half, 1], 3),
        };
        let cos = self.upload(cos, cs_shape);
        let sin = self.upload(sin, cs_shape);
        let x4: Tensor<4> = x.0.clone().reshape(shape);
        let x0 = x4.clone().narrow(pair_dim, 0, 1);
        let x1 = x4.narrow(pair_dim, 1, 1);
        let y0 = x0.clone() * cos.clone() - x1.clone() * sin.clone();
        let y1 = x0 * sin + x1 * cos;
        let y = Tensor::cat(vec![y0, y1], pair_dim);
        Ok(BurnTensor(y.reshape([n, c])))
    }

    fn select_rows(&self, x: &BurnTensor, rows: &[usize]) -> Result<BurnTensor> {
        let [r, _] = x.0.dims();
        if rows.is_empty() || rows.iter().any(|&i| i >= r) {
            return Err(shape_err(
                "select_rows",
                format!("rows {rows:?} of a {r}-row tensor"),
            ));
        }
        Ok(BurnTensor(
            x.0.clone().select(0, self.indices(rows.iter().copied())),
        ))
    }

    fn kv_new(&self, heads: &Heads) -> Result<BurnKv> {
        if heads.n_kv_heads == 0 || heads.head_dim == 0 {
            return Err(shape_err("kv_new", format!("{heads:?}")));
        }
        Ok(BurnKv {
            k: None,
            v: None,
            len: 0,
            cap: 0,
            n_kv_heads: heads.n_kv_heads,
            head_dim: heads.head_dim,
        })
    }

    fn kv_len(&self, kv: &BurnKv) -> usize {
        kv.len
    }

    fn kv_append(&self, kv: &mut BurnKv, k: &BurnTensor, v: &BurnTensor) -> Result<()> {
        let (h, d) = (kv.n_kv_heads, kv.head_dim);
        let [n, c] = k.0.dims();
        if c != h * d || v.0.dims() != [n, c] {
            return Err(shape_err(
                "kv_append",
                format!(
                    "k {:?}, v {:?} into a cache of {h} heads × {d}",
                    k.0.dims(),
                    v.0.dims()
                ),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let (len, need) = (kv.len, kv.len + n);
        if need > kv.cap {
            let cap = need.max(2 * kv.cap).max(16);
            let grow = |old: Option<Tensor<3>>| {
                let fresh = Tensor::<3>::zeros([h, cap, d], (&self.device, DType::F32));
                match old {
                    Some(old) if len > 0 => {
                        fresh.slice_assign(s![.., 0..len, ..], old.narrow(1, 0, len))
                    }
                    _ => fresh,
                }
            };
            kv.k = Some(grow(kv.k.take()));
            kv.v = Some(grow(kv.v.take()));
            kv.cap = cap;
        }
        // [n, h*d] → [h, n, d], written at positions len..len+n.
        let heads_first = |t: &Tensor<2>| t.clone().reshape([n, h, d]).swap_dims(0, 1);
        let write = |buf: Option<Tensor<3>>, new: Tensor<3>| {
            buf.map(|b| b.slice_assign(s![.., len..need, ..], new))
        };
        kv.k = write(kv.k.take(), heads_first(&k.0));
        kv.v = write(kv.v.take(), heads_first(&v.0));
        kv.len = need;
        Ok(())
    }

    fn kv_truncate(&self, kv: &mut BurnKv, len: usize) -> Result<()> {
        if len > kv.len {
            return Err(shape_err(
                "kv_truncate",
                format!("to {len} of {} positions", kv.len),
            ));
        }
        // Positions past `len` stay in the buffer as spare capacity. A
        // truncated cache keeps no gradient graph: training appends tracked
        // rows and truncates them after each step, and a later pass must
        // not reach the consumed steps through the buffer.
        kv.len = len;
        kv.k = kv.k.take().map(Tensor::without_autodiff);
        kv.v = kv.v.take().map(Tensor::without_autodiff);
        Ok(())
    }

    fn kv_keep(&self, kv: &mut BurnKv, positions: &[usize]) -> Result<()> {
        if positions.windows(2).any(|w| w[0] >= w[1])
            || positions.last().is_some_and(|&p| p >= kv.len)
        {
            return Err(shape_err(
                "kv_keep",
                format!("positions must increase and stay below {}", kv.len),
            ));
        }
        if positions.is_empty() {
            kv.len = 0;
            return Ok(());
        }
        if positions.iter().enumerate().all(|(i, &p)| i == p) {
            // Already a prefix: nothing moves.
            kv.len = positions.len();
            return Ok(());
        }
        let idx = self.indices(positions.iter().copied());
        kv.k = kv.k.take().map(|t| t.select(1, idx.clone()));
        kv.v = kv.v.take().map(|t| t.select(1, idx));
        kv.len = positions.len();
        kv.cap = positions.len();
        Ok(())
    }

    fn attention(
        &self,
        q: &BurnTensor,
        kv: &BurnKv,
        mask: &Mask,
        heads: &Heads,
    ) -> Result<BurnTensor> {
        let [n, qc] = q.0.dims();
        let (hq, hkv, d) = (heads.n_heads, heads.n_kv_heads, heads.head_dim);
        if !heads.is_valid() || qc != hq * d || hkv != kv.n_kv_heads || d != kv.head_dim {
            return Err(shape_err(
                "attention",
                format!(
                    "q [{n}, {qc}] with heads {heads:?} over a cache of {} heads × {}",
                    kv.n_kv_heads, kv.head_dim
                ),
            ));
        }
        let t = kv.len;
        mask.validate(n, t)?;
        let (Some(k), Some(v)) = (&kv.k, &kv.v) else {
            return Err(shape_err("attention", "empty KV cache".into()));
        };
        #[cfg(feature = "cube")]
        if self.own_kernels(&q.0) {
            let out = cube::attention(&self.device, &self.pass, &q.0, k, v, t, mask, heads)?;
            return Ok(BurnTensor(out));
        }
        let group = hq / hkv;
        // Query heads come in `rounds` of `run` heads per KV head
        // ([n, rounds, hkv, run, d]; grouped heads are one round): gather
        // each KV head's query heads into one batch row, [hkv, group * n, d].
        let (rounds, run) = match heads.order {
            HeadOrder::Grouped => (1, group),
            HeadOrder::Interleaved { run } => (group / run, run),
        };
        let q =
            q.0.clone()
                .reshape([n, rounds, hkv, run, d])
                .permute([2, 1, 3, 0, 4])
                .reshape([hkv, group * n, d]);
        let k = k.clone().narrow(1, 0, t);
        let v = v.clone().narrow(1, 0, t);
        let scale = 1.0 / (d as f32).sqrt();
        let scores = q.matmul(k.swap_dims(1, 2)).mul_scalar(scale);
        let bias = self.upload(mask.to_bias(), [1, 1, n, t]);
        let scores: Tensor<4> = scores.reshape([hkv, group, n, t]) + bias;
        let probs = softmax(scores, 3).reshape([hkv, group * n, t]);
        let out = probs
            .matmul(v)
            .reshape([hkv, rounds, run, n, d])
            .permute([3, 1, 0, 2, 4])
            .reshape([n, qc]);
        Ok(BurnTensor(out))
    }
}

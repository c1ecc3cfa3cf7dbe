//! The backend abstraction: the handful of operations a decoder-only
//! transformer needs, and nothing more.
//!
//! A backend owns three kinds of values:
//! - [`Backend::Tensor`]: a 2-D `f32` activation matrix `[rows, cols]`
//!   (one row per token);
//! - [`Backend::Weight`]: a `[out, in]` weight matrix, kept in whatever form
//!   the backend multiplies fastest (GGUF quantized blocks, f16, f32);
//! - [`Backend::Kv`]: one layer's key/value cache.
//!
//! Attention takes an explicit boolean [`Mask`] over `[cached + new]`
//! positions, so causal decoding, prefill and token-tree verification are the
//! same call. The KV cache can be appended to, truncated, and compacted to a
//! chosen set of positions (to keep only the accepted branch of a tree).
//!
//! Everything returns [`Result`]: a backend reports shape mismatches and
//! device failures as errors, never panics.

pub use arbor_gguf::GgmlType;

mod shared;
pub use shared::{Plain, SharedBytes, StableBytes, Store};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("{backend} backend cannot {what}")]
    Unsupported { backend: &'static str, what: String },
    #[error("{backend} backend error: {message}")]
    Backend {
        backend: &'static str,
        message: String,
    },
    #[error(transparent)]
    Gguf(#[from] arbor_gguf::GgufError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A weight matrix as stored in a GGUF file: `rows` output features, each a
/// row of `cols` input features, in `ty` blocks (`bytes.len()` =
/// `rows * cols / ty.block_len() * ty.block_bytes()`). 1-D tensors (norm
/// weights, biases) have `rows == 1`.
#[derive(Debug, Clone, Copy)]
pub struct WeightData<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: &'a [u8],
}

impl WeightData<'_> {
    /// The weight as `f32`, row-major `[rows, cols]`.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        Ok(arbor_gguf::dequantize(
            self.ty,
            self.bytes,
            self.rows * self.cols,
        )?)
    }
}

/// Which pairs of dimensions rotary embeddings rotate together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: ggml's "normal" mode, used by `llama`.
    Interleaved,
    /// Halves `(i, i + d/2)`: ggml's "neox" mode, used by `qwen2`.
    Halves,
}

/// Rotary position embedding parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    pub style: RopeStyle,
    /// Base of the inverse frequencies, `theta^(-2i/d)`.
    pub theta: f32,
    pub head_dim: usize,
}

impl Rope {
    /// The inverse frequency of each of a head's `head_dim / 2` pairs,
    /// `theta^(-2i/d)`: a position's angle for pair `i` is `position ·
    /// inv_freq[i]`. Every backend's RoPE takes its angles from here.
    pub fn inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim;
        (0..d / 2)
            .map(|i| self.theta.powf(-2.0 * i as f32 / d as f32))
            .collect()
    }
}

/// Attention head layout (grouped-query attention when `n_kv_heads <
/// n_heads`): which KV head each query head reads is set by `order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub order: HeadOrder,
}

/// How query heads map to KV heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeadOrder {
    /// Query head `h` reads KV head `h / (n_heads / n_kv_heads)`: each KV
    /// head's query heads side by side, as model files store them.
    #[default]
    Grouped,
    /// Runs of `run` query heads take the KV heads in turn: head `h` reads
    /// KV head `(h / run) % n_kv_heads`. Elastic models store their heads
    /// so, most important first, so that any prefix of whole rounds keeps
    /// the same number of heads for every KV head.
    Interleaved { run: usize },
}

impl Heads {
    /// Heads of the usual grouped order.
    pub const fn grouped(n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        Self {
            n_heads,
            n_kv_heads,
            head_dim,
            order: HeadOrder::Grouped,
        }
    }

    /// The KV head query head `h` reads.
    pub fn kv_head(&self, h: usize) -> usize {
        match self.order {
            HeadOrder::Grouped => h / (self.n_heads / self.n_kv_heads).max(1),
            HeadOrder::Interleaved { run } => (h / run.max(1)) % self.n_kv_heads.max(1),
        }
    }

    /// Whether the layout is consistent: heads divide evenly among the KV
    /// heads (and, interleaved, into whole rounds of runs).
    pub fn is_valid(&self) -> bool {
        let whole = |n: usize| n > 0 && self.n_heads.is_multiple_of(n);
        self.head_dim > 0
            && whole(self.n_kv_heads)
            && match self.order {
                HeadOrder::Grouped => true,
                HeadOrder::Interleaved { run } => whole(run * self.n_kv_heads),
            }
    }
}

/// A boolean attention mask: `rows` new tokens × `cols` key positions
/// (`cols` = cache length after appending the new tokens). `true` means
/// "may attend". Row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mask {
    pub rows: usize,
    pub cols: usize,
    pub allowed: Vec<bool>,
}

impl Mask {
    /// The causal mask for `n` new tokens after `past` cached ones.
    pub fn causal(past: usize, n: usize) -> Self {
        let cols = past + n;
        let mut allowed = vec![false; n * cols];
        for r in 0..n {
            allowed[r * cols..r * cols + past + r + 1].fill(true);
        }
        Self {
            rows: n,
            cols,
            allowed,
        }
    }

    pub fn get(&self, row: usize, col: usize) -> bool {
        self.allowed[row * self.cols + col]
    }

    /// The mask as additive `f32` biases (0 or `-inf`).
    pub fn to_bias(&self) -> Vec<f32> {
        self.allowed
            .iter()
            .map(|&a| if a { 0.0 } else { f32::NEG_INFINITY })
            .collect()
    }

    /// Checks the shape, and that every row may attend to something (a row
    /// with no allowed key has no defined softmax).
    pub fn validate(&self, rows: usize, cols: usize) -> Result<()> {
        if self.rows != rows || self.cols != cols || self.allowed.len() != rows * cols {
            return Err(Error::Shape {
                op: "attention mask",
                detail: format!(
                    "mask is {}x{} ({} entries), attention needs {rows}x{cols}",
                    self.rows,
                    self.cols,
                    self.allowed.len()
                ),
            });
        }
        if let Some(r) =
            (0..rows).find(|&r| !self.allowed[r * cols..(r + 1) * cols].contains(&true))
        {
            return Err(Error::Shape {
                op: "attention mask",
                detail: format!("row {r} attends to nothing"),
            });
        }
        Ok(())
    }
}

/// Forward passes of at most this many rows must give every row exactly
/// (bit for bit) what a one-row pass gives it: speculative decoding verifies
/// up to this many tokens at once and must reproduce one-token decoding.
/// Larger batches (prompt prefill) may trade that for speed.
pub const EXACT_BATCH_ROWS: usize = 64;

/// KV caches grow in steps of this many tokens (backends that manage their
/// own cache memory): memory plans round a context up to it.
pub const KV_STEP: usize = 128;

/// How a backend stores its KV caches.
///
/// Attention that follows llama.cpp's numerics rounds keys and values to
/// f16 before using them, so [`KvFormat::F16`] holds exactly what such
/// attention reads, in half the bytes of [`KvFormat::F32`].
/// [`KvFormat::Q8_0`] stores 8-bit blocks of 32 values with an f16 scale
/// each (llama.cpp's `-ctk q8_0 -ctv q8_0`): about a quarter of f32's
/// bytes, and no longer exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvFormat {
    F32,
    F16,
    Q8_0,
}

impl KvFormat {
    /// Bytes one cached row of `width` values (keys or values) takes.
    pub fn row_bytes(self, width: usize) -> u64 {
        match self {
            Self::F32 => width as u64 * 4,
            Self::F16 => width as u64 * 2,
            Self::Q8_0 => width.div_ceil(32) as u64 * 34,
        }
    }

    /// The name `--kv` takes (`f32`, `f16`, `q8_0`).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
        }
    }
}

impl std::fmt::Display for KvFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvFormat {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "q8_0" | "q8" => Ok(Self::Q8_0),
            _ => Err(Error::Unsupported {
                backend: "any",
                what: format!("store a KV cache as `{s}` (f32, f16 or q8_0)"),
            }),
        }
    }
}

/// The operations a transformer forward pass is written against.
///
/// Shapes are given as `[rows, cols]`; `x` always has one row per token.
pub trait Backend: Clone + Send + Sync + 'static {
    type Tensor: Clone + Send + Sync;
    type Weight: Send + Sync;
    type Kv: Send + Sync;

    /// A short name for logs and errors (`candle`, `flex`, …).
    fn name(&self) -> &'static str;

    /// Loads a weight matrix (any GGUF type the backend supports) that will
    /// only be multiplied by ([`Backend::matmul`]).
    fn weight(&self, w: WeightData<'_>) -> Result<Self::Weight>;
    /// Loads a weight for one forward pass (a layer streamed under a memory
    /// budget): a backend may skip layout work that only pays off over
    /// many passes. Results must equal [`Backend::weight`]'s.
    fn streamed_weight(&self, w: WeightData<'_>) -> Result<Self::Weight> {
        self.weight(w)
    }
    /// Whether [`Backend::streamed_weight_in`] keeps a weight of this type
    /// and shape in the bytes it is lent rather than a copy: then a
    /// streamed layer costs its read buffers and nothing beside them.
    fn streams_in_place(&self, ty: GgmlType, rows: usize, cols: usize) -> bool {
        let _ = (ty, rows, cols);
        false
    }
    /// [`Backend::streamed_weight`] from bytes the weight may keep
    /// (`w.bytes` is `keep`'s slice). Backends that copy ignore `keep`.
    fn streamed_weight_in(&self, w: WeightData<'_>, keep: &SharedBytes) -> Result<Self::Weight> {
        let _ = keep;
        self.streamed_weight(w)
    }
    /// Whether [`Backend::weight`] and [`Backend::embedding_table`] hold a
    /// weight of this type and shape as its bytes are, so that
    /// [`Backend::streamed_weight_in`] builds the same weight from a buffer
    /// the loader read it into, with no copy beside that buffer.
    fn holds_as_read(&self, ty: GgmlType, rows: usize, cols: usize) -> bool {
        let _ = (ty, rows, cols);
        false
    }
    /// Loads a table that [`Backend::embed`] reads rows of (and that may be
    /// multiplied by too, for models whose head is tied to the embedding).
    fn embedding_table(&self, w: WeightData<'_>) -> Result<Self::Weight> {
        self.weight(w)
    }
    /// Bytes a weight of this type and shape holds once loaded, for memory
    /// planning (may differ from the file: repacked or dequantized forms).
    fn weight_bytes(&self, ty: GgmlType, rows: usize, cols: usize) -> u64 {
        ty.bytes_for((rows * cols) as u64).unwrap_or(0)
    }
    /// Bytes the device's allocator has reserved from its driver now (a
    /// GPU backend's memory pools); `None` where the backend does not say.
    fn device_reserved_bytes(&self) -> Option<u64> {
        None
    }
    /// An `f32` tensor `[rows, cols]` from host data (norm weights, biases,
    /// test inputs).
    fn tensor(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor>;
    /// [`Backend::tensor`] from data the caller gives up: backends whose
    /// tensors live on the host keep the buffer instead of copying it (a
    /// streamed head assembles a verification's logits, tens of MiB, on
    /// the host).
    fn tensor_from_vec(&self, data: Vec<f32>, rows: usize, cols: usize) -> Result<Self::Tensor> {
        self.tensor(&data, rows, cols)
    }
    /// The tensor's `[rows, cols]`.
    fn shape(&self, x: &Self::Tensor) -> (usize, usize);
    /// Copies a tensor to the host, row-major.
    fn to_vec(&self, x: &Self::Tensor) -> Result<Vec<f32>>;
    /// Moves a tensor to the host, row-major; backends whose tensors live
    /// on the host hand their buffer over instead of copying it (a
    /// verification's logits are tens of MiB).
    fn take_vec(&self, x: Self::Tensor) -> Result<Vec<f32>> {
        self.to_vec(&x)
    }

    /// Rows `ids` of an embedding table `[vocab, dim]` → `[ids.len(), dim]`.
    fn embed(&self, table: &Self::Weight, ids: &[u32]) -> Result<Self::Tensor>;
    /// `x [n, in] · wᵀ` for `w [out, in]` → `[n, out]`.
    fn matmul(&self, x: &Self::Tensor, w: &Self::Weight) -> Result<Self::Tensor>;
    /// `x · wᵀ + add`, `add` one row (a bias, added to every row) or one
    /// per row of `x` (a residual): the same values as [`Backend::add`] of
    /// the product and `add`. A backend may add in the matmul's last step
    /// and save a pass over the output (a kernel launch on a GPU).
    fn matmul_add(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        add: &Self::Tensor,
    ) -> Result<Self::Tensor> {
        self.add(&self.matmul(x, w)?, add)
    }
    /// `[out, in]` of a weight.
    fn weight_shape(&self, w: &Self::Weight) -> (usize, usize);
    /// A part of `w [out, in]` without copying it: its first `rows` rows
    /// over the input columns `cols`, times the same columns of `x [n, k]`
    /// (`k ≥ cols.end`) → `[n, rows]`. Elastic sub-models multiply such
    /// prefixes. `cols` must start and end on the weight's quantization
    /// blocks, and backends that hold rows in groups may need `rows` to be
    /// a whole number of groups (eight rows: every elastic unit is).
    /// Results equal [`Backend::matmul`] of that part cut out as a matrix
    /// of its own, bit for bit where the backend's matmul is exact.
    ///
    /// The default zero-fills the other columns of `x` and multiplies the
    /// whole weight (a zero block adds exactly nothing), then keeps the
    /// first `rows` outputs: right, not fast.
    fn matmul_part(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        rows: usize,
        cols: std::ops::Range<usize>,
    ) -> Result<Self::Tensor> {
        matmul_part_padded(self, x, w, rows, cols)
    }
    /// The first `rows` outputs of `w` over its input columns `0..e` for
    /// `e`, the last of `ends`, summed segment by segment: the part over
    /// each segment `ends[k - 1]..ends[k]` (from 0) multiplied alone (as
    /// [`Backend::matmul_part`]), then the products added in order. An
    /// elastic layer's down projection is one matrix whose levels end on
    /// segment boundaries; summed this way a level's result does not
    /// depend on whether its segments are held as one matrix or several
    /// (split layers, see `arbor-model`'s `split`), bit for bit.
    ///
    /// The default multiplies and adds the parts one at a time.
    fn matmul_sum(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        rows: usize,
        ends: &[usize],
    ) -> Result<Self::Tensor> {
        matmul_sum_parts(self, x, w, rows, ends)
    }
    /// `x [n, k] · m [k, m_cols]` for a small float matrix held as a tensor
    /// (a LoRA adapter's factors; tracked where the backend trains). Sums
    /// run over `k` in order, one output at a time, so a row's result does
    /// not depend on the rows beside it.
    fn matmul_tensor(&self, x: &Self::Tensor, m: &Self::Tensor) -> Result<Self::Tensor>;
    /// Elementwise `a + b`; `b` may be a single row broadcast over `a`'s rows.
    fn add(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;
    /// `silu(gate) * up`, elementwise.
    fn swiglu(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor>;

    /// `x [n, c]` with column `j` multiplied by `s[0, j]` (`s` is `[1, c]`):
    /// the probes whose gradients give units' importance.
    fn scale_cols(&self, x: &Self::Tensor, s: &Self::Tensor) -> Result<Self::Tensor>;
    /// Row-wise RMS normalisation scaled by `weight [1, cols]`.
    fn rms_norm(&self, x: &Self::Tensor, weight: &Self::Tensor, eps: f32) -> Result<Self::Tensor>;
    /// Rotates `x [n, heads * head_dim]`, row `i` at position `positions[i]`.
    fn rope(&self, x: &Self::Tensor, positions: &[u32], rope: &Rope) -> Result<Self::Tensor>;
    /// Keeps only the listed rows, in order.
    fn select_rows(&self, x: &Self::Tensor, rows: &[usize]) -> Result<Self::Tensor>;
    /// Columns `cols` of `x` (an elastic sub-model's share of a bias).
    fn narrow_cols(&self, x: &Self::Tensor, cols: std::ops::Range<usize>) -> Result<Self::Tensor> {
        let (n, c) = self.shape(x);
        if cols.start >= cols.end || cols.end > c {
            return Err(Error::Shape {
                op: "narrow_cols",
                detail: format!("columns {cols:?} of [{n}, {c}]"),
            });
        }
        let host = self.to_vec(x)?;
        let kept: Vec<f32> = (host.chunks_exact(c))
            .flat_map(|r| r[cols.clone()].iter().copied())
            .collect();
        self.tensor(&kept, n, cols.len())
    }

    /// `[a | b]`: the columns of `b` after those of `a` (rows must agree):
    /// a split layer's held and lent activations as one input.
    fn concat_cols(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor> {
        let ((n, ca), (m, cb)) = (self.shape(a), self.shape(b));
        if n != m {
            return Err(Error::Shape {
                op: "concat_cols",
                detail: format!("[{n}, {ca}] beside [{m}, {cb}]"),
            });
        }
        let (ha, hb) = (self.to_vec(a)?, self.to_vec(b)?);
        let joined: Vec<f32> = (ha.chunks_exact(ca.max(1)).zip(hb.chunks_exact(cb.max(1))))
            .flat_map(|(ra, rb)| ra.iter().chain(rb).copied())
            .collect();
        self.tensor(&joined, n, ca + cb)
    }

    /// The rows of `parts` one after another (columns must agree): the
    /// attention outputs of several sequences in one pass.
    fn concat_rows(&self, parts: &[Self::Tensor]) -> Result<Self::Tensor> {
        let cols = parts.first().map_or(0, |p| self.shape(p).1);
        let mut data = Vec::new();
        let mut rows = 0;
        for p in parts {
            let (n, c) = self.shape(p);
            if c != cols {
                return Err(Error::Shape {
                    op: "concat_rows",
                    detail: format!("[{n}, {c}] under rows of {cols} columns"),
                });
            }
            data.extend(self.to_vec(p)?);
            rows += n;
        }
        self.tensor(&data, rows, cols)
    }

    /// How this backend stores its KV caches (memory plans count their
    /// bytes with it).
    fn kv_format(&self) -> KvFormat {
        KvFormat::F32
    }
    /// An empty KV cache for one layer.
    fn kv_new(&self, heads: &Heads) -> Result<Self::Kv>;
    /// Number of cached positions.
    fn kv_len(&self, kv: &Self::Kv) -> usize;
    /// Appends `k`, `v` (`[n, n_kv_heads * head_dim]`, already rotated).
    fn kv_append(&self, kv: &mut Self::Kv, k: &Self::Tensor, v: &Self::Tensor) -> Result<()>;
    /// Forgets every position from `len` on.
    fn kv_truncate(&self, kv: &mut Self::Kv, len: usize) -> Result<()>;
    /// Keeps only the listed positions (strictly increasing), compacting
    /// them to the front.
    fn kv_keep(&self, kv: &mut Self::Kv, positions: &[usize]) -> Result<()>;

    /// Scaled dot-product attention of `q [n, n_heads * head_dim]` over the
    /// whole cache, with `mask` `[n, kv_len]` → `[n, n_heads * head_dim]`.
    fn attention(
        &self,
        q: &Self::Tensor,
        kv: &Self::Kv,
        mask: &Mask,
        heads: &Heads,
    ) -> Result<Self::Tensor>;
}

/// Checks a [`Backend::matmul_part`] request against a weight of shape
/// `[out, width]` and an input of `x_cols` columns.
pub fn check_part(
    op: &'static str,
    (out, width): (usize, usize),
    rows: usize,
    cols: &std::ops::Range<usize>,
    x_cols: usize,
) -> Result<()> {
    if rows == 0 || rows > out || cols.start >= cols.end || cols.end > width || x_cols < cols.end {
        return Err(Error::Shape {
            op,
            detail: format!(
                "rows ..{rows} and columns {cols:?} of a [{out}, {width}] weight for an input of \
                 {x_cols} columns"
            ),
        });
    }
    Ok(())
}

/// [`Backend::matmul_part`] by zero-filling `x` outside `cols` and
/// multiplying the whole weight (through the host): the default, and the
/// fallback of backends for weights their own kernels do not hold.
pub fn matmul_part_padded<B: Backend>(
    b: &B,
    x: &B::Tensor,
    w: &B::Weight,
    rows: usize,
    cols: std::ops::Range<usize>,
) -> Result<B::Tensor> {
    let (out, width) = b.weight_shape(w);
    let (n, c) = b.shape(x);
    check_part("matmul_part", (out, width), rows, &cols, c)?;
    let host = b.to_vec(x)?;
    let mut wide = vec![0f32; n * width];
    for (dst, src) in wide.chunks_exact_mut(width).zip(host.chunks_exact(c)) {
        dst[cols.clone()].copy_from_slice(&src[cols.clone()]);
    }
    let full = b.to_vec(&b.matmul(&b.tensor(&wide, n, width)?, w)?)?;
    let kept: Vec<f32> = (full.chunks_exact(out))
        .flat_map(|r| r[..rows].iter().copied())
        .collect();
    b.tensor(&kept, n, rows)
}

/// The segments `0..ends[0]`, `ends[0]..ends[1]`, … of
/// [`Backend::matmul_sum`], checked to be increasing and non-empty.
pub fn sum_segments(ends: &[usize]) -> Result<Vec<std::ops::Range<usize>>> {
    let mut start = 0;
    let mut segs = Vec::with_capacity(ends.len());
    for &end in ends {
        if end <= start {
            return Err(Error::Shape {
                op: "matmul_sum",
                detail: format!("segment ends {ends:?} are not increasing from above 0"),
            });
        }
        segs.push(start..end);
        start = end;
    }
    match segs.is_empty() {
        true => Err(Error::Shape {
            op: "matmul_sum",
            detail: "no segments".into(),
        }),
        false => Ok(segs),
    }
}

/// [`Backend::matmul_sum`] one part at a time: the default, and the
/// fallback of backends for weights their fused kernels do not hold.
pub fn matmul_sum_parts<B: Backend>(
    b: &B,
    x: &B::Tensor,
    w: &B::Weight,
    rows: usize,
    ends: &[usize],
) -> Result<B::Tensor> {
    let segs = sum_segments(ends)?;
    let mut acc = b.matmul_part(x, w, rows, segs[0].clone())?;
    for seg in &segs[1..] {
        acc = b.add(&acc, &b.matmul_part(x, w, rows, seg.clone())?)?;
    }
    Ok(acc)
}

/// Reference implementations on host slices, used by backends for the odd op
/// and by tests as ground truth.
pub mod reference;

/// The op tests every backend runs (the `suite` feature, for tests).
#[cfg(feature = "suite")]
pub mod suite;

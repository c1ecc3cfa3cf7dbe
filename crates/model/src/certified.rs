//! A streamed float head's argmax without reading the head: a held copy of
//! it in 8 (or 5.5) bits gives every logit to within a bound that is
//! proved, not estimated, and only the rows that bound cannot rule out of
//! the top are read exactly.
//!
//! Why: under a budget of a third of the F16 1.5B, the head is 445 MiB of
//! the 2.5 GiB a pass reads, and greedy verification only asks each row's
//! argmax. The Q8_0 copy holds 235 MiB (the budget pays it once, beside
//! the layers), the pass reads no head at all, and the rows read exactly
//! are tens, 3 KiB each.
//!
//! The bound, for a row `x` of final hidden states and head row `w`: the
//! kernel multiplies `q(x)` (x in Q8_0 blocks, each value within 0.5625 of
//! its block's scale `max|x|/127`, the f16 rounding of the scale included)
//! by `w'` (the copy's row), so
//! `|q(x)·w' − x·w| ≤ |q(x)|·|w' − w| + |q(x) − x|·|w|`, and both float
//! results (the approximate and the exact kernel's) sit within
//! `η |q(x)| (|w| + |w' − w|)` of their exact sums, η being twice the
//! worst case of f32 sums of that many terms (2⁻¹² at least). A row whose
//! approximate logit plus its bound is below the best lower bound of the
//! row cannot be the argmax or tie it; every other row's exact logit is
//! computed by the backend's own kernel over the gathered rows, which gives
//! the bits the whole head gives. So the logits handed on have the exact
//! head's values wherever the maximum could be, and approximate values
//! (below the maximum) elsewhere: their argmax is the exact one, tie
//! order included. Sampling, constraints and log-probabilities need every
//! value and do not use this.

use arbor_gguf::{GgmlType, dequantize, quantize_q5_0, quantize_q8_0};
use arbor_tensor::{Backend, WeightData};

use crate::{ModelError, Result};

/// Rows per held slice of the copy: its weights are built a slice at a
/// time, so loading holds one slice's bytes beside them.
pub const APPROX_SLICE_ROWS: usize = 4096;

/// Rows gathered for exact logits in one pass, at most; a pass whose
/// candidates are more runs the whole head instead.
pub const MAX_GATHERED: usize = 2048;

/// Rows a pass over a head of `rows` rows gathers at most:
/// [`MAX_GATHERED`], or a sixteenth of a small head.
pub fn max_gathered(rows: usize) -> usize {
    MAX_GATHERED.min(rows.div_ceil(16)).max(1)
}

/// Relative slack for the float rounding of both kernels' sums over rows
/// of `cols` values: a sum of `k` products in f32, in any order, is within
/// `k · 2⁻²⁴` of its exact value relative to the sum of their magnitudes
/// (to first order), the exact kernel summing `cols` products and the
/// copy's one per block of 32. Twice that, and at least 2⁻¹².
fn rounding(cols: usize) -> f64 {
    let terms = (cols + cols / 32 + 2) as f64;
    (2.0 * terms * 2f64.powi(-24)).max(1.0 / 4096.0)
}

/// Absolute slack: f16 scales of tiny blocks are subnormal, and the norms
/// are stored in f32.
const FLOOR: f64 = 1e-5;

/// The head's held copy in a smaller block type, with each row's norm and
/// the norm of its error.
pub struct ApproxHead<B: Backend> {
    ty: GgmlType,
    cols: usize,
    slices: Vec<B::Weight>,
    /// Rows quantized but not yet built into a slice.
    pending: Vec<u8>,
    pending_rows: usize,
    /// Per head row: `|w|` and `|w' − w|`, rounded up.
    norm: Vec<f32>,
    err: Vec<f32>,
    bytes: u64,
}

/// Rounds a non-negative f64 up into an f32 that is surely not below it.
fn up(v: f64) -> f32 {
    let f = v as f32;
    match f64::from(f) >= v {
        true => f,
        false => f.next_up(),
    }
}

impl<B: Backend> ApproxHead<B> {
    /// An empty copy of a head of `cols` columns in `ty` (Q8_0 or Q5_0).
    pub fn new(ty: GgmlType, cols: usize) -> Result<Self> {
        if !matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0) || !cols.is_multiple_of(32) || cols == 0 {
            return Err(ModelError::Input(format!(
                "an approximate head is Q8_0 or Q5_0 over whole blocks; asked {ty:?} over {cols} \
                 columns"
            )));
        }
        Ok(Self {
            ty,
            cols,
            slices: Vec::new(),
            pending: Vec::new(),
            pending_rows: 0,
            norm: Vec::new(),
            err: Vec::new(),
            bytes: 0,
        })
    }

    /// Bytes the copy of a head of `rows × cols` holds on `backend` in `ty`.
    pub fn bytes_for(backend: &B, ty: GgmlType, rows: usize, cols: usize) -> u64 {
        let full = rows / APPROX_SLICE_ROWS;
        let last = rows % APPROX_SLICE_ROWS;
        let slice = backend.weight_bytes(ty, APPROX_SLICE_ROWS, cols);
        let norms = (rows * 2 * 4) as u64;
        full as u64 * slice + u64::from(last > 0) * backend.weight_bytes(ty, last, cols) + norms
    }

    /// Appends the head rows stored in `bytes` as `src` (a float type,
    /// whole rows).
    pub fn push(&mut self, backend: &B, src: GgmlType, bytes: &[u8]) -> Result<()> {
        let row_bytes = src
            .bytes_for(self.cols as u64)
            .ok_or_else(|| ModelError::Input(format!("{src:?} rows of {} columns", self.cols)))?
            as usize;
        if !bytes.len().is_multiple_of(row_bytes) {
            return Err(ModelError::Input(format!(
                "{} bytes are not whole {src:?} rows of {} columns",
                bytes.len(),
                self.cols
            )));
        }
        for row in bytes.chunks_exact(row_bytes) {
            let w = dequantize(src, row, self.cols)?;
            let q = match self.ty {
                GgmlType::Q5_0 => quantize_q5_0(&w),
                _ => quantize_q8_0(&w),
            };
            let back = dequantize(self.ty, &q, self.cols)?;
            let (mut n2, mut e2) = (0f64, 0f64);
            for (&a, &b) in w.iter().zip(&back) {
                n2 += f64::from(a) * f64::from(a);
                let e = f64::from(a) - f64::from(b);
                e2 += e * e;
            }
            self.norm.push(up(n2.sqrt()));
            self.err.push(up(e2.sqrt()));
            self.pending.extend_from_slice(&q);
            self.pending_rows += 1;
            if self.pending_rows == APPROX_SLICE_ROWS {
                self.build(backend)?;
            }
        }
        Ok(())
    }

    /// Builds the rows pushed since the last slice into one.
    fn build(&mut self, backend: &B) -> Result<()> {
        if self.pending_rows == 0 {
            return Ok(());
        }
        let w = backend.weight(WeightData {
            name: "output.approx",
            ty: self.ty,
            rows: self.pending_rows,
            cols: self.cols,
            bytes: &self.pending,
        })?;
        self.bytes += backend.weight_bytes(self.ty, self.pending_rows, self.cols);
        self.slices.push(w);
        self.pending.clear();
        self.pending.shrink_to_fit();
        self.pending_rows = 0;
        Ok(())
    }

    /// Ends the copy once every row is pushed.
    pub fn finish(mut self, backend: &B) -> Result<Self> {
        self.build(backend)?;
        Ok(self)
    }

    /// Rows pushed.
    pub fn rows(&self) -> usize {
        self.norm.len()
    }

    /// Bytes held: the slices and the norms.
    pub fn held_bytes(&self) -> u64 {
        self.bytes + (self.norm.len() * 2 * 4) as u64
    }

    /// Approximate logits `[n, rows]` of normed hidden states `x`.
    pub(crate) fn logits(&self, backend: &B, x: &B::Tensor) -> Result<Vec<f32>> {
        let n = backend.shape(x).0;
        let rows = self.rows();
        let mut out = vec![0f32; n * rows];
        let mut first = 0;
        for w in &self.slices {
            let (r, _) = backend.weight_shape(w);
            let part = backend.take_vec(backend.matmul(x, w)?)?;
            crate::put_columns(&mut out, rows, first, &part, r);
            first += r;
        }
        Ok(out)
    }

    /// Head rows whose exact logit may be the maximum of the row with
    /// hidden state `x` (normed) and approximate logits `approx`; `None`
    /// when a value is not finite (the caller runs the whole head).
    pub(crate) fn candidates(&self, x: &[f32], approx: &[f32]) -> Option<Vec<usize>> {
        let (xn, ex) = activation_bounds(x)?;
        let q = xn + ex;
        let rounding = rounding(self.cols);
        let bound = |j: usize| {
            let (n, e) = (f64::from(self.norm[j]), f64::from(self.err[j]));
            q * e + ex * n + rounding * q * (n + e) + FLOOR
        };
        let mut floor = f64::NEG_INFINITY;
        for (j, &a) in approx.iter().enumerate() {
            if !a.is_finite() {
                return None;
            }
            floor = floor.max(f64::from(a) - bound(j));
        }
        Some(
            (approx.iter().enumerate())
                .filter(|&(j, &a)| f64::from(a) + bound(j) >= floor)
                .map(|(j, _)| j)
                .collect(),
        )
    }
}

/// `|x|` and a bound on `|q(x) − x|` for `x` quantized in Q8_0 blocks of 32
/// (each value within 0.5 of the block's step `max|x|/127`, plus up to 127
/// times the f16 rounding of that step: relatively 2⁻¹¹, or 2⁻²⁵ where it
/// is subnormal), rounded up; `None` when `x` is not finite.
fn activation_bounds(x: &[f32]) -> Option<(f64, f64)> {
    let (mut n2, mut e2) = (0f64, 0f64);
    for block in x.chunks(32) {
        let mut amax = 0f64;
        for &v in block {
            if !v.is_finite() {
                return None;
            }
            let v = f64::from(v);
            n2 += v * v;
            amax = amax.max(v.abs());
        }
        let d = amax / 127.0;
        let e = 0.5 * d * (1.0 + 1e-4) + 127.0 * (d / 2048.0 + 2f64.powi(-25));
        e2 += block.len() as f64 * e * e;
    }
    Some((n2.sqrt() * (1.0 + 1e-9), e2.sqrt() * (1.0 + 1e-9)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activation_bound_holds_for_q8_0_blocks() {
        // Values spread over several magnitudes, and a block of zeros.
        let x: Vec<f32> = (0..256)
            .map(|i| match i / 32 {
                3 => 0.0,
                b => (i as f32 * 0.737_1).sin() * 10f32.powi(b - 3),
            })
            .collect();
        let q = dequantize(GgmlType::Q8_0, &quantize_q8_0(&x), x.len()).unwrap();
        let err: f64 = (x.iter().zip(&q))
            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
            .sum::<f64>()
            .sqrt();
        let (n, e) = activation_bounds(&x).unwrap();
        assert!(err <= e, "error {err} above the bound {e}");
        // Not vacuous: within a few times the error.
        assert!(e < 4.0 * err + 1e-6, "bound {e} against error {err}");
        let norm: f64 = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
        assert!((n - norm).abs() <= 1e-6 * norm);
        assert!(activation_bounds(&[f32::NAN; 32]).is_none());
    }

    #[test]
    fn rounding_slack_covers_long_rows() {
        // The 1.5B's 1,536 columns: the floor.
        assert_eq!(rounding(1536), 1.0 / 4096.0);
        // A 70B's 8,192: past it, and above one f32 rounding per product.
        assert!(rounding(8192) > 1.0 / 4096.0);
        assert!(rounding(8192) >= 8192.0 * 2f64.powi(-24));
    }

    #[test]
    fn rounding_up_never_rounds_down() {
        for v in [0.1f64, 1.0 / 3.0, 2.0, 1e-30, 12_345.678_9] {
            assert!(f64::from(up(v)) >= v);
            assert!(f64::from(up(v)) <= v * (1.0 + 1e-6));
        }
    }
}

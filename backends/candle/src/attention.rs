//! The KV cache ([`HostKv`]) and the arithmetic attention and the norms
//! share: f16 rounding of what attention sees, and vectorisable dot
//! products and `axpy`.

use std::borrow::Cow;

use half::slice::HalfFloatSliceExt;

use crate::CandleBackend;

/// One layer's KV cache: `len` rows of `kv_dim` keys and values.
#[derive(Debug, Clone, Default)]
pub struct HostKv {
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) kv_dim: usize,
    pub(crate) len: usize,
}

/// Attention with fewer (query row × key × head) scores than this runs on
/// the calling thread.
pub(crate) const PARALLEL_ATTENTION_MIN: usize = 1 << 10;

pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
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

pub(crate) fn axpy(out: &mut [f32], w: f32, x: &[f32]) {
    for (o, v) in out.iter_mut().zip(x) {
        *o += w * v;
    }
}

impl CandleBackend {
    /// Values as the attention sees them: rounded to f16 (exactly
    /// representable in the f32 they are kept in) unless f32 attention was
    /// asked for.
    pub(crate) fn round<'a>(&self, x: &'a [f32]) -> Cow<'a, [f32]> {
        if !self.f16_attention {
            return Cow::Borrowed(x);
        }
        let mut h = vec![half::f16::ZERO; x.len()];
        h.convert_from_f32_slice(x);
        let mut out = vec![0f32; x.len()];
        h.convert_to_f32_slice(&mut out);
        Cow::Owned(out)
    }

    pub(crate) fn round_one(&self, x: f32) -> f32 {
        if self.f16_attention {
            half::f16::from_f32(x).to_f32()
        } else {
            x
        }
    }
}

//! Activation quantization in vector registers, with exactly the bytes of
//! candle-core's `from_float` (Q8_K for the K-quant kernels, Q8_0 for Q8_0
//! and Q5_0).
//!
//! candle's x86 `from_float` is scalar and calls `roundf` once per value:
//! in a prefill or verification pass that was about 7% of the time, more
//! than attention. The kernels' results depend on these bytes, so they must
//! not change: the vector code below rounds half away from zero as `roundf`
//! does (truncate, then step away from zero where the dropped part is at
//! least one half; both steps are exact for values this small), multiplies
//! in the same order, and takes the same sign of the largest magnitude (the
//! first value reaching it). A block holding a NaN or an infinity takes
//! candle's own code, whose comparisons treat those in their own way.

use candle_core::quantized::k_quants::{BlockQ8_0, BlockQ8K, GgmlType as CandleBlock};

/// Values per Q8_K block and per Q8_0 block.
const QK_K: usize = 256;
const QK8_0: usize = 32;

/// Quantizes `x` (a whole number of blocks) into `out` as candle's
/// `BlockQ8K::from_float` would.
pub(crate) fn q8k(x: &[f32], out: &mut [BlockQ8K]) {
    debug_assert_eq!(x.len(), out.len() * QK_K);
    #[cfg(target_arch = "x86_64")]
    if super::isa().is_some() {
        // SAFETY: the kernels (AVX2 at least) run on this CPU, and
        // `q8k_block` writes a Q8_K block's 292 bytes.
        return unsafe { blockwise(x, out, x86::q8k_block) };
    }
    BlockQ8K::from_float(x, out);
}

/// Quantizes `x` into `out` as candle's `BlockQ8_0::from_float` would.
pub(crate) fn q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    debug_assert_eq!(x.len(), out.len() * QK8_0);
    #[cfg(target_arch = "x86_64")]
    if super::isa().is_some() {
        // SAFETY: as in `q8k`; `q8_0_block` writes a Q8_0 block's 34 bytes.
        return unsafe { blockwise(x, out, x86::q8_0_block) };
    }
    BlockQ8_0::from_float(x, out);
}

/// `x` quantized a block at a time by `kernel`, or by candle's
/// `from_float` for a block the kernel declines (NaN, infinity).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C, and `kernel` writes exactly the bytes of
/// a `B` from one block of values.
#[cfg(target_arch = "x86_64")]
unsafe fn blockwise<B: CandleBlock>(
    x: &[f32],
    out: &mut [B],
    kernel: unsafe fn(&[f32], &mut [u8]) -> bool,
) {
    for (x, block) in x.chunks_exact(B::BLCK_SIZE).zip(out.iter_mut()) {
        // SAFETY: the caller vouches for the CPU and the layout.
        if !unsafe { kernel(x, as_bytes_mut(block)) } {
            B::from_float(x, std::slice::from_mut(block));
        }
    }
}

/// A block's bytes (candle's blocks are `repr(C)` structs of plain numbers
/// without padding: `super` asserts their sizes).
#[cfg(target_arch = "x86_64")]
fn as_bytes_mut<B>(block: &mut B) -> &mut [u8] {
    // SAFETY: see above; every bit pattern is a valid block.
    unsafe { std::slice::from_raw_parts_mut(block as *mut B as *mut u8, std::mem::size_of::<B>()) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{QK_K, QK8_0};
    use std::arch::x86_64::*;

    /// `roundf(v)` for each lane (|v| well under 2^23), as floats.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn round_away(v: __m256) -> __m256 {
        let sign = _mm256_set1_ps(-0.0);
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
        // Exact: `t` and `v` share their leading bits.
        let dropped = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
        let step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0));
        let up = _mm256_cmp_ps::<_CMP_GE_OQ>(dropped, _mm256_set1_ps(0.5));
        _mm256_add_ps(t, _mm256_and_ps(up, step))
    }

    /// Whether any lane is a NaN or an infinity.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn any_not_finite(v: __m256) -> bool {
        let inf = _mm256_set1_ps(f32::INFINITY);
        let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), v);
        // NaN compares unordered: not-less-than is true for it.
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NLT_UQ>(abs, inf)) != 0
    }

    /// Largest lane.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }

    /// Eight rounded values (in i8 range) as eight bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn to_bytes(v: __m256) -> i64 {
        let i = _mm256_cvttps_epi32(v);
        let w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256::<1>(i));
        _mm_cvtsi128_si64(_mm_packs_epi16(w, w))
    }

    /// One Q8_K block (f32 scale, 256 quants, 16 sums of 16) into `out`;
    /// `false` (nothing written) where `x` holds a NaN or an infinity.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `x` is 256 values, `out` 292 bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8k_block(x: &[f32], out: &mut [u8]) -> bool {
        debug_assert!(x.len() == QK_K && out.len() == 4 + QK_K + 32);
        let v: [__m256; 32] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
        let abs_mask = _mm256_set1_ps(-0.0);
        let mut amax = _mm256_setzero_ps();
        let mut bad = false;
        for &v in &v {
            bad |= any_not_finite(v);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(abs_mask, v));
        }
        if bad {
            return false;
        }
        let amax = hmax(amax);
        if amax == 0.0 {
            out.fill(0);
            return true;
        }
        // The first value of that magnitude gives the sign, as candle's
        // strict `<` scan does.
        let max = x[x.iter().position(|v| v.abs() == amax).unwrap_or(0)];
        let iscale = -127f32 / max;
        if !iscale.is_finite() {
            // A subnormal largest value: zero times infinity lies ahead.
            return false;
        }
        let s = _mm256_set1_ps(iscale);
        let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
        let q = &mut out[4..4 + QK_K];
        for (i, &v) in v.iter().enumerate() {
            let r = _mm256_min_ps(_mm256_max_ps(round_away(_mm256_mul_ps(s, v)), lo), hi);
            q[8 * i..8 * i + 8].copy_from_slice(&to_bytes(r).to_le_bytes());
        }
        // Sums of 16 quants: biased to unsigned, summed by `psadbw`.
        let mut sums = [0u8; 32];
        for (j, sum) in sums.chunks_exact_mut(2).enumerate() {
            let b = unsafe { _mm_loadu_si128(q.as_ptr().add(16 * j) as *const __m128i) };
            let s = _mm_sad_epu8(_mm_xor_si128(b, _mm_set1_epi8(-128)), _mm_setzero_si128());
            let total = _mm_cvtsi128_si32(s) + _mm_extract_epi16::<4>(s) - 16 * 128;
            sum.copy_from_slice(&(total as i16).to_le_bytes());
        }
        out[4 + QK_K..].copy_from_slice(&sums);
        out[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        true
    }

    /// One Q8_0 block (f16 scale, 32 quants) into `out`; `false` (nothing
    /// written) where `x` holds a NaN or an infinity.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `x` is 32 values, `out` 34 bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0_block(x: &[f32], out: &mut [u8]) -> bool {
        debug_assert!(x.len() == QK8_0 && out.len() == 2 + QK8_0);
        let v: [__m256; 4] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
        let abs_mask = _mm256_set1_ps(-0.0);
        let mut amax = _mm256_setzero_ps();
        for &v in &v {
            if any_not_finite(v) {
                return false;
            }
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(abs_mask, v));
        }
        let d = hmax(amax) / ((1 << 7) - 1) as f32;
        let id = if d != 0f32 { 1. / d } else { 0. };
        if !id.is_finite() {
            // As in `q8k_block`.
            return false;
        }
        out[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        let s = _mm256_set1_ps(id);
        // `as i8` saturates; the products stay within ±127 and a bit.
        let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
        for (i, &v) in v.iter().enumerate() {
            let r = _mm256_min_ps(_mm256_max_ps(round_away(_mm256_mul_ps(v, s)), lo), hi);
            out[2 + 8 * i..2 + 8 * i + 8].copy_from_slice(&to_bytes(r).to_le_bytes());
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<B>(blocks: &[B]) -> Vec<u8> {
        // SAFETY: plain-number blocks (see `as_bytes_mut`).
        unsafe {
            std::slice::from_raw_parts(blocks.as_ptr() as *const u8, std::mem::size_of_val(blocks))
        }
        .to_vec()
    }

    /// Values that stress the rounding and the scale's sign: halves after
    /// scaling, ties of magnitude with both signs, zeros, tiny and huge.
    fn inputs(n: usize) -> Vec<Vec<f32>> {
        let mut s = 0x9E3779B97F4A7C15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut out = Vec::new();
        for case in 0..40 {
            let v: Vec<f32> = (0..n)
                .map(|i| {
                    let r = (next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                    match case % 8 {
                        0 => r,
                        1 => r * 1e-30,
                        2 => r * 3e30,
                        // A largest value of -127 makes the scale 1 (127
                        // of Q8_0): the rest are exact halves.
                        3 if i % 32 == 0 => -127.0,
                        3 => ((next() % 253) as f32 - 126.0) + 0.5,
                        4 => (i % 7) as f32 - 3.0,
                        5 if i == 5 => -1.0,
                        5 if i == 9 => 1.0,
                        5 => r * 0.5,
                        6 if i % 3 == 0 => 1e-44,
                        6 => 0.0,
                        _ => (r * 1000.0).round() / 8.0,
                    }
                })
                .collect();
            out.push(v);
        }
        out
    }

    #[test]
    fn q8k_blocks_equal_candles() {
        for x in inputs(3 * QK_K) {
            let (mut ours, mut theirs) = (vec![BlockQ8K::zeros(); 3], vec![BlockQ8K::zeros(); 3]);
            q8k(&x, &mut ours);
            BlockQ8K::from_float(&x, &mut theirs);
            assert_eq!(bytes(&ours), bytes(&theirs), "{:?}", &x[..8]);
        }
    }

    #[test]
    fn q8_0_blocks_equal_candles() {
        for x in inputs(5 * QK8_0) {
            let (mut ours, mut theirs) = (vec![BlockQ8_0::zeros(); 5], vec![BlockQ8_0::zeros(); 5]);
            q8_0(&x, &mut ours);
            BlockQ8_0::from_float(&x, &mut theirs);
            assert_eq!(bytes(&ours), bytes(&theirs), "{:?}", &x[..8]);
        }
    }

    #[test]
    fn blocks_with_nan_or_infinity_take_candles_code() {
        let mut x: Vec<f32> = (0..QK_K).map(|i| i as f32 / 100.0).collect();
        x[17] = f32::NAN;
        x[200] = f32::INFINITY;
        let (mut ours, mut theirs) = (vec![BlockQ8K::zeros(); 1], vec![BlockQ8K::zeros(); 1]);
        q8k(&x, &mut ours);
        BlockQ8K::from_float(&x, &mut theirs);
        assert_eq!(bytes(&ours), bytes(&theirs));
        let x = &x[..QK8_0 * 4];
        let (mut ours, mut theirs) = (vec![BlockQ8_0::zeros(); 4], vec![BlockQ8_0::zeros(); 4]);
        q8_0(x, &mut ours);
        BlockQ8_0::from_float(x, &mut theirs);
        assert_eq!(bytes(&ours), bytes(&theirs));
    }
}

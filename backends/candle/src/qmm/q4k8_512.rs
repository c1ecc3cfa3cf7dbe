//! The Q4_K group kernel with 512-bit AVX-512 VNNI: one `vpdpbusd` adds
//! 64 products (four per 32-bit lane, two lanes per row of the group,
//! see [`super::q4k8`]), where the 256-bit kernels take `vpmaddubsw` and
//! `vpmaddwd` for 32. A lane's sum over one sub-block is at most 16
//! products of 15 × 128 in size, so it fits an i16, and `vpdpwssd` then
//! multiplies it by the sub-block scale exactly and adds it to the
//! block's sum. Each row's block sum is one exact integer, the same as
//! the 256-bit kernels' and the row kernels' (see `lanes::q4k`).

use super::q4k8::{BYTES, PICK_MINS, QUANTS_AT};
use super::vnni::{q4k8_head, scale_bytes};
use super::{Q8K_BYTES, Q8K_SUMS};
use std::arch::x86_64::*;
use std::ptr::read_unaligned;

/// Eight interleaved Q4_K rows (`nb` group blocks at `g`) against `T`
/// tokens' Q8_K blocks at `a`: the eight rows' results go to `out[t]`.
///
/// # Safety
/// The CPU has AVX-512 VNNI; `g` holds `nb` group blocks, each `a[t]` the
/// token's `nb` blocks (with sums of 32 quants), each `out[t]` room for
/// eight floats.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4k8<const T: usize>(
    g: *const u8,
    nb: usize,
    a: [*const u8; T],
    out: [*mut f32; T],
) {
    let m4 = _mm512_set1_epi8(0xF);
    let pick = unsafe { _mm256_loadu_si256(PICK_MINS.as_ptr() as *const __m256i) };
    let mut acc = [_mm256_setzero_ps(); T];
    let mut acc_m = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let blk = unsafe { g.add(b * BYTES) };
        // Six group blocks ahead, as the 256-bit kernel does.
        let ahead = blk.wrapping_add(6 * BYTES);
        for off in (0..BYTES).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off) as *const i8);
        }
        let (xd, nxmin, u) = unsafe { q4k8_head(blk) };
        let mut d = [_mm256_setzero_ps(); T];
        {
            let mins: [__m256i; 4] = std::array::from_fn(|gi| {
                let v = u[2 + gi / 2];
                let mn = if gi % 2 == 0 {
                    _mm256_permute2x128_si256(v, v, 0x00)
                } else {
                    _mm256_permute2x128_si256(v, v, 0x11)
                };
                _mm256_shuffle_epi8(mn, pick)
            });
            for t in 0..T {
                let y = unsafe { a[t].add(b * Q8K_BYTES) };
                let yd = _mm256_set1_ps(unsafe { read_unaligned(y as *const f32) });
                d[t] = _mm256_mul_ps(yd, xd);
                let mut summ = _mm256_setzero_si256();
                for (i, mn) in mins.iter().enumerate() {
                    let s = unsafe { read_unaligned(y.add(Q8K_SUMS + 4 * i) as *const i32) };
                    summ = _mm256_dpwssd_epi32(summ, *mn, _mm256_set1_epi32(s));
                }
                let dmin = _mm256_mul_ps(yd, nxmin);
                acc_m[t] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(summ), acc_m[t]);
            }
        }
        // Lane 2r + h: row r, the four quants at 4h of each eight.
        let mut sumi = [_mm512_setzero_si512(); T];
        for c in 0..4 {
            let mut lo = [_mm512_setzero_si512(); T];
            let mut hi = [_mm512_setzero_si512(); T];
            for j in 0..4 {
                let bits = unsafe {
                    _mm512_loadu_si512(blk.add(QUANTS_AT + 64 * (4 * c + j)) as *const _)
                };
                let ql = _mm512_and_si512(bits, m4);
                let qh = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
                for t in 0..T {
                    // Elements 8j..8j + 8 of sub-blocks 2c and 2c + 1.
                    let q8 = unsafe { a[t].add(b * Q8K_BYTES + 4 + 64 * c + 8 * j) };
                    let (yl, yh) = unsafe {
                        (
                            _mm512_set1_epi64(read_unaligned(q8 as *const i64)),
                            _mm512_set1_epi64(read_unaligned(q8.add(32) as *const i64)),
                        )
                    };
                    lo[t] = _mm512_dpbusd_epi32(lo[t], ql, yl);
                    hi[t] = _mm512_dpbusd_epi32(hi[t], qh, yh);
                }
            }
            // Sub-block scales 2c and 2c + 1 in lanes 2r and 2r + 1.
            let (sl, sh) = (
                _mm512_cvtepu8_epi32(scale_bytes(u[c / 2], (2 * c) % 4)),
                _mm512_cvtepu8_epi32(scale_bytes(u[c / 2], (2 * c + 1) % 4)),
            );
            for t in 0..T {
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], lo[t], sl);
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], hi[t], sh);
            }
        }
        for t in 0..T {
            // Each row's two lanes, added in the low half of its 64 bits.
            let pairs = _mm512_add_epi32(sumi[t], _mm512_srli_epi64(sumi[t], 32));
            let s = _mm512_cvtepi64_epi32(pairs);
            acc[t] = _mm256_fmadd_ps(d[t], _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
    for t in 0..T {
        unsafe { _mm256_storeu_ps(out[t], _mm256_add_ps(acc[t], acc_m[t])) };
    }
}

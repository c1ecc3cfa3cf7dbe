//! The group kernels with 512-bit AVX-512 VNNI.
//!
//! Q8_0 and Q5_0 ([`q8x16`]): one `vpdpbusd` adds four products into
//! each of sixteen rows' lanes; eight of them make a block's sums, exact,
//! one per row, with no reduction (see [`super::q8x16`]).
//!
//! The K-quants ([`q4k8`], [`q6k8`]): one `vpdpbusd`
//! adds 64 products (four per 32-bit lane, two lanes per row of the group,
//! see [`super::q4k8`], [`super::q6k8`]), where the 256-bit kernels take
//! `vpmaddubsw` and `vpmaddwd` for 32. A lane's sum over one sub-block fits
//! an i16 (Q4_K: 16 products of at most 15 × 128; Q6_K: 4 of 63 × 128), so
//! `vpdpwssd` then multiplies it by the sub-block scale exactly and adds it
//! to the block's sum. Each row's block sum is one exact integer, the same
//! as the 256-bit kernels' and the row kernels' (see `lanes::q4k`,
//! `lanes::q6k`).

use super::Q8K_BYTES;
use super::q4k8::{BYTES, PICK_MINS, QUANTS_AT};
use super::q6k8;
use super::q8x16::{Q5_BYTES, Q5_MASKS_AT, Q5_NIBBLES_AT, Q8_BYTES, Q8_QUANTS_AT};
use super::vnni::{
    prefetch_group, q4k8_head, q4k8_min_sum, q4k8_mins, q6k8_offset, q6k8_scale_pairs, q6k8_scales,
    scale_bytes,
};
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
        prefetch_group(blk.wrapping_add(6 * BYTES), BYTES, T);
        let (xd, nxmin, u) = unsafe { q4k8_head(blk) };
        let mut d = [_mm256_setzero_ps(); T];
        {
            let mins = q4k8_mins(&u, pick);
            for t in 0..T {
                let y = unsafe { a[t].add(b * Q8K_BYTES) };
                let yd = _mm256_set1_ps(unsafe { read_unaligned(y as *const f32) });
                d[t] = _mm256_mul_ps(yd, xd);
                let summ = unsafe { q4k8_min_sum(&mins, y) };
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

/// Eight interleaved Q6_K rows (`nb` group blocks at `g`) against `T`
/// tokens' Q8_K blocks at `a`, `block` bytes apart (with or without the
/// row kernels' offset sums after each): the eight rows' results go to
/// `out[t]`.
///
/// # Safety
/// As [`q4k8`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q6k8<const T: usize>(
    g: *const u8,
    nb: usize,
    a: [*const u8; T],
    block: usize,
    out: [*mut f32; T],
) {
    let (m4, m3) = (_mm512_set1_epi8(0xF), _mm512_set1_epi8(3));
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let blk = unsafe { g.add(b * q6k8::BYTES) };
        prefetch_group(blk.wrapping_add(4 * q6k8::BYTES), q6k8::BYTES, T);
        // Lane 2r + h: row r, the four quants at 4h of each eight.
        let mut sumi = [_mm512_setzero_si512(); T];
        for n in 0..2 {
            for j in 0..4 {
                let v = unsafe { blk.add(q6k8::QUANTS_AT + 192 * (4 * n + j)) };
                let (l0, l1, h) = unsafe {
                    (
                        _mm512_loadu_si512(v as *const _),
                        _mm512_loadu_si512(v.add(64) as *const _),
                        _mm512_loadu_si512(v.add(128) as *const _),
                    )
                };
                let high = |shift: u32| {
                    let h = match shift {
                        0 => h,
                        2 => _mm512_srli_epi16(h, 2),
                        4 => _mm512_srli_epi16(h, 4),
                        _ => _mm512_srli_epi16(h, 6),
                    };
                    _mm512_slli_epi16(_mm512_and_si512(h, m3), 4)
                };
                // Elements 8j..8j + 8 of chunks 4n..4n + 4 (0..64).
                let q = [
                    _mm512_or_si512(_mm512_and_si512(l0, m4), high(0)),
                    _mm512_or_si512(_mm512_and_si512(l1, m4), high(2)),
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), high(4)),
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4), high(6)),
                ];
                for (i, q) in q.iter().enumerate() {
                    // Sub-block (128n + 32i + 8j) / 16: its scale in the
                    // low i16 of each row's two lanes, zero above.
                    let x = unsafe { q6k8_scales(blk, 8 * n + 2 * i + j / 2) };
                    let sc = _mm512_cvtepu16_epi32(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(x, x)));
                    for t in 0..T {
                        let y = unsafe { a[t].add(b * block + 4 + 128 * n + 32 * i + 8 * j) };
                        let y = _mm512_set1_epi64(unsafe { read_unaligned(y as *const i64) });
                        let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), *q, y);
                        sumi[t] = _mm512_dpwssd_epi32(sumi[t], p, sc);
                    }
                }
            }
        }
        let xd = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(blk as *const __m128i) });
        // For the quants' offset of 32.
        let pairs = unsafe { q6k8_scale_pairs(blk) };
        for t in 0..T {
            let y = unsafe { a[t].add(b * block) };
            let off = unsafe { q6k8_offset(&pairs, y) };
            let pairs = _mm512_add_epi32(sumi[t], _mm512_srli_epi64(sumi[t], 32));
            let s = _mm256_sub_epi32(_mm512_cvtepi64_epi32(pairs), _mm256_slli_epi32(off, 5));
            let yd = _mm256_set1_ps(unsafe { read_unaligned(y as *const f32) });
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(yd, xd), _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
    for t in 0..T {
        unsafe { _mm256_storeu_ps(out[t], acc[t]) };
    }
}

/// Sixteen interleaved Q8_0 rows (`Q5`: Q5_0 rows; `nb` group blocks at
/// `g`) against `T` tokens' Q8_0 quants `a`, block scales `s` and block
/// sums `sums`: the sixteen rows' results go to `out[t]`. The weights
/// multiply as unsigned bytes (Q8_0: `q + 128`; Q5_0: `q` in 0..32), and
/// the offset times the token's block sum comes off each lane.
///
/// # Safety
/// The CPU has AVX-512 VNNI; `g` holds `nb` group blocks, each `a[t]`,
/// `s[t]` and `sums[t]` the token's `nb` blocks, each `out[t]` room for
/// sixteen floats.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q8x16<const T: usize, const Q5: bool>(
    g: *const u8,
    nb: usize,
    a: [*const u8; T],
    s: [*const f32; T],
    sums: [*const i32; T],
    out: [*mut f32; T],
) {
    let bytes = if Q5 { Q5_BYTES } else { Q8_BYTES };
    let offset = if Q5 { 16 } else { 128 };
    let (m4, bit4) = (_mm512_set1_epi8(0xF), _mm512_set1_epi8(0x10));
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let blk = unsafe { g.add(b * bytes) };
        prefetch_group(blk.wrapping_add(8 * bytes), bytes, T);
        // Two chains for few tokens (the integer sums are exact: any split).
        let mut sumi = [[_mm512_setzero_si512(); 2]; T];
        for v in 0..8 {
            let q = if Q5 {
                let n = unsafe {
                    _mm512_loadu_si512(blk.add(Q5_NIBBLES_AT + 64 * (v % 4)) as *const _)
                };
                let n = if v < 4 { n } else { _mm512_srli_epi16(n, 4) };
                let high = unsafe { read_unaligned(blk.add(Q5_MASKS_AT + 8 * v) as *const u64) };
                let n = _mm512_and_si512(n, m4);
                with_high_bits(n, high, bit4)
            } else {
                unsafe { _mm512_loadu_si512(blk.add(Q8_QUANTS_AT + 64 * v) as *const _) }
            };
            for t in 0..T {
                let y = unsafe { read_unaligned(a[t].add(b * 32 + 4 * v) as *const i32) };
                let h = if T < 4 { v % 2 } else { 0 };
                sumi[t][h] = _mm512_dpbusd_epi32(sumi[t][h], q, _mm512_set1_epi32(y));
            }
        }
        let wd = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(blk as *const __m256i) });
        for t in 0..T {
            let (ys, yd) = unsafe { (*sums[t].add(b), *s[t].add(b)) };
            let sum = _mm512_add_epi32(sumi[t][0], sumi[t][1]);
            let sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(offset * ys));
            let d = _mm512_mul_ps(wd, _mm512_set1_ps(yd));
            acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), acc[t]);
        }
    }
    for t in 0..T {
        unsafe { _mm512_storeu_ps(out[t], acc[t]) };
    }
}

/// `n` with `bit` added in the bytes `mask` selects (`n` has bit 4 clear).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn with_high_bits(n: __m512i, mask: u64, bit: __m512i) -> __m512i {
    _mm512_mask_add_epi8(n, mask, n, bit)
}

/// Lane `l` of the transposed vectors holds row `ROW_GROUP_OF_LANES[l / 4]
/// * 4 + l % 4`'s quants (the transpose's order of four-row groups).
const ROW_GROUP_OF_LANES: [usize; 4] = [0, 2, 1, 3];

/// `z[i]` holds the eight 32-bit words of row `i` (low half) and of row
/// `i + 8` (high half); word `j` of all sixteen rows goes to vector `j`,
/// four-row groups in the lane order [`ROW_GROUP_OF_LANES`].
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose(z: &[__m512i; 8]) -> [__m512i; 8] {
    // In every 128-bit lane: pairs of rows, then words c of four rows.
    let t: [__m512i; 8] = std::array::from_fn(|k| {
        let (x, y) = (z[2 * (k / 2)], z[2 * (k / 2) + 1]);
        if k % 2 == 0 {
            _mm512_unpacklo_epi32(x, y)
        } else {
            _mm512_unpackhi_epi32(x, y)
        }
    });
    // u[c] (rows 0..4 and 8..12) and u[c + 4] (rows 4..8, 12..16): 128-bit
    // lanes hold words c, c + 4 of the low rows, then c, c + 4 of the high.
    let u: [__m512i; 8] = std::array::from_fn(|k| {
        let (c, g) = (k % 4, 4 * (k / 4));
        let (x, y) = (t[g + (c / 2)], t[g + 2 + (c / 2)]);
        if c % 2 == 0 {
            _mm512_unpacklo_epi64(x, y)
        } else {
            _mm512_unpackhi_epi64(x, y)
        }
    });
    std::array::from_fn(|j| {
        let (c, hi) = (j % 4, j >= 4);
        if hi {
            _mm512_shuffle_i32x4::<0b11_01_11_01>(u[c], u[c + 4])
        } else {
            _mm512_shuffle_i32x4::<0b10_00_10_00>(u[c], u[c + 4])
        }
    })
}

/// Sixteen GGUF Q8_0 rows at `base`, `row_bytes` apart (as streamed
/// layers hold them), against `T` tokens (arguments as [`q8x16`]'s): each
/// block of the sixteen rows is transposed in registers into
/// [`q8x16`]'s vectors (32 shuffles per 512 quants, shared by the tile of
/// tokens), so a row's block sum is its own lane's, as in the interleaved
/// layout: the same bits, without laying the layer out first (which costs
/// more than a one-row pass).
///
/// # Safety
/// The CPU has AVX-512 VNNI; the sixteen rows hold `nb` Q8_0 blocks from
/// `base`; `a[t]`, `s[t]` and `sums[t]` the token's `nb` blocks, each
/// `out[t]` room for sixteen floats.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn gguf_q8_0_tile<const T: usize>(
    base: *const u8,
    row_bytes: usize,
    nb: usize,
    a: [*const u8; T],
    s: [*const f32; T],
    sums: [*const i32; T],
    out: [*mut f32; T],
) {
    let flip = _mm512_set1_epi8(0x80u8 as i8);
    // Byte offsets of the rows in lane order, for the scales' gather.
    let offsets: [i32; 16] = std::array::from_fn(|l| {
        let row = ROW_GROUP_OF_LANES[l / 4] * 4 + l % 4;
        (row * row_bytes) as i32
    });
    let offsets = unsafe { _mm512_loadu_si512(offsets.as_ptr() as *const _) };
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let blk = unsafe { base.add(b * 34) };
        // Rows i and i + 8 side by side, then an 8×8 transpose of 32-bit
        // words in each half.
        let z: [__m512i; 8] = std::array::from_fn(|i| unsafe {
            let lo = _mm256_loadu_si256(blk.add(i * row_bytes + 2) as *const __m256i);
            let hi = _mm256_loadu_si256(blk.add((i + 8) * row_bytes + 2) as *const __m256i);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        });
        if b % 2 == 0 {
            // Sixteen streams, one cache line per two blocks, eight ahead.
            for i in 0..16 {
                _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(i * row_bytes + 8 * 34) as *const i8);
            }
        }
        let q = transpose(&z);
        let q = q.map(|v| _mm512_xor_si512(v, flip));
        let mut sumi = [[_mm512_setzero_si512(); 2]; T];
        for (v, q) in q.iter().enumerate() {
            for t in 0..T {
                let y = unsafe { read_unaligned(a[t].add(b * 32 + 4 * v) as *const i32) };
                let h = if T < 4 { v % 2 } else { 0 };
                sumi[t][h] = _mm512_dpbusd_epi32(sumi[t][h], *q, _mm512_set1_epi32(y));
            }
        }
        let d = unsafe { _mm512_i32gather_epi32::<1>(offsets, blk as *const _) };
        let wd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d));
        for t in 0..T {
            let (ys, yd) = unsafe { (*sums[t].add(b), *s[t].add(b)) };
            let sum = _mm512_add_epi32(sumi[t][0], sumi[t][1]);
            let sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(128 * ys));
            let dd = _mm512_mul_ps(wd, _mm512_set1_ps(yd));
            acc[t] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(sum), acc[t]);
        }
    }
    for t in 0..T {
        // Lanes back in row order: groups 0, 2, 1, 3.
        let v = _mm512_shuffle_f32x4::<0b11_01_10_00>(acc[t], acc[t]);
        unsafe { _mm512_storeu_ps(out[t], v) };
    }
}

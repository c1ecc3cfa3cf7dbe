//! The kernels on aarch64 (NEON), row at a time, with exactly the
//! arithmetic of the x86 kernels: results are the same bits.
//!
//! Every type sums a row's products over a block into one exact integer
//! (`qmm/lanes.rs`): `sdot` (dotprod) sums four i8 × i8 products per
//! 32-bit lane, and without dotprod `smull` + pairwise adds give the same
//! sums; the lanes are added across (`addv`), exact in any order. The
//! float steps are the x86 kernels' in the same order: the block scales'
//! product, then one fused multiply-add per block.
//!
//! Per 256 quants (a K-quant block) against one token: Q4_K reads 144
//! weight bytes and does 16 `sdot` + 16 `mla` (a scale per 32 quants);
//! Q6_K reads 210 and does 16 `sdot` + 16 `mla`; Q8_0 (8 blocks) 272 bytes,
//! 16 `sdot`; Q5_0 176 bytes, 16 `sdot` and about 10 instructions per
//! block to unpack the fifth bits. Without dotprod each `sdot` becomes five
//! instructions (`smull`, `smull2`, two `saddlp`, `addp`). A decoded
//! weight block stays in registers for a tile of tokens (up to 8 for
//! Q8_0/Q5_0, 4 for K-quants), so a batch of `n` tokens reads the weights
//! `n / tile` times, not `n` times, and every token runs the same
//! instructions in the same order at every batch size (batch invariance).

use super::{Activations, Kind, Part, Q8K_BYTES, Q8K_SUMS, QWeight, SendPtr};
use std::arch::aarch64::*;
use std::ops::Range;

/// `acc + ` the sums of four consecutive i8 × i8 products per lane, one
/// `sdot` instruction (stable Rust has no intrinsic for it yet).
///
/// # Safety
/// The CPU has dotprod.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: a register-only instruction the caller's CPU has.
    unsafe {
        std::arch::asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    acc
}

/// [`sdot`] in plain NEON: products widened to i16, pairs, then pairs of
/// pairs (the same integers).
#[inline]
#[target_feature(enable = "neon")]
fn dot4_plain(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_high_s8(a, b);
    vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)))
}

/// The f16 at `p`, as f32: one `fcvt` (Armv8 base; `half` would check
/// for FEAT_FP16 at run time on every call and, on cores without it such
/// as the Cortex-A72, convert in software). Exact either way.
///
/// # Safety
/// `p` points at two readable bytes.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = u32::from(u16::from_le(unsafe {
        std::ptr::read_unaligned(p as *const u16)
    }));
    let out: f32;
    // SAFETY: register-only instructions every aarch64 core has.
    unsafe {
        std::arch::asm!(
            "ins {t:v}.h[0], {b:w}",
            "fcvt {o:s}, {t:h}",
            b = in(reg) bits,
            t = out(vreg) _,
            o = out(vreg) out,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    out
}

/// A Q5_0 block's quants as i8 `q - 16` (what its Q8_0 repacking holds):
/// elements 0..16 and 16..32.
///
/// # Safety
/// `blk` points at a 22-byte Q5_0 block.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn q5_0_quants(blk: *const u8) -> [int8x16_t; 2] {
    let qh = u32::from_le(unsafe { std::ptr::read_unaligned(blk.add(2) as *const u32) });
    let qs = unsafe { vld1q_u8(blk.add(6)) };
    let nibbles = [vandq_u8(qs, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(qs)];
    // Byte e of each half: bit e % 8 picks its element's fifth bit from
    // byte e / 8 of the half's 16 bits.
    let bit = vcombine_u8(
        vcreate_u8(0x8040_2010_0804_0201),
        vcreate_u8(0x8040_2010_0804_0201),
    );
    std::array::from_fn(|h| {
        let b = qh >> (16 * h);
        let spread = vcombine_u8(vdup_n_u8(b as u8), vdup_n_u8((b >> 8) as u8));
        let set = vtstq_u8(spread, bit);
        // Without the fifth bit, q - 16 = nibble | 0xF0 (as i8).
        vreinterpretq_s8_u8(vorrq_u8(nibbles[h], vbicq_u8(vdupq_n_u8(0xF0), set)))
    })
}

/// Quants `16h..16h + 16` of 32-quant chunk `4j + i` of a Q6_K block, as
/// i8 `q - 32`: low four bits from byte `64j + 32(i % 2) + 16h` (low
/// nibbles for `i < 2`), the high two from byte `128 + 32j + 16h` (bits
/// `2i`, `2i + 1`), as ggml lays them out.
///
/// # Safety
/// `blk` points at a 210-byte Q6_K block; `j < 2`, `i < 4`, `h < 2`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn q6k_quants(blk: *const u8, j: usize, i: usize, h: usize) -> int8x16_t {
    let (m4, m30) = (vdupq_n_u8(0xF), vdupq_n_u8(0x30));
    let lo = unsafe { vld1q_u8(blk.add(64 * j + 32 * (i % 2) + 16 * h)) };
    let hi = unsafe { vld1q_u8(blk.add(128 + 32 * j + 16 * h)) };
    let low = if i < 2 {
        vandq_u8(lo, m4)
    } else {
        vshrq_n_u8::<4>(lo)
    };
    let high = match i {
        0 => vandq_u8(vshlq_n_u8::<4>(hi), m30),
        1 => vandq_u8(vshlq_n_u8::<2>(hi), m30),
        2 => vandq_u8(hi, m30),
        _ => vandq_u8(vshrq_n_u8::<2>(hi), m30),
    };
    vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, high)), vdupq_n_s8(32))
}

/// One kernel call's tokens: `t0..t0 + T`, quantized in `act`.
struct Tokens<'a> {
    act: &'a Activations,
    /// Blocks per token row in `act` (the part's width).
    nb: usize,
    t0: usize,
}

/// The kernels, compiled once with `sdot` and once without.
macro_rules! kernels {
    ($name:ident, $features:literal, dotprod: $dotprod:literal) => {
        pub(super) mod $name {
            use super::*;

            const DOTPROD: bool = $dotprod;
            /// Tokens multiplied by one decoded weight block.
            const TILE_Q8: usize = 8;
            const TILE_K: usize = 4;

            #[inline]
            #[target_feature(enable = $features)]
            fn dot4(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
                if DOTPROD {
                    // SAFETY: only the module compiled for dotprod, which
                    // runs where the CPU has it, takes this branch.
                    unsafe { sdot(acc, a, b) }
                } else {
                    dot4_plain(acc, a, b)
                }
            }

            /// Which of two integer partial sums 32-quant chunk `k` adds
            /// to: with few tokens two chains halve the dependent `mla`s,
            /// with many the tokens already overlap.
            #[inline(always)]
            const fn chain<const T: usize>(k: usize) -> usize {
                if T >= 4 { 0 } else { k % 2 }
            }

            /// Computes output rows `rows` of `part` for all `m` tokens,
            /// each output summed segment by segment (see
            /// `QWeight::matmul_sum`).
            ///
            /// # Safety
            /// The CPU has the module's features; `out` points to
            /// `m * part.rows` floats and no other thread writes these rows.
            #[target_feature(enable = $features)]
            pub(in super::super) unsafe fn rows(
                w: &QWeight,
                part: &Part,
                segs: &[Range<usize>],
                act: &Activations,
                m: usize,
                rows: Range<usize>,
                out: SendPtr<f32>,
            ) {
                let bb = w.kind.block_bytes();
                let row_bytes = w.cols / w.kind.block_len() * bb;
                let nb = part.blocks.len();
                let base = unsafe { w.bytes.as_ptr().add(part.blocks.start * bb) };
                let width = match w.kind {
                    Kind::Q5_0 | Kind::Q8_0 => TILE_Q8,
                    Kind::Q4K | Kind::Q6K => TILE_K,
                };
                for r in rows {
                    let row = unsafe { base.add(r * row_bytes) };
                    let mut t0 = 0;
                    while t0 < m {
                        let n = (m - t0).min(width);
                        let at = Tokens { act, nb, t0 };
                        let o = |t: usize| unsafe { out.get().add((t0 + t) * part.rows + r) };
                        unsafe {
                            match n {
                                1 => tile::<1>(w.kind, row, segs, &at, o),
                                2 => tile::<2>(w.kind, row, segs, &at, o),
                                3 => tile::<3>(w.kind, row, segs, &at, o),
                                4 => tile::<4>(w.kind, row, segs, &at, o),
                                5 => tile::<5>(w.kind, row, segs, &at, o),
                                6 => tile::<6>(w.kind, row, segs, &at, o),
                                7 => tile::<7>(w.kind, row, segs, &at, o),
                                _ => tile::<8>(w.kind, row, segs, &at, o),
                            }
                        }
                        t0 += n;
                    }
                }
            }

            /// One row against `T` tokens, segment by segment: each
            /// segment's sum from zero, written to `out(t)` (the first) or
            /// added to it.
            #[target_feature(enable = $features)]
            unsafe fn tile<const T: usize>(
                kind: Kind,
                row: *const u8,
                segs: &[Range<usize>],
                at: &Tokens<'_>,
                out: impl Fn(usize) -> *mut f32,
            ) {
                let Tokens { act, nb, t0 } = *at;
                let a: [*const u8; T] = std::array::from_fn(|t| unsafe {
                    act.bytes.as_ptr().add((t0 + t) * act.stride)
                });
                for (k, seg) in segs.iter().enumerate() {
                    let mut acc = [[vdupq_n_f32(0.0); 2]; T];
                    let mut acc_m = [vdupq_n_f32(0.0); T];
                    unsafe {
                        match kind {
                            Kind::Q5_0 | Kind::Q8_0 => {
                                let s: [*const f32; T] =
                                    std::array::from_fn(|t| act.scales.as_ptr().add((t0 + t) * nb));
                                if kind == Kind::Q5_0 {
                                    q8_0::<T, true>(row, seg.clone(), a, s, &mut acc)
                                } else {
                                    q8_0::<T, false>(row, seg.clone(), a, s, &mut acc)
                                }
                            }
                            Kind::Q4K => q4k::<T>(row, seg.clone(), a, &mut acc, &mut acc_m),
                            Kind::Q6K => q6k::<T>(row, seg.clone(), a, &mut acc),
                        }
                    }
                    for t in 0..T {
                        // One value per accumulator, in every lane.
                        let v = match kind {
                            Kind::Q4K => {
                                vgetq_lane_f32::<0>(acc[t][0]) + vgetq_lane_f32::<0>(acc_m[t])
                            }
                            _ => vgetq_lane_f32::<0>(acc[t][0]),
                        };
                        let o = out(t);
                        unsafe { *o = if k > 0 { *o + v } else { v } };
                    }
                }
            }

            /// Q8_0 row (blocks of 34 bytes; with `Q5`, Q5_0 blocks of 22
            /// unpacked to `q - 16`) against `T` tokens' Q8_0 quants (`a`,
            /// 32 bytes per block) and scales (`s`).
            #[target_feature(enable = $features)]
            unsafe fn q8_0<const T: usize, const Q5: bool>(
                w: *const u8,
                blocks: Range<usize>,
                a: [*const u8; T],
                s: [*const f32; T],
                acc_out: &mut [[float32x4_t; 2]; T],
            ) {
                let mut acc = *acc_out;
                let zero = vdupq_n_s32(0);
                for b in blocks {
                    let blk = unsafe { w.add(b * if Q5 { 22 } else { 34 }) };
                    let wd = unsafe { f16_at(blk) };
                    let x = if Q5 {
                        unsafe { q5_0_quants(blk) }
                    } else {
                        unsafe {
                            [
                                vld1q_s8(blk.add(2) as *const i8),
                                vld1q_s8(blk.add(18) as *const i8),
                            ]
                        }
                    };
                    for t in 0..T {
                        let y = unsafe { a[t].add(b * 32) as *const i8 };
                        let (y0, y1) = unsafe { (vld1q_s8(y), vld1q_s8(y.add(16))) };
                        // wd * the token's block scale, in every lane.
                        let d = vdupq_n_f32(wd * unsafe { *s[t].add(b) });
                        // The block's one integer (see `lanes::q8_0`).
                        let sumi = vaddvq_s32(dot4(dot4(zero, x[0], y0), x[1], y1));
                        let q = vdupq_n_f32(sumi as f32);
                        acc[t][0] = vfmaq_f32(acc[t][0], d, q);
                    }
                }
                *acc_out = acc;
            }

            /// Q4_K row (blocks of 144 bytes: f16 scale and min scale, 12
            /// bytes of 6-bit sub-block scales and mins, 4-bit quants)
            /// against `T` tokens' Q8_K blocks (with sums of 32 quants).
            #[target_feature(enable = $features)]
            unsafe fn q4k<const T: usize>(
                w: *const u8,
                blocks: Range<usize>,
                a: [*const u8; T],
                acc_out: &mut [[float32x4_t; 2]; T],
                acc_m_out: &mut [float32x4_t; T],
            ) {
                let (mut acc, mut acc_m) = (*acc_out, *acc_m_out);
                let zero = vdupq_n_s32(0);
                let m4 = vdupq_n_u8(0xF);
                for b in blocks {
                    let blk = unsafe { w.add(b * 144) };
                    let (xd, xmin) = unsafe { (f16_at(blk), f16_at(blk.add(2))) };
                    let packed: &[u8; 12] = unsafe { &*(blk.add(4) as *const [u8; 12]) };
                    let (sc, mn) = super::super::q4k8::unpack_scales(packed);
                    let mins = vmovl_u8(unsafe { vld1_u8(mn.as_ptr()) });
                    let mins = vreinterpretq_s16_u16(mins);
                    // Sub-block 2j: low nibbles of bytes 32j.., 2j + 1: high.
                    let mut q = [[vdupq_n_s8(0); 2]; 8];
                    for j in 0..4 {
                        for h in 0..2 {
                            let bits = unsafe { vld1q_u8(blk.add(16 + 32 * j + 16 * h)) };
                            q[2 * j][h] = vreinterpretq_s8_u8(vandq_u8(bits, m4));
                            q[2 * j + 1][h] = vreinterpretq_s8_u8(vshrq_n_u8::<4>(bits));
                        }
                    }
                    for t in 0..T {
                        let y = unsafe { a[t].add(b * Q8K_BYTES) };
                        let yd = unsafe { std::ptr::read_unaligned(y as *const f32) };
                        // yd * -xmin: the mins' sums, lanes 0..4 of ggml's
                        // 128-bit accumulator.
                        let dmin = vdupq_n_f32(yd * -xmin);
                        let sums = unsafe { vld1q_s16(y.add(Q8K_SUMS) as *const i16) };
                        let prod = vpaddq_s32(
                            vmull_s16(vget_low_s16(mins), vget_low_s16(sums)),
                            vmull_high_s16(mins, sums),
                        );
                        // One exact integer per block (see `lanes::q4k`),
                        // in every lane; lane 0 is read.
                        let prod = vdupq_n_s32(vaddvq_s32(prod));
                        acc_m[t] = vfmaq_f32(acc_m[t], dmin, vcvtq_f32_s32(prod));
                        let q8 = unsafe { y.add(4) as *const i8 };
                        // Two chains of dependent `mla`s per lane half
                        // for few tokens (exact integers: any grouping).
                        let mut sumi = [[zero; 2]; 2];
                        for (k, q) in q.iter().enumerate() {
                            for h in 0..2 {
                                let yv = unsafe { vld1q_s8(q8.add(32 * k + 16 * h)) };
                                let p = dot4(zero, q[h], yv);
                                let s = &mut sumi[chain::<T>(k)][h];
                                *s = vmlaq_n_s32(*s, p, i32::from(sc[k]));
                            }
                        }
                        let d = vdupq_n_f32(yd * xd);
                        let sumi = vaddq_s32(
                            vaddq_s32(sumi[0][0], sumi[1][0]),
                            vaddq_s32(sumi[0][1], sumi[1][1]),
                        );
                        let sumi = vdupq_n_s32(vaddvq_s32(sumi));
                        acc[t][0] = vfmaq_f32(acc[t][0], d, vcvtq_f32_s32(sumi));
                    }
                }
                *acc_out = acc;
                *acc_m_out = acc_m;
            }

            /// Q6_K row (blocks of 210 bytes: low 4 bits, high 2 bits, 16
            /// i8 sub-block scales, f16 scale) against `T` tokens' Q8_K
            /// blocks. Quants are unpacked to `q - 32` (fits i8), so no
            /// offset sums are needed: the products are the same integers.
            #[target_feature(enable = $features)]
            unsafe fn q6k<const T: usize>(
                w: *const u8,
                blocks: Range<usize>,
                a: [*const u8; T],
                acc_out: &mut [[float32x4_t; 2]; T],
            ) {
                let mut acc = *acc_out;
                let zero = vdupq_n_s32(0);
                for b in blocks {
                    let blk = unsafe { w.add(b * 210) };
                    let xd = unsafe { f16_at(blk.add(208)) };
                    let sc: [i8; 16] =
                        unsafe { std::ptr::read_unaligned(blk.add(192) as *const [i8; 16]) };
                    // As in `q4k`: two chains for few tokens.
                    let mut sumi = [[[zero; 2]; 2]; T];
                    // Half a block (128 quants, four 32-quant chunks) at a
                    // time, as ggml does.
                    for j in 0..2 {
                        let q: [[int8x16_t; 2]; 4] = std::array::from_fn(|i| {
                            std::array::from_fn(|h| unsafe { q6k_quants(blk, j, i, h) })
                        });
                        for (t, sumi) in sumi.iter_mut().enumerate() {
                            let q8 = unsafe { a[t].add(b * Q8K_BYTES + 4) as *const i8 };
                            for (i, q) in q.iter().enumerate() {
                                // Chunk c: its first 16 quants take scale
                                // 2c, its last 16 scale 2c + 1.
                                let c = 4 * j + i;
                                for h in 0..2 {
                                    let yv = unsafe { vld1q_s8(q8.add(32 * c + 16 * h)) };
                                    let p = dot4(zero, q[h], yv);
                                    let s = &mut sumi[chain::<T>(c)][h];
                                    *s = vmlaq_n_s32(*s, p, i32::from(sc[2 * c + h]));
                                }
                            }
                        }
                    }
                    for t in 0..T {
                        let yd = unsafe {
                            std::ptr::read_unaligned(a[t].add(b * Q8K_BYTES) as *const f32)
                        };
                        let d = vdupq_n_f32(yd * xd);
                        // One exact integer per block (see `lanes::q6k`),
                        // in every lane; lane 0 is read.
                        let sumi = vaddq_s32(
                            vaddq_s32(sumi[t][0][0], sumi[t][1][0]),
                            vaddq_s32(sumi[t][0][1], sumi[t][1][1]),
                        );
                        let sumi = vdupq_n_s32(vaddvq_s32(sumi));
                        acc[t][0] = vfmaq_f32(acc[t][0], d, vcvtq_f32_s32(sumi));
                    }
                }
                *acc_out = acc;
            }
        }
    };
}

kernels!(plain, "neon", dotprod: false);
kernels!(dotprod, "neon,dotprod", dotprod: true);

#[cfg(test)]
mod tests {
    /// `fcvt` against `half`'s conversion, for every f16.
    #[test]
    fn f16_at_converts_every_half_exactly() {
        for bits in 0..=u16::MAX {
            let want = half::f16::from_bits(bits).to_f32();
            // SAFETY: two bytes; NEON is part of every aarch64 core.
            let got = unsafe { super::f16_at(bits.to_le_bytes().as_ptr()) };
            if want.is_nan() {
                assert!(got.is_nan(), "{bits:#06x}: {got}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{bits:#06x}");
            }
        }
    }
}

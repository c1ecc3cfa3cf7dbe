//! Passes of two tokens or more on aarch64 cores with the int8 matrix
//! multiply (i8mm: Armv8.6, and optional from Armv8.2 — Cortex-A510/A710/
//! X2 and later, Neoverse V1/N2, Apple M2; not the Jetson Orin's A78AE),
//! with the same bits as every other variant.
//!
//! `smmla` multiplies a 2 × 8 block of i8 by the transpose of another,
//! adding a 2 × 2 block of i32: given two weight rows' next eight quants
//! and two tokens' next eight quants, it adds each (row, token)'s eight
//! products into that pair's own lane. Since every type sums a row's block
//! (or K-quant sub-block) into one exact integer (`qmm/lanes.rs`), and
//! eight consecutive quants always lie inside one sub-block, those lanes
//! hold exactly the integers the `sdot` kernels get, for four (row, token)
//! pairs at once; the float steps that follow are the same, lane by lane.
//!
//! Layout: the pass's tokens are taken in pairs, their quants interleaved
//! eight at a time once per matmul, beside their quantization ([`Pairs`]);
//! two weight rows are interleaved the same way in registers (`zip1`/`zip2`
//! on 64-bit lanes) after unpacking, so the GGUF rows (resident or
//! streamed) need no other layout. Per 256 quants and a tile of two rows ×
//! two tokens, a Q4_K block costs 32 `smmla` + 8 `mla` where the `sdot`
//! kernel spends 64 `sdot` + 64 `mla` (16 + 16 per row and token); the
//! unpacking and 32 `zip`s are shared by up to eight tokens. A lone token
//! (decode) and an odd last row take the `sdot` kernel, which gives the
//! same bits.

use super::neon::{f16_at, q5_0_quants, q6k_quants};
use super::{Activations, Kind, Part, Q8K_SUMS, QWeight, SendPtr};
use std::arch::aarch64::*;
use std::ops::Range;

/// Pairs of tokens per tile (so up to eight tokens share a decoded pair
/// of weight rows).
const TILE_PAIRS: usize = 4;

/// A pass's activations taken two tokens at a time, quants interleaved
/// eight by eight: for pair `p` and block `b`, eight quants of the first
/// token, the same eight of the second, and so on. An odd last token is
/// paired with zeros (its partner's outputs are never written).
pub(super) struct Pairs {
    /// Quants per pair and block: 64 bytes (Q8_0) or 512 (Q8_K).
    q: Vec<i8>,
    /// Per pair and block, the two tokens' block scales as
    /// `[s0, s1, s0, s1]`, the lane order of `smmla`'s results.
    d: Vec<f32>,
    /// Q4_K: per pair and block, the first token's eight sums of 32 quants,
    /// then the second's.
    sums: Vec<i16>,
    n: usize,
    /// Blocks per token.
    nb: usize,
}

impl Pairs {
    /// The pairs of `act`'s `m` tokens, each of `nb` blocks, quantized for
    /// `kind`.
    pub(super) fn new(kind: Kind, act: &Activations, m: usize, nb: usize) -> Pairs {
        let n = m.div_ceil(2);
        let q8 = matches!(kind, Kind::Q8_0 | Kind::Q5_0);
        let qb = if q8 { 32 } else { 256 };
        let step = act.stride / nb.max(1);
        let mut out = Pairs {
            q: Vec::with_capacity(n * nb * 2 * qb),
            d: Vec::with_capacity(n * nb * 4),
            sums: Vec::new(),
            n,
            nb,
        };
        let at = |t: usize, b: usize| t * act.stride + b * step;
        for p in 0..n {
            let tokens = [2 * p, 2 * p + 1];
            for b in 0..nb {
                let quants = tokens.map(|t| {
                    let from = at(t, b) + if q8 { 0 } else { 4 };
                    (t < m).then(|| &act.bytes[from..from + qb])
                });
                for c in 0..qb / 8 {
                    for q in quants {
                        match q {
                            Some(q) => out.q.extend(q[8 * c..8 * c + 8].iter().map(|&v| v as i8)),
                            None => out.q.extend([0; 8]),
                        }
                    }
                }
                let scale = tokens.map(|t| match (t < m, q8) {
                    (false, _) => 0.0,
                    (true, true) => act.scales[t * nb + b],
                    (true, false) => {
                        let d = &act.bytes[at(t, b)..at(t, b) + 4];
                        f32::from_le_bytes([d[0], d[1], d[2], d[3]])
                    }
                });
                out.d.extend([scale[0], scale[1], scale[0], scale[1]]);
                if kind == Kind::Q4K {
                    for t in tokens {
                        for i in 0..8 {
                            out.sums.push(if t < m {
                                let s = at(t, b) + Q8K_SUMS + 2 * i;
                                i16::from_le_bytes([act.bytes[s], act.bytes[s + 1]])
                            } else {
                                0
                            });
                        }
                    }
                }
            }
        }
        out
    }
}

/// `acc +` the 2 × 2 block of i32 sums `a · bᵀ`, `a` and `b` each two
/// rows of eight i8: one `smmla` (no stable intrinsic on Rust 1.95).
///
/// # Safety
/// The CPU has i8mm.
#[inline]
#[target_feature(enable = "neon,i8mm")]
unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: a register-only instruction the caller's CPU has.
    unsafe {
        std::arch::asm!(
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    acc
}

/// Two rows' sixteen quants as two `smmla` operands: eight of the first
/// row then eight of the second, twice.
#[inline]
#[target_feature(enable = "neon")]
fn zip_rows(a: int8x16_t, b: int8x16_t) -> [int8x16_t; 2] {
    let (a, b) = (vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b));
    [
        vreinterpretq_s8_s64(vzip1q_s64(a, b)),
        vreinterpretq_s8_s64(vzip2q_s64(a, b)),
    ]
}

/// `[x, x, y, y]`: a value per row in `smmla`'s lane order.
#[inline]
#[target_feature(enable = "neon")]
fn per_row_f32(x: f32, y: f32) -> float32x4_t {
    vcombine_f32(vdup_n_f32(x), vdup_n_f32(y))
}

#[inline]
#[target_feature(enable = "neon")]
fn per_row_i32(x: i32, y: i32) -> int32x4_t {
    vcombine_s32(vdup_n_s32(x), vdup_n_s32(y))
}

/// Computes output rows `rows` of `part` for all `m` tokens (two or more;
/// `pairs` holds them), each output summed segment by segment (see
/// `QWeight::matmul_sum`).
///
/// # Safety
/// The CPU has dotprod and i8mm; `out` points to `m * part.rows` floats
/// and no other thread writes these rows.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "neon,dotprod,i8mm")]
pub(super) unsafe fn rows(
    w: &QWeight,
    part: &Part,
    segs: &[Range<usize>],
    act: &Activations,
    pairs: &Pairs,
    m: usize,
    rows: Range<usize>,
    out: SendPtr<f32>,
) {
    let bb = w.kind.block_bytes();
    let row_bytes = w.cols / w.kind.block_len() * bb;
    debug_assert_eq!(pairs.nb, part.blocks.len());
    let base = unsafe { w.bytes.as_ptr().add(part.blocks.start * bb) };
    let mut r = rows.start;
    while r + 2 <= rows.end {
        let w0 = unsafe { base.add(r * row_bytes) };
        let rows2 = [w0, unsafe { w0.add(row_bytes) }];
        let mut p0 = 0;
        while p0 < pairs.n {
            let np = (pairs.n - p0).min(TILE_PAIRS);
            // Lane `l` of pair `p`: row `r + l / 2`, token `2 (p0 + p) + l % 2`.
            let o = |p: usize, l: usize| {
                let t = 2 * (p0 + p) + l % 2;
                (t < m).then(|| unsafe { out.get().add(t * part.rows + r + l / 2) })
            };
            let at = Tile {
                rows: rows2,
                pairs,
                p0,
            };
            unsafe {
                match np {
                    1 => tile::<1>(w.kind, &at, segs, o),
                    2 => tile::<2>(w.kind, &at, segs, o),
                    3 => tile::<3>(w.kind, &at, segs, o),
                    _ => tile::<4>(w.kind, &at, segs, o),
                }
            }
            p0 += np;
        }
        r += 2;
    }
    if r < rows.end {
        unsafe { super::neon::dotprod::rows(w, part, segs, act, m, r..rows.end, out) }
    }
}

/// Two weight rows and the pairs of tokens from `p0` on.
struct Tile<'a> {
    rows: [*const u8; 2],
    pairs: &'a Pairs,
    p0: usize,
}

impl Tile<'_> {
    /// Index of pair `p0 + p`'s block `b` in [`Pairs`]' arrays.
    fn index(&self, p: usize, b: usize) -> usize {
        (self.p0 + p) * self.pairs.nb + b
    }
}

/// Two rows against `P` pairs of tokens, segment by segment: each
/// segment's sum from zero, written to `out(p, lane)` (the first) or added
/// to it.
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn tile<const P: usize>(
    kind: Kind,
    at: &Tile<'_>,
    segs: &[Range<usize>],
    out: impl Fn(usize, usize) -> Option<*mut f32>,
) {
    for (k, seg) in segs.iter().enumerate() {
        let mut acc = [vdupq_n_f32(0.0); P];
        let mut acc_m = [vdupq_n_f32(0.0); P];
        unsafe {
            match kind {
                Kind::Q8_0 => q8_0::<P, false>(at, seg.clone(), &mut acc),
                Kind::Q5_0 => q8_0::<P, true>(at, seg.clone(), &mut acc),
                Kind::Q4K => q4k::<P>(at, seg.clone(), &mut acc, &mut acc_m),
                Kind::Q6K => q6k::<P>(at, seg.clone(), &mut acc),
            }
        }
        for p in 0..P {
            let (mut a, mut am) = ([0f32; 4], [0f32; 4]);
            unsafe {
                vst1q_f32(a.as_mut_ptr(), acc[p]);
                vst1q_f32(am.as_mut_ptr(), acc_m[p]);
            }
            for l in 0..4 {
                if let Some(o) = out(p, l) {
                    // As the `sdot` kernels: Q4_K adds its mins' sum last.
                    let v = if kind == Kind::Q4K {
                        a[l] + am[l]
                    } else {
                        a[l]
                    };
                    unsafe { *o = if k > 0 { *o + v } else { v } };
                }
            }
        }
    }
}

/// Two Q8_0 rows (with `Q5`, Q5_0 rows unpacked to `q - 16`) against `P`
/// pairs of tokens: per block, four `smmla` give the four exact block sums.
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn q8_0<const P: usize, const Q5: bool>(
    at: &Tile<'_>,
    blocks: Range<usize>,
    acc: &mut [float32x4_t; P],
) {
    let bb = if Q5 { 22 } else { 34 };
    for b in blocks {
        let blk = at.rows.map(|r| unsafe { r.add(b * bb) });
        let wd = unsafe { per_row_f32(f16_at(blk[0]), f16_at(blk[1])) };
        let x = blk.map(|blk| unsafe {
            if Q5 {
                q5_0_quants(blk)
            } else {
                [
                    vld1q_s8(blk.add(2) as *const i8),
                    vld1q_s8(blk.add(18) as *const i8),
                ]
            }
        });
        let [z0, z1] = zip_rows(x[0][0], x[1][0]);
        let [z2, z3] = zip_rows(x[0][1], x[1][1]);
        for (p, acc) in acc.iter_mut().enumerate() {
            let i = at.index(p, b);
            let y = unsafe { at.pairs.q.as_ptr().add(64 * i) };
            let mut s = vdupq_n_s32(0);
            for (c, z) in [z0, z1, z2, z3].into_iter().enumerate() {
                s = unsafe { smmla(s, z, vld1q_s8(y.add(16 * c))) };
            }
            // wd * the token's block scale, lane by lane (see `neon::q8_0`).
            let d = vmulq_f32(wd, unsafe { vld1q_f32(at.pairs.d.as_ptr().add(4 * i)) });
            *acc = vfmaq_f32(*acc, d, vcvtq_f32_s32(s));
        }
    }
}

/// Two Q4_K rows against `P` pairs of tokens' Q8_K blocks: per 32-quant
/// sub-block four `smmla` and one `mla` by the two rows' scales.
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn q4k<const P: usize>(
    at: &Tile<'_>,
    blocks: Range<usize>,
    acc: &mut [float32x4_t; P],
    acc_m: &mut [float32x4_t; P],
) {
    let zero = vdupq_n_s32(0);
    let m4 = vdupq_n_u8(0xF);
    for b in blocks {
        let blk = at.rows.map(|r| unsafe { r.add(b * 144) });
        let (xd, xmin) = (
            blk.map(|b| unsafe { f16_at(b) }),
            blk.map(|b| unsafe { f16_at(b.add(2)) }),
        );
        let (xd, nmin) = (per_row_f32(xd[0], xd[1]), per_row_f32(-xmin[0], -xmin[1]));
        let unpacked = blk.map(|blk| {
            let packed: &[u8; 12] = unsafe { &*(blk.add(4) as *const [u8; 12]) };
            super::q4k8::unpack_scales(packed)
        });
        let mins = unpacked
            .map(|(_, mn)| vreinterpretq_s16_u16(vmovl_u8(unsafe { vld1_u8(mn.as_ptr()) })));
        let mut sumi = [zero; P];
        for k in 0..8 {
            let sc = per_row_i32(i32::from(unpacked[0].0[k]), i32::from(unpacked[1].0[k]));
            // Sub-block 2j: low nibbles of bytes 32j.., 2j + 1: high.
            let quants = |h: usize| {
                blk.map(|blk| {
                    let bits = unsafe { vld1q_u8(blk.add(16 + 32 * (k / 2) + 16 * h)) };
                    let q = if k % 2 == 0 {
                        vandq_u8(bits, m4)
                    } else {
                        vshrq_n_u8::<4>(bits)
                    };
                    vreinterpretq_s8_u8(q)
                })
            };
            let ([q0, q1], [q2, q3]) = (quants(0), quants(1));
            let z = [zip_rows(q0, q1), zip_rows(q2, q3)];
            for (p, sumi) in sumi.iter_mut().enumerate() {
                let y = unsafe { at.pairs.q.as_ptr().add(512 * at.index(p, b) + 64 * k) };
                let mut s = zero;
                for (c, z) in z.iter().flatten().enumerate() {
                    s = unsafe { smmla(s, *z, vld1q_s8(y.add(16 * c))) };
                }
                *sumi = vmlaq_s32(*sumi, s, sc);
            }
        }
        for p in 0..P {
            let i = at.index(p, b);
            let yd = unsafe { vld1q_f32(at.pairs.d.as_ptr().add(4 * i)) };
            // yd * xd and yd * -xmin, as the `sdot` kernel takes them.
            acc[p] = vfmaq_f32(acc[p], vmulq_f32(yd, xd), vcvtq_f32_s32(sumi[p]));
            let sums = unsafe { at.pairs.sums.as_ptr().add(16 * i) };
            let sums = unsafe { [vld1q_s16(sums), vld1q_s16(sums.add(8))] };
            let dot = |m: int16x8_t, s: int16x8_t| {
                vmlal_high_s16(vmull_s16(vget_low_s16(m), vget_low_s16(s)), m, s)
            };
            // [Σ row 0 · token 0, row 0 · token 1, row 1 · token 0, row 1 · token 1].
            let mins_sum = vpaddq_s32(
                vpaddq_s32(dot(mins[0], sums[0]), dot(mins[0], sums[1])),
                vpaddq_s32(dot(mins[1], sums[0]), dot(mins[1], sums[1])),
            );
            acc_m[p] = vfmaq_f32(acc_m[p], vmulq_f32(yd, nmin), vcvtq_f32_s32(mins_sum));
        }
    }
}

/// Two Q6_K rows against `P` pairs of tokens' Q8_K blocks, quants unpacked
/// to `q - 32` as the `sdot` kernel does: per 16-quant sub-block two
/// `smmla` and one `mla` by the rows' scales.
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn q6k<const P: usize>(at: &Tile<'_>, blocks: Range<usize>, acc: &mut [float32x4_t; P]) {
    let zero = vdupq_n_s32(0);
    for b in blocks {
        let blk = at.rows.map(|r| unsafe { r.add(b * 210) });
        let xd = unsafe { per_row_f32(f16_at(blk[0].add(208)), f16_at(blk[1].add(208))) };
        let sc =
            blk.map(|blk| unsafe { std::ptr::read_unaligned(blk.add(192) as *const [i8; 16]) });
        let mut sumi = [zero; P];
        // Sub-block s = 2c + h: 32-quant chunk c = 4j + i of half j, its
        // half h (the `sdot` kernel's order).
        #[allow(clippy::needless_range_loop)]
        for s in 0..16 {
            let (c, h) = (s / 2, s % 2);
            let (j, i) = (c / 4, c % 4);
            let q = blk.map(|blk| unsafe { q6k_quants(blk, j, i, h) });
            let z = zip_rows(q[0], q[1]);
            let scale = per_row_i32(i32::from(sc[0][s]), i32::from(sc[1][s]));
            for (p, sumi) in sumi.iter_mut().enumerate() {
                let y = unsafe { at.pairs.q.as_ptr().add(512 * at.index(p, b) + 32 * s) };
                let mut t = unsafe { smmla(zero, z[0], vld1q_s8(y)) };
                t = unsafe { smmla(t, z[1], vld1q_s8(y.add(16))) };
                *sumi = vmlaq_s32(*sumi, t, scale);
            }
        }
        for p in 0..P {
            let yd = unsafe { vld1q_f32(at.pairs.d.as_ptr().add(4 * at.index(p, b))) };
            acc[p] = vfmaq_f32(acc[p], vmulq_f32(yd, xd), vcvtq_f32_s32(sumi[p]));
        }
    }
}

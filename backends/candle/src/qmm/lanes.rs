//! The x86 kernels' arithmetic in plain Rust, one (row, token) pair at a
//! time: the reference the kernels are tested against on every CPU. On
//! x86 the tests also hold it against candle's `vec_dot` (ggml's AVX2 dot
//! products), within rounding (see below); on aarch64 candle's `vec_dot`
//! is ggml's NEON one, which sums in another order, so this is what ties
//! the NEON kernels to the x86 ones.
//!
//! Every type sums a row's products over a block in one exact integer
//! (see [`q8_0`], [`q4k`], [`q6k`]) and takes one fused multiply-add per
//! block with the block scales' product: integer sums are exact in any
//! order, so the 512-bit kernels may multiply with `vpdpbusd` over lanes
//! of their own and still give the row kernels' bits. (ggml instead keeps
//! eight lane sums per row in eight float accumulators and adds them at
//! the end.)

use super::{Kind, Q8K_BYTES, Q8K_SUMS, as_bytes};
use candle_core::quantized::k_quants::{BlockQ8_0, BlockQ8K, GgmlType as _};

/// Token `x` as Q8_0 blocks: (f16 scale as f32, 32 quants) each.
fn q8_0_blocks(x: &[f32]) -> Vec<(f32, Vec<i8>)> {
    let mut a = vec![BlockQ8_0::zeros(); x.len() / 32];
    BlockQ8_0::from_float(x, &mut a);
    let q = |b: &[u8]| b.iter().map(|&v| v as i8).collect();
    (as_bytes(&a).chunks_exact(34))
        .map(|b| (f16_at(b), q(&b[2..])))
        .collect()
}

/// Token `x` as Q8_K blocks: (scale, 256 quants, 16 sums of 16 quants).
fn q8k_blocks(x: &[f32]) -> Vec<(f32, Vec<i8>, Vec<i16>)> {
    let mut a = vec![BlockQ8K::zeros(); x.len() / 256];
    BlockQ8K::from_float(x, &mut a);
    (as_bytes(&a).chunks_exact(Q8K_BYTES))
        .map(|b| {
            let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let qs = b[4..Q8K_SUMS].iter().map(|&v| v as i8).collect();
            let sums = (b[Q8K_SUMS..].chunks_exact(2))
                .map(|p| i16::from_le_bytes([p[0], p[1]]))
                .collect();
            (d, qs, sums)
        })
        .collect()
}

fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Row `row` (GGUF blocks of `kind`; Q5_0 as its Q8_0 repacking) times
/// token `x`, quantized with candle's `from_float` as the kernels do.
pub(super) fn dot(kind: Kind, row: &[u8], x: &[f32]) -> f32 {
    match kind {
        Kind::Q8_0 => q8_0(row, x),
        Kind::Q4K => q4k(row, x),
        Kind::Q6K => q6k(row, x),
        Kind::Q5_0 => panic!("Q5_0 is checked through its Q8_0 repacking"),
    }
}

/// Q8_0: `Σ_e q_e y_e` over a block, one exact integer (at most 32 ×
/// 128 × 127 in size: exact as an f32 too), into one float accumulator by
/// a fused multiply-add with the product of the two block scales.
fn q8_0(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (blk, (ad, qs)) in row.chunks_exact(34).zip(q8_0_blocks(x)) {
        let sumi: i32 = (blk[2..].iter().zip(&qs))
            .map(|(&q, &y)| i32::from(q as i8) * i32::from(y))
            .sum();
        acc = (f16_at(blk) * ad).mul_add(sumi as f32, acc);
    }
    acc
}

/// Q4_K sums each block's products exactly, in one integer per row and
/// block: `Σ_k scale_k Σ_e q_ke y_ke`, and the mins' `Σ_k min_k s_k` (`s_k`
/// the token's sum of sub-block `k`'s quants); each goes into its own float
/// accumulator by a fused multiply-add with the block scales' product, and
/// the two are added at the end. No lanes: the 512-bit kernels' lane pairs,
/// the 256-bit kernels' halves and the row kernels' eight lanes all sum to
/// the same integers.
fn q4k(row: &[u8], x: &[f32]) -> f32 {
    let (mut acc, mut acc_m) = (0f32, 0f32);
    for (blk, (ad, qs, bsums)) in row.chunks_exact(144).zip(q8k_blocks(x)) {
        let (xd, xmin) = (f16_at(blk), f16_at(&blk[2..]));
        let (sc, mn) = super::q4k8::unpack_scales(&blk[4..16]);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for k in 0..8 {
            // Sub-block 2j: low nibbles of bytes 32j..; 2j + 1: high ones.
            let bytes = &blk[16 + 32 * (k / 2)..][..32];
            let dot: i32 = (bytes.iter().zip(&qs[32 * k..]))
                .map(|(&b, &y)| i32::from((b >> (4 * (k % 2))) & 15) * i32::from(y))
                .sum();
            sumi += i32::from(sc[k]) * dot;
            // The sum of sub-block k's 32 quants, as the kernels get it.
            let sum = bsums[2 * k].wrapping_add(bsums[2 * k + 1]);
            summ += i32::from(mn[k]) * i32::from(sum);
        }
        acc = (ad * xd).mul_add(sumi as f32, acc);
        acc_m = (ad * -xmin).mul_add(summ as f32, acc_m);
    }
    acc + acc_m
}

/// Q6_K, like Q4_K, sums a block's products exactly in one integer per
/// row: `Σ_s scale_s Σ_e (q_se - 32) y_se` (`q` 0..64), one fused
/// multiply-add per block with the scales' product.
fn q6k(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (blk, (ad, qs, _)) in row.chunks_exact(210).zip(q8k_blocks(x)) {
        let xd = f16_at(&blk[208..]);
        let sc = &blk[192..208];
        let mut sumi = 0i32;
        for c in 0..8 {
            // Chunk c = 4j + i: quants 128j + 32i.. of the block.
            let (j, i) = (c / 4, c % 4);
            let (ql, qh) = (&blk[64 * j..], &blk[128 + 32 * j..]);
            for e in 0..32 {
                let low = (ql[32 * (i % 2) + e] >> (4 * (i / 2))) & 15;
                let high = (qh[e] >> (2 * i)) & 3;
                let q = i32::from(low | (high << 4)) - 32;
                sumi += i32::from(sc[2 * c + e / 16] as i8) * q * i32::from(qs[32 * c + e]);
            }
        }
        acc = (ad * xd).mul_add(sumi as f32, acc);
    }
    acc
}

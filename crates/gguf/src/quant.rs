//! Dequantization of every supported block format to `f32`.
//!
//! Each format has one small function that decodes a single block into its
//! `block_len` floats; [`dequantize`] checks the sizes once and then walks
//! the blocks. The bit layouts follow ggml's block structs exactly (all
//! multi-byte fields little-endian):
//!
//! | type | block | bytes | layout |
//! | --- | --- | --- | --- |
//! | Q4_0 | 32 | 18 | `d: f16`, `qs: [u8; 16]` (two 4-bit quants a byte) |
//! | Q4_1 | 32 | 20 | `d: f16`, `m: f16`, `qs: [u8; 16]` |
//! | Q5_0 | 32 | 22 | `d: f16`, `qh: u32` (fifth bits), `qs: [u8; 16]` |
//! | Q5_1 | 32 | 24 | `d: f16`, `m: f16`, `qh: u32`, `qs: [u8; 16]` |
//! | Q8_0 | 32 | 34 | `d: f16`, `qs: [i8; 32]` |
//! | Q8_1 | 32 | 36 | `d: f16`, `s: f16` (= d·Σq, unused here), `qs: [i8; 32]` |
//! | Q2_K | 256 | 84 | `scales: [u8; 16]`, `qs: [u8; 64]`, `d: f16`, `dmin: f16` |
//! | Q3_K | 256 | 110 | `hmask: [u8; 32]`, `qs: [u8; 64]`, `scales: [u8; 12]`, `d: f16` |
//! | Q4_K | 256 | 144 | `d: f16`, `dmin: f16`, `scales: [u8; 12]`, `qs: [u8; 128]` |
//! | Q5_K | 256 | 176 | `d: f16`, `dmin: f16`, `scales: [u8; 12]`, `qh: [u8; 32]`, `qs: [u8; 128]` |
//! | Q6_K | 256 | 210 | `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d: f16` |
//! | Q8_K | 256 | 292 | `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]` (unused here) |
//!
//! The arithmetic is done in `f32` in the same order as ggml's reference
//! dequantizers (scale the sub-block scale first, then multiply the quant),
//! so results are bit-for-bit the ones ggml produces.

use half::{bf16, f16};

use crate::{GgmlType, GgufError, Result};

mod encode;
pub use encode::quantize_q5_0;

/// Converts `n` elements stored as `ty` blocks in `bytes` to `f32`.
///
/// Fails (without allocating) when `n` is not a whole number of blocks or
/// `bytes` is not exactly the size of `n` elements.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
    check_len(ty, bytes.len(), n)?;
    let mut out = vec![0.0; n];
    decode(ty, bytes, &mut out);
    Ok(out)
}

/// Like [`dequantize`], into a caller-provided buffer whose length is the
/// element count.
pub fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    check_len(ty, bytes.len(), out.len())?;
    decode(ty, bytes, out);
    Ok(())
}

/// Dequantizes the chosen rows of a row-major `[n_rows, row_len]` matrix
/// stored as `ty` blocks (each row a whole number of blocks, as GGUF
/// requires), returning them one after another: `rows.len() * row_len`
/// floats. This is an embedding lookup: only the selected rows are decoded.
pub fn dequantize_rows(
    ty: GgmlType,
    bytes: &[u8],
    row_len: usize,
    rows: &[usize],
) -> Result<Vec<f32>> {
    if row_len == 0 {
        return Err(GgufError::Invalid(
            "dequantize_rows: row length is 0".into(),
        ));
    }
    let row_bytes = row_size(ty, row_len)?;
    if !bytes.len().is_multiple_of(row_bytes) {
        return Err(GgufError::Invalid(format!(
            "dequantize_rows: {} bytes is not a whole number of {ty} rows of {row_len} elements \
             ({row_bytes} bytes each)",
            bytes.len()
        )));
    }
    let n_rows = bytes.len() / row_bytes;
    if let Some(&row) = rows.iter().find(|&&r| r >= n_rows) {
        return Err(GgufError::RowOutOfRange { row, rows: n_rows });
    }
    // Rows may repeat, so the output can be larger than the input.
    let total = rows
        .len()
        .checked_mul(row_len)
        .ok_or_else(|| GgufError::Invalid("dequantize_rows: output too large".into()))?;
    let mut out = vec![0.0; total];
    for (&r, dst) in rows.iter().zip(out.chunks_exact_mut(row_len)) {
        decode(ty, &bytes[r * row_bytes..(r + 1) * row_bytes], dst);
    }
    Ok(out)
}

/// Bytes taken by one row of `row_len` elements.
fn row_size(ty: GgmlType, row_len: usize) -> Result<usize> {
    if !row_len.is_multiple_of(ty.block_len()) {
        return Err(GgufError::PartialBlock { ty, n: row_len });
    }
    (row_len / ty.block_len())
        .checked_mul(ty.block_bytes())
        .ok_or_else(|| GgufError::Invalid(format!("{row_len} {ty} elements is too large")))
}

/// Checks that `len` bytes hold exactly `n` elements of `ty`.
fn check_len(ty: GgmlType, len: usize, n: usize) -> Result<()> {
    if !n.is_multiple_of(ty.block_len()) {
        return Err(GgufError::PartialBlock { ty, n });
    }
    let expected = ((n / ty.block_len()) as u64).saturating_mul(ty.block_bytes() as u64);
    if expected != len as u64 {
        return Err(GgufError::DataLength {
            ty,
            n,
            expected,
            len,
        });
    }
    Ok(())
}

/// Decodes `bytes` into `out`; the caller has checked that the sizes match.
fn decode(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => each_block(bytes, out, |b: &[u8; 4], y: &mut [f32; 1]| {
            y[0] = f32::from_le_bytes(*b);
        }),
        GgmlType::F16 => each_block(bytes, out, |b: &[u8; 2], y: &mut [f32; 1]| {
            y[0] = f16::from_le_bytes(*b).to_f32();
        }),
        GgmlType::BF16 => each_block(bytes, out, |b: &[u8; 2], y: &mut [f32; 1]| {
            y[0] = bf16::from_le_bytes(*b).to_f32();
        }),
        GgmlType::Q4_0 => each_block(bytes, out, q4_0),
        GgmlType::Q4_1 => each_block(bytes, out, q4_1),
        GgmlType::Q5_0 => each_block(bytes, out, q5_0),
        GgmlType::Q5_1 => each_block(bytes, out, q5_1),
        GgmlType::Q8_0 => each_block(bytes, out, q8_0),
        GgmlType::Q8_1 => each_block(bytes, out, q8_1),
        GgmlType::Q2_K => each_block(bytes, out, q2_k),
        GgmlType::Q3_K => each_block(bytes, out, q3_k),
        GgmlType::Q4_K => each_block(bytes, out, q4_k),
        GgmlType::Q5_K => each_block(bytes, out, q5_k),
        GgmlType::Q6_K => each_block(bytes, out, q6_k),
        GgmlType::Q8_K => each_block(bytes, out, q8_k),
    }
}

/// Runs `f` over matching blocks of `bytes` (`B` bytes each) and `out`
/// (`L` floats each). Fixed-size arrays let the per-block code index
/// without bounds checks.
fn each_block<const B: usize, const L: usize>(
    bytes: &[u8],
    out: &mut [f32],
    f: impl Fn(&[u8; B], &mut [f32; L]),
) {
    let (blocks, rest) = bytes.as_chunks::<B>();
    let (outs, out_rest) = out.as_chunks_mut::<L>();
    debug_assert!(rest.is_empty() && out_rest.is_empty() && blocks.len() == outs.len());
    for (b, y) in blocks.iter().zip(outs) {
        f(b, y);
    }
}

/// The `f16` at byte offset `at`.
fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// 4-bit quants `q` in 0..16, value `d * (q - 8)`. Byte `i` of `qs` holds
/// element `i` in its low nibble and element `i + 16` in its high nibble.
fn q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = half_at(b, 0);
    let qs = &b[2..18];
    for i in 0..16 {
        y[i] = d * f32::from(i16::from(qs[i] & 0x0f) - 8);
        y[i + 16] = d * f32::from(i16::from(qs[i] >> 4) - 8);
    }
}

/// 4-bit quants with an offset: value `d * q + m`. Nibble order as Q4_0.
fn q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let d = half_at(b, 0);
    let m = half_at(b, 2);
    let qs = &b[4..20];
    for i in 0..16 {
        y[i] = d * f32::from(qs[i] & 0x0f) + m;
        y[i + 16] = d * f32::from(qs[i] >> 4) + m;
    }
}

/// The 5-bit quant of element `i` of a Q5 block: its nibble (Q4 order) plus
/// bit `i` of the little-endian `qh` word as the fifth bit.
fn five_bit(qs: &[u8], qh: u32, i: usize) -> u8 {
    let nibble = if i < 16 {
        qs[i] & 0x0f
    } else {
        qs[i - 16] >> 4
    };
    nibble | ((((qh >> i) & 1) as u8) << 4)
}

/// 5-bit quants `q` in 0..32, value `d * (q - 16)`.
fn q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = half_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for (i, v) in y.iter_mut().enumerate() {
        *v = d * f32::from(i16::from(five_bit(qs, qh, i)) - 16);
    }
}

/// 5-bit quants with an offset: value `d * q + m`.
fn q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let d = half_at(b, 0);
    let m = half_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for (i, v) in y.iter_mut().enumerate() {
        *v = d * f32::from(five_bit(qs, qh, i)) + m;
    }
}

/// Signed 8-bit quants, value `d * q`.
fn q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = half_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[2..34]) {
        *v = d * f32::from(q as i8);
    }
}

/// As Q8_0 with a second `f16` (the block sum) before the quants.
fn q8_1(b: &[u8; 36], y: &mut [f32; 32]) {
    let d = half_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[4..36]) {
        *v = d * f32::from(q as i8);
    }
}

/// Where element `e` (0..256) of a 2-bit-plane K block finds its bits: the
/// block is two halves of 128, each half reading 32 bytes of `qs` four
/// times at shifts 0, 2, 4, 6. Returns (byte index in `qs`, shift).
fn two_bit_pos(e: usize) -> (usize, usize) {
    let half = e / 128;
    let plane = (e % 128) / 32;
    (half * 32 + e % 32, 2 * plane)
}

/// 16 sub-blocks of 16, each with a 4-bit scale and a 4-bit min:
/// value `d * scale * q - dmin * min` with 2-bit `q`.
fn q2_k(b: &[u8; 84], y: &mut [f32; 256]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = half_at(b, 80);
    let dmin = half_at(b, 82);
    for (g, sub) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * f32::from(scales[g] & 0x0f);
        let ml = dmin * f32::from(scales[g] >> 4);
        for (l, v) in sub.iter_mut().enumerate() {
            let (byte, shift) = two_bit_pos(g * 16 + l);
            *v = dl * f32::from((qs[byte] >> shift) & 3) - ml;
        }
    }
}

/// The signed 6-bit scale of sub-block `g` (0..16) of a Q3_K block. Bytes
/// 0..8 hold the low four bits (sub-blocks 0..8 in the low nibbles, 8..16
/// in the high ones); bytes 8..12 hold the top two bits, sub-block `g` at
/// byte `8 + g % 4`, bit pair `g / 4`.
fn q3_k_scale(scales: &[u8], g: usize) -> i16 {
    let low = if g < 8 {
        scales[g] & 0x0f
    } else {
        scales[g - 8] >> 4
    };
    let high = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    i16::from(low | (high << 4)) - 32
}

/// 16 sub-blocks of 16 with signed 6-bit scales; 3-bit quants made of two
/// low bits (laid out as in Q2_K) and a high bit from `hmask`, where a
/// *clear* bit subtracts 4: value `d * scale * (q_low - (hbit ? 0 : 4))`.
/// Element `e` takes bit `e / 32` of `hmask[e % 32]`.
fn q3_k(b: &[u8; 110], y: &mut [f32; 256]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let scales = &b[96..108];
    let d = half_at(b, 108);
    for (g, sub) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * f32::from(q3_k_scale(scales, g));
        for (l, v) in sub.iter_mut().enumerate() {
            let e = g * 16 + l;
            let (byte, shift) = two_bit_pos(e);
            let low = i16::from((qs[byte] >> shift) & 3);
            let high_set = hmask[e % 32] & (1 << (e / 32)) != 0;
            *v = dl * f32::from(if high_set { low } else { low - 4 });
        }
    }
}

/// The 6-bit (scale, min) of sub-block `j` (0..8) in the 12 packed bytes
/// shared by Q4_K and Q5_K. Sub-blocks 0..4 keep theirs in the low six bits
/// of bytes `j` and `j + 4`; sub-blocks 4..8 keep their low four bits in the
/// nibbles of byte `j + 4` and their top two bits in the spare top bits of
/// bytes `j - 4` (scale) and `j` (min).
fn k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 0x3f, s[j + 4] & 0x3f)
    } else {
        let scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        let min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        (scale, min)
    }
}

/// 8 sub-blocks of 32 with 6-bit scales and mins: value
/// `d * scale * q - dmin * min`. The 256 quants come in four 32-byte
/// chunks; chunk `c` holds sub-block `2c` in its low nibbles and `2c + 1`
/// in its high nibbles.
fn q4_k(b: &[u8; 144], y: &mut [f32; 256]) {
    let d = half_at(b, 0);
    let dmin = half_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (j, sub) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = k_scale_min(scales, j);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        let chunk = &qs[(j / 2) * 32..(j / 2) * 32 + 32];
        let shift = 4 * (j % 2);
        for (v, &q) in sub.iter_mut().zip(chunk) {
            *v = dl * f32::from((q >> shift) & 0x0f) - ml;
        }
    }
}

/// Q4_K plus a fifth bit per quant: element `l` of sub-block `j` takes bit
/// `j` of `qh[l]`.
fn q5_k(b: &[u8; 176], y: &mut [f32; 256]) {
    let d = half_at(b, 0);
    let dmin = half_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (j, sub) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = k_scale_min(scales, j);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        let chunk = &qs[(j / 2) * 32..(j / 2) * 32 + 32];
        let shift = 4 * (j % 2);
        for (l, v) in sub.iter_mut().enumerate() {
            let q = ((chunk[l] >> shift) & 0x0f) | (((qh[l] >> j) & 1) << 4);
            *v = dl * f32::from(q) - ml;
        }
    }
}

/// 16 sub-blocks of 16 with signed 8-bit scales; 6-bit quants, value
/// `d * scale * (q - 32)`. Each half of 128 elements has 64 bytes of `ql`
/// (low nibbles) and 32 of `qh` (top two bits). Element `l` (0..32) of
/// quarter `t` (0..4) of a half takes the low nibble (t < 2) or high nibble
/// (t >= 2) of `ql[l + 32 * (t % 2)]`, and bits `2t, 2t+1` of `qh[l]`.
fn q6_k(b: &[u8; 210], y: &mut [f32; 256]) {
    let d = half_at(b, 208);
    let scales = &b[192..208];
    for (half, out) in y.chunks_exact_mut(128).enumerate() {
        let ql = &b[half * 64..half * 64 + 64];
        let qh = &b[128 + half * 32..128 + half * 32 + 32];
        for (t, quarter) in out.chunks_exact_mut(32).enumerate() {
            for (l, v) in quarter.iter_mut().enumerate() {
                let low = (ql[l + 32 * (t % 2)] >> (4 * (t / 2))) & 0x0f;
                let high = (qh[l] >> (2 * t)) & 3;
                let q = i16::from(low | (high << 4)) - 32;
                let scale = scales[half * 8 + t * 2 + l / 16] as i8;
                *v = d * f32::from(scale) * f32::from(q);
            }
        }
    }
}

/// An `f32` scale and signed 8-bit quants: value `d * q`. The trailing
/// group sums are only for dot products.
fn q8_k(b: &[u8; 292], y: &mut [f32; 256]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (v, &q) in y.iter_mut().zip(&b[4..260]) {
        *v = d * f32::from(q as i8);
    }
}

/// Rewrites Q5_0 blocks as Q8_0 blocks holding the same values: the scale
/// is copied and each 5-bit quant `q` becomes the byte `q - 16`, so
/// dequantizing the result gives exactly what the Q5_0 data gives.
pub fn repack_q5_0_to_q8_0(bytes: &[u8]) -> Result<Vec<u8>> {
    let (blocks, rest) = bytes.as_chunks::<22>();
    if !rest.is_empty() {
        return Err(GgufError::Invalid(format!(
            "{} bytes is not a whole number of Q5_0 blocks (22 bytes each)",
            bytes.len()
        )));
    }
    let mut out = Vec::with_capacity(blocks.len() * 34);
    for b in blocks {
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        out.extend_from_slice(&b[0..2]);
        out.extend((0..32).map(|i| (five_bit(&b[6..22], qh, i) as i8 - 16) as u8));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;

/// Q8_0 blocks for `x` (length a multiple of 32): per block an f16 scale
/// `max|x| / 127`, then the values divided by it, rounded to i8. Used to
/// build test weights.
pub fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 34);
    for block in x.chunks(32) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = f16::from_f32(amax / 127.0);
        out.extend_from_slice(&d.to_le_bytes());
        let inv = if d.to_f32() == 0.0 {
            0.0
        } else {
            1.0 / d.to_f32()
        };
        out.extend(
            block
                .iter()
                .map(|v| (v * inv).round().clamp(-127.0, 127.0) as i8 as u8),
        );
    }
    out
}

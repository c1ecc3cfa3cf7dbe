//! Q4_K rows interleaved eight at a time, so that one vector instruction
//! works on eight rows and their sub-block scales unpack together.
//!
//! A GGUF Q4_K block (144 bytes: f16 `d`, f16 `dmin`, twelve bytes packing
//! eight 6-bit sub-block scales and eight 6-bit mins, 128 bytes of 4-bit
//! quants) costs a one-token dot product about as much work unpacking its
//! scales as multiplying its quants. Here the same block of eight
//! consecutive rows becomes one 1152-byte group block (the same bytes, so a
//! weight holds exactly its GGUF size):
//!
//! | bytes | what |
//! |---|---|
//! | 0..16 | the eight rows' `d` (f16) |
//! | 16..32 | the eight rows' `dmin` (f16) |
//! | 32..128 | the 128 six-bit scales and mins, packed as described below |
//! | 128..1152 | 16 vectors of 64 quant bytes: vector `q` holds, for rows 0..8 in turn, the row's quant bytes `8q .. 8q + 8` |
//!
//! Low nibbles of a quant byte `32c + e` are element `e` of sub-block `2c`,
//! high nibbles element `e` of sub-block `2c + 1`; so vector `4c + j` holds
//! elements `8j..8j + 8` of sub-blocks `2c` and `2c + 1` for all eight rows,
//! and a 512-bit `vpdpbusd` against eight activation bytes broadcast adds
//! up four products per 32-bit lane, two lanes per row (a 256-bit half holds
//! four rows). The arithmetic (see `lanes::q4k`) sums each row's products
//! per sub-block, times the sub-block's scale, into one exact integer per
//! block, so any grouping of the lanes gives the same result.
//!
//! Scales: the unpacked values are 128 bytes `u`: byte `8k + r` is the
//! scale of sub-block `k` of row `r`, byte `64 + 8k + r` its min. As four
//! 32-byte vectors `u0..u4` they pack into three,
//! `A = u0 & 15 | (u1 & 15) << 4`, `B = u2 & 15 | (u3 & 15) << 4`,
//! `C = u0 >> 4 | (u1 >> 4) << 2 | (u2 >> 4) << 4 | (u3 >> 4) << 6`, which
//! unpack with a few shifts and masks.

use super::groups::{self, ROWS};

/// Bytes of one group block (eight Q4_K blocks).
pub(crate) const BYTES: usize = ROWS * 144;
/// Where a group block's packed scales and quants start.
pub(crate) const SCALES_AT: usize = 32;
pub(crate) const QUANTS_AT: usize = 128;

/// A Q4_K block's sub-block scales and mins (ggml's 6-bit packing).
pub(crate) fn unpack_scales(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut s, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        if j < 4 {
            s[j] = q[j] & 63;
            m[j] = q[j + 4] & 63;
        } else {
            s[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
    (s, m)
}

/// The inverse of [`unpack_scales`].
fn pack_scales(s: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = s[j] | ((s[j + 4] >> 4) << 6);
        q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (s[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
    q
}

/// The weight with its first `rows / 8 * 8` rows in group blocks (see
/// [`groups::interleave`]).
pub(crate) fn interleave(src: &[u8], rows: usize, nb: usize) -> Vec<u8> {
    groups::interleave::<ROWS, BYTES>(src, rows, nb, 144, |x, dst| {
        let mut u = [0u8; 128];
        for (r, x) in x.iter().enumerate() {
            dst[2 * r..2 * r + 2].copy_from_slice(&x[0..2]);
            dst[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&x[2..4]);
            let (s, m) = unpack_scales(&x[4..16]);
            for k in 0..8 {
                u[16 * (k / 2) + 8 * (k % 2) + r] = s[k];
                u[64 + 16 * (k / 2) + 8 * (k % 2) + r] = m[k];
            }
        }
        for (r, x) in x.iter().enumerate() {
            for q in 0..16 {
                dst[QUANTS_AT + 64 * q + 8 * r..][..8].copy_from_slice(&x[16 + 8 * q..][..8]);
            }
        }
        for i in 0..32 {
            let v = [u[i], u[32 + i], u[64 + i], u[96 + i]];
            dst[SCALES_AT + i] = (v[0] & 15) | ((v[1] & 15) << 4);
            dst[SCALES_AT + 32 + i] = (v[2] & 15) | ((v[3] & 15) << 4);
            dst[SCALES_AT + 64 + i] =
                (v[0] >> 4) | ((v[1] >> 4) << 2) | ((v[2] >> 4) << 4) | ((v[3] >> 4) << 6);
        }
    })
}

/// Row `r` as GGUF Q4_K blocks (appended to `out`), from a weight laid out
/// by [`interleave`].
pub(crate) fn gguf_row(held: &[u8], rows: usize, nb: usize, r: usize, out: &mut Vec<u8>) {
    groups::gguf_row(held, (rows, nb, 144, ROWS), r, out, |src, i, out| {
        let mut block = [0u8; 144];
        block[0..2].copy_from_slice(&src[2 * i..2 * i + 2]);
        block[2..4].copy_from_slice(&src[16 + 2 * i..16 + 2 * i + 2]);
        let at = |k: usize, mins: bool| {
            let n = usize::from(mins) * 64 + 16 * (k / 2) + 8 * (k % 2) + i;
            let (a, b, c) = (
                src[SCALES_AT + n % 32],
                src[SCALES_AT + 32 + n % 32],
                src[SCALES_AT + 64 + n % 32],
            );
            let v = n / 32;
            let low = ((if v < 2 { a } else { b }) >> (4 * (v % 2))) & 15;
            low | (((c >> (2 * v)) & 3) << 4)
        };
        let s: [u8; 8] = std::array::from_fn(|k| at(k, false));
        let m: [u8; 8] = std::array::from_fn(|k| at(k, true));
        block[4..16].copy_from_slice(&pack_scales(&s, &m));
        for q in 0..16 {
            block[16 + 8 * q..][..8].copy_from_slice(&src[QUANTS_AT + 64 * q + 8 * i..][..8]);
        }
        out.extend_from_slice(&block);
    });
}

/// `_mm256_shuffle_epi8` pick over the 16 bytes of sub-block mins `2g` and
/// `2g + 1` (rows 0..8 each, in both halves): puts those of row `r` in i16
/// lanes `2r` and `2r + 1`.
#[cfg(target_arch = "x86_64")]
pub(crate) const PICK_MINS: [u8; 32] = {
    let mut t = [0u8; 32];
    let mut p = 0;
    while p < 32 {
        let r = 4 * (p / 16) + (p % 16) / 4;
        t[p] = match p % 4 {
            0 => r as u8,
            2 => (8 + r) as u8,
            _ => 0x80,
        };
        p += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_pack_back_to_the_same_bytes() {
        for seed in 0..200u32 {
            let q: [u8; 12] = std::array::from_fn(|i| {
                (seed.wrapping_mul(2654435761) >> (i % 24)) as u8 ^ (i as u8).wrapping_mul(37)
            });
            let (s, m) = unpack_scales(&q);
            assert_eq!(pack_scales(&s, &m), q);
        }
    }
}

//! Q8_0 and Q5_0 rows interleaved sixteen at a time, so that one 512-bit
//! `vpdpbusd` adds four products into each of sixteen rows' own 32-bit lane
//! (four activation bytes broadcast to every row): a row's block sum comes
//! out of its lane exactly, with no reduction across lanes.
//!
//! A Q8_0 block (f16 `d`, 32 i8 quants) of sixteen consecutive rows
//! becomes one 544-byte group block:
//!
//! | bytes | what |
//! |---|---|
//! | 0..32 | the sixteen rows' `d` (f16) |
//! | 32..544 | vector `v` (0..8) at `32 + 64v`: row `r`'s quants `4v..4v + 4` at `4r`, each as `q + 128` (u8: `q ^ 0x80`) |
//!
//! `vpdpbusd` multiplies unsigned bytes by signed ones: the weights go in
//! as `q + 128` and the kernels subtract `128 Σ y` (the token's sum over
//! the block) from the lane's sum, which leaves `Σ q y` exactly.
//!
//! A Q5_0 block (f16 `d`, 32 high bits, 16 bytes of nibbles: byte `k`
//! holds elements `k` and `k + 16`) becomes one 352-byte group block:
//!
//! | bytes | what |
//! |---|---|
//! | 0..32 | the sixteen rows' `d` (f16) |
//! | 32..96 | mask `v` (0..8), a u64 at `32 + 8v`: bit `4r + c` is the high bit of row `r`'s element `4v + c` |
//! | 96..352 | nibble vector `j` (0..4) at `96 + 64j`: row `r`'s nibble bytes `4j..4j + 4` at `4r` |
//!
//! Low nibbles of vector `j` are elements `4j..4j + 4`, high nibbles
//! elements `16 + 4j..`; mask `v` sets bit 4 of quant vector `v`'s bytes
//! (an AVX-512 byte mask, as it stands). The quants are `q` in 0..32, so
//! the kernels subtract `16 Σ y` for Q5_0's offset.
//!
//! Both layouts are the blocks' bytes moved (Q8_0's quants with their top
//! bit flipped): the group takes exactly the bytes of its rows, and
//! [`gguf_row_q8_0`] / [`gguf_row_q5_0`] give a row's GGUF blocks back.

use super::groups;

/// Rows per group.
pub(crate) const ROWS: usize = 16;
/// Bytes of one Q8_0 group block, and where its quants start.
pub(crate) const Q8_BYTES: usize = ROWS * 34;
pub(crate) const Q8_QUANTS_AT: usize = 32;
/// Bytes of one Q5_0 group block; where its masks and nibbles start.
pub(crate) const Q5_BYTES: usize = ROWS * 22;
pub(crate) const Q5_MASKS_AT: usize = 32;
pub(crate) const Q5_NIBBLES_AT: usize = 96;

/// Where row `i`'s quant `e` of a Q8_0 block lives in its group block.
fn q8_place(i: usize, e: usize) -> usize {
    Q8_QUANTS_AT + 64 * (e / 4) + 4 * i + e % 4
}

/// The weight with its first `rows / 16 * 16` Q8_0 rows in group blocks.
pub(crate) fn interleave_q8_0(src: &[u8], rows: usize, nb: usize) -> Vec<u8> {
    groups::interleave::<ROWS, Q8_BYTES>(src, rows, nb, 34, |x, dst| {
        for (i, x) in x.iter().enumerate() {
            dst[2 * i..2 * i + 2].copy_from_slice(&x[..2]);
            // Four quants at a time (layers streamed under a budget are
            // laid out on every pass).
            for v in 0..8 {
                let q = u32::from_ne_bytes(x[2 + 4 * v..][..4].try_into().unwrap());
                let at = q8_place(i, 4 * v);
                dst[at..at + 4].copy_from_slice(&(q ^ 0x8080_8080).to_ne_bytes());
            }
        }
    })
}

/// Row `r` as GGUF Q8_0 blocks (appended to `out`), from a weight laid out
/// by [`interleave_q8_0`].
pub(crate) fn gguf_row_q8_0(held: &[u8], rows: usize, nb: usize, r: usize, out: &mut Vec<u8>) {
    groups::gguf_row(held, (rows, nb, 34, ROWS), r, out, |src, i, out| {
        out.extend_from_slice(&src[2 * i..2 * i + 2]);
        out.extend((0..32).map(|e| src[q8_place(i, e)] ^ 0x80));
    });
}

/// Where row `i`'s nibble byte `k` of a Q5_0 block lives in its group block.
fn q5_nibble_place(i: usize, k: usize) -> usize {
    Q5_NIBBLES_AT + 64 * (k / 4) + 4 * i + k % 4
}

/// Where row `i`'s high bit of element `e` lives: (byte, bit).
fn q5_bit_place(i: usize, e: usize) -> (usize, usize) {
    let bit = 4 * i + e % 4;
    (Q5_MASKS_AT + 8 * (e / 4) + bit / 8, bit % 8)
}

/// The weight with its first `rows / 16 * 16` Q5_0 rows in group blocks.
pub(crate) fn interleave_q5_0(src: &[u8], rows: usize, nb: usize) -> Vec<u8> {
    groups::interleave::<ROWS, Q5_BYTES>(src, rows, nb, 22, |x, dst| {
        for (i, x) in x.iter().enumerate() {
            dst[2 * i..2 * i + 2].copy_from_slice(&x[..2]);
            for j in 0..4 {
                let at = q5_nibble_place(i, 4 * j);
                dst[at..at + 4].copy_from_slice(&x[6 + 4 * j..][..4]);
            }
            // The high bits of elements 4v..4v + 4 are nibble v of `qh`,
            // and land in one nibble of the mask (`dst` starts zeroed; the
            // two rows sharing a byte fill its two nibbles).
            let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
            for v in 0..8 {
                let (at, bit) = q5_bit_place(i, 4 * v);
                dst[at] |= (((qh >> (4 * v)) & 0xF) as u8) << bit;
            }
        }
    })
}

/// Row `r` as GGUF Q5_0 blocks (appended to `out`), from a weight laid out
/// by [`interleave_q5_0`].
pub(crate) fn gguf_row_q5_0(held: &[u8], rows: usize, nb: usize, r: usize, out: &mut Vec<u8>) {
    groups::gguf_row(held, (rows, nb, 22, ROWS), r, out, |src, i, out| {
        out.extend_from_slice(&src[2 * i..2 * i + 2]);
        let mut qh = 0u32;
        for e in 0..32 {
            let (at, bit) = q5_bit_place(i, e);
            qh |= u32::from((src[at] >> bit) & 1) << e;
        }
        out.extend_from_slice(&qh.to_le_bytes());
        out.extend((0..16).map(|k| src[q5_nibble_place(i, k)]));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layouts_place_every_byte_and_bit_once() {
        let mut seen = vec![false; Q8_BYTES];
        for i in 0..ROWS {
            for p in [2 * i, 2 * i + 1]
                .into_iter()
                .chain((0..32).map(|e| q8_place(i, e)))
            {
                assert!(!seen[p], "Q8_0 row {i}: place {p} taken twice");
                seen[p] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        let mut seen = vec![0u8; Q5_BYTES];
        for i in 0..ROWS {
            let bytes = [2 * i, 2 * i + 1].into_iter();
            for p in bytes.chain((0..16).map(|k| q5_nibble_place(i, k))) {
                assert_eq!(seen[p], 0, "Q5_0 row {i}: byte {p} taken twice");
                seen[p] = 0xFF;
            }
            for e in 0..32 {
                let (at, bit) = q5_bit_place(i, e);
                assert_eq!(seen[at] & (1 << bit), 0, "Q5_0 row {i}: bit {e} twice");
                seen[at] |= 1 << bit;
            }
        }
        assert!(seen.iter().all(|&s| s == 0xFF));
    }
}

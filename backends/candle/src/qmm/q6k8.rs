//! Q6_K rows interleaved eight at a time, as [`super::q4k8`] does for Q4_K.
//!
//! A GGUF Q6_K block (210 bytes: 128 bytes of low 4 bits, 64 of high 2
//! bits, sixteen i8 sub-block scales, f16 `d`) of eight consecutive rows
//! becomes one 1680-byte group block:
//!
//! | bytes | what |
//! |---|---|
//! | 0..16 | the eight rows' `d` (f16) |
//! | 16..144 | scales: byte `16 + 8 * s + r` is sub-block scale `s` of row `r` |
//! | 144..1680 | for half `n` (0..2) and eighth `j` (0..4), at `144 + 192 * (4n + j)`: three vectors of 64 bytes, each holding eight bytes per row (row `r` at `8r`): low bits `ql[64n + 8j..]`, low bits `ql[64n + 32 + 8j..]`, high bits `qh[32n + 8j..]` |
//!
//! Those three vectors decode (as ggml decodes a row's) into elements
//! `8j..8j + 8` of the four 32-quant chunks `4n..4n + 4` for all eight
//! rows: eight consecutive quants per row, the form of the Q4_K group
//! vectors, which a 512-bit `vpdpbusd` multiplies by eight activation bytes
//! broadcast. The arithmetic (`lanes::q6k`) sums a row's block in one exact
//! integer, so every kernel's grouping of the products gives the same bits.

use super::groups::{self, ROWS};

/// Bytes of one group block (eight Q6_K blocks).
pub(crate) const BYTES: usize = ROWS * 210;
/// Where a group block's scales and quants start.
pub(crate) const SCALES_AT: usize = 16;
pub(crate) const QUANTS_AT: usize = 144;

/// Where, in a group block, row `i`'s copy of GGUF block byte `at` lives
/// (for every byte of a Q6_K block: the layout is a permutation).
fn place(i: usize, at: usize) -> usize {
    match at {
        0..128 => {
            // ql: half n, second 32 bytes or not, eighth j, byte k of eight.
            let (n, rest) = (at / 64, at % 64);
            let (second, e) = (rest / 32, rest % 32);
            QUANTS_AT + 192 * (4 * n + e / 8) + 64 * second + 8 * i + e % 8
        }
        128..192 => {
            let (n, e) = ((at - 128) / 32, (at - 128) % 32);
            QUANTS_AT + 192 * (4 * n + e / 8) + 128 + 8 * i + e % 8
        }
        192..208 => SCALES_AT + 8 * (at - 192) + i,
        _ => 2 * i + (at - 208),
    }
}

/// The weight with its first `rows / 8 * 8` rows in group blocks (see
/// [`groups::interleave`]).
pub(crate) fn interleave(src: &[u8], rows: usize, nb: usize) -> Vec<u8> {
    groups::interleave::<ROWS, BYTES>(src, rows, nb, 210, |x, dst| {
        for (i, x) in x.iter().enumerate() {
            for (s, &v) in x[192..208].iter().enumerate() {
                dst[SCALES_AT + 8 * s + i] = v;
            }
            dst[2 * i..2 * i + 2].copy_from_slice(&x[208..210]);
            // Quants in runs of eight bytes, which stay together.
            for at in (0..192).step_by(8) {
                dst[place(i, at)..][..8].copy_from_slice(&x[at..at + 8]);
            }
        }
    })
}

/// Row `r` as GGUF Q6_K blocks (appended to `out`), from a weight laid out
/// by [`interleave`].
pub(crate) fn gguf_row(held: &[u8], rows: usize, nb: usize, r: usize, out: &mut Vec<u8>) {
    groups::gguf_row(held, (rows, nb, 210, ROWS), r, out, |src, i, out| {
        out.extend((0..210).map(|at| src[place(i, at)]))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_a_permutation_of_eight_blocks() {
        let mut seen = vec![false; BYTES];
        for i in 0..ROWS {
            for at in 0..210 {
                let p = place(i, at);
                assert!(!seen[p], "byte {at} of row {i} lands on a taken place {p}");
                seen[p] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }
}

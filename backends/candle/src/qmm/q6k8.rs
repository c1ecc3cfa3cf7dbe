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
//! | 144..1680 | for lane `l` (0..8) and half `j` (0..2), at `144 + 96 * (2l + j)`: three vectors of 32 bytes, each holding four bytes per row (row `r` at `4r`): low bits `ql[64j + 4l..]`, low bits `ql[64j + 32 + 4l..]`, high bits `qh[32j + 4l..]` |
//!
//! Those three vectors decode (as ggml decodes a row's) into elements
//! `4l..4l + 4` of the four 32-quant chunks `4j..4j + 4` for all eight rows:
//! exactly what lane `l` of ggml's per-row integer sums adds up, so the
//! kernel's results are the same bits as the row-at-a-time kernel's.

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
            // ql: half j, second 32 bytes or not, lane l, byte k of four.
            let (j, rest) = (at / 64, at % 64);
            let (second, e) = (rest / 32, rest % 32);
            let (l, k) = (e / 4, e % 4);
            QUANTS_AT + 96 * (2 * l + j) + 32 * second + 4 * i + k
        }
        128..192 => {
            let (j, e) = ((at - 128) / 32, (at - 128) % 32);
            let (l, k) = (e / 4, e % 4);
            QUANTS_AT + 96 * (2 * l + j) + 64 + 4 * i + k
        }
        192..208 => SCALES_AT + 8 * (at - 192) + i,
        _ => 2 * i + (at - 208),
    }
}

/// The weight with its first `rows / 8 * 8` rows in group blocks (see
/// [`groups::interleave`]).
pub(crate) fn interleave(src: &[u8], rows: usize, nb: usize) -> Vec<u8> {
    groups::interleave::<BYTES>(src, rows, nb, 210, |x, dst| {
        for (i, x) in x.iter().enumerate() {
            for (s, &v) in x[192..208].iter().enumerate() {
                dst[SCALES_AT + 8 * s + i] = v;
            }
            dst[2 * i..2 * i + 2].copy_from_slice(&x[208..210]);
        }
        // Quants: 32-byte runs of low bits (`64j + 32h`) and of high bits
        // (`128 + 32j`), each a transpose of words over the rows; `to` is
        // where lane 0's vector goes (lane l: 192 further on).
        for (run, to) in [(0, 0), (32, 32), (64, 96), (96, 128), (128, 64), (160, 160)] {
            let from = std::array::from_fn(|i| x[i][run..][..32].as_ptr());
            let dst_at =
                std::array::from_fn(|l| dst[QUANTS_AT + to + 192 * l..][..32].as_mut_ptr());
            // SAFETY: on x86 only where the kernels run (AVX2; elsewhere the
            // plain-Rust version); 32-byte slices.
            unsafe { groups::transpose_words(from, dst_at) };
        }
    })
}

/// Row `r` as GGUF Q6_K blocks (appended to `out`), from a weight laid out
/// by [`interleave`].
pub(crate) fn gguf_row(held: &[u8], rows: usize, nb: usize, r: usize, out: &mut Vec<u8>) {
    groups::gguf_row(held, (rows, nb, 210), r, out, |src, i, out| {
        out.extend((0..210).map(|at| src[place(i, at)]))
    });
}

/// `_mm_shuffle_epi8` pick doubling each of eight bytes (a scale per row,
/// then sign-extended into the two i16 lanes of that row's i32 lane).
#[cfg(target_arch = "x86_64")]
pub(crate) const DOUBLE: [u8; 16] = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7];

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

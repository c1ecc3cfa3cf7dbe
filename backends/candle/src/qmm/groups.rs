//! What the interleaved layouts share (the K-quants' groups of eight rows,
//! [`super::q4k8`] and [`super::q6k8`]; Q8_0's and Q5_0's groups of
//! sixteen, [`super::q8x16`]): the blocks of `N` consecutive rows at one
//! column become one group block holding the same bytes, and rows after the
//! last whole group stay GGUF blocks where they were (a group takes exactly
//! the bytes of its rows).

/// Rows per K-quant group.
pub(crate) const ROWS: usize = 8;

/// `src` (`rows` rows of `nb` blocks of `block` bytes) with its first
/// `rows / N * N` rows in group blocks of `GROUP` (= `N` × `block`) bytes,
/// each laid out by `fill` from its `N` rows' blocks. Runs once per
/// resident weight, at load.
pub(crate) fn interleave<const N: usize, const GROUP: usize>(
    src: &[u8],
    rows: usize,
    nb: usize,
    block: usize,
    fill: impl Fn(&[&[u8]; N], &mut [u8; GROUP]),
) -> Vec<u8> {
    assert_eq!(GROUP, N * block, "a group block is N blocks");
    let row_bytes = nb * block;
    let groups = rows / N;
    // Appended in order, never zero-filled first (a whole extra pass).
    let mut out = Vec::with_capacity(src.len());
    for g in 0..groups {
        let at = |r: usize, b: usize| (g * N + r) * row_bytes + b * block;
        for b in 0..nb {
            // `N` source streams, which the hardware prefetcher follows
            // poorly.
            for r in 0..N {
                if let Some(p) = src.get(at(r, b + 4)..at(r, b + 4) + block) {
                    prefetch(p);
                }
            }
            // Assembled in L1, then written out whole.
            let mut dst = [0u8; GROUP];
            fill(
                &std::array::from_fn(|r| &src[at(r, b)..][..block]),
                &mut dst,
            );
            out.extend_from_slice(&dst);
        }
    }
    out.extend_from_slice(&src[groups * N * row_bytes..]);
    out
}

/// Row `r` as GGUF blocks of `block` bytes (appended to `out`), from a
/// weight laid out by [`interleave`] in groups of `n` rows; `unfill`
/// appends row `i`'s block of a group block.
pub(crate) fn gguf_row(
    held: &[u8],
    (rows, nb, block, n): (usize, usize, usize, usize),
    r: usize,
    out: &mut Vec<u8>,
    unfill: impl Fn(&[u8], usize, &mut Vec<u8>),
) {
    let row_bytes = nb * block;
    if r >= rows / n * n {
        out.extend_from_slice(&held[r * row_bytes..][..row_bytes]);
        return;
    }
    let (g, i) = (r / n, r % n);
    for b in 0..nb {
        unfill(&held[(g * nb + b) * n * block..][..n * block], i, out);
    }
}

/// Asks for the cache lines of `bytes`.
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
    #[cfg(target_arch = "x86_64")]
    for at in (0..bytes.len()).step_by(64) {
        // SAFETY: a prefetch of memory we hold; prefetches never fault.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                bytes.as_ptr().add(at) as *const i8,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::super::{q4k8, q6k8, q8x16};

    type Layout = (
        usize,
        fn(&[u8], usize, usize) -> Vec<u8>,
        fn(&[u8], usize, usize, usize, &mut Vec<u8>),
    );

    #[test]
    fn every_row_comes_back_as_its_gguf_blocks() {
        let layouts: [Layout; 4] = [
            (144, q4k8::interleave, q4k8::gguf_row),
            (210, q6k8::interleave, q6k8::gguf_row),
            (34, q8x16::interleave_q8_0, q8x16::gguf_row_q8_0),
            (22, q8x16::interleave_q5_0, q8x16::gguf_row_q5_0),
        ];
        for (block, interleave, gguf_row) in layouts {
            for rows in [1usize, 8, 13, 16, 21, 32, 37] {
                let nb = 3;
                let src: Vec<u8> = (0..rows * nb * block)
                    .map(|i| ((i as u32).wrapping_mul(2654435761) >> 13) as u8)
                    .collect();
                let held = interleave(&src, rows, nb);
                assert_eq!(held.len(), src.len());
                if rows >= 16 {
                    assert_ne!(
                        held, src,
                        "{block}-byte blocks, {rows} rows: not interleaved"
                    );
                }
                for r in 0..rows {
                    let mut out = Vec::new();
                    gguf_row(&held, rows, nb, r, &mut out);
                    assert_eq!(
                        out,
                        src[r * nb * block..][..nb * block],
                        "{block}-byte blocks, {rows} rows, row {r}"
                    );
                }
            }
        }
    }
}

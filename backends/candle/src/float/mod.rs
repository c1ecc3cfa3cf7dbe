//! Float (F32, F16, BF16) weight matrices, multiplied so that a token's
//! results never depend on the other tokens of its pass.
//!
//! candle's float matmul picks its blocking from the batch size: one token
//! takes a matrix-vector path, several a tiled one, and the sums come out
//! in a different order (a few 1e-5 apart on a random model, which is
//! enough to flip a near tie between two tokens). Speculative verification
//! feeds many tokens at once and must reproduce one-token decoding bit for
//! bit, so here every output is one dot product over the whole row in the
//! order [`tiles`] fixes, the same at every batch size and on every
//! instruction set; register tiles of rows × tokens load each value once
//! for several outputs. Rows are shared out to candle's thread pool; F16 and
//! BF16 rows are widened (exactly) to f32 once per block of tokens, a long
//! pass taking its tokens a few hundred KiB of activations at a time.

mod tiles;

use std::ops::Range;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use arbor_tensor::{SharedBytes, Store};

use crate::qmm::SendPtr;
use tiles::{Elem, Tiles};

/// The values of a float matrix, in the type the file stores.
/// Each is a copy, or a streamed layer's read buffer kept in place.
pub(crate) enum Values {
    F32(Store<f32>),
    F16(Store<f16>),
    BF16(Store<bf16>),
}

/// A row-major float matrix of `rows × cols`.
pub(crate) struct FloatWeight {
    values: Values,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

/// Rows per grab from the pool (a multiple of every tile's rows: 1, 4, 6, 8).
const CHUNK: usize = 24;

/// A float type whose every bit pattern is a value (so bytes may be copied
/// into it): the three a [`FloatWeight`] holds.
trait Plain: Copy {}
impl Plain for f32 {}
impl Plain for f16 {}
impl Plain for bf16 {}

/// The values stored little-endian in `bytes`, `N` bytes each. On a
/// little-endian machine that is one copy of the bytes (a streamed F16
/// layer is built once per pass: converting value by value cost about as
/// much CPU as reading the layer).
fn le_values<T: Plain, const N: usize>(bytes: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
    let n = bytes.len() / N;
    if cfg!(target_endian = "little") && std::mem::size_of::<T>() == N {
        let mut v = Vec::<T>::with_capacity(n);
        // SAFETY: the capacity holds `n` values of `N` bytes; `T` is a
        // plain float of that size whose every bit pattern is valid, and
        // on a little-endian machine its memory is its little-endian bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), n * N);
            v.set_len(n);
        }
        return v;
    }
    bytes
        .chunks_exact(N)
        .map(|b| from(b.try_into().expect("chunks of N bytes")))
        .collect()
}

impl FloatWeight {
    /// The matrix from its little-endian bytes (`bytes` holds exactly
    /// `rows * cols` values of `ty`, checked by the caller), or `None` when
    /// `ty` is not a float type.
    pub(crate) fn from_bytes(
        ty: arbor_tensor::GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Option<Self> {
        use arbor_tensor::GgmlType as T;
        let values = match ty {
            T::F32 => Values::F32(Store::owned(le_values(bytes, f32::from_le_bytes))),
            T::F16 => Values::F16(Store::owned(le_values(bytes, f16::from_le_bytes))),
            T::BF16 => Values::BF16(Store::owned(le_values(bytes, bf16::from_le_bytes))),
            _ => return None,
        };
        Some(Self { values, rows, cols })
    }

    /// [`Self::from_bytes`] keeping the values in `bytes` (a streamed
    /// layer's read buffer) instead of a copy; `None` when `ty` is not a
    /// float type or the bytes are not aligned for it.
    pub(crate) fn in_place(
        ty: arbor_tensor::GgmlType,
        rows: usize,
        cols: usize,
        bytes: &SharedBytes,
    ) -> Option<Self> {
        use arbor_tensor::GgmlType as T;
        let values = match ty {
            T::F32 => Values::F32(Store::shared(bytes)?),
            T::F16 => Values::F16(Store::shared(bytes)?),
            T::BF16 => Values::BF16(Store::shared(bytes)?),
            _ => return None,
        };
        Some(Self { values, rows, cols })
    }

    /// The matrix from `rows * cols` f32 values, row-major.
    pub(crate) fn from_f32(rows: usize, cols: usize, values: Vec<f32>) -> Self {
        assert_eq!(values.len(), rows * cols, "a {rows}x{cols} float matrix");
        Self {
            values: Values::F32(Store::owned(values)),
            rows,
            cols,
        }
    }

    /// Bytes held.
    pub(crate) fn held_bytes(&self) -> u64 {
        let each = match self.values {
            Values::F32(_) => 4,
            Values::F16(_) | Values::BF16(_) => 2,
        };
        (self.rows * self.cols * each) as u64
    }

    /// Columns `cols` of row `r` as `f32`, widened into `buf` unless
    /// already stored so.
    fn row<'a>(&'a self, r: usize, cols: Range<usize>, buf: &'a mut Vec<f32>) -> &'a [f32] {
        let span = r * self.cols + cols.start..r * self.cols + cols.end;
        match &self.values {
            Values::F32(v) => &v[span],
            Values::F16(v) => {
                buf.clear();
                buf.extend(v[span].iter().map(|x| x.to_f32()));
                buf
            }
            Values::BF16(v) => {
                buf.clear();
                buf.extend(v[span].iter().map(|x| x.to_f32()));
                buf
            }
        }
    }

    /// Rows `ids` as `f32`, one after another (an embedding lookup; ids are
    /// checked by the caller).
    pub(crate) fn gather(&self, ids: &[u32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(ids.len() * self.cols);
        let mut buf = Vec::new();
        for &i in ids {
            out.extend_from_slice(self.row(i as usize, 0..self.cols, &mut buf));
        }
        out
    }

    /// `out[t * rows + r] = x[t] · row r` for the `m` rows of `x`.
    pub(crate) fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        self.matmul_part(x, m, self.rows, 0..self.cols, out);
    }

    /// `out[t * rows + r] = x[t] · row r[cols]` for the first `rows` rows
    /// (`x` holds `m` rows of `cols.len()` values, `out` `m * rows`).
    pub(crate) fn matmul_part(
        &self,
        x: &[f32],
        m: usize,
        rows: usize,
        cols: Range<usize>,
        out: &mut [f32],
    ) {
        let width = cols.len();
        assert!(rows <= self.rows && cols.end <= self.cols);
        assert!(x.len() == m * width && out.len() == m * rows);
        let tiles = Tiles::here();
        let (tile_rows, tile_tokens) = tiles.shape(m);
        let out_at = SendPtr(out.as_mut_ptr());
        // Tokens per block: their activations stay in the cache while
        // every row passes over them.
        let block = (TOKEN_BLOCK_BYTES / (width * 4).max(1)).max(tile_tokens);
        for first in (0..m).step_by(block) {
            let tokens = first..(first + block).min(m);
            let work = |chunks: Range<usize>| {
                let mut buf = vec![0f32; tile_rows * width];
                let end = (chunks.end * CHUNK).min(rows);
                for r0 in (chunks.start * CHUNK..end).step_by(tile_rows) {
                    // Rows past the end repeat the last (their sums are
                    // dropped). F16 rows are read as they are where the
                    // tiles widen in registers.
                    let row = |i: usize| (r0 + i).min(end - 1);
                    let at = Out {
                        ptr: out_at,
                        rows,
                        first: r0,
                        live: (end - r0).min(tile_rows),
                    };
                    let run = Run {
                        tiles,
                        m,
                        x,
                        width,
                        tokens: tokens.clone(),
                    };
                    if let (Values::F16(v), false) = (&self.values, tiles == Tiles::Plain) {
                        let w: Vec<*const u16> = (0..tile_rows)
                            .map(|i| v[row(i) * self.cols + cols.start..].as_ptr().cast())
                            .collect();
                        // SAFETY: each pointer starts `width` values of a
                        // row of the matrix.
                        unsafe { run.rows(&w, &at) };
                    } else {
                        let w: Vec<*const f32> = (0..tile_rows)
                            .map(|i| self.row_ptr(row(i), &cols, &mut buf, i * width))
                            .collect();
                        // SAFETY: each pointer starts `width` values of a
                        // row of the matrix or of `buf`.
                        unsafe { run.rows(&w, &at) };
                    }
                }
            };
            candle_core::utils::barrier_pool().execute_chunked(rows.div_ceil(CHUNK), work);
        }
    }

    /// A pointer to columns `cols` of row `r` as `f32`: into the matrix
    /// when stored so, else widened into `buf[at..]`.
    fn row_ptr(&self, r: usize, cols: &Range<usize>, buf: &mut [f32], at: usize) -> *const f32 {
        let span = r * self.cols + cols.start..r * self.cols + cols.end;
        let to = &mut buf[at..at + cols.len()];
        match &self.values {
            Values::F32(v) => return v[span].as_ptr(),
            Values::F16(v) => v[span].convert_to_f32_slice(to),
            Values::BF16(v) => v[span].convert_to_f32_slice(to),
        }
        to.as_ptr()
    }
}

/// Where a tile's sums go: `live` rows from row `first` of an output of
/// `rows` columns per token.
struct Out {
    ptr: SendPtr<f32>,
    rows: usize,
    first: usize,
    live: usize,
}

/// One block of tokens for the tiles of a pass of `m`.
struct Run<'a> {
    tiles: Tiles,
    m: usize,
    x: &'a [f32],
    width: usize,
    tokens: Range<usize>,
}

impl Run<'_> {
    /// The tile's rows at `w` against every token of the block.
    ///
    /// # Safety
    /// Every pointer in `w` must reach `width` values; `at` must be this
    /// thread's own rows of an output holding `m * rows` values.
    unsafe fn rows<W: Elem>(&self, w: &[*const W], at: &Out) {
        let (_, tile_tokens) = self.tiles.shape(self.m);
        let (x, width, end) = (self.x, self.width, self.tokens.end);
        for t0 in self.tokens.clone().step_by(tile_tokens) {
            let xs: Vec<*const f32> = (0..tile_tokens)
                .map(|j| x[(t0 + j).min(end - 1) * width..].as_ptr())
                .collect();
            let mut sums: tiles::Sums = [[0f32; 8]; 4];
            // SAFETY: the caller's rows; every token pointer a token of `x`.
            unsafe { self.tiles.run(self.m, w, &xs, width, &mut sums) };
            for (j, s) in sums.iter().enumerate().take((end - t0).min(tile_tokens)) {
                for (i, v) in s.iter().enumerate().take(at.live) {
                    // SAFETY: the caller's: these rows are this thread's.
                    unsafe { *at.ptr.get().add((t0 + j) * at.rows + at.first + i) = *v };
                }
            }
        }
    }
}

/// Bytes of activations a block of tokens holds at most.
const TOKEN_BLOCK_BYTES: usize = 512 << 10;

#[cfg(test)]
mod tests {
    use super::*;
    use arbor_tensor::GgmlType;

    fn matrix(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.37)
            .collect()
    }

    #[test]
    fn values_copied_in_bulk_are_the_files_values() {
        // Odd bit patterns included: NaN payloads, subnormals, -0.
        let bytes: Vec<u8> = (0..4096u32)
            .flat_map(|i| (i.wrapping_mul(2_654_435_761)).to_le_bytes())
            .collect();
        let f32s: Vec<f32> = le_values(&bytes, f32::from_le_bytes);
        let want: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(f32s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
        let f16s: Vec<f16> = le_values(&bytes, f16::from_le_bytes);
        let want: Vec<u16> = bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(f16s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
        let bf16s: Vec<bf16> = le_values(&bytes[2..], bf16::from_le_bytes);
        assert_eq!(bf16s.len(), (bytes.len() - 2) / 2);
        assert_eq!(bf16s[0].to_bits(), u16::from_le_bytes([bytes[2], bytes[3]]));
    }

    #[test]
    fn a_token_gets_the_same_bits_alone_and_in_a_batch() {
        let (rows, cols, m) = (37, 96, 9);
        let w = matrix(rows, cols);
        let x: Vec<f32> = matrix(m, cols).iter().map(|v| v * 1.3 + 0.01).collect();
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let bytes: Vec<u8> = match ty {
                GgmlType::F32 => w.iter().flat_map(|v| v.to_le_bytes()).collect(),
                GgmlType::F16 => w
                    .iter()
                    .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                    .collect(),
                _ => w
                    .iter()
                    .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                    .collect(),
            };
            let fw = FloatWeight::from_bytes(ty, rows, cols, &bytes).unwrap();
            let mut all = vec![0f32; m * rows];
            fw.matmul(&x, m, &mut all);
            for t in 0..m {
                let mut one = vec![0f32; rows];
                fw.matmul(&x[t * cols..(t + 1) * cols], 1, &mut one);
                assert_eq!(one, all[t * rows..(t + 1) * rows], "{ty:?} token {t}");
                // And the products are the matrix's.
                let mut buf = Vec::new();
                let want: f32 = fw
                    .row(5, 0..cols, &mut buf)
                    .iter()
                    .zip(&x[t * cols..])
                    .map(|(a, b)| a * b)
                    .sum();
                assert!((one[5] - want).abs() < 1e-4, "{ty:?}: {} vs {want}", one[5]);
            }
        }
    }

    #[test]
    fn non_float_types_are_not_taken() {
        assert!(FloatWeight::from_bytes(GgmlType::Q8_0, 1, 32, &[0; 34]).is_none());
    }
}

//! The KV cache ([`HostKv`]): one layer's keys and values, stored as the
//! backend's [`KvFormat`] says — f32, f16 (what llama.cpp-style attention
//! reads anyway, in half the bytes) or Q8_0 blocks — and read back a head
//! at a time as `f32` for attention.

use arbor_tensor::{Heads, KvFormat, Result};
use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::shape_err;

/// Values of one side (keys or values) of a cache, row after row.
#[derive(Debug, Clone)]
pub(crate) enum Rows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// Q8_0 blocks: per 32 values an f16 scale and 32 signed bytes.
    Q8(Vec<u8>),
}

/// Bytes of one Q8_0 block of 32 values.
const Q8_BLOCK: usize = 34;

impl Rows {
    fn new(format: KvFormat) -> Self {
        match format {
            KvFormat::F32 => Self::F32(Vec::new()),
            KvFormat::F16 => Self::F16(Vec::new()),
            KvFormat::Q8_0 => Self::Q8(Vec::new()),
        }
    }

    /// Storage units (values, or bytes for Q8_0) of a row of `width`.
    fn units(&self, width: usize) -> usize {
        match self {
            Self::F32(_) | Self::F16(_) => width,
            Self::Q8(_) => width / 32 * Q8_BLOCK,
        }
    }

    fn reserve_rows(&mut self, rows: usize, width: usize) {
        let want = rows * self.units(width);
        fn grow<T>(v: &mut Vec<T>, want: usize) {
            if v.capacity() < want {
                v.reserve_exact(want - v.len());
            }
        }
        match self {
            Self::F32(v) => grow(v, want),
            Self::F16(v) => grow(v, want),
            Self::Q8(v) => grow(v, want),
        }
    }

    /// Appends `data` (whole rows of `width`).
    fn push(&mut self, data: &[f32], width: usize) {
        match self {
            Self::F32(v) => v.extend_from_slice(data),
            Self::F16(v) => {
                let at = v.len();
                v.resize(at + data.len(), f16::ZERO);
                v[at..].convert_from_f32_slice(data);
            }
            Self::Q8(v) => {
                debug_assert!(width.is_multiple_of(32));
                v.extend(arbor_gguf::quantize_q8_0(data));
            }
        }
    }

    fn truncate_rows(&mut self, rows: usize, width: usize) {
        let n = rows * self.units(width);
        match self {
            Self::F32(v) => v.truncate(n),
            Self::F16(v) => v.truncate(n),
            Self::Q8(v) => v.truncate(n),
        }
    }

    /// Copies row `src` over row `dst`.
    fn copy_row(&mut self, src: usize, dst: usize, width: usize) {
        let u = self.units(width);
        match self {
            Self::F32(v) => v.copy_within(src * u..(src + 1) * u, dst * u),
            Self::F16(v) => v.copy_within(src * u..(src + 1) * u, dst * u),
            Self::Q8(v) => v.copy_within(src * u..(src + 1) * u, dst * u),
        }
    }

    /// Values `start..start + n` of row `row` (a row of `width`) as `f32`:
    /// borrowed when stored so, else widened into `buf` (for Q8_0, `start`
    /// and `n` are whole blocks).
    pub(crate) fn read<'a>(
        &'a self,
        row: usize,
        width: usize,
        start: usize,
        n: usize,
        buf: &'a mut [f32],
    ) -> &'a [f32] {
        match self {
            Self::F32(v) => &v[row * width + start..][..n],
            Self::F16(v) => {
                let out = &mut buf[..n];
                v[row * width + start..][..n].convert_to_f32_slice(out);
                out
            }
            Self::Q8(v) => {
                let at = row * self.units(width) + start / 32 * Q8_BLOCK;
                let out = &mut buf[..n];
                for (block, o) in v[at..].chunks_exact(Q8_BLOCK).zip(out.chunks_exact_mut(32)) {
                    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                    for (x, &q) in o.iter_mut().zip(&block[2..]) {
                        *x = q as i8 as f32 * d;
                    }
                }
                out
            }
        }
    }

    /// The first `rows` rows (of `width`) as `f32`, widened once: the
    /// values [`Self::read`] gives, for a pass whose many query rows would
    /// otherwise widen every key and value once per row and head.
    pub(crate) fn widen(&self, rows: usize, width: usize) -> std::borrow::Cow<'_, [f32]> {
        match self {
            Self::F32(v) => std::borrow::Cow::Borrowed(&v[..rows * width]),
            Self::F16(v) => {
                let mut out = vec![0f32; rows * width];
                v[..rows * width].convert_to_f32_slice(&mut out);
                std::borrow::Cow::Owned(out)
            }
            Self::Q8(_) => {
                let mut out = vec![0f32; rows * width];
                let mut buf = vec![0f32; width];
                for (r, o) in out.chunks_exact_mut(width).enumerate() {
                    o.copy_from_slice(self.read(r, width, 0, width, &mut buf));
                }
                std::borrow::Cow::Owned(out)
            }
        }
    }

    /// Bytes held (capacity included).
    fn bytes(&self) -> usize {
        match self {
            Self::F32(v) => v.capacity() * 4,
            Self::F16(v) => v.capacity() * 2,
            Self::Q8(v) => v.capacity(),
        }
    }
}

/// One layer's KV cache: `len` rows of `kv_dim` keys and values.
#[derive(Debug, Clone)]
pub struct HostKv {
    pub(crate) k: Rows,
    pub(crate) v: Rows,
    pub(crate) kv_dim: usize,
    pub(crate) len: usize,
}

impl HostKv {
    /// An empty cache for `heads`, stored as `format`.
    pub(crate) fn new(heads: &Heads, format: KvFormat) -> Result<Self> {
        if format == KvFormat::Q8_0 && !heads.head_dim.is_multiple_of(32) {
            return Err(shape_err(
                "kv_new",
                format!(
                    "a q8_0 KV cache needs heads of a multiple of 32 values, not {}",
                    heads.head_dim
                ),
            ));
        }
        Ok(Self {
            k: Rows::new(format),
            v: Rows::new(format),
            kv_dim: heads.n_kv_heads * heads.head_dim,
            len: 0,
        })
    }

    /// Appends `n` rows of keys and values (`kv_dim` each). Capacity grows
    /// in steps of [`arbor_tensor::KV_STEP`] tokens, not by doubling: a
    /// memory budget plans the caches for the request rounded up to a step
    /// (`arbor_pipeline::kv_bytes`).
    pub(crate) fn append(&mut self, k: &[f32], v: &[f32], n: usize) {
        let needed = (self.len + n).div_ceil(arbor_tensor::KV_STEP) * arbor_tensor::KV_STEP;
        for side in [&mut self.k, &mut self.v] {
            side.reserve_rows(needed, self.kv_dim);
        }
        self.k.push(k, self.kv_dim);
        self.v.push(v, self.kv_dim);
        self.len += n;
    }

    pub(crate) fn truncate(&mut self, len: usize) {
        self.k.truncate_rows(len, self.kv_dim);
        self.v.truncate_rows(len, self.kv_dim);
        self.len = len;
    }

    /// Moves row `src` to row `dst`.
    pub(crate) fn copy_row(&mut self, src: usize, dst: usize) {
        self.k.copy_row(src, dst, self.kv_dim);
        self.v.copy_row(src, dst, self.kv_dim);
    }

    /// Bytes the cache holds.
    pub fn held_bytes(&self) -> usize {
        self.k.bytes() + self.v.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (x as f32 / (1u32 << 24) as f32 - 0.5) * 6.0
            })
            .collect()
    }

    #[test]
    fn f16_rows_read_back_as_rounded_f32() {
        let heads = Heads::grouped(4, 2, 64);
        let mut kv = HostKv::new(&heads, KvFormat::F16).unwrap();
        let (k, v) = (values(3 * 128, 1), values(3 * 128, 2));
        kv.append(&k, &v, 3);
        let mut buf = vec![0f32; 64];
        for row in 0..3 {
            let got = kv.k.read(row, 128, 64, 64, &mut buf).to_vec();
            let want: Vec<f32> = k[row * 128 + 64..][..64]
                .iter()
                .map(|x| f16::from_f32(*x).to_f32())
                .collect();
            assert_eq!(got, want, "row {row}");
        }
        assert_eq!(kv.held_bytes(), 2 * 128 * 128 * 2, "one step of f16 rows");
    }

    #[test]
    fn q8_rows_stay_within_half_a_step_and_compact() {
        let heads = Heads::grouped(2, 1, 64);
        let mut kv = HostKv::new(&heads, KvFormat::Q8_0).unwrap();
        let (k, v) = (values(5 * 64, 3), values(5 * 64, 4));
        kv.append(&k, &v, 5);
        let mut buf = vec![0f32; 64];
        for row in 0..5 {
            let got = kv.v.read(row, 64, 32, 32, &mut buf).to_vec();
            for (block, want) in [got].iter().zip([&v[row * 64 + 32..][..32]]) {
                let amax = want.iter().fold(0f32, |m, x| m.max(x.abs()));
                for (g, w) in block.iter().zip(want) {
                    assert!((g - w).abs() <= amax / 127.0 * 0.51 + 1e-3, "{g} vs {w}");
                }
            }
        }
        // Keeping rows 1 and 4 moves row 4's bytes to row 1.
        let before = kv.k.read(4, 64, 0, 64, &mut buf).to_vec();
        kv.copy_row(4, 1);
        kv.truncate(2);
        assert_eq!(kv.k.read(1, 64, 0, 64, &mut buf), &before[..]);
        assert_eq!(kv.len, 2);
    }

    #[test]
    fn q8_needs_whole_blocks_per_head() {
        let e = HostKv::new(&Heads::grouped(2, 1, 48), KvFormat::Q8_0).unwrap_err();
        assert!(e.to_string().contains("multiple of 32"), "{e}");
        assert!(HostKv::new(&Heads::grouped(2, 1, 48), KvFormat::F16).is_ok());
    }
}

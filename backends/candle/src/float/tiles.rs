//! The float matmul's arithmetic: one fixed order of fused multiply-adds
//! per output, the same on every instruction set and at every batch size.
//!
//! An output is the dot product of a weight row `w` and a token `x` of
//! `n` values. Sixteen lanes accumulate it: value `c` (below the last
//! whole 16) goes into lane `c % 16` as `lane = fma(w[c], x[c], lane)`,
//! `c` rising. The lanes then fold in halves — `s8[j] = l[j] + l[j+8]`,
//! `s4[j] = s8[j] + s8[j+4]`, `s2[j] = s4[j] + s4[j+2]`, `s2[0] + s2[1]`
//! — and the tail values follow one fused multiply-add at a time. One
//! AVX-512 register holds the sixteen lanes, two AVX2 registers or four
//! NEON ones hold them in the same places, so every variant gives the same
//! bits ([`dot`] is the plain definition the tests hold them to).
//!
//! A tile multiplies `R` rows by `T` tokens, keeping `R × T` sums in
//! registers while each 16 values of a row and of a token are loaded
//! once: rows and tokens past the real ones repeat the last real one (the
//! caller drops their sums), so the few tile shapes cover any batch.

/// Lanes of every sum.
pub(crate) const LANES: usize = 16;

/// A tile's sums: `[token][row]`, room for the largest tile.
pub(crate) type Sums = [[f32; 8]; 4];

/// The folding of sixteen lanes into one sum.
fn fold(l: &[f32; LANES]) -> f32 {
    let mut s8 = [0f32; 8];
    for j in 0..8 {
        s8[j] = l[j] + l[j + 8];
    }
    let s4 = [s8[0] + s8[4], s8[1] + s8[5], s8[2] + s8[6], s8[3] + s8[7]];
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

/// The dot product of `w` and `x` (equal lengths) in the order every
/// variant follows.
pub(crate) fn dot(w: &[f32], x: &[f32]) -> f32 {
    let whole = w.len() / LANES * LANES;
    let mut l = [0f32; LANES];
    for (wc, xc) in w[..whole]
        .chunks_exact(LANES)
        .zip(x[..whole].chunks_exact(LANES))
    {
        for j in 0..LANES {
            l[j] = wc[j].mul_add(xc[j], l[j]);
        }
    }
    let mut s = fold(&l);
    for c in whole..w.len() {
        s = w[c].mul_add(x[c], s);
    }
    s
}

/// Which tile code runs: chosen once per matmul from the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tiles {
    /// [`dot`] itself, one output at a time (any CPU; LLVM vectorises the
    /// lanes, e.g. into NEON `fmla`).
    Plain,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Tiles {
    /// The best this CPU runs (the same choice as the quantized kernels',
    /// `ARBOR_NO_AVX512` included).
    pub(crate) fn here() -> Self {
        match crate::qmm::isa() {
            #[cfg(target_arch = "x86_64")]
            Some(crate::qmm::Isa::Vnni) => Self::Avx512,
            #[cfg(target_arch = "x86_64")]
            Some(crate::qmm::Isa::Avx2) => Self::Avx2,
            _ => Self::Plain,
        }
    }

    /// `(rows, tokens)` of the tile for passes of `m` tokens.
    pub(crate) fn shape(self, m: usize) -> (usize, usize) {
        match (self, m) {
            (Self::Plain, _) => (1, 1),
            #[cfg(target_arch = "x86_64")]
            (Self::Avx512, 1) => (8, 1),
            #[cfg(target_arch = "x86_64")]
            (Self::Avx512, _) => (4, 4),
            #[cfg(target_arch = "x86_64")]
            (Self::Avx2, 1) => (8, 1),
            #[cfg(target_arch = "x86_64")]
            (Self::Avx2, _) => (6, 2),
        }
    }

    /// `out[t][r] = w[r] · x[t]` for the tile's shape ([`Tiles::shape`]
    /// of a pass of `m` tokens): `w` holds that many row pointers and `x`
    /// that many token pointers, each of `n` values.
    ///
    /// # Safety
    /// Every pointer must be valid for `n` reads.
    pub(crate) unsafe fn run<W: Elem>(
        self,
        m: usize,
        w: &[*const W],
        x: &[*const f32],
        n: usize,
        out: &mut Sums,
    ) {
        let (rows, tokens) = self.shape(m);
        debug_assert!(w.len() == rows && x.len() == tokens);
        // SAFETY (all arms): the caller's pointers are valid for `n`
        // reads, and the variant matches what the CPU runs.
        unsafe {
            match (self, rows, tokens) {
                #[cfg(target_arch = "x86_64")]
                (Self::Avx512, 8, 1) => x86::tile512::<W, 8, 1>(w, x, n, out),
                #[cfg(target_arch = "x86_64")]
                (Self::Avx512, 4, 4) => x86::tile512::<W, 4, 4>(w, x, n, out),
                #[cfg(target_arch = "x86_64")]
                (Self::Avx2, 8, 1) => x86::halves256::<W, 8, 1>(w, x, n, out),
                #[cfg(target_arch = "x86_64")]
                (Self::Avx2, 6, 2) => x86::halves256::<W, 6, 2>(w, x, n, out),
                _ => {
                    let w: Vec<f32> = (0..n).map(|c| W::get(w[0], c)).collect();
                    let x = std::slice::from_raw_parts(x[0], n);
                    out[0][0] = dot(&w, x);
                }
            }
        }
    }
}

/// A weight value the tiles read: `f32`, or f16 bits (`u16`) widened in
/// registers as they are loaded (exactly: every f16 is an f32).
pub(crate) trait Elem: Copy {
    /// Value `c` of the row at `p`.
    ///
    /// # Safety
    /// `p.add(c)` must be valid for a read.
    unsafe fn get(p: *const Self, c: usize) -> f32;
    /// Sixteen values from `c` on, widened (x86: one `zmm`).
    #[cfg(target_arch = "x86_64")]
    #[doc(hidden)]
    unsafe fn z(p: *const Self, c: usize) -> std::arch::x86_64::__m512;
    /// Eight values from `c` on, widened (x86: one `ymm`).
    #[cfg(target_arch = "x86_64")]
    #[doc(hidden)]
    unsafe fn y(p: *const Self, c: usize) -> std::arch::x86_64::__m256;
}

impl Elem for f32 {
    unsafe fn get(p: *const Self, c: usize) -> f32 {
        // SAFETY: the caller's.
        unsafe { *p.add(c) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn z(p: *const Self, c: usize) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's; used under AVX-512F only.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p.add(c)) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn y(p: *const Self, c: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's; used under AVX only.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p.add(c)) }
    }
}

impl Elem for u16 {
    unsafe fn get(p: *const Self, c: usize) -> f32 {
        // SAFETY: the caller's.
        half::f16::from_bits(unsafe { *p.add(c) }).to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn z(p: *const Self, c: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's; used under AVX-512F only.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.add(c) as *const __m256i)) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn y(p: *const Self, c: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's; used under F16C only.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(c) as *const __m128i)) }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Elem, LANES, Sums};

    /// Folds the lanes `j` of `lo` and `j + 8` of `hi` and on, as
    /// [`super::fold`].
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fold256(lo: __m256, hi: __m256) -> f32 {
        let s8 = _mm256_add_ps(lo, hi);
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)))
    }

    /// The tail values `whole..n` after the folded sum `s`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tail<W: Elem>(mut s: f32, w: *const W, x: *const f32, whole: usize, n: usize) -> f32 {
        for c in whole..n {
            // SAFETY: `c < n`, within the caller's reads.
            s = unsafe { W::get(w, c).mul_add(*x.add(c), s) };
        }
        s
    }

    /// `R` rows by `T` tokens, sixteen lanes in one `zmm` each.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn tile512<W: Elem, const R: usize, const T: usize>(
        w: &[*const W],
        x: &[*const f32],
        n: usize,
        out: &mut Sums,
    ) {
        let whole = n / LANES * LANES;
        let wp: [*const W; R] = std::array::from_fn(|r| w[r]);
        let xp: [*const f32; T] = std::array::from_fn(|t| x[t]);
        // SAFETY: the caller's.
        let acc = unsafe { lanes512(&wp, &xp, whole) };
        for r in 0..R {
            for t in 0..T {
                let a = acc[r][t];
                let lo = _mm512_castps512_ps256(a);
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
                // SAFETY: as above.
                out[t][r] = unsafe { tail(fold256(lo, hi), w[r], x[t], whole, n) };
            }
        }
    }

    /// The sixteen lanes of every row × token sum over the first `whole`
    /// values. Apart from the folding after it, so that the sums stay in
    /// registers (together, LLVM spilled some of them on every step).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn lanes512<W: Elem, const R: usize, const T: usize>(
        w: &[*const W; R],
        x: &[*const f32; T],
        whole: usize,
    ) -> [[__m512; T]; R] {
        let mut sums = [[_mm512_setzero_ps(); T]; R];
        let mut c = 0;
        while c < whole {
            // SAFETY: `c + 16 <= n` for every pointer.
            unsafe {
                let xs: [__m512; T] = std::array::from_fn(|t| _mm512_loadu_ps(x[t].add(c)));
                for r in 0..R {
                    let wv = W::z(w[r], c);
                    for t in 0..T {
                        sums[r][t] = _mm512_fmadd_ps(wv, xs[t], sums[r][t]);
                    }
                }
            }
            c += LANES;
        }
        sums
    }

    /// `R` rows by `T` tokens in `ymm` registers: lanes 0-7 of every sum
    /// over the whole row first, then lanes 8-15. A half takes one register
    /// per sum, so a tile of twelve sums fits in the sixteen registers
    /// (both halves at once fitted four), and each token value loaded
    /// feeds `R` multiply-adds. The halves meet only in the folding, so
    /// every lane sees the same additions in the same order as in
    /// [`lanes512`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn halves256<W: Elem, const R: usize, const T: usize>(
        w: &[*const W],
        x: &[*const f32],
        n: usize,
        out: &mut Sums,
    ) {
        let whole = n / LANES * LANES;
        let wp: [*const W; R] = std::array::from_fn(|r| w[r]);
        let xp: [*const f32; T] = std::array::from_fn(|t| x[t]);
        // SAFETY: the caller's.
        let (lo, hi) = unsafe { (half256(&wp, &xp, whole, 0), half256(&wp, &xp, whole, 8)) };
        for r in 0..R {
            for t in 0..T {
                // SAFETY: as above.
                out[t][r] = unsafe { tail(fold256(lo[r][t], hi[r][t]), w[r], x[t], whole, n) };
            }
        }
    }

    /// Lanes `off..off + 8` (`off` 0 or 8) of every row × token sum over
    /// the first `whole` values.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn half256<W: Elem, const R: usize, const T: usize>(
        w: &[*const W; R],
        x: &[*const f32; T],
        whole: usize,
        off: usize,
    ) -> [[__m256; T]; R] {
        let mut sums = [[_mm256_setzero_ps(); T]; R];
        let mut c = off;
        while c < whole {
            // SAFETY: `c + 8 <= whole <= n` for every pointer.
            unsafe {
                let xs: [__m256; T] = std::array::from_fn(|t| _mm256_loadu_ps(x[t].add(c)));
                for r in 0..R {
                    let wv = W::y(w[r], c);
                    for t in 0..T {
                        sums[r][t] = _mm256_fmadd_ps(wv, xs[t], sums[r][t]);
                    }
                }
            }
            c += LANES;
        }
        sums
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let v = (i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40503);
                ((v >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 3.0
            })
            .collect()
    }

    #[test]
    fn every_variant_gives_the_plain_order_bit_for_bit() {
        #[cfg_attr(not(target_arch = "x86_64"), expect(unused_mut))]
        let mut variants = vec![Tiles::Plain];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                variants.push(Tiles::Avx2);
            }
            if is_x86_feature_detected!("avx512f") {
                variants.push(Tiles::Avx512);
            }
        }
        // Widths with and without a tail, shorter than one lane group too.
        for n in [5, 16, 37, 96, 1536 + 9] {
            let w: Vec<Vec<f32>> = (0..8).map(|r| values(n, r)).collect();
            let x: Vec<Vec<f32>> = (0..4).map(|t| values(n, 100 + t)).collect();
            for &v in &variants {
                for m in [1, 3] {
                    let (rows, tokens) = v.shape(m);
                    let wp: Vec<*const f32> = w[..rows].iter().map(|r| r.as_ptr()).collect();
                    let xp: Vec<*const f32> = x[..tokens].iter().map(|t| t.as_ptr()).collect();
                    let mut out = [[0f32; 8]; 4];
                    // SAFETY: every row and token holds `n` values.
                    unsafe { v.run(m, &wp, &xp, n, &mut out) };
                    // The same rows as f16 bits, widened in registers,
                    // against the f16 values widened first.
                    let h: Vec<Vec<u16>> = (w[..rows].iter())
                        .map(|r| {
                            r.iter()
                                .map(|v| half::f16::from_f32(*v).to_bits())
                                .collect()
                        })
                        .collect();
                    let hp: Vec<*const u16> = h.iter().map(|r| r.as_ptr()).collect();
                    let mut half_out = [[0f32; 8]; 4];
                    // SAFETY: as above.
                    unsafe { v.run(m, &hp, &xp, n, &mut half_out) };
                    for t in 0..tokens {
                        for r in 0..rows {
                            let want = dot(&w[r], &x[t]);
                            assert_eq!(
                                out[t][r].to_bits(),
                                want.to_bits(),
                                "{v:?} n={n} r={r} t={t}"
                            );
                            let wide: Vec<f32> = h[r]
                                .iter()
                                .map(|b| half::f16::from_bits(*b).to_f32())
                                .collect();
                            let want = dot(&wide, &x[t]);
                            assert_eq!(half_out[t][r].to_bits(), want.to_bits(), "f16 {v:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_order_is_a_dot_product() {
        let (w, x) = (values(1000, 1), values(1000, 2));
        let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        assert!(
            (dot(&w, &x) as f64 - exact).abs() < 1e-3,
            "{} vs {exact}",
            dot(&w, &x)
        );
    }
}

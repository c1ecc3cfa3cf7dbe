//! The op tests every backend runs: each public function takes a backend,
//! drives one group of [`Backend`](crate::Backend) operations on small
//! random inputs and asserts the results against host math or
//! [`reference`](crate::reference), panicking (as a test does) on the first
//! disagreement. A backend's `tests/ops.rs` is a list of `#[test]`s that
//! call these with each backend value it covers.
//!
//! Behind the `suite` feature, which the backends enable for their tests
//! only (from `[dev-dependencies]`), so ordinary builds carry none of it.
//! The helpers beside the checks (a seeded generator, tolerances, random
//! GGUF blocks, a host matmul) are for backend-specific tests too.
//!
//! Where backends differ on purpose (candle rounds activations to 8 bits
//! against quantized weights) a check takes the tolerance as an argument;
//! everywhere else one tolerance holds for every backend.

mod attention;
mod elementwise;
mod matmul;
mod streamed;

pub use attention::*;
pub use elementwise::*;
pub use matmul::*;
pub use streamed::*;

use crate::{Backend, GgmlType, WeightData};
use half::{bf16, f16};

/// SplitMix64: a small deterministic generator for test data.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[-1, 1)`.
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// `n` values uniform in `[-1, 1)`.
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// How far a result may stray from the expected values. An element passes
/// when its error is within both bounds:
/// - `of_largest` times the largest expected magnitude (a bound for sums
///   whose terms cancel: the error follows the terms, not the total);
/// - `of_each` times its own expected magnitude, or `floor` where that
///   is smaller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tol {
    pub of_largest: f32,
    pub of_each: f32,
    pub floor: f32,
}

impl Tol {
    /// Within `t` of the largest expected magnitude.
    pub const fn largest(t: f32) -> Self {
        Self {
            of_largest: t,
            of_each: f32::INFINITY,
            floor: 1.0,
        }
    }
    /// Within `t` of each element's magnitude, or of `floor` where smaller.
    pub const fn each(t: f32, floor: f32) -> Self {
        Self {
            of_largest: f32::INFINITY,
            of_each: t,
            floor,
        }
    }
    /// This bound and [`NEAR`] both.
    pub const fn and_near(self) -> Self {
        Self {
            of_each: NEAR.of_each,
            floor: NEAR.floor,
            ..self
        }
    }
}

/// Float ops with nothing to round: 1e-4 of each value (of 1 below 1).
pub const NEAR: Tol = Tol::each(1e-4, 1.0);

/// `got` has `want`'s length and every element within `tol`.
#[track_caller]
pub fn assert_close(got: &[f32], want: &[f32], tol: Tol, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let largest = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        assert!(
            err <= tol.of_largest * largest && err <= tol.of_each * w.abs().max(tol.floor),
            "{what}: element {i}: got {g}, want {w} (largest {largest}, {tol:?})"
        );
    }
}

/// The bit patterns of `v`, to compare results exactly (NaNs included).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// `x [n, k] · wᵀ` for `w [m, k]` on the host, summed in f64.
pub fn host_matmul(x: &[f32], w: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    let mut out = vec![0.0; n * m];
    for i in 0..n {
        for j in 0..m {
            let s: f64 = (0..k)
                .map(|l| x[i * k + l] as f64 * w[j * k + l] as f64)
                .sum();
            out[i * m + j] = s as f32;
        }
    }
    out
}

/// Rows `rows` of `x` (`cols` wide), one after another.
pub fn gather_rows(x: &[f32], cols: usize, rows: &[usize]) -> Vec<f32> {
    rows.iter()
        .flat_map(|&r| x[r * cols..][..cols].iter().copied())
        .collect()
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A weight named `w`.
pub fn weight_data(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> WeightData<'_> {
    WeightData {
        name: "w",
        ty,
        rows,
        cols,
        bytes,
    }
}

/// A `[rows, cols]` weight of `ty` from random data: float types from
/// values in `[-1, 1)`; block types from random bytes, with every `f16`
/// scale and minimum set to a small finite value (random bits would give
/// infinities and NaNs).
pub fn random_blocks(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        GgmlType::F32 => return f32_bytes(&rng.vec(n)),
        GgmlType::F16 => {
            return (0..n)
                .flat_map(|_| f16::from_f32(rng.f32()).to_le_bytes())
                .collect();
        }
        GgmlType::BF16 => {
            return (0..n)
                .flat_map(|_| bf16::from_f32(rng.f32()).to_le_bytes())
                .collect();
        }
        _ => {}
    }
    let halves: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q6_K => &[208],
        _ => &[0, 2],
    };
    let (len, size) = (ty.block_len(), ty.block_bytes());
    let mut out = Vec::with_capacity(n / len * size);
    for _ in 0..n / len {
        let mut block = rng.bytes(size);
        for &at in halves {
            let h = f16::from_f32(0.002 + 0.02 * rng.f32().abs());
            block[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
        out.extend(block);
    }
    out
}

/// Q5_0 blocks holding `(q - 16) * d` for the 5-bit quants `qs` (32 a block).
pub fn q5_0(qs: &[u8], d: f32) -> Vec<u8> {
    let mut out = Vec::new();
    for block in qs.chunks(32) {
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        let high =
            (block.iter().enumerate()).fold(0u32, |h, (j, &q)| h | ((q as u32 >> 4) & 1) << j);
        out.extend_from_slice(&high.to_le_bytes());
        for j in 0..16 {
            out.push((block[j] & 0x0F) | ((block[j + 16] & 0x0F) << 4));
        }
    }
    out
}

/// Q8_0 blocks of random quants (all of -127..=127) under random scales,
/// and the values they hold.
pub fn random_q8_0(n: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let (mut bytes, mut values) = (Vec::new(), Vec::new());
    for _ in 0..n / 32 {
        let scale = f16::from_f32(0.01 + 0.04 * rng.f32().abs());
        bytes.extend(scale.to_le_bytes());
        for _ in 0..32 {
            let q = (rng.below(255) as i32 - 127) as i8;
            bytes.push(q as u8);
            values.push(scale.to_f32() * q as f32);
        }
    }
    (bytes, values)
}

/// A tensor from host data; panics on failure.
pub fn tensor<B: Backend>(b: &B, data: &[f32], rows: usize, cols: usize) -> B::Tensor {
    b.tensor(data, rows, cols).expect("tensor")
}

/// A tensor's values on the host; panics on failure.
pub fn host<B: Backend>(b: &B, x: &B::Tensor) -> Vec<f32> {
    b.to_vec(x).expect("to_vec")
}

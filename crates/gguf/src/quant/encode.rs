//! Quantization to Q5_0, as ggml's reference quantizer does it: per block
//! of 32 the value of largest magnitude `max` sets the scale
//! `d = max / -16`, and each value becomes `round(x / d) + 16` clamped to
//! 0..=31 (so `max` itself maps to 0, the far end of the range).

use half::f16;

/// Q5_0 blocks for `x` (length a multiple of 32; a partial block at the end
/// is ignored): per block an f16 scale, the 32 fifth bits, then the low
/// nibbles of values `j` and `j + 16` sharing byte `j`.
pub fn quantize_q5_0(x: &[f32]) -> Vec<u8> {
    let (blocks, _) = x.as_chunks::<32>();
    let mut out = Vec::with_capacity(blocks.len() * 22);
    for block in blocks {
        let max = block
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -16.0;
        let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
        let q = |v: f32| ((v * inv + 16.5) as i8).clamp(0, 31) as u8;
        let mut qh = 0u32;
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let (lo, hi) = (q(block[j]), q(block[j + 16]));
            qs[j] = (lo & 0x0f) | ((hi & 0x0f) << 4);
            qh |= u32::from(lo >> 4) << j;
            qh |= u32::from(hi >> 4) << (j + 16);
        }
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&qh.to_le_bytes());
        out.extend_from_slice(&qs);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GgmlType, dequantize, repack_q5_0_to_q8_0};

    fn values(n: usize, mut seed: u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    #[test]
    fn round_trips_within_half_a_step() {
        let x = values(32 * 40, 9);
        let q = quantize_q5_0(&x);
        assert_eq!(q.len(), 40 * 22);
        let y = dequantize(GgmlType::Q5_0, &q, x.len()).unwrap();
        for (bx, by) in x.chunks(32).zip(y.chunks(32)) {
            let amax = bx.iter().fold(0f32, |m, v| m.max(v.abs()));
            let step = amax / 16.0;
            for (a, b) in bx.iter().zip(by) {
                // Half a step, plus the f16 rounding of the scale; a whole
                // step for values past 15 steps on the side opposite the
                // largest magnitude, where the quants end (as in ggml).
                let bound = if a.abs() <= step * 15.0 { 0.5 } else { 1.0 };
                assert!((a - b).abs() <= step * bound + amax * 2e-3, "{a} -> {b}");
            }
        }
    }

    #[test]
    fn values_on_the_grid_come_back_exactly() {
        // d = -0.25: quants 0..=31 are the values 4, 3.75, ..., -3.75.
        let x: Vec<f32> = (0..32).map(|q| (q as f32 - 16.0) * -0.25).collect();
        let y = dequantize(GgmlType::Q5_0, &quantize_q5_0(&x), 32).unwrap();
        assert_eq!(x, y);
        // Repacking the result as Q8_0 keeps every value.
        let r = repack_q5_0_to_q8_0(&quantize_q5_0(&x)).unwrap();
        assert_eq!(dequantize(GgmlType::Q8_0, &r, 32).unwrap(), x);
    }

    #[test]
    fn a_zero_block_is_all_zeros() {
        let y = dequantize(GgmlType::Q5_0, &quantize_q5_0(&[0.0; 32]), 32).unwrap();
        assert!(y.iter().all(|&v| v == 0.0));
    }
}

//! Synthetic quantized weights for the benches and examples: only speed is
//! measured, so the values need only be varied and finite.

use arbor_tensor::GgmlType;

/// Blocks of `ty` for `n` weights, with varied quants (shifted by `seed`,
/// so copies differ) and a small fixed f16 scale in every block.
pub fn blocks(ty: GgmlType, n: usize, seed: usize) -> Vec<u8> {
    let size = ty.block_bytes();
    let mut out: Vec<u8> = (0..n / ty.block_len() * size)
        .map(|i| (((i + seed) * 2654435761) >> 7) as u8)
        .collect();
    let scales: &[usize] = match ty {
        GgmlType::Q6_K => &[208],
        GgmlType::Q4_K => &[0, 2],
        _ => &[0],
    };
    for block in out.chunks_mut(size) {
        for &at in scales {
            block[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
    }
    out
}

/// `n` activations in [-1, 1), varied.
#[allow(dead_code)] // not every bench or example including this file uses it
pub fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 2654435761) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

//! Dequantized pseudo-random blocks against hashes of what the numpy
//! dequantizers of the `gguf` Python package give for the same bytes
//! (printed by `compare_with_gguf_py.py`). Random bytes exercise every bit
//! of every field, including NaN and infinite scales; a single differing
//! bit in any output changes the hash.

use arbor_gguf::{GgmlType, dequantize};

/// xorshift64, one byte per step (same stream as the Python script).
fn noise(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        })
        .collect()
}

/// FNV-1a over the little-endian bits of `y`, every NaN counted as the
/// canonical quiet NaN (NaN payloads depend on operand order).
fn fnv1a(y: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in y {
        let bits = if v.is_nan() { 0x7fc0_0000 } else { v.to_bits() };
        for b in bits.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[test]
fn random_blocks_match_gguf_py() {
    let cases = [
        (GgmlType::F32, 0x9e2f_9cdf_44d2_34fe),
        (GgmlType::F16, 0xbd83_1f09_9e05_e938),
        (GgmlType::BF16, 0xb0cb_4e24_c2a2_7cec),
        (GgmlType::Q4_0, 0x70b6_54d8_5238_670a),
        (GgmlType::Q4_1, 0x3948_a308_b363_920e),
        (GgmlType::Q5_0, 0xece8_d1b4_5412_4be6),
        (GgmlType::Q5_1, 0xc418_a2de_9538_0931),
        (GgmlType::Q8_0, 0xdea9_c00c_d75c_f372),
        (GgmlType::Q2_K, 0x634e_065c_815a_0c37),
        (GgmlType::Q3_K, 0xeb63_2506_b6d9_c848),
        (GgmlType::Q4_K, 0xe113_c9b4_8795_04b3),
        (GgmlType::Q5_K, 0x3d7b_d513_2dcd_1f51),
        (GgmlType::Q6_K, 0x67d1_a4b3_67a5_1202),
    ];
    for (ty, want) in cases {
        let blocks = if ty.block_len() > 1 { 16 } else { 256 };
        let bytes = noise(blocks * ty.block_bytes(), 0x5eed + u64::from(ty.to_u32()));
        let y = dequantize(ty, &bytes, blocks * ty.block_len()).unwrap();
        assert_eq!(fnv1a(&y), want, "{ty}: differs from gguf-py");
    }
}

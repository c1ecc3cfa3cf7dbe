//! Hand-built blocks with values worked out from the layouts by hand.

use super::*;

fn h(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

/// Deterministic pseudo-random bytes (xorshift64).
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

/// `n` floats, all `fill` except the listed (index, value) pairs.
fn expect(n: usize, fill: &[(std::ops::Range<usize>, f32)], at: &[(usize, f32)]) -> Vec<f32> {
    let mut v = vec![0.0; n];
    for (r, x) in fill {
        v[r.clone()].fill(*x);
    }
    for &(i, x) in at {
        v[i] = x;
    }
    v
}

fn deq(ty: GgmlType, b: &[u8]) -> Vec<f32> {
    let n = b.len() / ty.block_bytes() * ty.block_len();
    dequantize(ty, b, n).unwrap()
}

#[test]
fn float_types() {
    let b: Vec<u8> = [1.5f32, -2.0, 1e-30]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(deq(GgmlType::F32, &b), [1.5, -2.0, 1e-30]);
    let b = [h(0.5), h(-3.0), h(65504.0)].concat();
    assert_eq!(deq(GgmlType::F16, &b), [0.5, -3.0, 65504.0]);
    // bf16 is the top half of an f32.
    let b = [0x3fc0u16, 0xc000, 0x0000, 0x8000]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect::<Vec<_>>();
    let y = deq(GgmlType::BF16, &b);
    assert_eq!(y, [1.5, -2.0, 0.0, 0.0]);
    assert!(y[3].is_sign_negative());
}

#[test]
fn q4_0_block() {
    let mut b = [0x88u8; 18];
    b[0..2].copy_from_slice(&h(0.5));
    b[2] = 0x9f; // element 0: 15 - 8 = 7; element 16: 9 - 8 = 1
    b[17] = 0x08; // element 15: 8 - 8 = 0; element 31: 0 - 8 = -8
    let want = expect(32, &[], &[(0, 3.5), (16, 0.5), (31, -4.0)]);
    assert_eq!(deq(GgmlType::Q4_0, &b), want);
}

#[test]
fn q4_1_block() {
    let mut b = [0u8; 20];
    b[0..2].copy_from_slice(&h(0.25));
    b[2..4].copy_from_slice(&h(-1.0));
    b[4] = 0x3a; // element 0: 10; element 16: 3
    let want = expect(32, &[(0..32, -1.0)], &[(0, 1.5), (16, -0.25)]);
    assert_eq!(deq(GgmlType::Q4_1, &b), want);
}

#[test]
fn q5_0_block() {
    let mut b = [0u8; 22];
    b[0..2].copy_from_slice(&h(2.0));
    b[2..6].copy_from_slice(&(1u32 | 1 << 17).to_le_bytes());
    b[6] = 0x0f; // element 0: 15 + 16 = 31
    b[7] = 0x10; // element 17: 1 + 16 = 17 (element 1: 0)
    let want = expect(32, &[(0..32, -32.0)], &[(0, 30.0), (17, 2.0)]);
    assert_eq!(deq(GgmlType::Q5_0, &b), want);
}

#[test]
fn q5_1_block() {
    let mut b = [0u8; 24];
    b[0..2].copy_from_slice(&h(0.5));
    b[2..4].copy_from_slice(&h(1.0));
    b[4..8].copy_from_slice(&(1u32 << 31).to_le_bytes());
    b[23] = 0xf0; // element 31: 15 + 16 = 31; element 15: 0
    let want = expect(32, &[(0..32, 1.0)], &[(31, 16.5)]);
    assert_eq!(deq(GgmlType::Q5_1, &b), want);
}

#[test]
fn q8_0_and_q8_1_blocks() {
    let mut b = [0u8; 34];
    b[0..2].copy_from_slice(&h(0.25));
    b[2] = 127;
    b[3] = 0x80; // -128
    b[33] = 0xff; // -1
    let want = expect(32, &[], &[(0, 31.75), (1, -32.0), (31, -0.25)]);
    assert_eq!(deq(GgmlType::Q8_0, &b), want);

    let mut b = [0u8; 36];
    b[0..2].copy_from_slice(&h(0.5));
    b[2..4].copy_from_slice(&h(1234.0)); // the sum field is ignored
    b[4] = 3;
    b[9] = (-4i8) as u8;
    let want = expect(32, &[], &[(0, 1.5), (5, -2.0)]);
    assert_eq!(deq(GgmlType::Q8_1, &b), want);
}

#[test]
fn q2_k_block() {
    let mut b = [0u8; 84];
    // Sub-block scales: low nibble scale, high nibble min.
    b[0] = 0x21; // group 0: scale 1, min 2
    b[1] = 0x03; // group 1: scale 3, min 0
    b[5] = 0x12; // group 5: scale 2, min 1
    b[15] = 0xff; // group 15: scale 15, min 15
    let qs = 16;
    b[qs] = 0b11; // element 0 (byte 0, shift 0) = 3
    b[qs + 16] = 0b01_0010; // element 16 (shift 0) = 2; element 80 (shift 4) = 1
    b[qs + 63] = 0b11 << 6; // element 255 (byte 63, shift 6) = 3
    b[80..82].copy_from_slice(&h(0.5));
    b[82..84].copy_from_slice(&h(0.25));
    let want = expect(
        256,
        &[(0..16, -0.5), (80..96, -0.25), (240..256, -3.75)],
        &[(0, 1.0), (16, 3.0), (80, 0.75), (255, 18.75)],
    );
    assert_eq!(deq(GgmlType::Q2_K, &b), want);
}

#[test]
fn q3_k_block() {
    let mut b = [0u8; 110];
    let (hm, qs, sc) = (0, 32, 96);
    // Every 6-bit scale starts at 32 (= 0 after the -32 bias): low bits 0,
    // high bits 2 for all sixteen groups.
    b[sc + 8..sc + 12].fill(0xaa);
    b[sc] |= 1; // group 0: 33 -> 1
    b[sc + 1] |= 0xe0; // group 9 low bits 14 ...
    b[sc + 9] = 0x9a; // ... high bits (byte 9, bits 4-5) 1: 30 -> -2
    b[sc + 7] |= 0xf0; // group 15 low bits 15 ...
    b[sc + 11] = 0xea; // ... high bits (byte 11, bits 6-7) 3: 63 -> 31
    b[108..110].copy_from_slice(&h(0.5));
    b[qs] = 3; // element 0 low bits 3
    b[hm] = 1; // element 0 high bit set: q = 3
    b[hm + 1] = 1; // element 1 high bit set: q = 0
    b[qs + 54] = 2; // element 150 low bits 2 (byte 32 + 22, shift 0) ...
    b[hm + 22] = 1 << 4; // ... high bit (hmask[22], bit 4) set: q = 2
    b[qs + 63] = 1 << 6; // element 255 low bits 1, high bit clear: q = -3
    // Clear high bits elsewhere: q = -4.
    let want = expect(
        256,
        &[(0..16, -2.0), (144..160, 4.0), (240..256, -62.0)],
        &[(0, 1.5), (1, 0.0), (150, -2.0), (255, -46.5)],
    );
    assert_eq!(deq(GgmlType::Q3_K, &b), want);
}

/// The 12 scale bytes used by the Q4_K and Q5_K tests: sub-block 0 has
/// scale 2 and min 1, sub-block 5 scale 19 and min 36, the rest zero.
fn k_scales() -> [u8; 12] {
    let mut s = [0u8; 12];
    s[0] = 2;
    s[4] = 1;
    s[9] = 0x43; // low four bits: scale 3, min 4
    s[1] |= 1 << 6; // top bits of scale 5: 1 -> 16 + 3 = 19
    s[5] |= 2 << 6; // top bits of min 5: 2 -> 32 + 4 = 36
    s
}

#[test]
fn k_scale_unpacking() {
    let s = k_scales();
    let got: Vec<_> = (0..8).map(|j| k_scale_min(&s, j)).collect();
    let mut want = vec![(0, 0); 8];
    want[0] = (2, 1);
    want[5] = (19, 36);
    assert_eq!(got, want);
}

#[test]
fn q4_k_block() {
    let mut b = [0u8; 144];
    b[0..2].copy_from_slice(&h(0.5));
    b[2..4].copy_from_slice(&h(0.25));
    b[4..16].copy_from_slice(&k_scales());
    let qs = 16;
    b[qs] = 0xa7; // element 0 (sub-block 0, low nibble) = 7; element 32 = 10
    b[qs + 65] = 0xc0; // element 161 (sub-block 5: chunk 2, high nibble, l = 1) = 12
    // Sub-block 0: 0.5*2*q - 0.25*1; sub-block 5: 0.5*19*q - 0.25*36.
    let want = expect(
        256,
        &[(0..32, -0.25), (160..192, -9.0)],
        &[(0, 6.75), (161, 105.0)],
    );
    assert_eq!(deq(GgmlType::Q4_K, &b), want);
}

#[test]
fn q5_k_block() {
    let mut b = [0u8; 176];
    b[0..2].copy_from_slice(&h(0.5));
    b[2..4].copy_from_slice(&h(0.25));
    b[4..16].copy_from_slice(&k_scales());
    let (qh, qs) = (16, 48);
    b[qs] = 0x07; // element 0 low bits 7 ...
    b[qh] = 1; // ... fifth bit (qh[0] bit 0): 23
    b[qs + 65] = 0xc0; // element 161 low bits 12 ...
    b[qh + 1] = 1 << 5; // ... fifth bit (qh[1], bit 5): 28
    b[qs + 66] = 0x50; // element 162: 5, no fifth bit
    let want = expect(
        256,
        &[(0..32, -0.25), (160..192, -9.0)],
        &[(0, 22.75), (161, 257.0), (162, 38.5)],
    );
    assert_eq!(deq(GgmlType::Q5_K, &b), want);
}

#[test]
fn q6_k_block() {
    let mut b = [0u8; 210];
    let (ql, qh, sc) = (0, 128, 192);
    b[sc] = 2;
    b[sc + 5] = (-3i8) as u8;
    b[sc + 15] = 1;
    b[208..210].copy_from_slice(&h(0.5));
    // Element 0: ql[0] low nibble 5, qh[0] bits 0-1 = 2: q = 37 - 32 = 5.
    b[ql] = 0x05;
    b[qh] = 0b10;
    // Element 81 (first half, quarter 2, l = 17): ql[17] high nibble 15,
    // qh[17] bits 4-5 = 3: q = 63 - 32 = 31.
    b[ql + 17] = 0xf0;
    b[qh + 17] = 0b11 << 4;
    // Element 255 (second half, quarter 3, l = 31): ql[64 + 32 + 31] high
    // nibble 1, qh[32 + 31] bits 6-7 = 1: q = 17 - 32 = -15.
    b[ql + 127] = 0x10;
    b[qh + 63] = 0b01 << 6;
    // Everything else is q = -32.
    let want = expect(
        256,
        &[(0..16, -32.0), (80..96, 48.0), (240..256, -16.0)],
        &[(0, 5.0), (81, -46.5), (255, -7.5)],
    );
    assert_eq!(deq(GgmlType::Q6_K, &b), want);
}

#[test]
fn q8_k_block() {
    let mut b = noise(292, 7); // the group sums are not read
    b[0..4].copy_from_slice(&0.125f32.to_le_bytes());
    b[4..260].fill(0);
    b[4] = 8;
    b[259] = 0x80;
    let want = expect(256, &[], &[(0, 1.0), (255, -16.0)]);
    assert_eq!(deq(GgmlType::Q8_K, &b), want);
}

#[test]
fn several_blocks_in_order() {
    // Two Q8_0 blocks with different scales land one after the other.
    let mut b = vec![0u8; 68];
    b[0..2].copy_from_slice(&h(1.0));
    b[2..34].fill(1);
    b[34..36].copy_from_slice(&h(-2.0));
    b[36..68].fill(1);
    let want = expect(64, &[(0..32, 1.0), (32..64, -2.0)], &[]);
    assert_eq!(deq(GgmlType::Q8_0, &b), want);
}

#[test]
fn every_type_decodes_whole_blocks() {
    for ty in GgmlType::ALL {
        let bytes = noise(3 * ty.block_bytes(), 42);
        let n = 3 * ty.block_len();
        let y = dequantize(ty, &bytes, n).unwrap();
        assert_eq!(y.len(), n, "{ty}");
        let mut into = vec![f32::NAN; n];
        dequantize_into(ty, &bytes, &mut into).unwrap();
        assert_eq!(
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            into.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{ty}"
        );
        assert!(dequantize(ty, &[], 0).unwrap().is_empty());
    }
}

#[test]
fn size_mismatches_are_errors() {
    for ty in GgmlType::ALL {
        let (bl, bb) = (ty.block_len(), ty.block_bytes());
        if bl > 1 {
            let r = dequantize(ty, &vec![0u8; 3 * bb], 2 * bl + 1);
            assert!(matches!(r, Err(GgufError::PartialBlock { .. })), "{ty}");
        }
        for (len, n) in [
            (2 * bb - 1, 2 * bl),
            (2 * bb + 1, 2 * bl),
            (2 * bb, bl),
            (0, bl),
        ] {
            let r = dequantize(ty, &vec![0u8; len], n);
            assert!(
                matches!(r, Err(GgufError::DataLength { .. })),
                "{ty}: {len} bytes for {n} elements"
            );
        }
        let mut out = vec![0.0; bl];
        assert!(dequantize_into(ty, &vec![0u8; 2 * bb], &mut out).is_err());
        // A huge count fails before allocating.
        assert!(dequantize(ty, &vec![0u8; bb], usize::MAX / bl * bl).is_err());
    }
}

#[test]
fn partial_block_for_scalar_types_is_impossible() {
    // Block length 1: every count is whole, only the byte length can be off.
    assert!(matches!(
        dequantize(GgmlType::F16, &[0; 3], 1),
        Err(GgufError::DataLength {
            expected: 2,
            len: 3,
            ..
        })
    ));
    assert!(matches!(
        dequantize(GgmlType::Q4_K, &[0; 144], 255),
        Err(GgufError::PartialBlock { n: 255, .. })
    ));
}

#[test]
fn selected_rows_match_the_full_matrix() {
    for ty in GgmlType::ALL {
        let row_len = 2 * ty.block_len();
        let n_rows = 5;
        let bytes = noise(n_rows * 2 * ty.block_bytes(), 9);
        let full = dequantize(ty, &bytes, n_rows * row_len).unwrap();
        let pick = [4, 0, 2, 2];
        let got = dequantize_rows(ty, &bytes, row_len, &pick).unwrap();
        let want: Vec<f32> = pick
            .iter()
            .flat_map(|&r| full[r * row_len..(r + 1) * row_len].iter().copied())
            .collect();
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{ty}"
        );
        assert!(
            dequantize_rows(ty, &bytes, row_len, &[])
                .unwrap()
                .is_empty()
        );
        assert!(matches!(
            dequantize_rows(ty, &bytes, row_len, &[1, 5]),
            Err(GgufError::RowOutOfRange { row: 5, rows: 5 })
        ));
        assert!(dequantize_rows(ty, &bytes[1..], row_len, &[0]).is_err());
        assert!(dequantize_rows(ty, &bytes, 0, &[0]).is_err());
        if ty.block_len() > 1 {
            assert!(matches!(
                dequantize_rows(ty, &bytes, row_len + 1, &[0]),
                Err(GgufError::PartialBlock { .. })
            ));
        }
    }
}

#[test]
fn q5_0_repacks_to_q8_0_exactly() {
    let mut bytes = noise(22 * 64, 3);
    // Keep the scales finite so equality is meaningful (NaN != NaN).
    for (i, block) in bytes.chunks_exact_mut(22).enumerate() {
        block[0..2].copy_from_slice(&h((i as f32 - 30.0) * 0.01));
    }
    let repacked = repack_q5_0_to_q8_0(&bytes).unwrap();
    assert_eq!(repacked.len(), 34 * 64);
    let a = dequantize(GgmlType::Q5_0, &bytes, 64 * 32).unwrap();
    let b = dequantize(GgmlType::Q8_0, &repacked, 64 * 32).unwrap();
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // Quants stay in -16..16.
    for block in repacked.chunks_exact(34) {
        assert!(block[2..].iter().all(|&q| (-16..16).contains(&(q as i8))));
    }
    assert!(repack_q5_0_to_q8_0(&bytes[..21]).is_err());
    assert!(repack_q5_0_to_q8_0(&[]).unwrap().is_empty());
}

#[test]
fn quantize_q8_0_round_trips_within_half_a_step() {
    let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
    let q = quantize_q8_0(&x);
    assert_eq!(q.len(), 2 * 34);
    let y = dequantize(GgmlType::Q8_0, &q, 64).unwrap();
    for (block, (xs, ys)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
        let step = xs.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        for (a, b) in xs.iter().zip(ys) {
            assert!(
                (a - b).abs() <= 0.51 * step + 1e-3,
                "block {block}: {a} vs {b}"
            );
        }
    }
    assert!(quantize_q8_0(&[0.0; 32]).iter().skip(2).all(|&b| b == 0));
}

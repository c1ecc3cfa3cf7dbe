//! Our CubeCL kernels on wgpu (lavapipe in CI): quantized weights kept in
//! their GGUF blocks, every format against the host dequantizer
//! (`arbor_gguf::dequantize`); the device bytes are the blocks' bytes; and
//! a row gets the same bits from matmul, RMS norm and attention whatever
//! else is in its pass.
#![cfg(feature = "wgpu")]

use arbor_backend_burn::BurnBackend;
use arbor_tensor::suite::{Rng, Tol, assert_close, bits, host_matmul, random_blocks, weight_data};
use arbor_tensor::{Backend, GgmlType, HeadOrder, Heads, Mask, Rope, RopeStyle};

const FORMATS: [GgmlType; 10] = [
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

#[test]
fn every_format_multiplies_as_the_host_dequantizes() {
    let be = BurnBackend::wgpu();
    let mut rng = Rng(11);
    for ty in FORMATS {
        // Two super-blocks per row; 20 outputs (not a multiple of 8 or 32).
        let (m, k) = (20, 512);
        let bytes = random_blocks(ty, m, k, &mut rng);
        let d = weight_data(ty, m, k, &bytes);
        let values = d.to_f32().unwrap();
        let w = be.weight(d).unwrap();
        assert!(w.is_quantized(), "{ty:?} kept as blocks");
        let scale = values.iter().fold(0f32, |a, v| a.max(v.abs())) * (k as f32).sqrt();
        for n in [1, 3, 8, 9, 17] {
            let x = rng.vec(n * k);
            let y = be.matmul(&be.tensor(&x, n, k).unwrap(), &w).unwrap();
            assert_eq!(be.shape(&y), (n, m));
            let want = host_matmul(&x, &values, n, k, m);
            assert_close(
                &be.to_vec(&y).unwrap(),
                &want,
                Tol::each(1e-4, scale),
                &format!("{ty:?} n={n}"),
            );
        }
        // The embedding path dequantizes rows exactly as the host does.
        let ids = [3u32, 0, 19, 3];
        let rows = be.to_vec(&be.embed(&w, &ids).unwrap()).unwrap();
        for (i, &id) in ids.iter().enumerate() {
            let want = &values[id as usize * k..(id as usize + 1) * k];
            assert_eq!(&rows[i * k..(i + 1) * k], want, "{ty:?} row {id}");
        }
    }
}

#[test]
fn a_row_gets_the_same_bits_in_any_pass() {
    let be = BurnBackend::wgpu();
    let mut rng = Rng(12);
    for ty in FORMATS {
        let (m, k) = (40, 768);
        let bytes = random_blocks(ty, m, k, &mut rng);
        let w = be.weight(weight_data(ty, m, k, &bytes)).unwrap();
        let n = 21;
        let x = rng.vec(n * k);
        let all = be
            .to_vec(&be.matmul(&be.tensor(&x, n, k).unwrap(), &w).unwrap())
            .unwrap();
        for r in [0, 7, 8, 20] {
            let alone = be.tensor(&x[r * k..(r + 1) * k], 1, k).unwrap();
            let one = be.to_vec(&be.matmul(&alone, &w).unwrap()).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&one), bits(&all[r * m..(r + 1) * m]), "{ty:?} row {r}");
        }
    }
}

#[test]
fn parts_of_a_block_weight() {
    let be = BurnBackend::wgpu();
    let mut rng = Rng(13);
    let (m, k, n) = (24, 512, 3);
    for ty in [GgmlType::Q4_K, GgmlType::Q8_0] {
        let bytes = random_blocks(ty, m, k, &mut rng);
        let d = weight_data(ty, m, k, &bytes);
        let values = d.to_f32().unwrap();
        let w = be.weight(d).unwrap();
        let x = rng.vec(n * k);
        let xt = be.tensor(&x, n, k).unwrap();
        // Aligned column ranges run in the kernel; the odd one is taken
        // dequantized. Both must equal the host product of the slice.
        for (rows, cols) in [
            (m, 0..k),
            (16, 0..256),
            (24, 256..512),
            (5, 32..96),
            (7, 3..70),
        ] {
            let w_part: Vec<f32> = (0..rows)
                .flat_map(|r| values[r * k + cols.start..r * k + cols.end].to_vec())
                .collect();
            let x_part: Vec<f32> = (0..n)
                .flat_map(|i| x[i * k + cols.start..i * k + cols.end].to_vec())
                .collect();
            let want = host_matmul(&x_part, &w_part, n, cols.len(), rows);
            let what = format!("{ty:?} rows {rows} cols {cols:?}");
            let got = be.matmul_part(&xt, &w, rows, cols.clone()).unwrap();
            assert_close(
                &be.to_vec(&got).unwrap(),
                &want,
                Tol::each(1e-4, 10.0),
                &what,
            );
            // x only as wide as the columns used (a leading range).
            if cols.start == 0 {
                let narrow = be.tensor(&x_part, n, cols.len()).unwrap();
                let got = be.matmul_part(&narrow, &w, rows, cols.clone()).unwrap();
                assert_close(
                    &be.to_vec(&got).unwrap(),
                    &want,
                    Tol::each(1e-4, 10.0),
                    &what,
                );
            }
        }
        assert!(be.matmul_part(&xt, &w, m + 1, 0..k).is_err());
        assert!(be.matmul_part(&xt, &w, m, 0..k + 32).is_err());
    }
}

#[test]
fn device_bytes_are_the_blocks_bytes() {
    let be = BurnBackend::wgpu();
    let mut rng = Rng(14);
    let before = be.resident_weight_bytes();
    let (m, k) = (64, 1024);
    let mut held = Vec::new();
    let mut file_bytes = 0u64;
    let mut promised = 0u64;
    for ty in FORMATS {
        let bytes = random_blocks(ty, m, k, &mut rng);
        file_bytes += bytes.len() as u64;
        promised += be.weight_bytes(ty, m, k);
        held.push(be.weight(weight_data(ty, m, k, &bytes)).unwrap());
    }
    let resident = be.resident_weight_bytes() - before;
    assert_eq!(
        resident, promised,
        "weight_bytes promised what loading holds"
    );
    // Word padding adds at most 2 bytes per 32-value block (Q4_0: 1/9).
    assert!(
        resident >= file_bytes && resident <= file_bytes * 12 / 10,
        "{resident} vs {file_bytes}"
    );
    // f32 would be 4 bytes a value.
    assert!(resident * 3 < (FORMATS.len() * m * k * 4) as u64);
    // An F32 weight and a shape the kernels do not take stay dense.
    let f32_bytes: Vec<u8> = rng
        .vec(m * 32)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let dense = be
        .weight(weight_data(GgmlType::F32, m, 32, &f32_bytes))
        .unwrap();
    assert!(!dense.is_quantized());
    assert_eq!(be.weight_bytes(GgmlType::F32, m, 32), (m * 32 * 4) as u64);
    drop(held);
    drop(dense);
    assert_eq!(be.resident_weight_bytes(), before);
}

#[test]
fn a_block_count_that_disagrees_with_the_shape_is_an_error() {
    let be = BurnBackend::wgpu();
    let bytes = random_blocks(GgmlType::Q4_K, 2, 256, &mut Rng(15));
    assert!(
        be.weight(weight_data(GgmlType::Q4_K, 3, 256, &bytes))
            .is_err()
    );
}

#[test]
fn rms_norm_of_a_row_does_not_depend_on_the_pass() {
    let be = BurnBackend::wgpu();
    let mut rng = Rng(16);
    for c in [64, 1536, 100] {
        let n = 19;
        let x = rng.vec(n * c);
        let w = be.tensor(&rng.vec(c), 1, c).unwrap();
        let all = be
            .to_vec(
                &be.rms_norm(&be.tensor(&x, n, c).unwrap(), &w, 1e-6)
                    .unwrap(),
            )
            .unwrap();
        for r in [0, 5, 18] {
            let one = be.tensor(&x[r * c..(r + 1) * c], 1, c).unwrap();
            let one = be.to_vec(&be.rms_norm(&one, &w, 1e-6).unwrap()).unwrap();
            assert_eq!(
                bits(&one),
                bits(&all[r * c..(r + 1) * c]),
                "cols {c} row {r}"
            );
        }
    }
}

/// A query row attending to some cached positions under a tree-like mask
/// gets the same bits as the same query over a cache holding only those
/// positions, in order, alone in its pass: what verifying a tree and then
/// decoding the accepted branch alone need.
#[test]
fn attention_of_a_row_depends_only_on_the_positions_it_sees() {
    let be = BurnBackend::wgpu();
    let mut rng = Rng(17);
    for (heads, order) in [
        (8, HeadOrder::Grouped),
        (8, HeadOrder::Interleaved { run: 2 }),
    ] {
        let heads = Heads {
            n_heads: heads,
            n_kv_heads: 2,
            head_dim: 64,
            order,
        };
        let (qc, kc) = (
            heads.n_heads * heads.head_dim,
            heads.n_kv_heads * heads.head_dim,
        );
        let t = 77;
        let (k, v) = (rng.vec(t * kc), rng.vec(t * kc));
        let mut kv = be.kv_new(&heads).unwrap();
        be.kv_append(
            &mut kv,
            &be.tensor(&k, t, kc).unwrap(),
            &be.tensor(&v, t, kc).unwrap(),
        )
        .unwrap();
        let n = 6;
        let q: Vec<f32> = rng.vec(n * qc).iter().map(|x| 4.0 * x).collect();
        let allowed: Vec<bool> = (0..n * t).map(|i| (i * 7 + i / t) % 3 != 0).collect();
        let mask = Mask {
            rows: n,
            cols: t,
            allowed: allowed.clone(),
        };
        let all = be
            .attention(&be.tensor(&q, n, qc).unwrap(), &kv, &mask, &heads)
            .unwrap();
        let all = be.to_vec(&all).unwrap();
        for r in 0..n {
            let seen: Vec<usize> = (0..t).filter(|&p| allowed[r * t + p]).collect();
            let mut only = be.kv_new(&heads).unwrap();
            be.kv_append(
                &mut only,
                &be.tensor(&k, t, kc).unwrap(),
                &be.tensor(&v, t, kc).unwrap(),
            )
            .unwrap();
            be.kv_keep(&mut only, &seen).unwrap();
            let mask = Mask {
                rows: 1,
                cols: seen.len(),
                allowed: vec![true; seen.len()],
            };
            let one = be.tensor(&q[r * qc..(r + 1) * qc], 1, qc).unwrap();
            let one = be
                .to_vec(&be.attention(&one, &only, &mask, &heads).unwrap())
                .unwrap();
            assert_eq!(
                bits(&one),
                bits(&all[r * qc..(r + 1) * qc]),
                "{order:?} row {r}"
            );
        }
    }
}

/// A weight kept in several buffers (an output head past a device's
/// buffer limit) gives the same bits as in one: products, parts and rows.
#[test]
fn a_weight_in_several_buffers_gives_the_same_bits() {
    let one = BurnBackend::wgpu();
    // 4 KiB buffers: a tile of 32 rows of 512 Q4_K values is 9 KiB, so one
    // tile per buffer, and the last holds 8 rows.
    let many = BurnBackend::wgpu().max_weight_buffer(4096);
    let mut rng = Rng(18);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0] {
        let (m, k, n) = (104, 512, 5);
        let bytes = random_blocks(ty, m, k, &mut rng);
        let (w1, wn) = (
            one.weight(weight_data(ty, m, k, &bytes)).unwrap(),
            many.weight(weight_data(ty, m, k, &bytes)).unwrap(),
        );
        assert_eq!(one.resident_weight_bytes(), many.resident_weight_bytes());
        let x = rng.vec(n * k);
        let (x1, xn) = (
            one.tensor(&x, n, k).unwrap(),
            many.tensor(&x, n, k).unwrap(),
        );
        let run = |be: &BurnBackend, x, w| bits(&be.to_vec(&be.matmul(x, w).unwrap()).unwrap());
        assert_eq!(run(&one, &x1, &w1), run(&many, &xn, &wn), "{ty:?} matmul");
        for (rows, cols) in [(70, 0..k), (33, 256..512)] {
            let part = |be: &BurnBackend, x, w| {
                bits(
                    &be.to_vec(&be.matmul_part(x, w, rows, cols.clone()).unwrap())
                        .unwrap(),
                )
            };
            assert_eq!(
                part(&one, &x1, &w1),
                part(&many, &xn, &wn),
                "{ty:?} part {rows}"
            );
        }
        let ids = [103u32, 0, 31, 32, 64, 96, 5];
        let rows = |be: &BurnBackend, w| bits(&be.to_vec(&be.embed(w, &ids).unwrap()).unwrap());
        assert_eq!(rows(&one, &w1), rows(&many, &wn), "{ty:?} rows");
    }
}

/// A matmul that adds a bias row or a residual in its last step gives the
/// bits of the matmul followed by an add: one split and several (a wide
/// weight), one buffer and several, one row and a pass; a mismatched
/// `add` is a shape error.
#[test]
fn matmul_add_gives_the_bits_of_matmul_then_add() {
    let mut rng = Rng(19);
    for be in [
        BurnBackend::wgpu(),
        BurnBackend::wgpu().max_weight_buffer(4096),
    ] {
        for ty in [GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q6_K] {
            // 512 columns: one split; 8192: sixteen.
            for k in [512, 8192] {
                let m = 40;
                let bytes = random_blocks(ty, m, k, &mut rng);
                let w = be.weight(weight_data(ty, m, k, &bytes)).unwrap();
                for n in [1, 9] {
                    let x = be.tensor(&rng.vec(n * k), n, k).unwrap();
                    let bias = be.tensor(&rng.vec(m), 1, m).unwrap();
                    let residual = be.tensor(&rng.vec(n * m), n, m).unwrap();
                    for add in [&bias, &residual] {
                        let fused = be.to_vec(&be.matmul_add(&x, &w, add).unwrap()).unwrap();
                        let apart = be.add(&be.matmul(&x, &w).unwrap(), add).unwrap();
                        let what = format!("{ty:?} k={k} n={n} add {:?}", be.shape(add));
                        assert_eq!(bits(&fused), bits(&be.to_vec(&apart).unwrap()), "{what}");
                    }
                }
                let x = be.tensor(&rng.vec(3 * k), 3, k).unwrap();
                for bad in [(2, m), (1, m + 1), (3, m - 1)] {
                    let add = be.tensor(&vec![0.0; bad.0 * bad.1], bad.0, bad.1).unwrap();
                    assert!(
                        matches!(
                            be.matmul_add(&x, &w, &add),
                            Err(arbor_tensor::Error::Shape { .. })
                        ),
                        "{bad:?}"
                    );
                }
            }
        }
    }
}

/// The RoPE angles and the mask are uploaded once and reused while the
/// calls bring the same ones (every layer of a pass); other positions or
/// another mask replace them. Alternating between two must give what a
/// backend that never saw the other gives.
#[test]
fn shared_uploads_follow_the_positions_and_mask_they_were_made_for() {
    let mut rng = Rng(20);
    let heads = Heads::grouped(4, 2, 16);
    let (n, t) = (3, 11);
    let (qc, kc) = (4 * 16, 2 * 16);
    let (q, k, v) = (rng.vec(n * qc), rng.vec(t * kc), rng.vec(t * kc));
    let rope = Rope {
        style: RopeStyle::Halves,
        theta: 10000.0,
        head_dim: 16,
    };
    let positions = [vec![8u32, 9, 10], vec![3, 9, 10]];
    let masks: Vec<Mask> = (0..2)
        .map(|s| Mask {
            rows: n,
            cols: t,
            allowed: (0..n * t).map(|i| (i + s) % 4 != 0).collect(),
        })
        .collect();
    let run = |be: &BurnBackend, which: usize| {
        let kv = {
            let mut kv = be.kv_new(&heads).unwrap();
            let (k, v) = (be.tensor(&k, t, kc).unwrap(), be.tensor(&v, t, kc).unwrap());
            be.kv_append(&mut kv, &k, &v).unwrap();
            kv
        };
        let q = be.tensor(&q, n, qc).unwrap();
        let r = be.rope(&q, &positions[which], &rope).unwrap();
        let a = be.attention(&r, &kv, &masks[which], &heads).unwrap();
        (bits(&be.to_vec(&r).unwrap()), bits(&be.to_vec(&a).unwrap()))
    };
    let shared = BurnBackend::wgpu();
    for which in [0, 1, 0, 1] {
        let fresh = BurnBackend::wgpu();
        assert_eq!(
            run(&shared, which),
            run(&fresh, which),
            "call with set {which}"
        );
    }
}

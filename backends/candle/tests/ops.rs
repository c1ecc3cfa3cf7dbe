//! The candle backend against the host reference implementations.

use arbor_backend_candle::CandleBackend;
use arbor_tensor::{Backend, GgmlType, Heads, Mask, Rope, RopeStyle, WeightData, reference};
use half::f16;

/// A small deterministic generator (xorshift) for test data in [-1, 1).
struct Gen(u64);
impl Gen {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// Q5_0 blocks whose values are `(q - 16) * d` for the given 5-bit `q`s.
fn q5_0(qs: &[u8], d: f32) -> Vec<u8> {
    let mut out = Vec::new();
    for block in qs.chunks(32) {
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        let mut qh = 0u32;
        for (j, &q) in block.iter().enumerate() {
            qh |= ((q as u32 >> 4) & 1) << j;
        }
        out.extend_from_slice(&qh.to_le_bytes());
        for j in 0..16 {
            out.push((block[j] & 0x0F) | ((block[j + 16] & 0x0F) << 4));
        }
    }
    out
}

fn host_matmul(x: &[f32], w: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    let mut out = vec![0.0; n * m];
    for i in 0..n {
        for j in 0..m {
            out[i * m + j] = (0..k).map(|t| x[i * k + t] * w[j * k + t]).sum();
        }
    }
    out
}

fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = b.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{what}[{i}]: {x} vs {y} (scale {scale})"
        );
    }
}

#[test]
fn matmul_on_f32_and_quantized_weights_matches_host_math() {
    let be = CandleBackend::new();
    let mut g = Gen(1);
    let (n, k, m) = (3, 64, 40);
    let x = g.vec(n * k);
    let w = g.vec(m * k);
    let xt = be.tensor(&x, n, k).unwrap();

    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let wf = be
        .weight(WeightData {
            name: "w",
            ty: GgmlType::F32,
            rows: m,
            cols: k,
            bytes: &bytes,
        })
        .unwrap();
    let got = be.to_vec(&be.matmul(&xt, &wf).unwrap()).unwrap();
    assert_close(&got, &host_matmul(&x, &w, n, k, m), 1e-5, "f32 matmul");

    // Quantized weights: compare against the dequantized weight; candle
    // also quantizes the activations to 8 bits, hence the looser bound.
    let q = arbor_gguf::quantize_q8_0(&w);
    let wq_data = WeightData {
        name: "wq",
        ty: GgmlType::Q8_0,
        rows: m,
        cols: k,
        bytes: &q,
    };
    let deq = wq_data.to_f32().unwrap();
    let wq = be.weight(wq_data).unwrap();
    let got = be.to_vec(&be.matmul(&xt, &wq).unwrap()).unwrap();
    assert_close(&got, &host_matmul(&x, &deq, n, k, m), 2e-2, "q8_0 matmul");
}

#[test]
fn q5_0_weights_are_held_or_repacked_losslessly() {
    let (m, k) = (4, 64);
    let qs: Vec<u8> = (0..m * k).map(|i| (i * 7 % 32) as u8).collect();
    let bytes = q5_0(&qs, 0.25);
    let data = WeightData {
        name: "w5",
        ty: GgmlType::Q5_0,
        rows: m,
        cols: k,
        bytes: &bytes,
    };
    let expected: Vec<f32> = qs.iter().map(|&q| (q as f32 - 16.0) * 0.25).collect();
    assert_eq!(data.to_f32().unwrap(), expected);
    let x = Gen(5).vec(3 * k);
    let mut products = Vec::new();
    // Our kernel multiplies the Q5_0 blocks as they are; candle's are given
    // them repacked to Q8_0.
    for be in [
        CandleBackend::new(),
        CandleBackend::new().with_candle_kernels(),
    ] {
        let w = be.weight(data).unwrap();
        // F32: an aarch64 core without dotprod, where candle's Q8_0 kernel
        // cannot run (it issues sdot) and the values are held dequantized.
        let held = w.held_as();
        assert!(matches!(
            held,
            GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::F32
        ));
        // Embedding rows come straight from the stored blocks: exact.
        let rows = be.to_vec(&be.embed(&w, &[2, 0]).unwrap()).unwrap();
        assert_eq!(rows[..k], expected[2 * k..3 * k]);
        assert_eq!(rows[k..], expected[..k]);
        assert!(be.embed(&w, &[4]).is_err(), "id past the table is an error");
        let y = be.matmul(&be.tensor(&x, 3, k).unwrap(), &w).unwrap();
        let y = be.to_vec(&y).unwrap();
        if held == GgmlType::F32 {
            // Unquantized activations against exact values: the float
            // product, to f32 rounding.
            for (i, got) in y.iter().enumerate() {
                let (r, c) = (i / m, i % m);
                let want: f64 = (0..k)
                    .map(|j| x[r * k + j] as f64 * expected[c * k + j] as f64)
                    .sum();
                assert!(
                    (*got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "{got} {want}"
                );
            }
        } else {
            products.push(y);
        }
    }
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    if let [ours, candles] = &products[..] {
        assert_eq!(
            bits(ours),
            bits(candles),
            "Q5_0 kernel and the Q8_0 repacking disagree"
        );
    }
}

#[test]
fn elementwise_ops_match_host_math() {
    let be = CandleBackend::new();
    let mut g = Gen(2);
    let (a, b, w) = (g.vec(12), g.vec(4), g.vec(4));
    let at = be.tensor(&a, 3, 4).unwrap();
    let bt = be.tensor(&b, 1, 4).unwrap();
    let sum = be.to_vec(&be.add(&at, &bt).unwrap()).unwrap();
    assert_close(
        &sum,
        &a.iter()
            .enumerate()
            .map(|(i, v)| v + b[i % 4])
            .collect::<Vec<_>>(),
        1e-6,
        "add",
    );

    let sw = be.to_vec(&be.swiglu(&at, &at).unwrap()).unwrap();
    let expect: Vec<f32> = a.iter().map(|&v| v / (1.0 + (-v).exp()) * v).collect();
    assert_close(&sw, &expect, 1e-6, "swiglu");

    let wt = be.tensor(&w, 1, 4).unwrap();
    let sc = be.to_vec(&be.scale_cols(&at, &wt).unwrap()).unwrap();
    let expect: Vec<f32> = a.iter().enumerate().map(|(i, v)| v * w[i % 4]).collect();
    assert_eq!(sc, expect, "scale_cols");
    assert!(be.scale_cols(&at, &at).is_err());
    let n = be.to_vec(&be.rms_norm(&at, &wt, 1e-6).unwrap()).unwrap();
    for r in 0..3 {
        let row = &a[r * 4..r * 4 + 4];
        let rms = (row.iter().map(|v| v * v).sum::<f32>() / 4.0 + 1e-6).sqrt();
        let expect: Vec<f32> = row.iter().zip(&w).map(|(v, w)| v / rms * w).collect();
        assert_close(&n[r * 4..r * 4 + 4], &expect, 1e-5, "rms_norm");
    }
    let sel = be.to_vec(&be.select_rows(&at, &[2, 0]).unwrap()).unwrap();
    assert_eq!(sel[..4], a[8..12]);
    assert_eq!(sel[4..], a[..4]);
    assert!(be.add(&at, &be.tensor(&a[..8], 2, 4).unwrap()).is_err());

    // [3, 4] · [4, 2], and a row alone gives the same bits as in the batch.
    let m = g.vec(8);
    let mt = be.tensor(&m, 4, 2).unwrap();
    let prod = be.to_vec(&be.matmul_tensor(&at, &mt).unwrap()).unwrap();
    let expect: Vec<f32> = (0..6)
        .map(|o| (0..4).map(|j| a[o / 2 * 4 + j] * m[j * 2 + o % 2]).sum())
        .collect();
    assert_close(&prod, &expect, 1e-6, "matmul_tensor");
    let row = be.tensor(&a[4..8], 1, 4).unwrap();
    assert_eq!(
        be.to_vec(&be.matmul_tensor(&row, &mt).unwrap()).unwrap(),
        prod[2..4]
    );
    assert!(be.matmul_tensor(&at, &at).is_err());
}

#[test]
fn rope_matches_reference_in_both_styles() {
    let be = CandleBackend::new();
    let mut g = Gen(3);
    for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
        let rope = Rope {
            style,
            theta: 10000.0,
            head_dim: 8,
        };
        let x = g.vec(3 * 16);
        let pos = [0, 5, 1000];
        let got = be
            .to_vec(
                &be.rope(&be.tensor(&x, 3, 16).unwrap(), &pos, &rope)
                    .unwrap(),
            )
            .unwrap();
        let mut expect = x.clone();
        reference::rope(&mut expect, 16, &pos, &rope);
        assert_close(&got, &expect, 1e-5, "rope");
    }
}

#[test]
fn attention_and_cache_edits_match_reference() {
    let be = CandleBackend::with_f32_attention();
    let mut g = Gen(4);
    let h = Heads::grouped(4, 2, 8);
    let kvd = 16;
    let mut kv = be.kv_new(&h).unwrap();
    let (mut ks, mut vs) = (Vec::new(), Vec::new());
    for rows in [3, 1, 4] {
        let (k, v) = (g.vec(rows * kvd), g.vec(rows * kvd));
        be.kv_append(
            &mut kv,
            &be.tensor(&k, rows, kvd).unwrap(),
            &be.tensor(&v, rows, kvd).unwrap(),
        )
        .unwrap();
        ks.extend(k);
        vs.extend(v);
    }
    assert_eq!(be.kv_len(&kv), 8);
    // A tree-shaped mask: every row sees the first 3 positions plus some.
    let q = g.vec(2 * 32);
    let mut allowed = vec![false; 16];
    for c in [0, 1, 2, 4, 6] {
        allowed[c] = true;
    }
    for c in [0, 1, 2, 3, 5, 7] {
        allowed[8 + c] = true;
    }
    let mask = Mask {
        rows: 2,
        cols: 8,
        allowed,
    };
    let qt = be.tensor(&q, 2, 32).unwrap();
    let got = be
        .to_vec(&be.attention(&qt, &kv, &mask, &h).unwrap())
        .unwrap();
    assert_close(
        &got,
        &reference::attention(&q, &ks, &vs, &mask, &h),
        1e-5,
        "attention",
    );

    // Keep positions 0, 2, 5 and compare with the gathered reference.
    let keep = [0, 2, 5];
    be.kv_keep(&mut kv, &keep).unwrap();
    let gather = |src: &[f32]| {
        keep.iter()
            .flat_map(|&p| src[p * kvd..(p + 1) * kvd].to_vec())
            .collect::<Vec<_>>()
    };
    let full = Mask::causal(2, 1);
    let q1 = be.tensor(&q[..32], 1, 32).unwrap();
    let got = be
        .to_vec(&be.attention(&q1, &kv, &full, &h).unwrap())
        .unwrap();
    assert_close(
        &got,
        &reference::attention(&q[..32], &gather(&ks), &gather(&vs), &full, &h),
        1e-5,
        "kept",
    );

    be.kv_truncate(&mut kv, 1).unwrap();
    assert_eq!(be.kv_len(&kv), 1);
    assert!(be.kv_truncate(&mut kv, 2).is_err());
    assert!(be.kv_keep(&mut kv, &[3]).is_err());
    assert!(
        be.attention(
            &q1,
            &kv,
            &Mask {
                rows: 1,
                cols: 1,
                allowed: vec![false]
            },
            &h
        )
        .is_err()
    );
}

#[test]
fn default_attention_rounds_operands_to_f16() {
    let (f16, f32) = (CandleBackend::new(), CandleBackend::with_f32_attention());
    let h = Heads::grouped(2, 1, 4);
    let mut g = Gen(5);
    let (k, v, q) = (g.vec(3 * 4), g.vec(3 * 4), g.vec(8));
    let round = |x: &[f32]| {
        x.iter()
            .map(|v| f16::from_f32(*v).to_f32())
            .collect::<Vec<_>>()
    };
    let run = |be: &CandleBackend, k: &[f32], v: &[f32], q: &[f32]| {
        let mut kv = be.kv_new(&h).unwrap();
        be.kv_append(
            &mut kv,
            &be.tensor(k, 3, 4).unwrap(),
            &be.tensor(v, 3, 4).unwrap(),
        )
        .unwrap();
        be.to_vec(
            &be.attention(&be.tensor(q, 1, 8).unwrap(), &kv, &Mask::causal(2, 1), &h)
                .unwrap(),
        )
        .unwrap()
    };
    let a = run(&f16, &k, &v, &q);
    // The same as f32 attention over rounded operands, up to the rounding
    // of the attention weights.
    let b = run(&f32, &round(&k), &round(&v), &round(&q));
    assert_close(&a, &b, 2e-3, "f16 attention");
    assert_ne!(a, run(&f32, &k, &v, &q));
}

/// Large enough for the thread-pool path of attention.
#[test]
fn parallel_attention_matches_reference() {
    let be = CandleBackend::with_f32_attention();
    let mut g = Gen(6);
    let h = Heads::grouped(4, 2, 8);
    let (n, past) = (96, 96);
    let t = n + past;
    let (k, v, q) = (g.vec(t * 16), g.vec(t * 16), g.vec(n * 32));
    let mut kv = be.kv_new(&h).unwrap();
    be.kv_append(
        &mut kv,
        &be.tensor(&k, t, 16).unwrap(),
        &be.tensor(&v, t, 16).unwrap(),
    )
    .unwrap();
    let mask = Mask::causal(past, n);
    assert!(n * t * h.n_heads >= 1 << 16, "exercises the parallel path");
    let got = be
        .to_vec(
            &be.attention(&be.tensor(&q, n, 32).unwrap(), &kv, &mask, &h)
                .unwrap(),
        )
        .unwrap();
    assert_close(
        &got,
        &reference::attention(&q, &k, &v, &mask, &h),
        1e-5,
        "parallel attention",
    );
}

/// Blocks of `ty` from random bytes, with every f16 scale set to a sane
/// value (random bits would include NaNs and infinities).
fn random_blocks(ty: GgmlType, n_blocks: usize, g: &mut Gen) -> Vec<u8> {
    let size = ty.block_bytes();
    let mut out: Vec<u8> = (0..n_blocks * size)
        .map(|_| ((g.next() + 1.0) * 127.9) as u8)
        .collect();
    let scale = f16::from_f32(0.01).to_le_bytes();
    for block in out.chunks_mut(size) {
        let scale_offsets: &[usize] = match ty {
            GgmlType::Q6_K => &[208],
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
            _ => &[0],
        };
        for &o in scale_offsets {
            block[o..o + 2].copy_from_slice(&scale);
        }
    }
    out
}

/// Speculative decoding verifies many tokens in one pass and must
/// reproduce one-token decoding exactly, so a row's matmul result may not
/// depend on the other rows of the batch.
#[test]
fn batched_matmul_rows_equal_single_row_matmuls_bit_for_bit() {
    let be = CandleBackend::new();
    let mut g = Gen(0x5eed);
    let (rows, cols) = (64, 512);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        let bytes = random_blocks(ty, rows * cols / ty.block_len(), &mut g);
        let w = be
            .weight(WeightData {
                name: "w",
                ty,
                rows,
                cols,
                bytes: &bytes,
            })
            .unwrap();
        for n in [2usize, 5, 16, 33] {
            let x = g.vec(n * cols);
            let batch = be
                .to_vec(&be.matmul(&be.tensor(&x, n, cols).unwrap(), &w).unwrap())
                .unwrap();
            for i in 0..n {
                let one = be
                    .to_vec(
                        &be.matmul(&be.tensor(&x[i * cols..][..cols], 1, cols).unwrap(), &w)
                            .unwrap(),
                    )
                    .unwrap();
                let got = &batch[i * rows..][..rows];
                assert!(
                    one.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty}: row {i} of a {n}-row batch differs from the same row alone"
                );
            }
        }
    }
}

/// Elastic parts: float weights and weights under our kernels read their
/// part in place, candle-held weights through the padded default; all
/// equal the host product of the slice. Interleaved heads read the KV
/// head the reference says.
#[test]
fn weight_parts_and_interleaved_heads_match_host_math() {
    let (m, k) = (24, 64);
    let mut g = Gen(21);
    let w = g.vec(m * k);
    let q8 = arbor_gguf::quantize_q8_0(&w);
    let values = arbor_gguf::dequantize(GgmlType::Q8_0, &q8, m * k).unwrap();
    let f32_bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    for (be, ty, bytes, vals, tol) in [
        (CandleBackend::new(), GgmlType::F32, &f32_bytes, &w, 1e-5),
        (CandleBackend::new(), GgmlType::Q8_0, &q8, &values, 0.05),
        (
            CandleBackend::new().with_candle_kernels(),
            GgmlType::Q8_0,
            &q8,
            &values,
            0.05,
        ),
    ] {
        let wt = be
            .weight(WeightData {
                name: "w",
                ty,
                rows: m,
                cols: k,
                bytes,
            })
            .unwrap();
        for (rows, cols, xk) in [(8, 0..64, 64), (16, 32..64, 64), (24, 0..32, 40)] {
            let x = g.vec(3 * xk);
            let got = be
                .to_vec(
                    &be.matmul_part(&be.tensor(&x, 3, xk).unwrap(), &wt, rows, cols.clone())
                        .unwrap(),
                )
                .unwrap();
            let xs: Vec<f32> = x
                .chunks_exact(xk)
                .flat_map(|r| r[cols.clone()].to_vec())
                .collect();
            let ws: Vec<f32> = (vals.chunks_exact(k).take(rows))
                .flat_map(|r| r[cols.clone()].to_vec())
                .collect();
            let want = host_matmul(&xs, &ws, 3, cols.len(), rows);
            assert_close(&got, &want, tol, &format!("{ty} part ..{rows} {cols:?}"));
        }
        let x = be.tensor(&g.vec(2 * k), 2, k).unwrap();
        assert!(be.matmul_part(&x, &wt, 25, 0..k).is_err());
        assert!(be.matmul_part(&x, &wt, 8, 0..k + 32).is_err());
    }
    // Columns inside a quantization block are refused.
    let be = CandleBackend::new();
    let wt = be
        .weight(WeightData {
            name: "w",
            ty: GgmlType::Q8_0,
            rows: m,
            cols: k,
            bytes: &q8,
        })
        .unwrap();
    let x = be.tensor(&g.vec(2 * k), 2, k).unwrap();
    assert!(be.matmul_part(&x, &wt, 8, 4..36).is_err());
    // Columns side by side, and rows that disagree refused.
    let (a, c) = (g.vec(2 * 3), g.vec(2 * 5));
    let joined = be
        .concat_cols(&be.tensor(&a, 2, 3).unwrap(), &be.tensor(&c, 2, 5).unwrap())
        .unwrap();
    let want: Vec<f32> = [&a[..3], &c[..5], &a[3..], &c[5..]].concat();
    assert_eq!(
        (be.shape(&joined), be.to_vec(&joined).unwrap()),
        ((2, 8), want)
    );
    let three = be.tensor(&g.vec(3 * 5), 3, 5).unwrap();
    assert!(
        be.concat_cols(&be.tensor(&a, 2, 3).unwrap(), &three)
            .is_err()
    );

    let be = CandleBackend::with_f32_attention();
    let grouped = Heads::grouped(4, 2, 8);
    let mut kv = be.kv_new(&grouped).unwrap();
    let (ks, vs) = (g.vec(5 * 16), g.vec(5 * 16));
    be.kv_append(
        &mut kv,
        &be.tensor(&ks, 5, 16).unwrap(),
        &be.tensor(&vs, 5, 16).unwrap(),
    )
    .unwrap();
    for (n_heads, run) in [(4, 1), (4, 2), (2, 1)] {
        let h = Heads {
            n_heads,
            order: arbor_tensor::HeadOrder::Interleaved { run },
            ..grouped
        };
        let q = g.vec(2 * n_heads * 8);
        let mask = Mask::causal(3, 2);
        let got = be
            .to_vec(
                &be.attention(&be.tensor(&q, 2, n_heads * 8).unwrap(), &kv, &mask, &h)
                    .unwrap(),
            )
            .unwrap();
        let want = reference::attention(&q, &ks, &vs, &mask, &h);
        assert_close(&got, &want, 1e-5, &format!("{h:?}"));
    }
}

/// A sum over segments (an elastic layer's down projection held whole)
/// gives the bits of its parts multiplied one at a time and added in
/// order — fused under our kernels, part by part for candle-held, float
/// and interleaved K-quant weights — and bad segment ends are errors.
#[test]
fn segment_sums_equal_their_parts_added_bit_for_bit() {
    let mut g = Gen(0x5e9);
    let (m, k) = (24, 512);
    for (be, ty) in [
        (CandleBackend::new(), GgmlType::Q8_0),
        (CandleBackend::new(), GgmlType::Q5_0),
        (CandleBackend::new(), GgmlType::Q6_K),
        (CandleBackend::new(), GgmlType::F32),
        (CandleBackend::new().with_candle_kernels(), GgmlType::Q8_0),
    ] {
        let bytes = match ty {
            GgmlType::F32 => g.vec(m * k).iter().flat_map(|v| v.to_le_bytes()).collect(),
            _ => random_blocks(ty, m * k / ty.block_len(), &mut g),
        };
        let w = be
            .weight(WeightData {
                name: "w",
                ty,
                rows: m,
                cols: k,
                bytes: &bytes,
            })
            .unwrap();
        let ends: &[usize] = match ty {
            GgmlType::Q6_K => &[256, 512],
            _ => &[64, 96, 256, 512],
        };
        for (rows, upto, n) in [(24, ends.len(), 1), (16, ends.len() - 1, 5), (8, 1, 9)] {
            let x = be.tensor(&g.vec(n * k), n, k).unwrap();
            let got = be.to_vec(&be.matmul_sum(&x, &w, rows, &ends[..upto]).unwrap());
            let want = be
                .to_vec(&arbor_tensor::matmul_sum_parts(&be, &x, &w, rows, &ends[..upto]).unwrap());
            let (got, want) = (got.unwrap(), want.unwrap());
            assert_eq!(got.len(), n * rows);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty}: rows ..{rows}, ends {:?}, {n} tokens",
                &ends[..upto]
            );
        }
        let x = be.tensor(&g.vec(2 * k), 2, k).unwrap();
        for bad in [&[][..], &[64, 64], &[96, 64], &[0, 64], &[64, k + 32]] {
            assert!(be.matmul_sum(&x, &w, 8, bad).is_err(), "{ty}: ends {bad:?}");
        }
        assert!(
            be.matmul_sum(&x, &w, m + 1, &[64]).is_err(),
            "{ty}: too many rows"
        );
    }
}

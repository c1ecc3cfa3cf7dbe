//! The candle backend under arbor-tensor's op suite (`arbor_tensor::suite`),
//! with our kernels and with candle's, then what only candle does: Q5_0
//! repacked for candle's kernels, attention on f16 operands.

use arbor_backend_candle::CandleBackend;
use arbor_tensor::suite::{self, Rng, Tol, assert_close, bits, host, q5_0, tensor};
use arbor_tensor::{Backend, GgmlType, Heads, Mask, WeightData};
use half::f16;

fn ours() -> CandleBackend {
    CandleBackend::new()
}

/// Quantized weights multiplied by candle's kernels instead of ours.
fn candles() -> CandleBackend {
    CandleBackend::new().with_candle_kernels()
}

/// The suite's attention checks are against f32 math; the default rounds
/// the operands to f16 (see the last test).
fn f32_attention() -> CandleBackend {
    CandleBackend::with_f32_attention()
}

/// Candle rounds the activations to 8 bits against quantized weights.
const QUANTIZED: Tol = Tol::largest(2e-2);
/// The same for a part's shorter sums.
const QUANTIZED_PART: Tol = Tol::largest(0.05);

#[test]
fn matmul_f32() {
    suite::matmul_f32(&ours());
}

#[test]
fn matmul_f16() {
    suite::matmul_f16(&ours());
}

#[test]
fn matmul_q8_0() {
    suite::matmul_q8_0(&ours(), QUANTIZED);
    suite::matmul_q8_0(&candles(), QUANTIZED);
}

#[test]
fn batched_rows_equal_single_rows_bit_for_bit() {
    use GgmlType::*;
    let types = [Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K];
    suite::batched_rows_equal_single_rows(&ours(), &types);
}

#[test]
fn streamed_weights_in_their_read_buffers() {
    use GgmlType as T;
    let types = [
        T::F32,
        T::F16,
        T::BF16,
        T::Q8_0,
        T::Q5_0,
        T::Q4_K,
        T::Q6_K,
        T::Q4_1,
    ];
    suite::streamed_in_place(&ours(), &types);
    suite::streamed_in_place(&candles(), &types);
    // Float matrices stay in place on every CPU (quantized ones where our
    // kernels run, which the suite checks against what is said).
    for ty in [T::F32, T::F16, T::BF16] {
        assert!(ours().streams_in_place(ty, 48, 256), "{ty}");
    }
}

#[test]
fn held_weights_built_in_the_bytes_read_for_them() {
    use GgmlType as T;
    let types = [T::F32, T::F16, T::BF16, T::Q8_0, T::Q4_K, T::Q6_K];
    // Float matrices under our float matmul, whichever quantized kernels
    // run; our kernels lay quantized weights out again once held.
    assert_eq!(suite::held_as_read(&ours(), &types), 3);
    assert_eq!(suite::held_as_read(&candles(), &types), 3);
}

#[test]
fn weight_parts() {
    suite::weight_parts(&ours(), GgmlType::F32, Tol::largest(1e-5));
    suite::weight_parts(&ours(), GgmlType::Q8_0, QUANTIZED_PART);
    suite::weight_parts(&candles(), GgmlType::Q8_0, QUANTIZED_PART);
    suite::part_inside_a_block_is_refused(&ours());
}

#[test]
fn segment_sums_equal_parts_bit_for_bit() {
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q6_K,
        GgmlType::F32,
    ] {
        suite::segment_sums_equal_parts(&ours(), ty);
    }
    suite::segment_sums_equal_parts(&candles(), GgmlType::Q8_0);
}

#[test]
fn a_tensor_from_a_vec_keeps_its_buffer() {
    // A streamed head's logits (tens of MiB) become the pass's output
    // without a copy: the memory plan counts them once.
    let b = ours();
    let want: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
    let data = want.clone();
    let at = data.as_ptr();
    let t = b.tensor_from_vec(data, 3, 4).unwrap();
    assert_eq!(b.shape(&t), (3, 4));
    let back = b.take_vec(t).unwrap();
    assert_eq!(back.as_ptr(), at);
    assert_eq!(back, want);
    assert!(b.tensor_from_vec(vec![0.0; 5], 2, 3).is_err());
}

#[test]
fn embed() {
    suite::embed(&ours());
}

#[test]
fn add() {
    suite::add(&ours());
}

#[test]
fn swiglu() {
    suite::swiglu(&ours());
}

#[test]
fn scale_cols() {
    suite::scale_cols(&ours());
}

#[test]
fn rms_norm() {
    suite::rms_norm(&ours());
}

#[test]
fn select_rows() {
    suite::select_rows(&ours());
}

#[test]
fn matmul_tensor() {
    suite::matmul_tensor(&ours());
}

#[test]
fn rope() {
    suite::rope(&ours());
}

#[test]
fn shape_errors() {
    suite::shape_errors(&ours());
}

#[test]
fn narrow_and_concat_cols() {
    suite::narrow_and_concat_cols(&ours());
}

#[test]
fn attention_over_a_growing_cache() {
    suite::attention_over_a_growing_cache(&f32_attention());
}

#[test]
fn attention_and_cache_edits() {
    suite::attention_and_cache_edits(&f32_attention());
}

#[test]
fn kv_truncate_and_keep() {
    suite::kv_truncate_and_keep(&f32_attention());
}

#[test]
fn interleaved_heads() {
    suite::interleaved_heads(&f32_attention());
}

/// Large enough for the thread-pool path of attention.
#[test]
fn long_causal_attention() {
    suite::long_causal_attention(&f32_attention());
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
    let x = Rng(5).vec(3 * k);
    let mut products = Vec::new();
    // Our kernel multiplies the Q5_0 blocks as they are; candle's are given
    // them repacked to Q8_0.
    for be in [ours(), candles()] {
        let w = be.weight(data).unwrap();
        // F32: an aarch64 core without dotprod, where candle's Q8_0 kernel
        // cannot run (it issues sdot) and the values are held dequantized.
        let held = w.held_as();
        assert!(matches!(
            held,
            GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::F32
        ));
        // Embedding rows come straight from the stored blocks: exact.
        let rows = host(&be, &be.embed(&w, &[2, 0]).unwrap());
        assert_eq!(rows[..k], expected[2 * k..3 * k]);
        assert_eq!(rows[k..], expected[..k]);
        assert!(be.embed(&w, &[4]).is_err(), "id past the table is an error");
        let y = host(&be, &be.matmul(&tensor(&be, &x, 3, k), &w).unwrap());
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
    if let [ours, candles] = &products[..] {
        assert_eq!(
            bits(ours),
            bits(candles),
            "Q5_0 kernel and the Q8_0 repacking disagree"
        );
    }
}

#[test]
fn default_attention_rounds_operands_to_f16() {
    let (f16, f32) = (ours(), f32_attention());
    let h = Heads::grouped(2, 1, 4);
    let mut rng = Rng(5);
    let (k, v, q) = (rng.vec(3 * 4), rng.vec(3 * 4), rng.vec(8));
    let round = |x: &[f32]| {
        x.iter()
            .map(|v| f16::from_f32(*v).to_f32())
            .collect::<Vec<_>>()
    };
    let run = |be: &CandleBackend, k: &[f32], v: &[f32], q: &[f32]| {
        let mut kv = be.kv_new(&h).unwrap();
        be.kv_append(&mut kv, &tensor(be, k, 3, 4), &tensor(be, v, 3, 4))
            .unwrap();
        let y = be.attention(&tensor(be, q, 1, 8), &kv, &Mask::causal(2, 1), &h);
        host(be, &y.unwrap())
    };
    let a = run(&f16, &k, &v, &q);
    // The same as f32 attention over rounded operands, up to the rounding
    // of the attention weights.
    let b = run(&f32, &round(&k), &round(&v), &round(&q));
    assert_close(&a, &b, Tol::largest(2e-3), "f16 attention");
    assert_ne!(a, run(&f32, &k, &v, &q));
}

//! Checks against the real models, found through the one lookup every
//! real-model test uses (`arbor_fetch::testing::cached_model`): a model
//! that is not fetched is reported as `skipped: …`, or fails the test when
//! `ARBOR_REQUIRE_MODELS` lists it (CI lists SmolLM2, which it fetches).
//!
//! There is no second Rust dequantizer to compare with, so these check that
//! every tensor decodes to finite numbers of plausible size, that row
//! lookups agree with whole decodes, and that the Q5_0 → Q8_0 repacking is
//! lossless on real data (SmolLM2's embedding quantized to Q5_0 in CI, the
//! Qwen files' own Q5_0 embedding where fetched). Bit-exact agreement with
//! the `gguf` Python package is checked by `compare_with_gguf_py.py`.

use arbor_fetch::testing::cached_model as model_path;
use arbor_gguf::{
    GgmlType, GgufFile, TensorInfo, dequantize, dequantize_rows, quantize_q5_0, repack_q5_0_to_q8_0,
};

/// Up to `n` row indices spread over `0..rows`, first and last included.
fn spread(rows: usize, n: usize) -> Vec<usize> {
    if rows <= n {
        return (0..rows).collect();
    }
    (0..n).map(|i| i * (rows - 1) / (n - 1)).collect()
}

/// The tensor as `[rows, row_len]`: all of it when small, else 48 rows
/// spread over it (decoded with `dequantize_rows`).
fn sample(file: &GgufFile, t: &TensorInfo) -> (usize, Vec<f32>) {
    let bytes = file.tensor_bytes(t);
    let n = t.n_elements() as usize;
    let row_len = t.dims[0] as usize;
    if n <= 1 << 20 {
        (row_len, dequantize(t.ty, bytes, n).unwrap())
    } else {
        let rows = spread(n / row_len, 48);
        (
            row_len,
            dequantize_rows(t.ty, bytes, row_len, &rows).unwrap(),
        )
    }
}

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64).sqrt()
}

/// Decodes (a sample of) every tensor and checks the numbers look like
/// trained weights; returns the types seen.
fn check_model(file: &GgufFile) -> Vec<GgmlType> {
    let mut types = Vec::new();
    for t in &file.header().tensors {
        if !types.contains(&t.ty) {
            types.push(t.ty);
        }
        let (row_len, x) = sample(file, t);
        assert!(
            x.iter().all(|v| v.is_finite()),
            "{}: non-finite value",
            t.name
        );
        let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        // Qwen2's attention biases reach a few hundred; weights stay far
        // below that.
        assert!(max < 1000.0, "{}: |x| up to {max}", t.name);
        let r = rms(&x);
        if t.name.ends_with("norm.weight") {
            // Norm gains: order one at most. (Not necessarily positive:
            // SmolLM2's first attn_norm averages 0.001, spread over ±0.3.)
            assert!((0.01..50.0).contains(&r), "{}: rms {r}", t.name);
        } else if t.dims.len() == 2 {
            // Trained matrices: neither collapsed nor blown up, and rows differ.
            assert!((1e-3..1.0).contains(&r), "{}: rms {r}", t.name);
            let first = &x[..row_len];
            assert!(
                x.chunks(row_len).skip(1).any(|row| row != first),
                "{}",
                t.name
            );
        }
    }
    types
}

/// Token embedding rows: a real lookup (decoding only those rows) agrees
/// with decoding a whole leading slice of the matrix, and row norms are
/// plausible and not all equal.
fn check_embeddings(file: &GgufFile, vocab: usize, dim: usize) {
    let (t, bytes) = file.tensor("token_embd.weight").unwrap();
    assert_eq!(t.dims, [dim as u64, vocab as u64]);
    let row_bytes = bytes.len() / vocab;
    let head = dequantize(t.ty, &bytes[..64 * row_bytes], 64 * dim).unwrap();
    let ids = [0, 17, 63, 5, 17];
    let rows = dequantize_rows(t.ty, bytes, dim, &ids).unwrap();
    for (k, &id) in ids.iter().enumerate() {
        assert_eq!(rows[k * dim..(k + 1) * dim], head[id * dim..(id + 1) * dim]);
    }
    let ids = spread(vocab, 200);
    let rows = dequantize_rows(t.ty, bytes, dim, &ids).unwrap();
    let norms: Vec<f64> = rows
        .chunks(dim)
        .map(|r| rms(r) * (dim as f64).sqrt())
        .collect();
    let mut sorted = norms.clone();
    sorted.sort_by(f64::total_cmp);
    let (lo, median, hi) = (sorted[0], sorted[100], sorted[199]);
    eprintln!("token_embd row norms over 200 rows: min {lo:.3} median {median:.3} max {hi:.3}");
    assert!((0.1..10.0).contains(&median), "median row norm {median}");
    assert!(hi < 100.0 && hi > lo, "row norms {lo}..{hi}");
    assert!(dequantize_rows(t.ty, bytes, dim, &[vocab]).is_err());
}

/// Every fetched model decodes plausibly (SmolLM2 wherever CI runs; the
/// Qwen files where fetched).
#[test]
fn real_files_decode_plausibly() {
    smollm2_135m();
    qwen25_coder_05b();
    qwen25_coder_15b();
}

fn smollm2_135m() {
    let Some(path) = model_path("smollm2-135m") else {
        return;
    };
    let file = GgufFile::open(path).unwrap();
    let h = file.header();
    assert_eq!(h.architecture().unwrap(), "llama");
    assert_eq!(h.tensors.len(), 272);
    let types = check_model(&file);
    eprintln!("smollm2-135m types: {types:?}");
    check_embeddings(&file, 49152, 576);
}

fn qwen25_coder_05b() {
    let Some(path) = model_path("qwen2.5-coder-0.5b") else {
        return;
    };
    let file = GgufFile::open(path).unwrap();
    assert_eq!(file.header().architecture().unwrap(), "qwen2");
    let types = check_model(&file);
    eprintln!("qwen2.5-coder-0.5b types: {types:?}");
    check_embeddings(&file, 151936, 896);

    // The embedding is Q5_0: repacking it as Q8_0 must change no value.
    let (t, bytes) = file.tensor("token_embd.weight").unwrap();
    assert_eq!(t.ty, GgmlType::Q5_0);
    assert_repack_lossless(bytes, 896);
}

/// Repacking Q5_0 `bytes` (rows of `dim`) as Q8_0 changes no value.
fn assert_repack_lossless(bytes: &[u8], dim: usize) {
    let row_bytes = dim / 32 * 22;
    for chunk in bytes.chunks(row_bytes * 8192) {
        let n = chunk.len() / 22 * 32;
        let q8 = repack_q5_0_to_q8_0(chunk).unwrap();
        let a = dequantize(GgmlType::Q5_0, chunk, n).unwrap();
        let b = dequantize(GgmlType::Q8_0, &q8, n).unwrap();
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}

/// The Q5_0 repacking on real weights wherever CI runs: SmolLM2's
/// embedding (Q4_1 in the file) quantized to Q5_0.
#[test]
fn q5_0_repacking_is_lossless_on_smollm2_weights() {
    let Some(path) = model_path("smollm2-135m") else {
        return;
    };
    let file = GgufFile::open(path).unwrap();
    let (t, bytes) = file.tensor("token_embd.weight").unwrap();
    let dim = t.dims[0] as usize;
    let x = dequantize(t.ty, bytes, t.n_elements() as usize).unwrap();
    let q5 = quantize_q5_0(&x);
    assert_eq!(q5.len(), x.len() / 32 * 22);
    assert_repack_lossless(&q5, dim);
}

fn qwen25_coder_15b() {
    let Some(path) = model_path("qwen2.5-coder-1.5b") else {
        return;
    };
    let file = GgufFile::open(path).unwrap();
    assert_eq!(file.header().architecture().unwrap(), "qwen2");
    let types = check_model(&file);
    eprintln!("qwen2.5-coder-1.5b types: {types:?}");
    check_embeddings(&file, 151936, 1536);
}

//! Products with weights: whole, in parts, summed over segments, row by
//! row within a batch; and embedding rows.

use super::{
    NEAR, Rng, Tol, assert_close, bits, f32_bytes, host, host_matmul, random_blocks, random_q8_0,
    tensor, weight_data,
};
use crate::{Backend, GgmlType, matmul_sum_parts};
use half::f16;

/// Float ops that sum many terms: within 1e-5 of the largest value and
/// [`NEAR`] each.
const SUMS: Tol = Tol::largest(1e-5).and_near();

/// `x · wᵀ` for `n` rows of random `x` per `ns`, against the host product
/// of `values` (the weight as the host reads it).
#[allow(clippy::too_many_arguments)]
fn check_matmul<B: Backend>(
    b: &B,
    ty: GgmlType,
    bytes: &[u8],
    values: &[f32],
    (m, k): (usize, usize),
    ns: &[usize],
    tol: Tol,
    rng: &mut Rng,
) -> B::Weight {
    let w = b.weight(weight_data(ty, m, k, bytes)).unwrap();
    for &n in ns {
        let x = rng.vec(n * k);
        let y = b.matmul(&tensor(b, &x, n, k), &w).unwrap();
        assert_eq!(b.shape(&y), (n, m), "{ty:?} n={n}: shape");
        let want = host_matmul(&x, values, n, k, m);
        assert_close(&host(b, &y), &want, tol, &format!("matmul {ty:?} n={n}"));
    }
    w
}

/// `matmul` on `f32` weights (one of an odd shape too); an input of the
/// wrong width is an error.
pub fn matmul_f32<B: Backend>(b: &B) {
    let mut rng = Rng(7);
    let (m, k) = (40, 64);
    let w = Rng(1).vec(m * k);
    check_matmul(
        b,
        GgmlType::F32,
        &f32_bytes(&w),
        &w,
        (m, k),
        &[1, 3, 5],
        SUMS,
        &mut rng,
    );
    let (m, k) = (33, 50);
    let w = rng.vec(m * k);
    let wt = check_matmul(
        b,
        GgmlType::F32,
        &f32_bytes(&w),
        &w,
        (m, k),
        &[1, 3, 8],
        SUMS,
        &mut rng,
    );
    let bad = tensor(b, &rng.vec(2 * (k + 1)), 2, k + 1);
    assert!(b.matmul(&bad, &wt).is_err(), "input one column too wide");
}

/// `matmul` on `f16` weights against their exact `f32` values.
pub fn matmul_f16<B: Backend>(b: &B) {
    let (m, k) = (24, 96);
    let w: Vec<f16> = Rng(2).vec(m * k).into_iter().map(f16::from_f32).collect();
    let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
    let values: Vec<f32> = w.iter().map(|x| x.to_f32()).collect();
    check_matmul(
        b,
        GgmlType::F16,
        &bytes,
        &values,
        (m, k),
        &[1, 5],
        NEAR,
        &mut Rng(7),
    );
}

/// `matmul` on Q8_0 weights against the values their blocks hold: blocks
/// of every quant, and blocks quantized from random floats. `tol` is the
/// backend's: exact products meet [`NEAR`]; candle, which rounds the
/// activations to 8 bits too, meets `Tol::largest(2e-2)`.
pub fn matmul_q8_0<B: Backend>(b: &B, tol: Tol) {
    let mut rng = Rng(3);
    let (m, k) = (24, 64);
    let (bytes, values) = random_q8_0(m * k, &mut rng);
    check_matmul(
        b,
        GgmlType::Q8_0,
        &bytes,
        &values,
        (m, k),
        &[1, 5],
        tol,
        &mut Rng(7),
    );
    let (m, k) = (40, 64);
    let bytes = arbor_gguf::quantize_q8_0(&rng.vec(m * k));
    let values = weight_data(GgmlType::Q8_0, m, k, &bytes).to_f32().unwrap();
    check_matmul(
        b,
        GgmlType::Q8_0,
        &bytes,
        &values,
        (m, k),
        &[3],
        tol,
        &mut rng,
    );
}

/// Speculative decoding checks many tokens in one pass and must give what
/// one-token decoding gives, so a row's product with a weight of each of
/// `types` may not depend on the other rows of its batch: bit for bit.
pub fn batched_rows_equal_single_rows<B: Backend>(b: &B, types: &[GgmlType]) {
    let mut rng = Rng(0x5eed);
    let (rows, cols) = (64, 512);
    for &ty in types {
        let bytes = random_blocks(ty, rows, cols, &mut rng);
        let w = b.weight(weight_data(ty, rows, cols, &bytes)).unwrap();
        for n in [2usize, 5, 16, 33] {
            let x = rng.vec(n * cols);
            let batch = host(b, &b.matmul(&tensor(b, &x, n, cols), &w).unwrap());
            for i in 0..n {
                let row = tensor(b, &x[i * cols..][..cols], 1, cols);
                let one = host(b, &b.matmul(&row, &w).unwrap());
                assert_eq!(
                    bits(&one),
                    bits(&batch[i * rows..][..rows]),
                    "{ty}: row {i} of a {n}-row batch differs from the same row alone"
                );
            }
        }
    }
}

/// A `[24, 64]` weight of `ty` (F32, Q8_0 quantized from random floats,
/// or random blocks) and the values it holds.
fn part_weight(ty: GgmlType, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let (m, k) = (24, 64);
    let bytes = match ty {
        GgmlType::Q8_0 => arbor_gguf::quantize_q8_0(&rng.vec(m * k)),
        _ => random_blocks(ty, m, k, rng),
    };
    let values = weight_data(ty, m, k, &bytes).to_f32().unwrap();
    (bytes, values)
}

/// `matmul_part` (leading rows of a weight of `ty`, over a column range of
/// it and of `x`) equals the host product of that slice within `tol`; a
/// part past the weight or the input is an error.
pub fn weight_parts<B: Backend>(b: &B, ty: GgmlType, tol: Tol) {
    let (m, k) = (24, 64);
    let mut rng = Rng(21);
    let (bytes, values) = part_weight(ty, &mut rng);
    let w = b.weight(weight_data(ty, m, k, &bytes)).unwrap();
    for (rows, cols, xk) in [(8, 0..64, 64), (16, 32..64, 64), (24, 0..32, 40)] {
        let x = rng.vec(3 * xk);
        let y = b
            .matmul_part(&tensor(b, &x, 3, xk), &w, rows, cols.clone())
            .unwrap();
        assert_eq!(b.shape(&y), (3, rows));
        let xs: Vec<f32> = (x.chunks_exact(xk))
            .flat_map(|r| r[cols.clone()].to_vec())
            .collect();
        let ws: Vec<f32> = (values.chunks_exact(k).take(rows))
            .flat_map(|r| r[cols.clone()].to_vec())
            .collect();
        let want = host_matmul(&xs, &ws, 3, cols.len(), rows);
        assert_close(
            &host(b, &y),
            &want,
            tol,
            &format!("{ty} part ..{rows} {cols:?}"),
        );
    }
    let x = tensor(b, &rng.vec(2 * k), 2, k);
    assert!(b.matmul_part(&x, &w, m + 1, 0..k).is_err(), "{ty}: rows");
    assert!(b.matmul_part(&x, &w, 8, 0..k + 1).is_err(), "{ty}: cols");
    assert!(b.matmul_part(&x, &w, 8, 0..k + 32).is_err(), "{ty}: cols");
    let narrow = tensor(b, &rng.vec(2 * 16), 2, 16);
    assert!(b.matmul_part(&narrow, &w, 8, 0..32).is_err(), "{ty}: x");
}

/// A part whose columns start or end inside a Q8_0 block is refused. The
/// trait only asks callers not to, so this is for backends that check
/// (candle; burn multiplies such a part as asked).
pub fn part_inside_a_block_is_refused<B: Backend>(b: &B) {
    let (bytes, _) = part_weight(GgmlType::Q8_0, &mut Rng(22));
    let w = b
        .weight(weight_data(GgmlType::Q8_0, 24, 64, &bytes))
        .unwrap();
    let x = tensor(b, &Rng(23).vec(2 * 64), 2, 64);
    assert!(b.matmul_part(&x, &w, 8, 4..36).is_err());
}

/// `matmul_sum` of a weight of `ty` (an elastic layer's down projection
/// held whole) gives the bits of its parts multiplied one at a time and
/// added in order (`matmul_sum_parts`); bad segment ends are errors.
pub fn segment_sums_equal_parts<B: Backend>(b: &B, ty: GgmlType) {
    let mut rng = Rng(0x5e9);
    let (m, k) = (24, 512);
    let bytes = random_blocks(ty, m, k, &mut rng);
    let w = b.weight(weight_data(ty, m, k, &bytes)).unwrap();
    let ends: &[usize] = match ty.block_len() {
        256 => &[256, 512],
        _ => &[64, 96, 256, 512],
    };
    for (rows, upto, n) in [(24, ends.len(), 1), (16, ends.len() - 1, 5), (8, 1, 9)] {
        let x = tensor(b, &rng.vec(n * k), n, k);
        let got = host(b, &b.matmul_sum(&x, &w, rows, &ends[..upto]).unwrap());
        let want = host(
            b,
            &matmul_sum_parts(b, &x, &w, rows, &ends[..upto]).unwrap(),
        );
        assert_eq!(got.len(), n * rows);
        assert_eq!(
            bits(&got),
            bits(&want),
            "{ty}: rows ..{rows}, ends {:?}, {n} tokens",
            &ends[..upto]
        );
    }
    let x = tensor(b, &rng.vec(2 * k), 2, k);
    for bad in [&[][..], &[64, 64], &[96, 64], &[0, 64], &[64, k + 32]] {
        assert!(b.matmul_sum(&x, &w, 8, bad).is_err(), "{ty}: ends {bad:?}");
    }
    assert!(
        b.matmul_sum(&x, &w, m + 1, &[64]).is_err(),
        "{ty}: too many rows"
    );
}

/// `embed` reads rows (repeats too) of an `f32` table, loaded as a weight
/// and as an embedding table; an id past the table is an error.
pub fn embed<B: Backend>(b: &B) {
    let (vocab, dim) = (50, 24);
    let table = Rng(5).vec(vocab * dim);
    let bytes = f32_bytes(&table);
    let data = weight_data(GgmlType::F32, vocab, dim, &bytes);
    for w in [b.weight(data).unwrap(), b.embedding_table(data).unwrap()] {
        let ids = [3u32, 0, 49, 3, 17];
        let y = b.embed(&w, &ids).unwrap();
        assert_eq!(b.shape(&y), (ids.len(), dim));
        let want: Vec<f32> = (ids.iter())
            .flat_map(|&i| table[i as usize * dim..][..dim].to_vec())
            .collect();
        assert_close(&host(b, &y), &want, NEAR, "embed");
        assert!(b.embed(&w, &[50]).is_err());
    }
}

//! Every op of the burn backend, on every compiled device, against
//! `arbor_tensor::reference` or plain host math on small random inputs.

mod common;
use arbor_backend_burn::BurnBackend;
use arbor_tensor::{Backend, GgmlType, HeadOrder, Heads, Mask, Rope, RopeStyle, reference};
use common::{Rng, weight_data};
use half::f16;

#[track_caller]
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// `x [n, k] · wᵀ` for `w [m, k]` on the host.
fn host_matmul(x: &[f32], w: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    let mut out = vec![0.0; n * m];
    for i in 0..n {
        for j in 0..m {
            out[i * m + j] = (0..k).map(|l| x[i * k + l] * w[j * k + l]).sum();
        }
    }
    out
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn check_matmul(be: &BurnBackend, ty: GgmlType, bytes: &[u8], values: &[f32], m: usize, k: usize) {
    let mut rng = Rng(7);
    let w = be.weight(weight_data(ty, m, k, bytes)).unwrap();
    for n in [1, 5] {
        let x = rng.vec(n * k);
        let y = be.matmul(&be.tensor(&x, n, k).unwrap(), &w).unwrap();
        assert_eq!(be.shape(&y), (n, m));
        let what = format!("matmul {ty:?} n={n}");
        assert_close(
            &be.to_vec(&y).unwrap(),
            &host_matmul(&x, values, n, k, m),
            &what,
        );
    }
}

fn matmul_f32(be: &BurnBackend) {
    let (m, k) = (40, 64);
    let w = Rng(1).vec(m * k);
    check_matmul(be, GgmlType::F32, &f32_bytes(&w), &w, m, k);
}

fn matmul_f16(be: &BurnBackend) {
    let (m, k) = (24, 96);
    let w: Vec<f16> = Rng(2).vec(m * k).into_iter().map(f16::from_f32).collect();
    let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
    let values: Vec<f32> = w.iter().map(|x| x.to_f32()).collect();
    check_matmul(be, GgmlType::F16, &bytes, &values, m, k);
}

fn matmul_q8_0(be: &BurnBackend) {
    // Each block of 32: an f16 scale, then 32 i8 quants.
    let (m, k) = (24, 64);
    let mut rng = Rng(3);
    let (mut bytes, mut values) = (Vec::new(), Vec::new());
    for _ in 0..m * k / 32 {
        let scale = f16::from_f32(0.01 + 0.04 * rng.f32().abs());
        bytes.extend(scale.to_le_bytes());
        for _ in 0..32 {
            let q = (rng.below(255) as i32 - 127) as i8;
            bytes.push(q as u8);
            values.push(scale.to_f32() * q as f32);
        }
    }
    check_matmul(be, GgmlType::Q8_0, &bytes, &values, m, k);
}

fn matmul_host_weight(be: &BurnBackend) {
    let (m, k) = (33, 50);
    let mut rng = Rng(4);
    let w = rng.vec(m * k);
    let wt = be.weight_f32(&w, m, k).unwrap();
    for n in [1, 3, 8] {
        let x = rng.vec(n * k);
        let y = be.matmul(&be.tensor(&x, n, k).unwrap(), &wt).unwrap();
        let want = host_matmul(&x, &w, n, k, m);
        assert_close(&be.to_vec(&y).unwrap(), &want, "matmul f32 host weight");
    }
    let bad = be.tensor(&rng.vec(2 * (k + 1)), 2, k + 1).unwrap();
    assert!(be.matmul(&bad, &wt).is_err());
}

/// Parts of a weight (leading rows, a column range of `x` and `w`) equal
/// the host product of that slice; bad parts are errors.
fn matmul_part(be: &BurnBackend) {
    let (m, k) = (24, 64);
    let mut rng = Rng(5);
    let w = rng.vec(m * k);
    let wt = be.weight_f32(&w, m, k).unwrap();
    for (rows, cols, xk) in [(8, 0..64, 64), (16, 32..64, 64), (24, 0..32, 40)] {
        let x = rng.vec(3 * xk);
        let y = be
            .matmul_part(&be.tensor(&x, 3, xk).unwrap(), &wt, rows, cols.clone())
            .unwrap();
        let xs: Vec<f32> = (x.chunks_exact(xk))
            .flat_map(|r| r[cols.clone()].to_vec())
            .collect();
        let ws: Vec<f32> = (w.chunks_exact(k).take(rows))
            .flat_map(|r| r[cols.clone()].to_vec())
            .collect();
        let want = host_matmul(&xs, &ws, 3, cols.len(), rows);
        assert_close(
            &be.to_vec(&y).unwrap(),
            &want,
            &format!("part {rows} {cols:?}"),
        );
    }
    let x = be.tensor(&rng.vec(2 * k), 2, k).unwrap();
    assert!(be.matmul_part(&x, &wt, 25, 0..k).is_err());
    assert!(be.matmul_part(&x, &wt, 8, 0..k + 1).is_err());
    let narrow = be.tensor(&rng.vec(2 * 16), 2, 16).unwrap();
    assert!(be.matmul_part(&narrow, &wt, 8, 0..32).is_err());
    let n = be.narrow_cols(&x, 8..24).unwrap();
    assert_eq!(be.shape(&n), (2, 16));
    assert!(be.narrow_cols(&x, 60..70).is_err());
    let joined = be.concat_cols(&n, &x).unwrap();
    assert_eq!(be.shape(&joined), (2, 16 + k));
    let (jv, nv, xv) = (
        be.to_vec(&joined).unwrap(),
        be.to_vec(&n).unwrap(),
        be.to_vec(&x).unwrap(),
    );
    assert_eq!(jv[16..16 + k], xv[..k]);
    assert_eq!(jv[..16], nv[..16]);
    assert!(
        be.concat_cols(&n, &be.tensor(&rng.vec(k), 1, k).unwrap())
            .is_err()
    );
}

fn embed(be: &BurnBackend) {
    let (vocab, dim) = (50, 24);
    let table = Rng(5).vec(vocab * dim);
    let w = be.weight_f32(&table, vocab, dim).unwrap();
    let ids = [3u32, 0, 49, 3, 17];
    let y = be.embed(&w, &ids).unwrap();
    assert_eq!(be.shape(&y), (ids.len(), dim));
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&i| table[i as usize * dim..][..dim].to_vec())
        .collect();
    assert_close(&be.to_vec(&y).unwrap(), &want, "embed");
    assert!(be.embed(&w, &[50]).is_err());
}

fn add(be: &BurnBackend) {
    let mut rng = Rng(6);
    let (n, c) = (4, 10);
    let (a, b, row) = (rng.vec(n * c), rng.vec(n * c), rng.vec(c));
    let ta = be.tensor(&a, n, c).unwrap();
    let sum = be.add(&ta, &be.tensor(&b, n, c).unwrap()).unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_close(&be.to_vec(&sum).unwrap(), &want, "add");
    let sum = be.add(&ta, &be.tensor(&row, 1, c).unwrap()).unwrap();
    let want: Vec<f32> = a.iter().enumerate().map(|(i, x)| x + row[i % c]).collect();
    assert_close(&be.to_vec(&sum).unwrap(), &want, "add broadcast row");
    assert!(be.add(&ta, &be.tensor(&b[..2 * c], 2, c).unwrap()).is_err());
}

fn swiglu(be: &BurnBackend) {
    let mut rng = Rng(8);
    let (n, c) = (3, 17);
    let gate: Vec<f32> = rng.vec(n * c).iter().map(|x| 4.0 * x).collect();
    let up = rng.vec(n * c);
    let y = be
        .swiglu(
            &be.tensor(&gate, n, c).unwrap(),
            &be.tensor(&up, n, c).unwrap(),
        )
        .unwrap();
    let want: Vec<f32> = gate
        .iter()
        .zip(&up)
        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
        .collect();
    assert_close(&be.to_vec(&y).unwrap(), &want, "swiglu");
}

fn scale_cols(be: &BurnBackend) {
    let mut rng = Rng(12);
    let (n, c) = (3, 5);
    let (x, k) = (rng.vec(n * c), rng.vec(c));
    let y = be
        .scale_cols(&be.tensor(&x, n, c).unwrap(), &be.tensor(&k, 1, c).unwrap())
        .unwrap();
    let want: Vec<f32> = x.iter().enumerate().map(|(i, v)| v * k[i % c]).collect();
    assert_close(&be.to_vec(&y).unwrap(), &want, "scale_cols");
    let tall = be.tensor(&x[..2 * c], 2, c).unwrap();
    assert!(be.scale_cols(&be.tensor(&x, n, c).unwrap(), &tall).is_err());
}

fn matmul_tensor(be: &BurnBackend) {
    let mut rng = Rng(14);
    let (n, k, m) = (3, 5, 2);
    let (x, w) = (rng.vec(n * k), rng.vec(k * m));
    let y = be
        .matmul_tensor(&be.tensor(&x, n, k).unwrap(), &be.tensor(&w, k, m).unwrap())
        .unwrap();
    let want: Vec<f32> = (0..n * m)
        .map(|o| (0..k).map(|j| x[o / m * k + j] * w[j * m + o % m]).sum())
        .collect();
    assert_eq!(be.shape(&y), (n, m));
    assert_close(&be.to_vec(&y).unwrap(), &want, "matmul_tensor");
    let wrong = be.tensor(&w, m, k).unwrap();
    assert!(
        be.matmul_tensor(&be.tensor(&x, n, k).unwrap(), &wrong)
            .is_err()
    );
}

fn rms_norm(be: &BurnBackend) {
    let mut rng = Rng(9);
    let (n, c, eps) = (4, 32, 1e-5);
    let (x, w) = (rng.vec(n * c), rng.vec(c));
    let y = be
        .rms_norm(
            &be.tensor(&x, n, c).unwrap(),
            &be.tensor(&w, 1, c).unwrap(),
            eps,
        )
        .unwrap();
    let mut want = Vec::new();
    for row in x.chunks(c) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / c as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        want.extend(row.iter().zip(&w).map(|(v, g)| v * inv * g));
    }
    assert_close(&be.to_vec(&y).unwrap(), &want, "rms_norm");
}

fn rope(be: &BurnBackend) {
    let mut rng = Rng(10);
    let (n, heads, d) = (5, 3, 8);
    let c = heads * d;
    let x = rng.vec(n * c);
    let positions: Vec<u32> = (0..n).map(|_| rng.below(2000) as u32).collect();
    for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
        let r = Rope {
            style,
            theta: 10000.0,
            head_dim: d,
        };
        let y = be
            .rope(&be.tensor(&x, n, c).unwrap(), &positions, &r)
            .unwrap();
        let mut want = x.clone();
        reference::rope(&mut want, c, &positions, &r);
        assert_close(&be.to_vec(&y).unwrap(), &want, &format!("rope {style:?}"));
    }
}

fn select_rows(be: &BurnBackend) {
    let (n, c) = (6, 5);
    let x = Rng(11).vec(n * c);
    let rows = [4, 1, 5];
    let y = be
        .select_rows(&be.tensor(&x, n, c).unwrap(), &rows)
        .unwrap();
    let want: Vec<f32> = rows
        .iter()
        .flat_map(|&r| x[r * c..][..c].to_vec())
        .collect();
    assert_close(&be.to_vec(&y).unwrap(), &want, "select_rows");
    assert!(be.select_rows(&be.tensor(&x, n, c).unwrap(), &[6]).is_err());
}

const HEADS: Heads = Heads::grouped(4, 2, 8);

/// A random mask in which every row may attend to something.
fn random_mask(rng: &mut Rng, rows: usize, cols: usize) -> Mask {
    let mut allowed: Vec<bool> = (0..rows * cols).map(|_| rng.below(3) != 0).collect();
    for r in 0..rows {
        allowed[r * cols + rng.below(cols)] = true;
    }
    Mask {
        rows,
        cols,
        allowed,
    }
}

/// Appends `chunks` of random K/V rows to `kv`, returning them (host copies).
fn fill(
    be: &BurnBackend,
    rng: &mut Rng,
    kv: &mut <BurnBackend as Backend>::Kv,
    chunks: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let kc = HEADS.n_kv_heads * HEADS.head_dim;
    let (mut ks, mut vs) = (Vec::new(), Vec::new());
    for &n in chunks {
        let (k, v) = (rng.vec(n * kc), rng.vec(n * kc));
        be.kv_append(
            kv,
            &be.tensor(&k, n, kc).unwrap(),
            &be.tensor(&v, n, kc).unwrap(),
        )
        .unwrap();
        ks.extend(k);
        vs.extend(v);
    }
    (ks, vs)
}

fn check_attention(
    be: &BurnBackend,
    rng: &mut Rng,
    kv: &<BurnBackend as Backend>::Kv,
    k: &[f32],
    v: &[f32],
    what: &str,
) {
    let qc = HEADS.n_heads * HEADS.head_dim;
    let t = be.kv_len(kv);
    assert_eq!(
        t * HEADS.n_kv_heads * HEADS.head_dim,
        k.len(),
        "{what}: kv_len"
    );
    for n in [1, 3] {
        let q: Vec<f32> = rng.vec(n * qc).iter().map(|x| 3.0 * x).collect();
        let mask = random_mask(rng, n, t);
        let y = be
            .attention(&be.tensor(&q, n, qc).unwrap(), kv, &mask, &HEADS)
            .unwrap();
        assert_eq!(be.shape(&y), (n, qc));
        let want = reference::attention(&q, k, v, &mask, &HEADS);
        assert_close(&be.to_vec(&y).unwrap(), &want, &format!("{what}, n={n}"));
    }
}

fn attention(be: &BurnBackend) {
    let mut rng = Rng(12);
    let mut kv = be.kv_new(&HEADS).unwrap();
    let (mut k, mut v) = (Vec::new(), Vec::new());
    // Enough appends to outgrow the first buffer more than once.
    for (i, &n) in [3, 1, 9, 5, 20].iter().enumerate() {
        let (k1, v1) = fill(be, &mut rng, &mut kv, &[n]);
        k.extend(k1);
        v.extend(v1);
        check_attention(
            be,
            &mut rng,
            &kv,
            &k,
            &v,
            &format!("attention after append {i}"),
        );
    }
    // Causal prefill-style call: the new rows see the past and themselves.
    let qc = HEADS.n_heads * HEADS.head_dim;
    let t = be.kv_len(&kv);
    let q = rng.vec(4 * qc);
    let mask = Mask::causal(t - 4, 4);
    let y = be
        .attention(&be.tensor(&q, 4, qc).unwrap(), &kv, &mask, &HEADS)
        .unwrap();
    let want = reference::attention(&q, &k, &v, &mask, &HEADS);
    assert_close(&be.to_vec(&y).unwrap(), &want, "causal attention");
    // A mask of the wrong width is an error, not a panic.
    let bad = Mask::causal(t - 5, 4);
    assert!(
        be.attention(&be.tensor(&q, 4, qc).unwrap(), &kv, &bad, &HEADS)
            .is_err()
    );
}

/// Query heads interleaved in runs across the KV heads (elastic files)
/// read the KV head the reference says.
fn interleaved_attention(be: &BurnBackend) {
    let mut rng = Rng(13);
    let mut kv = be.kv_new(&HEADS).unwrap();
    let (k, v) = fill(be, &mut rng, &mut kv, &[7]);
    for heads in [
        Heads {
            n_heads: 4,
            order: HeadOrder::Interleaved { run: 1 },
            ..HEADS
        },
        Heads {
            n_heads: 4,
            order: HeadOrder::Interleaved { run: 2 },
            ..HEADS
        },
        Heads {
            n_heads: 2,
            order: HeadOrder::Interleaved { run: 1 },
            ..HEADS
        },
    ] {
        let qc = heads.n_heads * heads.head_dim;
        let q: Vec<f32> = rng.vec(3 * qc).iter().map(|x| 3.0 * x).collect();
        let mask = random_mask(&mut rng, 3, 7);
        let y = be
            .attention(&be.tensor(&q, 3, qc).unwrap(), &kv, &mask, &heads)
            .unwrap();
        let want = reference::attention(&q, &k, &v, &mask, &heads);
        assert_close(&be.to_vec(&y).unwrap(), &want, &format!("{heads:?}"));
    }
    // The order matters: runs of two differ from grouped heads.
    let q = rng.vec(4 * 8);
    let mask = Mask::causal(6, 1);
    let grouped = reference::attention(&q, &k, &v, &mask, &HEADS);
    let runs = Heads {
        order: HeadOrder::Interleaved { run: 1 },
        ..HEADS
    };
    assert_ne!(grouped, reference::attention(&q, &k, &v, &mask, &runs));
}

fn kv_truncate_and_keep(be: &BurnBackend) {
    let kc = HEADS.n_kv_heads * HEADS.head_dim;
    let mut rng = Rng(13);
    let mut kv = be.kv_new(&HEADS).unwrap();
    let (mut k, mut v) = fill(be, &mut rng, &mut kv, &[6, 7, 8]);
    assert_eq!(be.kv_len(&kv), 21);

    be.kv_truncate(&mut kv, 15).unwrap();
    k.truncate(15 * kc);
    v.truncate(15 * kc);
    check_attention(be, &mut rng, &kv, &k, &v, "after truncate");
    assert!(be.kv_truncate(&mut kv, 16).is_err());

    // Appending after a truncate overwrites the forgotten positions.
    let (k1, v1) = fill(be, &mut rng, &mut kv, &[4]);
    k.extend(k1);
    v.extend(v1);
    check_attention(be, &mut rng, &kv, &k, &v, "append after truncate");

    let keep = [0, 2, 3, 7, 11, 15, 18];
    be.kv_keep(&mut kv, &keep).unwrap();
    let gather = |x: &[f32]| -> Vec<f32> {
        keep.iter()
            .flat_map(|&p| x[p * kc..][..kc].to_vec())
            .collect()
    };
    let (mut k, mut v) = (gather(&k), gather(&v));
    check_attention(be, &mut rng, &kv, &k, &v, "after keep");
    assert!(be.kv_keep(&mut kv, &[1, 1]).is_err());
    assert!(be.kv_keep(&mut kv, &[0, 7]).is_err());

    // Keeping a prefix, then growing again.
    be.kv_keep(&mut kv, &[0, 1, 2, 3]).unwrap();
    k.truncate(4 * kc);
    v.truncate(4 * kc);
    let (k1, v1) = fill(be, &mut rng, &mut kv, &[2, 30]);
    k.extend(k1);
    v.extend(v1);
    check_attention(be, &mut rng, &kv, &k, &v, "append after keep");
}

fn shape_errors(be: &BurnBackend) {
    assert!(be.tensor(&[1.0, 2.0, 3.0], 2, 2).is_err());
    let a = be.tensor(&[1.0; 6], 2, 3).unwrap();
    let b = be.tensor(&[1.0; 6], 3, 2).unwrap();
    assert!(be.swiglu(&a, &b).is_err());
    assert!(be.rms_norm(&a, &b, 1e-5).is_err());
    let r = Rope {
        style: RopeStyle::Halves,
        theta: 10000.0,
        head_dim: 2,
    };
    assert!(be.rope(&a, &[0, 1], &r).is_err());
    let mut kv = be.kv_new(&HEADS).unwrap();
    assert!(be.kv_append(&mut kv, &a, &a).is_err());
}

macro_rules! device_tests {
    ($feature:literal, $module:ident, $backend:expr, $name:literal) => {
        #[cfg(feature = $feature)]
        mod $module {
            use super::*;

            fn be() -> BurnBackend {
                let be = $backend;
                assert_eq!(be.name(), $name);
                be
            }

            #[test]
            fn matmul_f32() {
                super::matmul_f32(&be());
            }
            #[test]
            fn matmul_f16() {
                super::matmul_f16(&be());
            }
            #[test]
            fn matmul_q8_0() {
                super::matmul_q8_0(&be());
            }
            #[test]
            fn matmul_host_weight() {
                super::matmul_host_weight(&be());
            }
            #[test]
            fn embed() {
                super::embed(&be());
            }
            #[test]
            fn add() {
                super::add(&be());
            }
            #[test]
            fn swiglu() {
                super::swiglu(&be());
            }
            #[test]
            fn scale_cols() {
                super::scale_cols(&be());
            }
            #[test]
            fn matmul_tensor() {
                super::matmul_tensor(&be());
            }
            #[test]
            fn rms_norm() {
                super::rms_norm(&be());
            }
            #[test]
            fn rope() {
                super::rope(&be());
            }
            #[test]
            fn select_rows() {
                super::select_rows(&be());
            }
            #[test]
            fn attention() {
                super::attention(&be());
            }
            #[test]
            fn matmul_part() {
                super::matmul_part(&be());
            }
            #[test]
            fn interleaved_attention() {
                super::interleaved_attention(&be());
            }
            #[test]
            fn kv_truncate_and_keep() {
                super::kv_truncate_and_keep(&be());
            }
            #[test]
            fn shape_errors() {
                super::shape_errors(&be());
            }
        }
    };
}

device_tests!("flex", flex, BurnBackend::flex(), "flex");
device_tests!("ndarray", ndarray, BurnBackend::ndarray(), "ndarray");
device_tests!("wgpu", wgpu, BurnBackend::wgpu(), "wgpu");

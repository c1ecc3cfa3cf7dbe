//! Elementwise and row ops, small float products, RoPE, shape errors.

use super::{Rng, Tol, assert_close, bits, gather_rows, host, tensor};
use crate::{Backend, Rope, RopeStyle, reference};

/// One or two roundings per value: within 1e-6 of the largest value and
/// [`NEAR`] each.
const ONE_STEP: Tol = Tol::largest(1e-6).and_near();
/// A few roundings per value: within 1e-5 of the largest and [`NEAR`].
const FEW_STEPS: Tol = Tol::largest(1e-5).and_near();

/// `add` of two matrices and of a matrix and one row; rows that disagree
/// are an error.
pub fn add<B: Backend>(b: &B) {
    let mut rng = Rng(6);
    for (n, c) in [(3, 4), (4, 10)] {
        let (a, other, row) = (rng.vec(n * c), rng.vec(n * c), rng.vec(c));
        let ta = tensor(b, &a, n, c);
        let sum = b.add(&ta, &tensor(b, &other, n, c)).unwrap();
        let want: Vec<f32> = a.iter().zip(&other).map(|(x, y)| x + y).collect();
        assert_close(&host(b, &sum), &want, ONE_STEP, "add");
        let sum = b.add(&ta, &tensor(b, &row, 1, c)).unwrap();
        let want: Vec<f32> = a.iter().enumerate().map(|(i, x)| x + row[i % c]).collect();
        assert_close(&host(b, &sum), &want, ONE_STEP, "add a row");
        assert!(b.add(&ta, &tensor(b, &other[..2 * c], 2, c)).is_err());
    }
}

/// `swiglu`, `silu(gate) * up`, and with one tensor as both.
pub fn swiglu<B: Backend>(b: &B) {
    let mut rng = Rng(8);
    let silu = |g: f32| g / (1.0 + (-g).exp());
    for (n, c) in [(3, 4), (3, 17)] {
        let gate: Vec<f32> = rng.vec(n * c).iter().map(|x| 4.0 * x).collect();
        let up = rng.vec(n * c);
        let tg = tensor(b, &gate, n, c);
        let y = b.swiglu(&tg, &tensor(b, &up, n, c)).unwrap();
        let want: Vec<f32> = gate.iter().zip(&up).map(|(&g, u)| silu(g) * u).collect();
        assert_close(&host(b, &y), &want, ONE_STEP, "swiglu");
        let y = b.swiglu(&tg, &tg).unwrap();
        let want: Vec<f32> = gate.iter().map(|&g| silu(g) * g).collect();
        assert_close(&host(b, &y), &want, ONE_STEP, "swiglu of one tensor");
    }
}

/// `scale_cols` is one product per value: exact. A scale that is not one
/// row is an error.
pub fn scale_cols<B: Backend>(b: &B) {
    let mut rng = Rng(12);
    for (n, c) in [(3, 4), (3, 5)] {
        let (x, s) = (rng.vec(n * c), rng.vec(c));
        let tx = tensor(b, &x, n, c);
        let y = b.scale_cols(&tx, &tensor(b, &s, 1, c)).unwrap();
        let want: Vec<f32> = x.iter().enumerate().map(|(i, v)| v * s[i % c]).collect();
        assert_eq!(host(b, &y), want, "scale_cols");
        assert!(b.scale_cols(&tx, &tensor(b, &x[..2 * c], 2, c)).is_err());
        assert!(b.scale_cols(&tx, &tx).is_err());
    }
}

/// `rms_norm` row by row, against the host.
pub fn rms_norm<B: Backend>(b: &B) {
    let mut rng = Rng(9);
    for (n, c, eps) in [(3, 4, 1e-6), (4, 32, 1e-5)] {
        let (x, w) = (rng.vec(n * c), rng.vec(c));
        let y = b
            .rms_norm(&tensor(b, &x, n, c), &tensor(b, &w, 1, c), eps)
            .unwrap();
        let y = host(b, &y);
        for (r, row) in x.chunks(c).enumerate() {
            let rms = (row.iter().map(|v| v * v).sum::<f32>() / c as f32 + eps).sqrt();
            let want: Vec<f32> = row.iter().zip(&w).map(|(v, g)| v / rms * g).collect();
            let what = format!("rms_norm [{n}, {c}] row {r}");
            assert_close(&y[r * c..][..c], &want, FEW_STEPS, &what);
        }
    }
}

/// `select_rows` copies rows exactly, in the order asked; a row past the
/// end is an error.
pub fn select_rows<B: Backend>(b: &B) {
    let mut rng = Rng(11);
    for ((n, c), rows) in [((3, 4), &[2, 0][..]), ((6, 5), &[4, 1, 5])] {
        let x = rng.vec(n * c);
        let tx = tensor(b, &x, n, c);
        let y = b.select_rows(&tx, rows).unwrap();
        assert_eq!(b.shape(&y), (rows.len(), c));
        assert_eq!(
            host(b, &y),
            gather_rows(&x, c, rows),
            "select_rows {rows:?}"
        );
        assert!(b.select_rows(&tx, &[n]).is_err());
    }
}

/// `matmul_tensor` against the host, every row alone giving the bits it
/// gets in the batch; a factor of the wrong height is an error.
pub fn matmul_tensor<B: Backend>(b: &B) {
    let mut rng = Rng(14);
    for (n, k, m) in [(3, 4, 2), (3, 5, 2)] {
        let (x, w) = (rng.vec(n * k), rng.vec(k * m));
        let (tx, tw) = (tensor(b, &x, n, k), tensor(b, &w, k, m));
        let y = b.matmul_tensor(&tx, &tw).unwrap();
        assert_eq!(b.shape(&y), (n, m));
        let want: Vec<f32> = (0..n * m)
            .map(|o| (0..k).map(|j| x[o / m * k + j] * w[j * m + o % m]).sum())
            .collect();
        let y = host(b, &y);
        assert_close(&y, &want, ONE_STEP, "matmul_tensor");
        for r in 0..n {
            let row = tensor(b, &x[r * k..][..k], 1, k);
            let one = host(b, &b.matmul_tensor(&row, &tw).unwrap());
            assert_eq!(bits(&one), bits(&y[r * m..][..m]), "row {r} alone");
        }
        assert!(b.matmul_tensor(&tx, &tensor(b, &w, m, k)).is_err());
        assert!(b.matmul_tensor(&tx, &tx).is_err());
    }
}

/// `rope` in both styles, at small and large positions, against
/// [`reference::rope`].
pub fn rope<B: Backend>(b: &B) {
    let mut rng = Rng(10);
    let random: Vec<u32> = (0..5).map(|_| rng.below(2000) as u32).collect();
    for (heads, positions) in [(2, &[0, 5, 1000][..]), (3, &random)] {
        let (n, c) = (positions.len(), heads * 8);
        let x = rng.vec(n * c);
        for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
            let r = Rope {
                style,
                theta: 10000.0,
                head_dim: 8,
            };
            let y = b.rope(&tensor(b, &x, n, c), positions, &r).unwrap();
            let mut want = x.clone();
            reference::rope(&mut want, c, positions, &r);
            let what = format!("rope {style:?} at {positions:?}");
            assert_close(&host(b, &y), &want, FEW_STEPS, &what);
        }
    }
}

/// Shapes that disagree are errors, not panics.
pub fn shape_errors<B: Backend>(b: &B) {
    assert!(b.tensor(&[1.0, 2.0, 3.0], 2, 2).is_err());
    let x = tensor(b, &[1.0; 6], 2, 3);
    let y = tensor(b, &[1.0; 6], 3, 2);
    assert!(b.swiglu(&x, &y).is_err());
    assert!(b.rms_norm(&x, &y, 1e-5).is_err());
    let r = Rope {
        style: RopeStyle::Halves,
        theta: 10000.0,
        head_dim: 2,
    };
    assert!(b.rope(&x, &[0, 1], &r).is_err());
    let mut kv = b.kv_new(&super::HEADS).unwrap();
    assert!(b.kv_append(&mut kv, &x, &x).is_err());
}

/// `narrow_cols` and `concat_cols` move values exactly; ranges past the
/// end and rows that disagree are errors.
pub fn narrow_and_concat_cols<B: Backend>(b: &B) {
    let mut rng = Rng(5);
    let k = 64;
    let xv = rng.vec(2 * k);
    let x = tensor(b, &xv, 2, k);
    let n = b.narrow_cols(&x, 8..24).unwrap();
    assert_eq!(b.shape(&n), (2, 16));
    let nv: Vec<f32> = xv.chunks(k).flat_map(|r| r[8..24].to_vec()).collect();
    assert_eq!(host(b, &n), nv);
    assert!(b.narrow_cols(&x, 60..70).is_err());
    let joined = b.concat_cols(&n, &x).unwrap();
    assert_eq!(b.shape(&joined), (2, 16 + k));
    let want = [&nv[..16], &xv[..k], &nv[16..], &xv[k..]].concat();
    assert_eq!(host(b, &joined), want);
    assert!(b.concat_cols(&n, &tensor(b, &rng.vec(k), 1, k)).is_err());

    let (a, c) = (rng.vec(2 * 3), rng.vec(2 * 5));
    let ta = tensor(b, &a, 2, 3);
    let joined = b.concat_cols(&ta, &tensor(b, &c, 2, 5)).unwrap();
    let want = [&a[..3], &c[..5], &a[3..], &c[5..]].concat();
    assert_eq!((b.shape(&joined), host(b, &joined)), ((2, 8), want));
    assert!(b.concat_cols(&ta, &tensor(b, &rng.vec(15), 3, 5)).is_err());
}

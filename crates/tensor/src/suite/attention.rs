//! Attention against [`reference::attention`], over caches grown,
//! truncated and compacted.

use super::{Rng, Tol, assert_close, gather_rows, host, tensor};
use crate::{Backend, HeadOrder, Heads, Mask, reference};

/// Grouped-query heads most checks use: 4 query heads over 2 KV heads.
pub const HEADS: Heads = Heads::grouped(4, 2, 8);

/// Softmax-weighted sums: within 1e-5 of the largest value and
/// [`NEAR`](super::NEAR) each.
const ATTENTION: Tol = Tol::largest(1e-5).and_near();

/// A random mask in which every row may attend to something.
pub fn random_mask(rng: &mut Rng, rows: usize, cols: usize) -> Mask {
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

/// Appends `chunks` of random K/V rows for [`HEADS`] to `kv`; returns the
/// rows appended (host copies).
pub fn fill<B: Backend>(
    b: &B,
    rng: &mut Rng,
    kv: &mut B::Kv,
    chunks: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let kc = HEADS.n_kv_heads * HEADS.head_dim;
    let (mut ks, mut vs) = (Vec::new(), Vec::new());
    for &n in chunks {
        let (k, v) = (rng.vec(n * kc), rng.vec(n * kc));
        b.kv_append(kv, &tensor(b, &k, n, kc), &tensor(b, &v, n, kc))
            .unwrap();
        ks.extend(k);
        vs.extend(v);
    }
    (ks, vs)
}

/// `q` (`n` rows for `heads`) over `kv` under `mask`, against the
/// reference over the host copies `k`, `v`.
#[allow(clippy::too_many_arguments)]
fn check<B: Backend>(
    b: &B,
    q: &[f32],
    kv: &B::Kv,
    (k, v): (&[f32], &[f32]),
    mask: &Mask,
    heads: &Heads,
    what: &str,
) {
    let qc = heads.n_heads * heads.head_dim;
    let n = q.len() / qc;
    let y = b.attention(&tensor(b, q, n, qc), kv, mask, heads).unwrap();
    assert_eq!(b.shape(&y), (n, qc), "{what}: shape");
    let want = reference::attention(q, k, v, mask, heads);
    assert_close(&host(b, &y), &want, ATTENTION, what);
}

/// One and three query rows under random masks over the whole cache,
/// after checking the cache holds as many positions as `k`.
fn check_random<B: Backend>(b: &B, rng: &mut Rng, kv: &B::Kv, k: &[f32], v: &[f32], what: &str) {
    let t = b.kv_len(kv);
    assert_eq!(
        t * HEADS.n_kv_heads * HEADS.head_dim,
        k.len(),
        "{what}: kv_len"
    );
    let qc = HEADS.n_heads * HEADS.head_dim;
    for n in [1, 3] {
        let q: Vec<f32> = rng.vec(n * qc).iter().map(|x| 3.0 * x).collect();
        let mask = random_mask(rng, n, t);
        check(b, &q, kv, (k, v), &mask, &HEADS, &format!("{what}, n={n}"));
    }
}

/// Attention after each of several appends (enough to outgrow a first
/// buffer more than once), then a causal prefill-style call; a mask of
/// the wrong width is an error, not a panic.
pub fn attention_over_a_growing_cache<B: Backend>(b: &B) {
    let mut rng = Rng(12);
    let mut kv = b.kv_new(&HEADS).unwrap();
    let (mut k, mut v) = (Vec::new(), Vec::new());
    for (i, n) in [3, 1, 9, 5, 20].into_iter().enumerate() {
        let (k1, v1) = fill(b, &mut rng, &mut kv, &[n]);
        k.extend(k1);
        v.extend(v1);
        check_random(b, &mut rng, &kv, &k, &v, &format!("after append {i}"));
    }
    let qc = HEADS.n_heads * HEADS.head_dim;
    let t = b.kv_len(&kv);
    let q = rng.vec(4 * qc);
    check(
        b,
        &q,
        &kv,
        (&k, &v),
        &Mask::causal(t - 4, 4),
        &HEADS,
        "causal",
    );
    let bad = Mask::causal(t - 5, 4);
    assert!(
        b.attention(&tensor(b, &q, 4, qc), &kv, &bad, &HEADS)
            .is_err()
    );
}

/// A tree-shaped mask over a cache filled in three appends; then the
/// cache compacted to some positions and truncated, with edits past its
/// end and a row that sees nothing refused.
pub fn attention_and_cache_edits<B: Backend>(b: &B) {
    let mut rng = Rng(4);
    let kc = HEADS.n_kv_heads * HEADS.head_dim;
    let mut kv = b.kv_new(&HEADS).unwrap();
    let (k, v) = fill(b, &mut rng, &mut kv, &[3, 1, 4]);
    assert_eq!(b.kv_len(&kv), 8);
    // Both rows see the first three positions, then branches of their own.
    let mut allowed = vec![false; 16];
    for c in [0, 1, 2, 4, 6] {
        allowed[c] = true;
    }
    for c in [0, 1, 2, 3, 5, 7] {
        allowed[8 + c] = true;
    }
    let tree = Mask {
        rows: 2,
        cols: 8,
        allowed,
    };
    let q = rng.vec(2 * 32);
    check(b, &q, &kv, (&k, &v), &tree, &HEADS, "tree mask");

    let keep = [0, 2, 5];
    b.kv_keep(&mut kv, &keep).unwrap();
    let (k, v) = (gather_rows(&k, kc, &keep), gather_rows(&v, kc, &keep));
    check(
        b,
        &q[..32],
        &kv,
        (&k, &v),
        &Mask::causal(2, 1),
        &HEADS,
        "kept",
    );

    b.kv_truncate(&mut kv, 1).unwrap();
    assert_eq!(b.kv_len(&kv), 1);
    assert!(b.kv_truncate(&mut kv, 2).is_err());
    assert!(b.kv_keep(&mut kv, &[3]).is_err());
    let nothing = Mask {
        rows: 1,
        cols: 1,
        allowed: vec![false],
    };
    let q1 = tensor(b, &q[..32], 1, 32);
    assert!(b.attention(&q1, &kv, &nothing, &HEADS).is_err());
}

/// Truncating, appending over the forgotten positions, keeping some
/// positions, keeping a prefix and growing again: attention follows the
/// cache's contents after each; bad edits are errors.
pub fn kv_truncate_and_keep<B: Backend>(b: &B) {
    let kc = HEADS.n_kv_heads * HEADS.head_dim;
    let mut rng = Rng(13);
    let mut kv = b.kv_new(&HEADS).unwrap();
    let (mut k, mut v) = fill(b, &mut rng, &mut kv, &[6, 7, 8]);
    assert_eq!(b.kv_len(&kv), 21);

    b.kv_truncate(&mut kv, 15).unwrap();
    k.truncate(15 * kc);
    v.truncate(15 * kc);
    check_random(b, &mut rng, &kv, &k, &v, "after truncate");
    assert!(b.kv_truncate(&mut kv, 16).is_err());

    let (k1, v1) = fill(b, &mut rng, &mut kv, &[4]);
    k.extend(k1);
    v.extend(v1);
    check_random(b, &mut rng, &kv, &k, &v, "append after truncate");

    let keep = [0, 2, 3, 7, 11, 15, 18];
    b.kv_keep(&mut kv, &keep).unwrap();
    let (mut k, mut v) = (gather_rows(&k, kc, &keep), gather_rows(&v, kc, &keep));
    check_random(b, &mut rng, &kv, &k, &v, "after keep");
    assert!(b.kv_keep(&mut kv, &[1, 1]).is_err());
    assert!(b.kv_keep(&mut kv, &[0, 7]).is_err());

    b.kv_keep(&mut kv, &[0, 1, 2, 3]).unwrap();
    k.truncate(4 * kc);
    v.truncate(4 * kc);
    let (k1, v1) = fill(b, &mut rng, &mut kv, &[2, 30]);
    k.extend(k1);
    v.extend(v1);
    check_random(b, &mut rng, &kv, &k, &v, "append after keep");
}

/// Query heads interleaved in runs across the KV heads (elastic files)
/// read the KV head the reference says, under causal and random masks.
pub fn interleaved_heads<B: Backend>(b: &B) {
    let mut rng = Rng(13);
    let mut kv = b.kv_new(&HEADS).unwrap();
    let (k, v) = fill(b, &mut rng, &mut kv, &[7]);
    for (n_heads, run) in [(4, 1), (4, 2), (2, 1)] {
        let heads = Heads {
            n_heads,
            order: HeadOrder::Interleaved { run },
            ..HEADS
        };
        let qc = n_heads * HEADS.head_dim;
        let q = rng.vec(2 * qc);
        check(
            b,
            &q,
            &kv,
            (&k, &v),
            &Mask::causal(5, 2),
            &heads,
            &format!("{heads:?}"),
        );
        let q: Vec<f32> = rng.vec(3 * qc).iter().map(|x| 3.0 * x).collect();
        let mask = random_mask(&mut rng, 3, 7);
        check(
            b,
            &q,
            &kv,
            (&k, &v),
            &mask,
            &heads,
            &format!("{heads:?}, random mask"),
        );
    }
    // The order matters: runs of one differ from grouped heads.
    let q = rng.vec(4 * 8);
    let mask = Mask::causal(6, 1);
    let grouped = reference::attention(&q, &k, &v, &mask, &HEADS);
    let runs = Heads {
        order: HeadOrder::Interleaved { run: 1 },
        ..HEADS
    };
    assert_ne!(grouped, reference::attention(&q, &k, &v, &mask, &runs));
}

/// 96 new rows after 96 cached ones, causal: large enough for backends'
/// parallel paths (`n · t · heads` ≥ 2¹⁶).
pub fn long_causal_attention<B: Backend>(b: &B) {
    let mut rng = Rng(6);
    let (n, past) = (96, 96);
    let t = n + past;
    assert!(n * t * HEADS.n_heads >= 1 << 16);
    let mut kv = b.kv_new(&HEADS).unwrap();
    let (k, v) = fill(b, &mut rng, &mut kv, &[t]);
    let q = rng.vec(n * HEADS.n_heads * HEADS.head_dim);
    check(
        b,
        &q,
        &kv,
        (&k, &v),
        &Mask::causal(past, n),
        &HEADS,
        "long causal",
    );
}

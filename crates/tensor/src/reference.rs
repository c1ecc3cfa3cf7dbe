//! Plain, obviously-correct host implementations of the ops that are easy to
//! get subtly wrong (RoPE, masked GQA attention). Slow; for tests and for
//! backends that have no better way.

use crate::{Heads, Mask, Rope, RopeStyle};

/// Rotates `x` (`positions.len()` rows of `cols` values, `cols` a multiple of
/// `rope.head_dim`) in place.
pub fn rope(x: &mut [f32], cols: usize, positions: &[u32], rope: &Rope) {
    let d = rope.head_dim;
    let half = d / 2;
    let inv_freq = rope.inv_freq();
    let mut cos_sin = vec![(0f32, 0f32); half];
    for (row, &pos) in x.chunks_exact_mut(cols).zip(positions) {
        for (cs, f) in cos_sin.iter_mut().zip(&inv_freq) {
            let (sin, cos) = (pos as f32 * f).sin_cos();
            *cs = (cos, sin);
        }
        for head in row.chunks_exact_mut(d) {
            for (i, &(cos, sin)) in cos_sin.iter().enumerate() {
                let (a, b) = match rope.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Halves => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos - x1 * sin;
                head[b] = x0 * sin + x1 * cos;
            }
        }
    }
}

/// Masked grouped-query attention. `q` is `[n, n_heads*d]`, `k` and `v` are
/// `[t, n_kv_heads*d]`, `mask` is `[n, t]`. Returns `[n, n_heads*d]`.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], mask: &Mask, h: &Heads) -> Vec<f32> {
    let d = h.head_dim;
    let (qc, kc) = (h.n_heads * d, h.n_kv_heads * d);
    let n = q.len() / qc;
    let t = k.len() / kc;
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0.0; n * qc];
    let mut scores = vec![0.0f32; t];
    for i in 0..n {
        for head in 0..h.n_heads {
            let kvh = h.kv_head(head);
            let qi = &q[i * qc + head * d..][..d];
            let mut max = f32::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate() {
                *s = if mask.get(i, j) {
                    let kj = &k[j * kc + kvh * d..][..d];
                    qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale
                } else {
                    f32::NEG_INFINITY
                };
                max = max.max(*s);
            }
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let o = &mut out[i * qc + head * d..][..d];
            for (j, s) in scores.iter().enumerate() {
                if *s == 0.0 {
                    continue;
                }
                let w = s / sum;
                for (oo, vv) in o.iter_mut().zip(&v[j * kc + kvh * d..][..d]) {
                    *oo += w * vv;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_mask_is_lower_triangular_after_the_past() {
        let m = Mask::causal(2, 3);
        let rows: Vec<Vec<bool>> = m.allowed.chunks(5).map(|r| r.to_vec()).collect();
        assert_eq!(rows[0], [true, true, true, false, false]);
        assert_eq!(rows[1], [true, true, true, true, false]);
        assert_eq!(rows[2], [true, true, true, true, true]);
        assert!(m.validate(3, 5).is_ok());
        assert!(m.validate(3, 4).is_err());
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm() {
        let r = Rope {
            style: RopeStyle::Halves,
            theta: 10000.0,
            head_dim: 4,
        };
        let orig = [1.0, 2.0, 3.0, 4.0, 0.5, -1.0, 2.0, 0.0];
        let mut x = orig;
        rope(&mut x, 4, &[0, 7], &r);
        assert_eq!(x[..4], orig[..4]);
        let n0: f32 = orig[4..].iter().map(|v| v * v).sum();
        let n1: f32 = x[4..].iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
        assert_ne!(x[4..], orig[4..]);
    }

    #[test]
    fn rope_pairs_dimensions_as_the_style_says() {
        // head_dim 4: pair 0 turns by `pos` radians, pair 1 by pos/100.
        let (c, s) = (1f32.cos(), 1f32.sin());
        for (style, expect) in [
            (RopeStyle::Halves, [c, 0.0, s, 0.0]),
            (RopeStyle::Interleaved, [c, s, 0.0, 0.0]),
        ] {
            let mut x = [1.0, 0.0, 0.0, 0.0];
            rope(
                &mut x,
                4,
                &[1],
                &Rope {
                    style,
                    theta: 10000.0,
                    head_dim: 4,
                },
            );
            for (a, b) in x.iter().zip(expect) {
                assert!((a - b).abs() < 1e-6, "{style:?}: {x:?}");
            }
        }
    }

    #[test]
    fn attention_with_one_visible_key_returns_its_value() {
        let h = Heads::grouped(2, 1, 2);
        let q = [1.0, 0.0, 0.0, 1.0];
        let k = [1.0, 1.0, -1.0, 3.0];
        let v = [10.0, 20.0, 30.0, 40.0];
        let mask = Mask {
            rows: 1,
            cols: 2,
            allowed: vec![false, true],
        };
        assert_eq!(
            attention(&q, &k, &v, &mask, &h),
            vec![30.0, 40.0, 30.0, 40.0]
        );
    }
}

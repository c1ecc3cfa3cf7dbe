//! Row-wise kernels whose arithmetic for a row depends on that row alone:
//! RMS norm and attention. burn's reductions and batched matmuls pick
//! their strategy (and so their order of additions) by shape, so a row
//! could get other bits in a pass of 64 rows than alone; these do not.

use cubecl::prelude::*;

/// Units per cube.
const LANES: usize = 32;

/// `out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) · w`: one cube per
/// row; unit `u` sums the squares of columns `u, u + 32, …`, the 32 sums
/// are added in a fixed tree.
#[cube(launch_unchecked)]
pub fn rms_norm(x: &[f32], w: &[f32], out: &mut [f32], cols: u32, eps: f32) {
    let r = CUBE_POS_X as usize;
    let u = UNIT_POS_X as usize;
    let cols = cols as usize;
    let base = r * cols;
    let mut part = Shared::<[f32]>::new_slice(LANES);
    let steps = (cols + LANES - 1 - u) / LANES;
    let mut s = 0.0f32;
    for i in 0..steps {
        let v = x[base + u + i * LANES];
        s += v * v;
    }
    part[u] = s;
    sync_cube();
    if u < 16 {
        part[u] += part[u + 16];
    }
    sync_cube();
    if u < 8 {
        part[u] += part[u + 8];
    }
    sync_cube();
    if u < 4 {
        part[u] += part[u + 4];
    }
    sync_cube();
    if u < 2 {
        part[u] += part[u + 2];
    }
    sync_cube();
    if u < 1 {
        part[u] += part[u + 1];
    }
    sync_cube();
    let inv = 1.0f32 / f32::sqrt(part[0] / f32::cast_from(cols) + eps);
    for i in 0..steps {
        let c = u + i * LANES;
        out[base + c] = x[base + c] * inv * w[c];
    }
}

/// Attention of query row `r`, head `h` (one cube each) over the first
/// `t_len` cached positions that `allowed[r, t]` lets it see.
///
/// Positions are taken in order, 32 at a time: unit `u` scores position
/// `32c + u` (a dot product in column order), then every unit walks the 32
/// scores in order with the same online-softmax updates, adding value
/// columns `u, u + 32, …` of its own. A row's bits depend only on the
/// sequence of positions it may see, not on where they sit in the cache or
/// what else is in the pass.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    allowed: &[u32],
    out: &mut [f32],
    t_len: u32,
    cap: u32,
    n_heads: u32,
    kv_heads: u32,
    run: u32,
    scale: f32,
    #[comptime] d: usize,
) {
    let h = CUBE_POS_X as usize;
    let r = CUBE_POS_Y as usize;
    let u = UNIT_POS_X as usize;
    let t_len = t_len as usize;
    let kvh = (h / run as usize) % kv_heads as usize;
    let qb = (r * n_heads as usize + h) * d;
    let kb = kvh * cap as usize * d;
    let per = comptime![d.div_ceil(LANES)];
    let mut scores = Shared::<[f32]>::new_slice(LANES);
    let mut seen = Shared::<[u32]>::new_slice(LANES);
    let mut acc = Array::<f32>::new(per);
    #[unroll]
    for i in 0..per {
        acc[i] = 0.0;
    }
    let mut m = 0.0f32;
    let mut l = 0.0f32;
    let mut started = false;
    let chunks = t_len.div_ceil(LANES);
    for c in 0..chunks {
        let t = c * LANES + u;
        let mut ok = 0u32;
        let mut s = 0.0f32;
        if t < t_len {
            ok = allowed[r * t_len + t];
            if ok == 1 {
                let kt = kb + t * d;
                for i in 0..d {
                    s += q[qb + i] * k[kt + i];
                }
                s *= scale;
            }
        }
        scores[u] = s;
        seen[u] = ok;
        sync_cube();
        let mut count = t_len - c * LANES;
        if count > LANES {
            count = LANES;
        }
        for j in 0..count {
            if seen[j] == 1 {
                let x = scores[j];
                if !started {
                    m = x;
                    started = true;
                } else if x > m {
                    let f = f32::exp(m - x);
                    l *= f;
                    #[unroll]
                    for i in 0..per {
                        acc[i] *= f;
                    }
                    m = x;
                }
                let p = f32::exp(x - m);
                l += p;
                let vt = kb + (c * LANES + j) * d;
                #[unroll]
                for i in 0..per {
                    let col = u + i * LANES;
                    if col < d {
                        acc[i] += p * v[vt + col];
                    }
                }
            }
        }
        sync_cube();
    }
    #[unroll]
    for i in 0..per {
        let col = u + i * LANES;
        if col < d {
            out[qb + col] = acc[i] / l;
        }
    }
}

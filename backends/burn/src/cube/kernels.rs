//! CubeCL kernels that read GGUF blocks in place: each works on "groups"
//! of 32 consecutive values of one weight row (a whole block for the
//! 32-value formats, one sub-block of a 256-value K-quant super-block).
//!
//! Layout (`super::blocks`): each block is padded to whole `u32` words (a
//! 2-byte `f16` scale that ggml puts before byte-aligned quants gets two
//! zero bytes after it; Q6_K's 210 bytes get two at the end), so every
//! field starts on a byte the kernels address directly. Rows come in tiles
//! of 32, interleaved word by word: word `k` of row `32t + l` is at
//! `32 · (t · row_words + k) + l`. The 32 units of a cube take the 32 rows
//! of a tile, so at every step they read 32 consecutive words.
//!
//! `matmul`: one unit computes one output feature for up to `tile`
//! activation rows over one fixed slice of the groups, dequantizing each
//! group once and adding it in column order into each row's own
//! accumulator; `sum_splits` then adds the slices in order. No unit talks
//! to another (no barriers), and nothing a row's arithmetic does depends
//! on the other rows of the pass or on how many there are: a row gets the
//! same bits in a pass of 1 or of 64 rows, the batch invariance lossless
//! speculation needs.

use cubecl::prelude::*;

use super::pointwise::index;

/// The most activation rows one unit multiplies by each dequantized group
/// (`matmul`'s `tile`; how many it takes changes no row's bits).
pub const TILE: usize = 4;
/// Values in a group; rows in a tile; units per cube.
pub const LANES: usize = 32;

// Format codes (comptime arguments).
pub const F16: u32 = 0;
pub const BF16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q5_0: u32 = 4;
pub const Q5_1: u32 = 5;
pub const Q8_0: u32 = 6;
pub const Q4_K: u32 = 7;
pub const Q5_K: u32 = 8;
pub const Q6_K: u32 = 9;

/// An IEEE half (low 16 bits of `h`) as `f32`, subnormals included.
#[cube]
fn half(h: u32) -> f32 {
    let exp = (h >> 10) & 31;
    let man = h & 1023;
    let mut v = f32::cast_from(man) * 0.000000059604645f32; // 2^-24: subnormal
    if exp == 31 {
        v = f32::reinterpret((255u32 << 23) | (man << 13));
    } else if exp != 0 {
        v = f32::reinterpret(((exp + 112) << 23) | (man << 13));
    }
    if (h >> 15) & 1 == 1 {
        v = -v;
    }
    v
}

/// Word `k` of the row in lane `l` of the tile at `t` (see the layout).
#[cube]
fn word(w: &[u32], t: usize, l: usize, k: usize) -> u32 {
    w[t + k * 32 + l]
}

/// Byte `k` counted from word `b` of the row.
#[cube]
fn byte(w: &[u32], t: usize, l: usize, b: usize, k: usize) -> u32 {
    (word(w, t, l, b + k / 4) >> (8 * (k % 4) as u32)) & 255
}

/// A signed byte (int8) as `f32`.
#[cube]
fn signed(b: u32) -> f32 {
    f32::cast_from(b ^ 128) - 128.0
}

/// The 6-bit scale (`want_min == false`) or min of sub-block `s` in a
/// Q4_K/Q5_K super-block whose 12 packed scale bytes start at word `b + 1`.
#[cube]
fn scale_min(w: &[u32], t: usize, l: usize, b: usize, s: usize, #[comptime] want_min: bool) -> f32 {
    let base = b + 1;
    // Sub-blocks 0-3: the low 6 bits of bytes s (scale) and s + 4 (min);
    // 4-7: a nibble of byte s + 4 and the top 2 bits of byte s - 4 or s.
    let mut v = byte(w, t, l, base, s) & 63;
    if comptime![want_min] {
        if s < 4 {
            v = byte(w, t, l, base, s + 4) & 63;
        } else {
            v = (byte(w, t, l, base, s + 4) >> 4) | ((byte(w, t, l, base, s) >> 6) << 4);
        }
    } else if s >= 4 {
        v = (byte(w, t, l, base, s + 4) & 15) | ((byte(w, t, l, base, s - 4) >> 6) << 4);
    }
    f32::cast_from(v)
}

/// The 32 values of group `g` of the row in lane `l` of the tile at `t`.
#[cube]
pub fn group(w: &[u32], t: usize, l: usize, g: usize, v: &mut Array<f32>, #[comptime] ty: u32) {
    if comptime![ty == F16 || ty == BF16] {
        let b = g * 16;
        #[unroll]
        for i in 0..16usize {
            let wd = word(w, t, l, b + i);
            if comptime![ty == F16] {
                v[2 * i] = half(wd & 65535);
                v[2 * i + 1] = half(wd >> 16);
            } else {
                v[2 * i] = f32::reinterpret(wd << 16);
                v[2 * i + 1] = f32::reinterpret(wd & 0xFFFF_0000u32);
            }
        }
    } else if comptime![ty == Q8_0] {
        let b = g * 9;
        let d = half(word(w, t, l, b) & 65535);
        #[unroll]
        for i in 0..8usize {
            let wd = word(w, t, l, b + 1 + i);
            #[unroll]
            for k in 0..4usize {
                v[4 * i + k] = d * signed((wd >> (8 * k as u32)) & 255);
            }
        }
    } else if comptime![ty == Q4_0 || ty == Q4_1] {
        let b = g * 5;
        let d = half(word(w, t, l, b) & 65535);
        let mut m = -8.0f32 * d;
        if comptime![ty == Q4_1] {
            m = half(word(w, t, l, b) >> 16);
        }
        #[unroll]
        for i in 0..4usize {
            let wd = word(w, t, l, b + 1 + i);
            #[unroll]
            for k in 0..4usize {
                let q = (wd >> (8 * k as u32)) & 255;
                v[4 * i + k] = d * f32::cast_from(q & 15) + m;
                v[4 * i + k + 16] = d * f32::cast_from(q >> 4) + m;
            }
        }
    } else if comptime![ty == Q5_0 || ty == Q5_1] {
        let b = g * 6;
        let d = half(word(w, t, l, b) & 65535);
        let mut m = -16.0f32 * d;
        if comptime![ty == Q5_1] {
            m = half(word(w, t, l, b) >> 16);
        }
        let qh = word(w, t, l, b + 1);
        #[unroll]
        for i in 0..4usize {
            let wd = word(w, t, l, b + 2 + i);
            #[unroll]
            for k in 0..4usize {
                let j = (4 * i + k) as u32;
                let q = (wd >> (8 * k as u32)) & 255;
                let lo = (q & 15) | (((qh >> j) & 1) << 4);
                let hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
                v[4 * i + k] = d * f32::cast_from(lo) + m;
                v[4 * i + k + 16] = d * f32::cast_from(hi) + m;
            }
        }
    } else if comptime![ty == Q4_K || ty == Q5_K] {
        let s = g % 8;
        let mut b = (g / 8) * 36;
        if comptime![ty == Q5_K] {
            b = (g / 8) * 44;
        }
        let d = half(word(w, t, l, b) & 65535);
        let dmin = half(word(w, t, l, b) >> 16);
        let d1 = d * scale_min(w, t, l, b, s, false);
        let m1 = dmin * scale_min(w, t, l, b, s, true);
        let shift = 4 * (s % 2) as u32;
        let mut qs = b + 4 + 8 * (s / 2);
        if comptime![ty == Q5_K] {
            qs = b + 12 + 8 * (s / 2);
        }
        #[unroll]
        for i in 0..8usize {
            let wd = word(w, t, l, qs + i);
            #[unroll]
            for k in 0..4usize {
                let mut q = (wd >> (8 * k as u32 + shift)) & 15;
                if comptime![ty == Q5_K] {
                    let h = byte(w, t, l, b + 4, 4 * i + k);
                    q |= ((h >> s as u32) & 1) << 4;
                }
                v[4 * i + k] = d1 * f32::cast_from(q) - m1;
            }
        }
    } else {
        // Q6_K: 128 low-nibble bytes, 64 high-bit bytes, 16 int8 scales,
        // then the f16 scale, in 53 words.
        let b = (g / 8) * 53;
        let sub = g % 8;
        let n = sub / 4;
        let q = sub % 4;
        let d = half(word(w, t, l, b + 52) & 65535);
        let ql = b + 16 * n + 8 * (q % 2);
        let qh = b + 32 + 8 * n;
        let nib = 4 * (q / 2) as u32;
        let hs = 2 * q as u32;
        let s0 = 8 * n + 2 * q;
        let d0 = d * signed(byte(w, t, l, b + 48, s0));
        let d1 = d * signed(byte(w, t, l, b + 48, s0 + 1));
        #[unroll]
        for i in 0..8usize {
            let lo = word(w, t, l, ql + i);
            let hi = word(w, t, l, qh + i);
            #[unroll]
            for k in 0..4usize {
                let sh = 8 * k as u32;
                let q6 = ((lo >> (sh + nib)) & 15) | (((hi >> (sh + hs)) & 3) << 4);
                let x = f32::cast_from(q6) - 32.0;
                if i < 4 {
                    v[4 * i + k] = d0 * x;
                } else {
                    v[4 * i + k] = d1 * x;
                }
            }
        }
    }
}

/// One slice of `x · Wᵀ`: `part[split, r, j] = Σ_c x[r, x_col + c] ·
/// W[j, 32·(g0 + first) + c]`, `c` over the split's groups (`per_split`
/// of them from `first = split · per_split`, fewer in the last). `x` is
/// `[n, x_stride]`; `part` is `[splits, n, m]`; rows of `W` hold `row_words`
/// words. Cube `(tile, split, rows)`: unit `l` takes output `32·tile + l`.
/// With `with_add` (one split only), `add[r · add_stride + j]` is added to
/// the finished sum (a bias row: stride 0; a residual: stride `m`).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    x: &[f32],
    w: &[u32],
    part: &mut [f32],
    n: u32,
    m: u32,
    x_stride: u32,
    x_col: u32,
    row_words: u32,
    g0: u32,
    groups: u32,
    per_split: u32,
    add: &[f32],
    add_stride: u32,
    #[comptime] ty: u32,
    #[comptime] with_add: bool,
    #[comptime] tile: usize,
) {
    let l = UNIT_POS_X as usize;
    let j = CUBE_POS_X as usize * LANES + l;
    let split = CUBE_POS_Y as usize;
    let r0 = CUBE_POS_Z as usize * tile;
    let (n, m) = (n as usize, m as usize);
    if j < m {
        let t = CUBE_POS_X as usize * LANES * row_words as usize;
        let first = split * per_split as usize;
        let mut last = first + per_split as usize;
        if last > groups as usize {
            last = groups as usize;
        }
        let mut acc = Array::<f32>::new(tile);
        #[unroll]
        for i in 0..tile {
            acc[i] = 0.0;
        }
        let mut v = Array::<f32>::new(LANES);
        for g in first..last {
            group(w, t, l, g0 as usize + g, &mut v, ty);
            let col = x_col as usize + g * LANES;
            #[unroll]
            for i in 0..tile {
                if r0 + i < n {
                    let xb = (r0 + i) * x_stride as usize + col;
                    let mut s = 0.0f32;
                    #[unroll]
                    for c in 0..LANES {
                        s += x[xb + c] * v[c];
                    }
                    acc[i] += s;
                }
            }
        }
        #[unroll]
        for i in 0..tile {
            if r0 + i < n {
                let mut y = acc[i];
                if comptime![with_add] {
                    y += add[(r0 + i) * add_stride as usize + j];
                }
                part[(split * n + r0 + i) * m + j] = y;
            }
        }
    }
}

/// `out[e] = Σ_s part[s · len + e]` in split order, one unit per element;
/// with `with_add`, then `+ add[(e / cols) · add_stride + e % cols]`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn sum_splits(
    part: &[f32],
    out: &mut [f32],
    len: u32,
    splits: u32,
    add: &[f32],
    cols: u32,
    add_stride: u32,
    #[comptime] with_add: bool,
) {
    let e = index();
    let len = len as usize;
    if e < len {
        let mut s = part[e];
        for i in 1..splits as usize {
            s += part[i * len + e];
        }
        if comptime![with_add] {
            let cols = cols as usize;
            s += add[(e / cols) * add_stride as usize + e % cols];
        }
        out[e] = s;
    }
}

/// `out[i, :] = W[ids[i], :]` dequantized, for the ids among the rows
/// `row0..row0 + rows` that `w` holds: one unit per group.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn rows(
    w: &[u32],
    ids: &[u32],
    out: &mut [f32],
    row_words: u32,
    groups: u32,
    row0: u32,
    rows: u32,
    #[comptime] ty: u32,
) {
    let i = CUBE_POS_Y as usize;
    let g = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    let held = ids[i] >= row0 && ids[i] < row0 + rows;
    if g < groups as usize && held {
        let id = (ids[i] - row0) as usize;
        let t = (id / LANES) * LANES * row_words as usize;
        let mut v = Array::<f32>::new(LANES);
        group(w, t, id % LANES, g, &mut v, ty);
        let o = i * groups as usize * LANES + g * LANES;
        #[unroll]
        for c in 0..LANES {
            out[o + c] = v[c];
        }
    }
}

/// One word of the device layout from the file's bytes: `raw` holds
/// `rows` rows of `row_bytes` bytes each, blocks of `bytes` bytes; a block
/// on the device is `packed` bytes, two zero bytes inserted at `pad_at`
/// (none when `pad_at >= packed`). Unit `e` writes word `e` of `out`
/// (tiles of 32 rows interleaved word by word; rows past `rows` are zero).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn pack(
    raw: &[u32],
    out: &mut [u32],
    len: u32,
    rows: u32,
    row_bytes: u32,
    row_words: u32,
    bytes: u32,
    packed: u32,
    pad_at: u32,
) {
    let e = index() as u32;
    if e < len {
        let l = e % 32;
        let k = (e / 32) % row_words;
        let row = (e / 32 / row_words) * 32 + l;
        let mut word = 0u32;
        if row < rows {
            let block_words = packed / 4;
            let block = k / block_words;
            let at = (k % block_words) * 4;
            let base = row * row_bytes + block * bytes;
            for j in 0..4u32 {
                let p = at + j;
                let mut keep = true;
                let mut src = p;
                if p >= pad_at {
                    src = p - 2;
                    if p < pad_at + 2 {
                        keep = false;
                    }
                }
                if keep {
                    let i = base + src;
                    let b = (raw[(i / 4) as usize] >> (8 * (i % 4))) & 255;
                    word |= b << (8 * j);
                }
            }
        }
        out[e as usize] = word;
    }
}

//! Kernels that compute each output value from a few inputs at the same
//! place: RoPE and SwiGLU. Each replaces a chain of burn ops (RoPE took
//! about nine kernels and two uploads per call, SwiGLU two or three), so a
//! layer launches fewer kernels; a value's arithmetic depends on nothing
//! else in the pass.

use cubecl::prelude::*;

/// Units per cube.
pub const UNITS: usize = 256;

/// The flat index of this unit in a grid of `UNITS`-unit cubes laid out
/// `(x, y)` (more than 65,535 cubes take a second dimension), as
/// `super::grid` launches them; every one-unit-per-element kernel uses it.
#[cube]
pub fn index() -> usize {
    (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize * UNITS + UNIT_POS_X as usize
}

/// Rotates each head of `x` (`[n, heads · d]`) by the angles of its row:
/// `table[r, i]` is the cosine of pair `i`'s angle, `table[r, d/2 + i]`
/// its sine. A pair is `(i, i + d/2)` (`halves`) or `(2i, 2i + 1)`. One
/// unit per pair.
#[cube(launch_unchecked)]
pub fn rope(
    x: &[f32],
    table: &[f32],
    out: &mut [f32],
    pairs: u32,
    heads: u32,
    half: u32,
    #[comptime] halves: bool,
) {
    let e = index();
    if e < pairs as usize {
        let half = half as usize;
        let i = e % half;
        let rh = e / half;
        let r = rh / heads as usize;
        let base = rh * 2 * half;
        let mut a = base + 2 * i;
        let mut b = a + 1;
        if comptime![halves] {
            a = base + i;
            b = a + half;
        }
        let c = table[r * 2 * half + i];
        let s = table[r * 2 * half + half + i];
        let (x0, x1) = (x[a], x[b]);
        out[a] = x0 * c - x1 * s;
        out[b] = x0 * s + x1 * c;
    }
}

/// `out = silu(gate) · up`, one unit per value.
#[cube(launch_unchecked)]
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32], len: u32) {
    let e = index();
    if e < len as usize {
        let g = gate[e];
        out[e] = g / (1.0 + f32::exp(-g)) * up[e];
    }
}

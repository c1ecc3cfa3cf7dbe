//! Our kernels on burn's CubeCL devices (wgpu; any CubeCL runtime burn
//! builds with): weights kept in their GGUF blocks ([`blocks`]), and the
//! row-wise ops whose bits must not depend on the rest of the pass
//! ([`rows`]: RMS norm, attention). Tensors cross over through burn's
//! extension API (`Tensor::try_into_primitive::<Cube>`).

use arbor_tensor::{Error, HeadOrder, Heads, Mask, Result, Rope, RopeStyle};
use burn::tensor::{DType, Device, Int, Shape, Tensor, TensorData};
use burn_cubecl::Cube;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

mod blocks;
mod kernels;
mod pointwise;
mod rows;

pub(crate) use blocks::{Blocks, MAX_BUFFER_BYTES, block_bytes};

fn backend_err(message: impl std::fmt::Display) -> Error {
    Error::Backend {
        backend: "cube",
        message: message.to_string(),
    }
}

/// The CubeCL tensor under a burn tensor (an error for another backend's
/// tensor or a tracked one).
fn primitive<const D: usize, K>(t: Tensor<D, K>) -> Result<CubeTensor>
where
    K: burn::tensor::kind::Basic + burn::tensor::BackendPrimitive<Cube, Primitive = CubeTensor>,
{
    t.try_into_primitive::<Cube>()
        .map_err(|e| backend_err(format!("not a CubeCL tensor: {e:?}")))
}

/// What CubeCL's memory pools hold on `device`, every stream's: bytes
/// reserved from the driver and bytes in use (a one-word tensor reaches the
/// device's client).
pub(crate) fn device_memory(device: &Device) -> Result<(u64, u64)> {
    let t = Tensor::<1, Int>::from_data(TensorData::new(vec![0u32], [1]), (device, DType::U32));
    let client = primitive(t)?.client;
    let usage = client.memory_report(cubecl::MemoryScope::Device).usage();
    Ok((usage.bytes_reserved, usage.bytes_in_use))
}

fn output(like: &CubeTensor, shape: [usize; 2]) -> CubeTensor {
    empty_device_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::new(shape),
        DType::F32,
    )
}

/// RMS norm of each row of `x` (`[n, c]`) scaled by `w` (`[1, c]`).
pub(crate) fn rms_norm(x: &Tensor<2>, w: &Tensor<2>, eps: f32) -> Result<Tensor<2>> {
    let [n, c] = x.dims();
    let x = into_contiguous(primitive(x.clone())?);
    let w = into_contiguous(primitive(w.clone())?);
    let out = output(&x, [n, c]);
    let client = x.client.clone();
    unsafe {
        rows::rms_norm::launch_unchecked(
            &client,
            CubeCount::Static(n as u32, 1, 1),
            CubeDim::new_1d(32),
            x.into_buffer_arg(),
            w.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            c as u32,
            eps,
        )
    };
    Ok(Tensor::from_primitive::<Cube>(out))
}

/// Attention of `q` (`[n, n_heads · d]`) over the first `t` positions of
/// `k`, `v` (`[kv_heads, cap, d]`) under `mask`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    device: &Device,
    cache: &PassCache,
    q: &Tensor<2>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    t: usize,
    mask: &Mask,
    heads: &Heads,
) -> Result<Tensor<2>> {
    let [n, qc] = q.dims();
    let [hkv, cap, d] = k.dims();
    let run = match heads.order {
        HeadOrder::Grouped => heads.n_heads / heads.n_kv_heads,
        HeadOrder::Interleaved { run } => run,
    };
    let allowed = cache.mask(device, mask);
    let q = into_contiguous(primitive(q.clone())?);
    let k = into_contiguous(primitive(k.clone())?);
    let v = into_contiguous(primitive(v.clone())?);
    let allowed = primitive(allowed)?;
    let out = output(&q, [n, qc]);
    let client = q.client.clone();
    unsafe {
        rows::attention::launch_unchecked(
            &client,
            CubeCount::Static(heads.n_heads as u32, n as u32, 1),
            CubeDim::new_1d(32),
            q.into_buffer_arg(),
            k.into_buffer_arg(),
            v.into_buffer_arg(),
            allowed.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            t as u32,
            cap as u32,
            heads.n_heads as u32,
            hkv as u32,
            run as u32,
            1.0 / (d as f32).sqrt(),
            d,
        )
    };
    Ok(Tensor::from_primitive::<Cube>(out))
}

/// What every layer of a pass uploads alike, uploaded once: the RoPE
/// angles of the pass's positions and the attention mask. Each upload
/// ends the GPU's batch of queued kernels (CubeCL submits before a
/// write), so uploading them per layer cost a submit each, several per
/// layer. Kept by content: a call with other positions or another mask
/// replaces the entry.
#[derive(Debug, Default)]
pub(crate) struct PassCache(std::sync::Mutex<Entries>);

#[derive(Debug, Default)]
struct Entries {
    rope: Option<(RopeKey, Tensor<2>)>,
    mask: Option<(usize, Vec<bool>, Tensor<1, Int>)>,
}

#[derive(Debug, PartialEq)]
struct RopeKey {
    positions: Vec<u32>,
    theta: u32,
    head_dim: usize,
}

impl PassCache {
    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        // The entries are plain values: one a panicking thread left is
        // still whole.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `[n, d]`: each row's cosines of its pairs' angles, then their sines
    /// (angles on the host, as the CPU backends compute them).
    fn rope_table(&self, device: &Device, positions: &[u32], rope: &Rope) -> Tensor<2> {
        let key = RopeKey {
            positions: positions.to_vec(),
            theta: rope.theta.to_bits(),
            head_dim: rope.head_dim,
        };
        let mut entries = self.entries();
        if let Some((k, t)) = &entries.rope
            && *k == key
        {
            return t.clone();
        }
        let (d, freqs) = (rope.head_dim, rope.inv_freq());
        let mut table = Vec::with_capacity(positions.len() * d);
        for &p in positions {
            let angles = freqs.iter().map(|f| (p as f32 * f).sin_cos());
            let (sin, cos): (Vec<f32>, Vec<f32>) = angles.unzip();
            table.extend(cos);
            table.extend(sin);
        }
        let t = Tensor::<2>::from_data(
            TensorData::new(table, [positions.len(), d]),
            (device, DType::F32),
        );
        entries.rope = Some((key, t.clone()));
        t
    }

    /// The mask as one `u32` per (row, position).
    fn mask(&self, device: &Device, mask: &Mask) -> Tensor<1, Int> {
        let mut entries = self.entries();
        if let Some((rows, allowed, t)) = &entries.mask
            && *rows == mask.rows
            && *allowed == mask.allowed
        {
            return t.clone();
        }
        let words: Vec<u32> = mask.allowed.iter().map(|&a| u32::from(a)).collect();
        let len = words.len();
        let t = Tensor::<1, Int>::from_data(TensorData::new(words, [len]), (device, DType::U32));
        entries.mask = Some((mask.rows, mask.allowed.clone(), t.clone()));
        t
    }
}

/// A grid of `pointwise::UNITS`-unit cubes covering `len` values, one
/// unit each (`pointwise::index` inside the kernel).
fn grid(len: usize) -> CubeCount {
    let cubes = len.div_ceil(pointwise::UNITS).max(1);
    let (x, y) = (cubes.min(32768), cubes.div_ceil(32768));
    CubeCount::Static(x as u32, y as u32, 1)
}

/// The cube shape [`grid`] counts in.
fn grid_dim() -> CubeDim {
    CubeDim::new_1d(pointwise::UNITS as u32)
}

/// RoPE of `x` (`[n, heads · head_dim]`) at `positions` (one per row).
pub(crate) fn rope(
    device: &Device,
    cache: &PassCache,
    x: &Tensor<2>,
    positions: &[u32],
    rope: &Rope,
) -> Result<Tensor<2>> {
    let [n, c] = x.dims();
    let table = into_contiguous(primitive(cache.rope_table(device, positions, rope))?);
    let x = into_contiguous(primitive(x.clone())?);
    let out = output(&x, [n, c]);
    let (half, heads) = (rope.head_dim / 2, c / rope.head_dim);
    let pairs = n * heads * half;
    let client = x.client.clone();
    unsafe {
        pointwise::rope::launch_unchecked(
            &client,
            grid(pairs),
            grid_dim(),
            x.into_buffer_arg(),
            table.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            pairs as u32,
            heads as u32,
            half as u32,
            matches!(rope.style, RopeStyle::Halves),
        )
    };
    Ok(Tensor::from_primitive::<Cube>(out))
}

/// `silu(gate) · up` (same shapes).
pub(crate) fn swiglu(gate: &Tensor<2>, up: &Tensor<2>) -> Result<Tensor<2>> {
    let [n, c] = gate.dims();
    let gate = into_contiguous(primitive(gate.clone())?);
    let up = into_contiguous(primitive(up.clone())?);
    let out = output(&gate, [n, c]);
    let len = n * c;
    let client = gate.client.clone();
    unsafe {
        pointwise::swiglu::launch_unchecked(
            &client,
            grid(len),
            grid_dim(),
            gate.into_buffer_arg(),
            up.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            len as u32,
        )
    };
    Ok(Tensor::from_primitive::<Cube>(out))
}

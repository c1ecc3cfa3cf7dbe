//! Our kernels on burn's CubeCL devices (wgpu; any CubeCL runtime burn
//! builds with): weights kept in their GGUF blocks ([`blocks`]), and the
//! row-wise ops whose bits must not depend on the rest of the pass
//! ([`rows`]: RMS norm, attention). Tensors cross over through burn's
//! extension API (`Tensor::try_into_primitive::<Cube>`).

use arbor_tensor::{Error, HeadOrder, Heads, Mask, Result};
use burn::tensor::{DType, Device, Int, Shape, Tensor, TensorData};
use burn_cubecl::Cube;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

mod blocks;
mod kernels;
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
pub(crate) fn attention(
    device: &Device,
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
    let allowed: Vec<u32> = mask.allowed.iter().map(|&a| u32::from(a)).collect();
    let allowed =
        Tensor::<1, Int>::from_data(TensorData::new(allowed, [n * t]), (device, DType::U32));
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

//! Times `x [n, 768] · wᵀ` for `w [3072, 768]` on every compiled device,
//! with the weight stored pre-transposed (`[in, out]`, what the backend
//! does) and as a transposed view of `[out, in]`.
//!
//! `cargo run --release -p arbor-backend-burn --example gemv --features flex,ndarray`

use std::time::Instant;

use arbor_backend_burn::BurnBackend;
use arbor_tensor::Backend;
use burn::tensor::{DType, Tensor, TensorData};

fn bench(be: &BurnBackend) {
    let (k, m) = (768, 3072);
    let w: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let wt = be.weight_f32(&w, m, k).unwrap();
    let w_view: Tensor<2> =
        Tensor::from_data(TensorData::new(w, [m, k]), (be.device(), DType::F32)).transpose();
    for n in [1, 64] {
        let x = be.tensor(&vec![0.25; n * k], n, k).unwrap();
        let flops = 2.0 * (n * k * m) as f64;
        let reps = if n == 1 { 200 } else { 20 };
        // Warm up (shader compilation on wgpu).
        be.to_vec(&be.matmul(&x, &wt).unwrap()).unwrap();
        let t = Instant::now();
        for _ in 0..reps {
            be.to_vec(&be.matmul(&x, &wt).unwrap()).unwrap();
        }
        let pre = flops * reps as f64 / t.elapsed().as_secs_f64() / 1e9;
        let xi = x.inner().clone();
        xi.clone().matmul(w_view.clone()).to_data();
        let t = Instant::now();
        for _ in 0..reps {
            xi.clone().matmul(w_view.clone()).to_data();
        }
        let view = flops * reps as f64 / t.elapsed().as_secs_f64() / 1e9;
        println!(
            "{:8} n={n:3}: pre-transposed {pre:6.1} GFLOP/s, transposed view {view:6.1} GFLOP/s",
            be.name()
        );
    }
}

fn main() {
    #[cfg(feature = "flex")]
    bench(&BurnBackend::flex());
    #[cfg(feature = "ndarray")]
    bench(&BurnBackend::ndarray());
    #[cfg(feature = "wgpu")]
    if std::env::var_os("GEMV_WGPU").is_some() {
        bench(&BurnBackend::wgpu());
    }
}

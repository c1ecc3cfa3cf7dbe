//! What CubeCL's memory pools reserve from the driver for our weights
//! (lavapipe in CI). Weights held for the run come from the persistent pool,
//! exact-fit: the reservation grows by their bytes, not by pages sized for
//! the largest buffer served so far. Alone in its test binary, so that no
//! other test's buffers move the device's count.
#![cfg(feature = "wgpu")]

use arbor_backend_burn::BurnBackend;
use arbor_tensor::suite::{Rng, random_blocks, weight_data};
use arbor_tensor::{Backend, GgmlType};

#[test]
fn held_weights_reserve_their_bytes_and_streamed_ones_are_recycled() {
    let be = BurnBackend::wgpu();
    let mut rng = Rng(41);
    // A layer's worth of a 0.5B-like model: projections of several sizes
    // and formats, as a Q4_K_M file mixes them.
    let shapes = [
        (GgmlType::Q4_K, 896, 896),
        (GgmlType::Q4_K, 128, 896),
        (GgmlType::Q6_K, 128, 896),
        (GgmlType::Q4_K, 4864, 896),
        (GgmlType::Q6_K, 896, 4864),
        (GgmlType::Q8_0, 896, 4864),
    ];
    let files: Vec<_> = (shapes.iter())
        .map(|&(ty, m, k)| (ty, m, k, random_blocks(ty, m, k, &mut rng)))
        .collect();
    let (reserved0, _) = be.device_memory().expect("a CubeCL device");
    let before = be.resident_weight_bytes();
    let mut held = Vec::new();
    for _ in 0..4 {
        for (ty, m, k, bytes) in &files {
            held.push(be.weight(weight_data(*ty, *m, *k, bytes)).unwrap());
        }
    }
    let weights = be.resident_weight_bytes() - before;
    let (reserved, in_use) = be.device_memory().unwrap();
    let grown = reserved - reserved0;
    eprintln!("held: {weights} bytes of weights, pools grew {grown}, in use {in_use}");
    // The uploads' own buffers (the file's bytes before packing) are
    // recycled: a few MiB beyond the weights at most.
    assert!(
        grown <= weights + weights / 10 + (8 << 20),
        "held weights: the pools grew {grown} bytes for {weights}"
    );
    assert!(in_use >= weights);
    // Streamed layers, built and dropped pass after pass, reuse what the
    // pools hold: the reservation stops growing.
    let mut after_first = 0;
    for pass in 0..6 {
        let layer: Vec<_> = (files.iter())
            .map(|(ty, m, k, bytes)| be.streamed_weight(weight_data(*ty, *m, *k, bytes)).unwrap())
            .collect();
        drop(layer);
        let (r, _) = be.device_memory().unwrap();
        if pass == 1 {
            after_first = r;
        }
        if pass > 1 {
            assert_eq!(r, after_first, "pass {pass}: the pools grew again");
        }
    }
    drop(held);
    assert_eq!(be.resident_weight_bytes(), before);
}

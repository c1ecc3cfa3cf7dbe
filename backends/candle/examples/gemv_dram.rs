//! One-token matmul throughput (GB/s of weights) on DRAM-resident matrices
//! of the 1.5B model's shapes, our kernels beside candle-core's in the same
//! run. Many copies of each matrix are cycled so none stays in cache, which
//! is what one decode step sees (criterion's `ops` bench measures
//! cache-resident matrices).
//!
//! `cargo run --release -p arbor-backend-candle --example gemv_dram`
//! (`ARBOR_NO_AVX512=1` for the AVX2 kernels on an AVX-512 CPU).

use arbor_backend_candle::CandleBackend;
use arbor_tensor::{Backend, GgmlType, WeightData};
use std::time::Instant;

#[path = "../benches/shared/synthetic.rs"]
mod synthetic;

fn main() {
    let ours = CandleBackend::new();
    let candle = CandleBackend::new().with_candle_kernels();
    println!("| matrix | arbor GB/s | candle GB/s | ratio |\n|---|---|---|---|");
    for (ty, rows, cols, copies, what) in [
        (GgmlType::Q4_K, 8960, 1536, 40, "ffn_gate/up Q4_K"),
        (GgmlType::Q4_K, 1536, 8960, 40, "ffn_down Q4_K"),
        (GgmlType::Q6_K, 1536, 8960, 40, "ffn_down Q6_K"),
        (GgmlType::Q6_K, 151936, 1536, 3, "output Q6_K"),
    ] {
        let bytes: Vec<Vec<u8>> = (0..copies)
            .map(|c| synthetic::blocks(ty, rows * cols, c))
            .collect();
        let load = |be: &CandleBackend| -> Vec<_> {
            let ws = bytes.iter().map(|b| {
                be.weight(WeightData {
                    name: "w",
                    ty,
                    rows,
                    cols,
                    bytes: b,
                })
                .expect("a valid matrix")
            });
            ws.collect()
        };
        let (w_ours, w_candle) = (load(&ours), load(&candle));
        let x = ours
            .tensor(
                &(0..cols).map(|i| (i % 7) as f32 - 3.0).collect::<Vec<_>>(),
                1,
                cols,
            )
            .expect("a valid tensor");
        // Alternate the two, best of several rounds (the machine drifts).
        let mut best = [f64::MAX; 2];
        for _ in 0..(200 / copies).max(5) {
            for (k, (be, ws)) in [(&ours, &w_ours), (&candle, &w_candle)]
                .into_iter()
                .enumerate()
            {
                let t = Instant::now();
                for w in ws {
                    std::hint::black_box(be.matmul(&x, w).expect("matmul"));
                }
                best[k] = best[k].min(t.elapsed().as_secs_f64());
            }
        }
        let gb = bytes.iter().map(Vec::len).sum::<usize>() as f64 / 1e9;
        let (a, c) = (gb / best[0], gb / best[1]);
        println!("| {what} {rows}x{cols} | {a:.1} | {c:.1} | {:.2}x |", a / c);
    }
}

//! Multi-row matmul speed on the 1.5B model's matrices: milliseconds and
//! multiply-adds per second for passes of 1 to 64 tokens (decode,
//! verification, prefill chunks), weights resident as a loaded model holds
//! them. Best of several rounds, sizes alternated (the machine drifts).
//!
//! `cargo run --release -p arbor-backend-candle --example qmm_rows`
//! (`ARBOR_NO_AVX512=1` for the AVX2 kernels on an AVX-512 CPU;
//! `-- --streamed` for the form a layer streamed under a memory budget
//! takes, K-quant rows not interleaved).

use arbor_backend_candle::CandleBackend;
use arbor_tensor::{Backend, GgmlType, WeightData};
use std::time::Instant;

#[path = "../benches/shared/synthetic.rs"]
mod synthetic;

fn main() {
    let be = CandleBackend::new();
    let streamed = std::env::args().any(|a| a == "--streamed");
    let sizes = [1usize, 2, 4, 8, 16, 32, 64, 128, 512];
    println!(
        "| matrix | {} |\n|---|{}",
        sizes.map(|n| format!("{n} rows ms (GMAC/s)")).join(" | "),
        "---|".repeat(sizes.len())
    );
    for (ty, rows, cols, what) in [
        (GgmlType::Q4_K, 8960, 1536, "ffn_gate/up Q4_K"),
        (GgmlType::Q4_K, 1536, 8960, "ffn_down Q4_K"),
        (GgmlType::Q6_K, 1536, 8960, "ffn_down Q6_K"),
        (GgmlType::Q8_0, 4864, 896, "0.5b ffn_up Q8_0"),
        (GgmlType::Q5_0, 1536, 1536, "attn_q Q5_0"),
        (GgmlType::F16, 8960, 1536, "ffn_gate/up F16"),
        (GgmlType::F16, 1536, 8960, "ffn_down F16"),
    ] {
        let bytes = synthetic::blocks(ty, rows * cols, 0);
        let data = WeightData {
            name: "w",
            ty,
            rows,
            cols,
            bytes: &bytes,
        };
        // Building the weight (a copy, or a copy into the interleaved
        // layout): once at load when resident, on every pass when streamed.
        let mut build = f64::MAX;
        let mut built = None;
        for _ in 0..5 {
            let t = Instant::now();
            let w = if streamed {
                be.streamed_weight(data)
            } else {
                be.weight(data)
            };
            build = build.min(t.elapsed().as_secs_f64());
            built = Some(w.expect("a valid matrix"));
        }
        let w = built.expect("built");
        let xs: Vec<_> = sizes
            .iter()
            .map(|&n| {
                be.tensor(&synthetic::values(n * cols), n, cols)
                    .expect("a valid tensor")
            })
            .collect();
        let mut best = vec![f64::MAX; sizes.len()];
        for _ in 0..12 {
            for (k, x) in xs.iter().enumerate() {
                let t = Instant::now();
                for _ in 0..4 {
                    std::hint::black_box(be.matmul(x, &w).expect("matmul"));
                }
                best[k] = best[k].min(t.elapsed().as_secs_f64() / 4.0);
            }
        }
        let cells: Vec<String> = sizes
            .iter()
            .zip(&best)
            .map(|(&n, &s)| {
                let gmac = (n * rows * cols) as f64 / s / 1e9;
                format!("{:.3} ({gmac:.0})", s * 1e3)
            })
            .collect();
        println!(
            "| {what} {rows}x{cols} (built in {:.3} ms) | {} |",
            build * 1e3,
            cells.join(" | ")
        );
    }
}

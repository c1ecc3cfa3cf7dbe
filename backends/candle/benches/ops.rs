//! Quantized matmul (decode GEMV, verification-sized batches, prefill
//! chunks; our kernels beside candle-core's) and attention on the candle
//! backend, at Qwen2.5 sizes.

use arbor_backend_candle::CandleBackend;
use arbor_tensor::{Backend, GgmlType, Heads, Mask, WeightData};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

#[path = "shared/synthetic.rs"]
mod synthetic;

/// Our kernels and candle's on the matrices the two Qwen models spend their
/// time in, for one token (decode), a verification-sized batch and a
/// prefill chunk. Criterion's report shows the two side by side.
fn matmul(c: &mut Criterion) {
    let ours = CandleBackend::new();
    let candle = CandleBackend::new().with_candle_kernels();
    for (ty, k, m, what) in [
        (GgmlType::Q8_0, 896, 4864, "0.5b_mlp_up"),
        (GgmlType::Q4_K, 1536, 8960, "1.5b_mlp_up"),
        (GgmlType::Q6_K, 8960, 1536, "1.5b_mlp_down"),
    ] {
        let bytes = synthetic::blocks(ty, k * m, 0);
        let data = |be: &CandleBackend| {
            be.weight(WeightData {
                name: "w",
                ty,
                rows: m,
                cols: k,
                bytes: &bytes,
            })
            .unwrap()
        };
        let (w_ours, w_candle) = (data(&ours), data(&candle));
        let mut group = c.benchmark_group(format!("matmul_{ty}_{what}"));
        for n in [1, 16, 64] {
            let x = ours.tensor(&synthetic::values(n * k), n, k).unwrap();
            group.throughput(Throughput::Elements((2 * n * k * m) as u64));
            group.bench_with_input(BenchmarkId::new("arbor", n), &n, |b, _| {
                b.iter(|| ours.matmul(&x, &w_ours).unwrap())
            });
            group.bench_with_input(BenchmarkId::new("candle", n), &n, |b, _| {
                b.iter(|| candle.matmul(&x, &w_candle).unwrap())
            });
        }
        group.finish();
    }
}

fn attention(c: &mut Criterion) {
    let be = CandleBackend::new();
    let h = Heads::grouped(12, 2, 128);
    let mut group = c.benchmark_group("attention_12q_2kv_128d");
    for (n, past) in [(1, 512), (16, 512), (128, 0)] {
        let mut kv = be.kv_new(&h).unwrap();
        let kvd = 2 * 128;
        let t = past + n;
        let k = be.tensor(&synthetic::values(t * kvd), t, kvd).unwrap();
        be.kv_append(&mut kv, &k, &k).unwrap();
        let q = be
            .tensor(&synthetic::values(n * 12 * 128), n, 12 * 128)
            .unwrap();
        let mask = Mask::causal(past, n);
        group.bench_function(format!("n{n}_past{past}"), |b| {
            b.iter(|| be.attention(&q, &kv, &mask, &h).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, matmul, attention);
criterion_main!(benches);

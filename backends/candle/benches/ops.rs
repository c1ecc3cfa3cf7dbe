//! Quantized matmul (decode GEMV and verification-sized batches) and
//! attention on the candle backend, at Qwen2.5-1.5B sizes.

use arbor_backend_candle::CandleBackend;
use arbor_tensor::{Backend, GgmlType, Heads, Mask, WeightData};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 2654435761) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// Q8_0 bytes with a fixed scale: the speed does not depend on values.
fn q8_0_bytes(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n / 32 * 34);
    for b in 0..n / 32 {
        out.extend_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        out.extend((0..32).map(|i| ((b * 31 + i * 7) % 255) as u8));
    }
    out
}

fn matmul(c: &mut Criterion) {
    let be = CandleBackend::new();
    let (k, m) = (1536, 8960); // the 1.5B's MLP up projection
    let bytes = q8_0_bytes(k * m);
    let w = be
        .weight(WeightData {
            name: "w",
            ty: GgmlType::Q8_0,
            rows: m,
            cols: k,
            bytes: &bytes,
        })
        .unwrap();
    let mut group = c.benchmark_group("matmul_q8_0_1536x8960");
    for n in [1, 16, 64] {
        let x = be.tensor(&data(n * k), n, k).unwrap();
        group.throughput(Throughput::Elements((2 * n * k * m) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| be.matmul(&x, &w).unwrap())
        });
    }
    group.finish();
}

fn attention(c: &mut Criterion) {
    let be = CandleBackend::new();
    let h = Heads {
        n_heads: 12,
        n_kv_heads: 2,
        head_dim: 128,
    };
    let mut group = c.benchmark_group("attention_12q_2kv_128d");
    for (n, past) in [(1, 512), (16, 512), (128, 0)] {
        let mut kv = be.kv_new(&h).unwrap();
        let kvd = 2 * 128;
        let t = past + n;
        let k = be.tensor(&data(t * kvd), t, kvd).unwrap();
        be.kv_append(&mut kv, &k, &k).unwrap();
        let q = be.tensor(&data(n * 12 * 128), n, 12 * 128).unwrap();
        let mask = Mask::causal(past, n);
        group.bench_function(format!("n{n}_past{past}"), |b| {
            b.iter(|| be.attention(&q, &kv, &mask, &h).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, matmul, attention);
criterion_main!(benches);

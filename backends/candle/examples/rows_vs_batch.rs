//! Is row i of a batched quantized matmul bit-identical to a one-row
//! matmul of the same input? `rows_vs_batch FILE TENSOR...`
use arbor_backend_candle::CandleBackend;
use arbor_tensor::{Backend, WeightData};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let file = arbor_gguf::GgufFile::open(&args[1]).unwrap();
    let be = CandleBackend::new();
    for name in &args[2..] {
        let (info, bytes) = file.tensor(name).unwrap();
        let (cols, rows) = (info.dims[0] as usize, info.dims[1] as usize);
        let w = be
            .weight(WeightData {
                name,
                ty: info.ty,
                rows,
                cols,
                bytes,
            })
            .unwrap();
        for n in [2usize, 5, 16] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 7919) % 2000) as f32 / 1000.0 - 1.0)
                .collect();
            let batch = be
                .to_vec(&be.matmul(&be.tensor(&x, n, cols).unwrap(), &w).unwrap())
                .unwrap();
            let mut differing = 0;
            for i in 0..n {
                let one = be
                    .to_vec(
                        &be.matmul(
                            &be.tensor(&x[i * cols..(i + 1) * cols], 1, cols).unwrap(),
                            &w,
                        )
                        .unwrap(),
                    )
                    .unwrap();
                differing += one
                    .iter()
                    .zip(&batch[i * rows..(i + 1) * rows])
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
            }
            println!(
                "{name} {} n={n}: {differing} of {} outputs differ",
                info.ty,
                n * rows
            );
            // Row 0 of a 2-row batch against row 0 of this batch.
            let two = be
                .to_vec(
                    &be.matmul(&be.tensor(&x[..2 * cols], 2, cols).unwrap(), &w)
                        .unwrap(),
                )
                .unwrap();
            let d2 = two[..rows]
                .iter()
                .zip(&batch[..rows])
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            let t = std::time::Instant::now();
            for _ in 0..20 {
                be.matmul(&be.tensor(&x[..cols], 1, cols).unwrap(), &w)
                    .unwrap();
            }
            let t1 = t.elapsed().as_secs_f64() / 20.0;
            let t = std::time::Instant::now();
            for _ in 0..20 {
                be.matmul(&be.tensor(&x[..2 * cols], 2, cols).unwrap(), &w)
                    .unwrap();
            }
            let t2 = t.elapsed().as_secs_f64() / 20.0;
            println!(
                "   vs 2-row batch: {d2} differ; 1 row {:.3} ms, 2 rows {:.3} ms",
                t1 * 1e3,
                t2 * 1e3
            );
        }
    }
}

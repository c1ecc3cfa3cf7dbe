//! Compares the backend's quantized matmul with dequantized host math on
//! real tensors of a GGUF file: `check_real FILE TENSOR...`.
use arbor_backend_candle::CandleBackend;
use arbor_tensor::{Backend, WeightData};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let file = arbor_gguf::GgufFile::open(&args[1]).unwrap();
    let be = CandleBackend::new();
    for name in &args[2..] {
        let (info, bytes) = file.tensor(name).unwrap();
        let (cols, rows) = (info.dims[0] as usize, info.dims[1] as usize);
        let wd = WeightData {
            name,
            ty: info.ty,
            rows,
            cols,
            bytes,
        };
        let deq = wd.to_f32().unwrap();
        let w = be.weight(wd).unwrap();
        for n in [1usize, 7, 40] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 7919) % 2000) as f32 / 1000.0 - 1.0)
                .collect();
            let got = be
                .to_vec(&be.matmul(&be.tensor(&x, n, cols).unwrap(), &w).unwrap())
                .unwrap();
            let mut max_err = 0f32;
            let mut max_ref = 0f32;
            for i in 0..n {
                for j in 0..rows {
                    let r: f32 = (0..cols).map(|t| x[i * cols + t] * deq[j * cols + t]).sum();
                    max_err = max_err.max((r - got[i * rows + j]).abs());
                    max_ref = max_ref.max(r.abs());
                }
            }
            println!(
                "{name} {} n={n}: max |err| {max_err:.4} of max |ref| {max_ref:.3}",
                info.ty
            );
        }
    }
}

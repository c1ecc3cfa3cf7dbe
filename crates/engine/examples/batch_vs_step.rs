//! Are the logits of a multi-token forward bit-identical to those of
//! one-token steps? (Lossless speculative decoding relies on it.)
//!
//! `cargo run --release --example batch_vs_step -- MODEL.gguf [n]`

use arbor_engine::{BackendKind, Engine, Mask};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: batch_vs_step MODEL.gguf [N]")?;
    let n: usize = args.get(2).map_or(Ok(8), |s| s.parse())?;
    let mut engine = Engine::load(path.as_ref(), BackendKind::Candle, &mut |_, _| {})?;
    let ids = engine.prompt_tokens(
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        false,
    )?;
    let (model, _) = engine.parts_mut();
    model.step(&ids)?;
    let base = model.cache_len();
    let next: Vec<u32> = (0..n as u32).map(|i| 300 + i * 17).collect();
    let mut single = Vec::new();
    for &t in &next {
        single.push(model.step(&[t])?);
    }
    model.truncate_cache(base)?;
    let positions: Vec<u32> = (base..base + n).map(|p| p as u32).collect();
    let rows: Vec<usize> = (0..n).collect();
    let batch = model.forward(&next, &positions, &Mask::causal(base, n), &rows)?;
    for (i, s) in single.iter().enumerate() {
        let b = batch.row(i);
        let diff = s
            .iter()
            .zip(b)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let same = s
            .iter()
            .zip(b)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        println!(
            "row {i}: max |diff| {diff:e}, bit-identical {same}/{}",
            s.len()
        );
    }
    Ok(())
}

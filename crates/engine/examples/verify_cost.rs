//! Forward latency of n new tokens with logits for every row or for the
//! last only: where verification time goes.
//!
//! `cargo run --release --example verify_cost -- MODEL.gguf`

use std::time::Instant;

use arbor_engine::{BackendKind, Engine, Mask};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: verify_cost MODEL.gguf")?;
    let mut engine = Engine::load(path.as_ref(), BackendKind::Candle, &mut |_, _| {})?;
    let (model, _) = engine.parts_mut();
    let prompt: Vec<u32> = (0..128).map(|i| 100 + i * 3).collect();
    model.step(&prompt)?;
    let base = model.cache_len();
    for n in [1usize, 2, 3, 4, 6, 8, 16] {
        let tokens: Vec<u32> = (0..n as u32).map(|i| 500 + i).collect();
        let positions: Vec<u32> = (base..base + n).map(|p| p as u32).collect();
        let mask = Mask::causal(base, n);
        let mut line = format!("n={n:2}");
        for rows in [vec![n - 1], (0..n).collect::<Vec<_>>()] {
            let mut best = f64::INFINITY;
            for _ in 0..3 {
                let t = Instant::now();
                model.forward(&tokens, &positions, &mask, &rows)?;
                best = best.min(t.elapsed().as_secs_f64());
                model.truncate_cache(base)?;
            }
            line += &format!("  {} logit rows: {:6.1} ms", rows.len(), best * 1e3);
        }
        println!("{line}");
    }
    Ok(())
}

//! Times one PPD training step on a real model: the teacher pass over a
//! sequence, then the prompt rows' loss and its backward pass.
//!
//! `cargo run --release -p arbor-train --example ppd_step -- MODEL.gguf [TOKENS] [POINTS] [COUNT]`
//! (defaults 256 tokens, 16 insertion points, 3 prompt tokens; the tokens
//! are a fixed pseudo-random sequence: only the time is measured).

use std::time::Instant;

use arbor_backend_burn::BurnBackend;
use arbor_gguf::GgufFile;
use arbor_model::{Decoder, LanguageModel};
use arbor_tensor::Backend;
use arbor_train::{ppd_loss, teacher_log_probs};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: ppd_step MODEL.gguf [TOKENS] [POINTS] [COUNT]")?;
    let arg = |i: usize, default: usize| args.get(i).map_or(Ok(default), |s| s.parse());
    let (len, points, count) = (arg(1, 256)?, arg(2, 16)?, arg(3, 3)?);
    if count == 0 || points == 0 || len < 16 + count + points {
        return Err("need COUNT >= 1, POINTS >= 1 and TOKENS >= 16 + COUNT + POINTS".into());
    }
    let t = Instant::now();
    let file = GgufFile::open(path)?;
    let mut m = Decoder::load(BurnBackend::flex(), &file, &mut |_, _| {})?;
    println!(
        "load (dequantized to f32): {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let vocab = m.config().vocab_size as u64;
    let tokens: Vec<u32> = (0..len as u64)
        .map(|i| ((i * 2_654_435_761 + 12_345) % vocab.min(30_000)) as u32)
        .collect();
    let at: Vec<usize> = (0..points)
        .map(|b| 16 + b * (len - 16 - count) / points.max(1))
        .collect();
    let t = Instant::now();
    let batch = teacher_log_probs(&mut m, &tokens, &at, count)?;
    println!(
        "teacher pass, {len} tokens: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let hidden = m.config().hidden;
    let init: Vec<f32> = m.embeddings(&tokens[..count])?;
    let b = m.backend().clone();
    for step in 0..2 {
        let t = Instant::now();
        let leaf = b.leaf(&init, count, hidden)?;
        let loss = ppd_loss(&mut m, &leaf, &batch, 0.8)?;
        let value = b.to_vec(&loss)?[0];
        let t_fwd = t.elapsed().as_secs_f64();
        let grad = b.gradient(&loss, &leaf)?.ok_or("no gradient")?;
        m.truncate_cache(batch.len)?;
        let norm: f32 = grad.iter().map(|g| g * g).sum::<f32>().sqrt();
        println!(
            "step {step}: {} prompt rows, loss {value:.3}, forward {t_fwd:.1} s, \
             forward + backward {:.1} s, gradient norm {norm:.3}",
            points * count,
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

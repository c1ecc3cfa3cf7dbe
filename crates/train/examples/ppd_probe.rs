//! A short PPD training probe on real text: AdamW steps on ShareGPT turns
//! (one sequence per step), the loss on a held-out turn before and after.
//! Not the training command (no chat template, checkpoints or schedule
//! search): it answers whether the loss falls on this machine, and how fast.
//!
//! `cargo run --release -p arbor-train --example ppd_probe -- MODEL.gguf SHAREGPT.json [STEPS] [LEN] [POINTS] [COUNT]`

use std::time::Instant;

use arbor_backend_burn::BurnBackend;
use arbor_gguf::GgufFile;
use arbor_model::{Decoder, LanguageModel};
use arbor_tensor::Backend;
use arbor_train::{AdamState, AdamW, Batch, cosine_lr, ppd_loss, teacher_log_probs};

/// The `"value"` strings of a ShareGPT dump, crudely (the file may be cut).
fn turns(json: &str) -> Vec<String> {
    json.split("\"value\": \"")
        .skip(1)
        .filter_map(|s| s.find("\"\n").map(|end| &s[..end]))
        .map(|s| s.replace("\\n", "\n").replace("\\\"", "\""))
        .filter(|s| s.len() > 1500)
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(model), Some(data)) = (args.first(), args.get(1)) else {
        return Err(
            "usage: ppd_probe MODEL.gguf SHAREGPT.json [STEPS] [LEN] [POINTS] [COUNT]".into(),
        );
    };
    let arg = |i: usize, default: usize| args.get(i).map_or(Ok(default), |s| s.parse());
    let (steps, len, points, count) = (arg(2, 30)?, arg(3, 192)?, arg(4, 16)?, arg(5, 3)?);
    if count == 0 || points == 0 || len < 16 + count + points {
        return Err("need COUNT >= 1, POINTS >= 1 and LEN >= 16 + COUNT + POINTS".into());
    }
    let file = GgufFile::open(model)?;
    let tokenizer = arbor_tokenizer::Tokenizer::from_gguf(file.header())?;
    let mut m = Decoder::load(BurnBackend::flex(), &file, &mut |_, _| {})?;
    let text = std::fs::read_to_string(data)?;
    let turns = turns(&text);
    if turns.len() < steps + 1 {
        return Err(format!("{} long turns found, {} needed", turns.len(), steps + 1).into());
    }
    let mut seqs = Vec::new();
    for t in turns.iter().take(steps + 1) {
        let mut ids = tokenizer.encode(t)?;
        ids.truncate(len);
        if ids.len() == len {
            seqs.push(ids);
        }
    }
    let at: Vec<usize> = (0..points)
        .map(|b| 16 + b * (len - 16 - count) / points)
        .collect();
    let hidden = m.config().hidden;
    let b = m.backend().clone();
    // The thesis starts from the embeddings of a short text.
    let init_ids = tokenizer.encode("Next 2 word")?;
    let init_ids: Vec<u32> = (0..count).map(|i| init_ids[i % init_ids.len()]).collect();
    let mut p = m.embeddings(&init_ids)?;
    let held_out = seqs.pop().ok_or("no held-out sequence")?;
    let eval =
        |m: &mut Decoder<BurnBackend>, p: &[f32]| -> Result<f32, Box<dyn std::error::Error>> {
            let batch: Batch = teacher_log_probs(m, &held_out, &at, count)?;
            let x = m.backend().tensor(p, count, hidden)?;
            let l = ppd_loss(m, &x, &batch, 0.8)?;
            Ok(m.backend().to_vec(&l)?[0])
        };
    println!("held-out loss before: {:.3}", eval(&mut m, &p)?);
    let opt = AdamW::default();
    let mut state = AdamState::default();
    let t0 = Instant::now();
    for (step, seq) in seqs.iter().enumerate() {
        let t = Instant::now();
        let batch = teacher_log_probs(&mut m, seq, &at, count)?;
        let leaf = b.leaf(&p, count, hidden)?;
        let loss = ppd_loss(&mut m, &leaf, &batch, 0.8)?;
        let value = b.to_vec(&loss)?[0];
        let grad = b.gradient(&loss, &leaf)?.ok_or("no gradient")?;
        m.truncate_cache(batch.len)?;
        let lr = cosine_lr(1e-2, step as u64, seqs.len() as u64);
        opt.step(&mut p, &grad, lr, &mut state)?;
        println!(
            "step {step:>3}: loss {value:.3}, lr {lr:.4}, {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    println!(
        "{} steps in {:.0} s; held-out loss after: {:.3}",
        seqs.len(),
        t0.elapsed().as_secs_f64(),
        eval(&mut m, &p)?
    );
    Ok(())
}

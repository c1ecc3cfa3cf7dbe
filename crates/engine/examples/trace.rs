//! Greedy decoding with the top candidates and their logit margins at every
//! step: the first thing to look at when an output diverges from another
//! implementation's.
//!
//! `cargo run --example trace -- MODEL.gguf "prompt" [steps] [backend]`

use arbor_engine::{BackendKind, Engine};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: trace MODEL.gguf PROMPT [STEPS] [BACKEND]")?;
    let prompt = args.get(2).ok_or("missing prompt")?;
    let steps: usize = args.get(3).map_or(Ok(20), |s| s.parse())?;
    let backend: BackendKind = args.get(4).map_or(Ok(BackendKind::Candle), |s| s.parse())?;
    let mut engine = Engine::load(path.as_ref(), backend, &mut |_, _| {})?;
    let ids = engine.prompt_tokens(prompt, false)?;
    println!("prompt ids {ids:?}");
    let (model, tok) = engine.parts_mut();
    let mut logits = model.step(&ids)?;
    let mut out = Vec::new();
    for step in 0..steps {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let top: Vec<String> = order[..4]
            .iter()
            .map(|&i| {
                format!(
                    "{i}:{:?}={:.3}",
                    tok.decode(&[i as u32]).unwrap_or_default(),
                    logits[i]
                )
            })
            .collect();
        println!(
            "{step:3} margin {:.4}  {}",
            logits[order[0]] - logits[order[1]],
            top.join("  ")
        );
        out.push(order[0] as u32);
        logits = model.step(&[order[0] as u32])?;
    }
    println!("text {:?}", tok.decode(&out)?);
    Ok(())
}

//! A model inside a memory budget: the layers that do not fit stream from
//! disk during each pass, and `auto` picks how to draft from the budget and
//! this device's measured speeds. The output is the target's own.
//!
//! `cargo run --release -p arbor --example budget_auto -- [MODEL] [DRAFT] [BUDGET_MIB]`
//! (default: `qwen2.5-coder-1.5b`, `qwen2.5-coder-0.5b`, 900 MiB).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "qwen2.5-coder-1.5b".into());
    let draft = args.next().unwrap_or_else(|| "qwen2.5-coder-0.5b".into());
    let mib: u64 = args.next().map_or(Ok(900), |a| a.parse())?;
    let prompt = "fn fibonacci(n: u64) -> u64 {";

    let mut session = arbor::Builder::new()
        .model(&model)
        .draft(draft)
        .memory_budget(mib << 20)
        .strategy("auto")
        .max_tokens(24)
        .on_progress(|p| {
            if let arbor::Progress::Note(note) = p {
                eprintln!("{note}");
            }
        })
        .build()?;
    let strategy = session.strategy()?;
    let reply = session.generate(prompt)?.finish()?;
    let s = &reply.stats;
    println!("{prompt}{}", reply.text);
    eprintln!(
        "{strategy} under {mib} MiB: {:.1} tok/s, {:.2} tokens per pass, {} MiB streamed, peak {} MiB",
        s.tokens_per_second,
        s.tokens_per_pass,
        s.streamed_bytes >> 20,
        s.peak_memory.unwrap_or(0) >> 20
    );

    // The same prompt without budget or draft gives the same tokens.
    let plain = arbor::Builder::new()
        .model(model)
        .max_tokens(24)
        .build()?
        .generate(prompt)?
        .finish()?;
    assert_eq!(
        plain.tokens, reply.tokens,
        "the budgeted run changed the output"
    );
    Ok(())
}

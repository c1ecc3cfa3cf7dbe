//! An elastic model (`arbor elastic build`) at a lower level — a weight
//! prefix of every layer, a smaller model — then at full size, in one
//! session: switching levels loads nothing.
//!
//! `cargo run --release -p arbor --example elastic_level -- ELASTIC_GGUF [LEVEL]`

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .ok_or("usage: elastic_level ELASTIC_GGUF [LEVEL] (make one with `arbor elastic build`)")?;
    let level: f64 = args.next().map_or(Ok(0.5), |a| a.parse())?;
    let prompt = "Once upon a time";

    let mut session = arbor::Builder::new()
        .model(model)
        .level(level)
        .max_tokens(24)
        .build()?;
    for wanted in [level, 1.0] {
        let at = session.set_level(wanted)?;
        let reply = session.generate(prompt)?.finish()?;
        println!("level {at}: {prompt}{}", reply.text);
        eprintln!("  {:.1} tok/s", reply.stats.tokens_per_second);
    }
    Ok(())
}

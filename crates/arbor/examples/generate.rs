//! Generates one reply and prints it with its statistics.
//!
//! `cargo run --release -p arbor --example generate -- [MODEL] [PROMPT]`
//! (MODEL: a GGUF path or a registered name; default `smollm2-135m`).

fn main() -> Result<(), arbor::Error> {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "smollm2-135m".into());
    let prompt = args
        .next()
        .unwrap_or_else(|| "The capital of France is".into());

    let mut session = arbor::Builder::new().model(model).max_tokens(32).build()?;
    let reply = session.generate(&prompt)?.finish()?;
    println!("{prompt}{}", reply.text);
    let s = &reply.stats;
    eprintln!(
        "{} prompt + {} new tokens, {:.1} tok/s, stopped by {:?}",
        s.prompt_tokens, s.generated_tokens, s.tokens_per_second, s.stop
    );
    assert!(s.generated_tokens > 0, "no tokens generated");
    Ok(())
}

//! Streams a reply piece by piece as the target confirms it, then cancels
//! a second reply halfway from another thread.
//!
//! `cargo run --release -p arbor --example stream -- [MODEL]`

use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "smollm2-135m".into());
    let mut session = arbor::Builder::new().model(model).max_tokens(48).build()?;
    let messages = [arbor::Message::user("Write a haiku about trees.")];

    let mut streamed = String::new();
    let mut stream = session.chat(&messages)?;
    for piece in &mut stream {
        let piece = piece?;
        print!("{piece}");
        std::io::stdout().flush()?;
        streamed.push_str(&piece);
    }
    let reply = stream.finish()?;
    println!();
    // Greedy: the pieces make up the reply's text exactly.
    assert_eq!(streamed, reply.text);

    // Cancelling: the reply stops within one forward pass and keeps what
    // it had.
    let mut stream = session.chat(&messages)?;
    let cancel = stream.cancel_handle();
    let first = stream.next().transpose()?;
    cancel.cancel();
    let rest = stream.finish()?;
    eprintln!(
        "cancelled after {} tokens ({:?}); first piece {first:?}",
        rest.stats.generated_tokens, rest.stats.stop
    );
    assert!(reply.text.starts_with(&rest.text));
    Ok(())
}

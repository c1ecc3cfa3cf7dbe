//! A conversation of two turns: each reply goes back into the history the
//! next turn is written from.
//!
//! `cargo run --release -p arbor --example chat -- [MODEL]`

use arbor::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "smollm2-135m".into());
    let mut session = arbor::Builder::new().model(model).max_tokens(40).build()?;
    let mut history = vec![Message::system("You are a concise assistant.")];
    for question in ["What is a binary tree?", "And a balanced one?"] {
        history.push(Message::user(question));
        let reply = session.chat(&history)?.finish()?;
        println!("> {question}\n{}\n", reply.text.trim());
        history.push(Message::assistant(reply.text));
    }
    Ok(())
}

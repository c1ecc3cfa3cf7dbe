//! arbor runs a language model (GGUF) inside a memory budget smaller than
//! the model: what does not fit streams from disk while it computes, and a
//! cheap draft — a smaller model, the target's own layers or a lower
//! elastic level, trained prompt tokens, or text from the prompt — guesses
//! tokens that the target verifies in one pass. Greedy output is the target
//! model's own, token for token, whatever the strategy.
//!
//! This crate is the small public face of the engine: a [`Builder`] opens a
//! [`Session`], and a session streams replies. Everything else (the planner,
//! the strategies, the backends, the server) lives in the `arbor-*` crates
//! this one is made of.
//!
//! # Streaming a reply
//!
//! ```no_run
//! use std::io::Write;
//!
//! let mut session = arbor::Builder::new()
//!     .model("smollm2-135m") // a registered name (fetched once) or a GGUF path
//!     .max_tokens(64)
//!     .build()?;
//! let mut stream = session.chat(&[arbor::Message::user("Name three prime numbers.")])?;
//! for piece in &mut stream {
//!     print!("{}", piece?);
//!     std::io::stdout().flush()?;
//! }
//! let stats = stream.finish()?.stats;
//! eprintln!("\n{:.1} tok/s", stats.tokens_per_second);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # A model larger than the budget
//!
//! ```no_run
//! let mut session = arbor::Builder::new()
//!     .model("qwen2.5-coder-1.5b")
//!     .draft("qwen2.5-coder-0.5b")
//!     .memory_budget(900 << 20) // bytes for the whole process
//!     .strategy("auto")         // the planner picks the draft source
//!     .build()?;
//! let text = session.generate("fn main() {")?.collect::<Result<String, _>>()?;
//! # Ok::<(), arbor::Error>(())
//! ```
//!
//! # Options are checked before anything loads
//!
//! ```
//! let e = arbor::Builder::new().model("m.gguf").temperature(-1.0).build();
//! assert!(matches!(e, Err(arbor::Error::InvalidOption { option: "temperature", .. })));
//! ```
//!
//! # Cargo features
//!
//! `candle` and `flex` (CPU backends, default), `ndarray` (CPU), `wgpu`
//! (GPUs through Vulkan, Metal or DX12). A build needs at least one.

#![warn(missing_docs)]

mod builder;
mod session;

pub use arbor_engine::BackendKind as Backend;
pub use arbor_engine::OpenEvent as Progress;
pub use arbor_engine::StopReason;
pub use arbor_engine::{ChatMessage as Message, Role};
pub use builder::Builder;
pub use session::{CancelHandle, Reply, Session, Stats, Stream};

/// What can go wrong opening a session or generating.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A builder option is out of range (checked before anything loads).
    #[error("{option}: {reason}")]
    InvalidOption {
        /// The builder method's name.
        option: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
    /// From the engine: a missing or corrupt model file, a draft with
    /// another tokenizer, a budget too small to run, a backend not compiled
    /// in, a prompt longer than the context, …
    #[error(transparent)]
    Engine(#[from] arbor_engine::EngineError),
    /// A generation panicked. The session's model went with it: open a
    /// new session.
    #[error("a generation panicked ({0}); open a new session")]
    Panicked(String),
    /// A generation panicked earlier and the session has no model.
    #[error("this session lost its model when a generation panicked; open a new session")]
    Closed,
    /// [`Stream::finish`] after the stream gave its error as an item.
    #[error("this reply already ended with the error its stream gave")]
    AlreadyFailed,
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

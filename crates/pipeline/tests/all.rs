//! Every integration test of this crate but the ones named in its
//! Cargo.toml, as modules of one test binary: one link, not one per file.

mod certified;
mod common;
mod failures;
mod head;
mod host;
mod streaming;

//! Every integration test of this crate but the ones named in its
//! Cargo.toml (`pool.rs`, which must run alone), as modules of one test
//! binary: one link, not one per file.

mod cube;
mod ops;

//! Every integration test of this crate but the ones named in its
//! Cargo.toml, as modules of one test binary: one link, not one per file.

mod golden;
mod real_models;
mod writer;

//! Every integration test of this crate but the ones named in its
//! Cargo.toml, as modules of one test binary: one link, not one per file.

#[macro_use]
mod common;
mod greedy_argmax;
mod lossless;
mod ppd;
mod provisional;

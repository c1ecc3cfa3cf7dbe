//! Every integration test of this crate but the ones named in its
//! Cargo.toml, as modules of one test binary: one link, not one per file.

mod common;
mod infill;
mod openai_client;
mod safety;
mod scoring;
mod server;
mod slo;
mod slots;
mod structured;
mod tools;

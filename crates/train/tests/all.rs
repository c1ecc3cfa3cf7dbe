//! Every integration test of this crate but the ones named in its
//! Cargo.toml, as modules of one test binary: one link, not one per file.

mod common;
mod gradients;
mod importance;
mod jobs;
mod lora;
mod lora_backends;
mod run;

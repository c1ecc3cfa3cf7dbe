//! Every integration test of this crate but the ones named in its
//! Cargo.toml, as modules of one test binary: one link, not one per file.

mod ppd_accuracy;
mod profiles;
mod real_models;
mod slo;
mod tiny_models;
mod wgpu;

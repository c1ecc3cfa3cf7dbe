//! Every integration test of this crate but the ones named in its
//! Cargo.toml, as modules of one test binary: one link, not one per file.

mod common;
mod derive;
mod lookup;
mod lossless;
mod requant;
mod self_draft;
mod slim_common;
mod slim_lossless;

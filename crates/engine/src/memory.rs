//! Loading under a memory budget: the draft stays resident, the target's
//! layers stay resident while the budget allows, the rest are streamed from
//! disk on every forward pass. The plan, the loading and the streaming are
//! `arbor-pipeline`'s; the engine re-exports its options and report.

pub use arbor_pipeline::{MemoryOptions, MemoryReport, peak_resident, resident_now};

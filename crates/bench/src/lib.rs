//! arbor's benchmarks as a library: what `arbor bench` runs, callable from
//! other programs and tests. Each benchmark takes its options (a struct;
//! with the `clap` feature they are the command's flags too) and a device
//! [`arbor_engine::RunConfig`], runs its measurements, and writes its
//! table (or JSON lines) and chart.
//!
//! - [`decode`]: prefill and decode speed of one model.
//! - [`spec`]: speculative strategies against autoregressive decoding on
//!   one loaded pair; under memory budgets [`budget`] runs one process per
//!   strategy inside a cgroup limit ([`cgroup`], rows in [`budgeted`]) with
//!   llama.cpp beside them ([`peer`]).
//! - [`ppd`]: PPD prompt tokens' accuracy by distance, then their decoding.
//! - [`elastic`]: elastic levels against unreordered prefixes, magnitude
//!   order and dropped layers.
//! - [`serve`]: an `arbor serve` on loopback under streaming clients.
//! - [`slo`]: latency objectives on a request trace, the elastic policy
//!   against baselines.
//! - [`random_model`]: a model file of a real shape with random weights.
//!
//! Beside them, what the benchmarks (and the `arbor` command) share:
//! prompt sets ([`prompts`]), calibration material and objective tables
//! ([`calibration`]), progress bars ([`progress`]), result printing
//! ([`report`]), trace timelines ([`trace`]), process memory ([`sys`]) and
//! the speculative tuning options ([`TuningArgs`]).
//!
//! The benchmarks are compiled with the `suite` feature, the charts and
//! timelines with `plot` (which `suite` turns on).
//!
//! Errors are [`anyhow`]'s: a benchmark reports them, it does not match on
//! them. The budget benchmark runs each strategy by starting this
//! program again as `bench spec --child` (see [`budget`]), so it needs a
//! program that answers those flags, like `arbor`.

#[cfg(feature = "suite")]
pub mod budget;
#[cfg(feature = "suite")]
pub mod budgeted;
pub mod calibration;
#[cfg(feature = "suite")]
pub mod cgroup;
#[cfg(feature = "suite")]
pub mod decode;
#[cfg(feature = "suite")]
pub mod elastic;
#[cfg(feature = "suite")]
pub mod peer;
#[cfg(feature = "suite")]
pub mod ppd;
pub mod progress;
pub mod prompts;
#[cfg(feature = "suite")]
pub mod random_model;
pub mod report;
#[cfg(feature = "suite")]
pub mod serve;
#[cfg(feature = "suite")]
pub mod slo;
#[cfg(feature = "suite")]
pub mod spec;
pub mod sys;
#[cfg(feature = "plot")]
pub mod trace;
pub mod tuning;

pub use tuning::TuningArgs;

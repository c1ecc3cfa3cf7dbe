//! What opening a run needs below the engine: the run configuration
//! ([`RunConfig`], from a device config, flags or a request), where its
//! draft comes from ([`DraftSource`]), the backends compiled in and picked
//! at run time ([`BackendKind`]), loading a model onto one — whole, or
//! under a memory budget with the rest streamed — the trained PPD prompt
//! tokens a target ships with, and the facts `auto` chooses from
//! ([`choose::choose`]). The engine composes these into a run; this crate
//! generates nothing.

pub mod backends;
pub mod choose;
pub mod config;
pub mod drafts;
pub mod events;
pub mod loaded;
pub mod ppd;

use std::path::PathBuf;

use arbor_planner::PlannerError;

pub use backends::{BackendKind, BackendSpec};
pub use config::{
    DEFAULT_DRAFT, DEFAULT_MAX_TOKENS, DEFAULT_TARGET, PROMPT_ALLOWANCE, RunConfig, Sampling,
    Tuning,
};
pub use drafts::DraftSource;
pub use events::{OpenEvent, resolve_or_fetch};

/// The backend crates compiled in, for tests and tools that build a model
/// on one directly.
#[cfg(feature = "burn")]
pub use arbor_backend_burn;
#[cfg(feature = "candle")]
pub use arbor_backend_candle;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] arbor_gguf::GgufError),
    #[error(transparent)]
    Model(#[from] arbor_model::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] arbor_tokenizer::TokenizerError),
    #[error(transparent)]
    Sampling(#[from] arbor_sampling::SamplingError),
    #[error(transparent)]
    Draft(#[from] arbor_drafts::DraftError),
    #[error("backend `{0}` is not compiled into this build (enable the cargo feature `{0}`)")]
    BackendNotCompiled(BackendKind),
    #[error("unknown backend `{0}` (choose candle, flex, ndarray or wgpu)")]
    UnknownBackend(String),
    #[error(transparent)]
    Speculative(#[from] arbor_speculative::SpecError),
    #[error(
        "the draft model's vocabulary differs from the target's ({draft} vs {target} tokens, or \
         different token strings): speculative decoding needs one shared tokenizer"
    )]
    VocabularyMismatch { draft: usize, target: usize },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Slo(#[from] arbor_slo::SloError),
    #[error("loading {path}: {inner}")]
    Load {
        path: PathBuf,
        inner: Box<EngineError>,
    },
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// The planner's errors keep the engine's kinds (an unmet objective stays
/// [`EngineError::Slo`], which the server answers with its own status).
impl From<PlannerError> for EngineError {
    fn from(e: PlannerError) -> Self {
        match e {
            PlannerError::Model(e) => Self::Model(e),
            PlannerError::Slo(e) => Self::Slo(e),
            PlannerError::Invalid(s) => Self::Invalid(s),
        }
    }
}

/// Makes glibc's allocator hand large freed blocks back to the OS at once
/// and keep few arenas: streamed layers allocate and free tens of MiB per
/// forward pass, which glibc would otherwise keep cached and count against
/// a memory limit.
pub fn limit_allocator_caching() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tunables.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Hands the heap's free memory back to the OS (glibc keeps freed small
/// blocks otherwise): after planning, which parses model headers, so the
/// memory a budget's plan measures as held is what the run will hold. A
/// run whose plan counted 21 MiB of such leftovers as held ran at the
/// cgroup limit and thrashed (1.97 against 4.86 tok/s at 800 MiB).
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the OS.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Free heap glibc keeps for reuse under a memory budget (see
/// [`reuse_freed_memory`]).
pub(crate) const KEEP_BUDGETED: usize = 64 << 20;

/// Free heap glibc keeps for reuse with no memory budget: more than a
/// 512-token pass's buffers of the 1.5B (its activations take ~100 MiB at
/// the peak), so long prompts do not fault them in afresh on every pass.
pub(crate) const KEEP_UNBUDGETED: usize = 1 << 30;

/// Once everything resident is loaded, lets glibc keep freed blocks of up
/// to 32 MiB for reuse, and up to `keep` bytes of free heap: a streamed
/// layer's weights are freed after each pass and the next layer allocates
/// the same sizes again, and every forward pass allocates the same
/// activation and logit buffers. Handing them back to the OS and faulting
/// fresh zeroed pages in costs about a quarter of each streamed layer's
/// build time and a few percent of a resident decode step; with 64 MiB
/// kept, a 512-token pass of the 1.5B still trimmed and faulted in ~2 GiB
/// (510,000 page faults a pass). Under a budget, keeping them costs only
/// the memory the streaming reserve already accounts for
/// ([`KEEP_BUDGETED`], or the reserve itself where that is larger: glibc
/// trims the whole free top of the heap once it passes the threshold, and
/// an F16 layer of the 1.5B frees 89 MiB, so with 64 MiB kept every
/// streamed layer was faulted in afresh — builds ran at ~2.2 GB/s, as much
/// CPU as the reads, on a 2-core machine where the pass computes too).
pub(crate) fn reuse_freed_memory(keep: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tunables.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(
            libc::M_TRIM_THRESHOLD,
            libc::c_int::try_from(keep).unwrap_or(libc::c_int::MAX),
        );
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = keep;
}

//! Picks a backend at run time among those compiled in.

use arbor_gguf::GgufFile;
use arbor_model::LanguageModel;

use crate::{EngineError, Result};

/// The backends arbor knows; which are usable depends on cargo features.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// candle-core on the CPU, matmuls on quantized blocks (default).
    Candle,
    /// burn's flex CPU backend, weights dequantized.
    Flex,
    /// burn's ndarray CPU backend, weights dequantized.
    Ndarray,
    /// burn's wgpu GPU backend (Vulkan, Metal, DX12, or lavapipe on a CPU).
    Wgpu,
}

impl BackendKind {
    pub const ALL: [BackendKind; 4] = [Self::Candle, Self::Flex, Self::Ndarray, Self::Wgpu];

    pub fn name(self) -> &'static str {
        match self {
            Self::Candle => "candle",
            Self::Flex => "flex",
            Self::Ndarray => "ndarray",
            Self::Wgpu => "wgpu",
        }
    }

    /// Whether this build includes the backend.
    pub fn is_compiled(self) -> bool {
        match self {
            Self::Candle => cfg!(feature = "candle"),
            Self::Flex => cfg!(feature = "flex"),
            Self::Ndarray => cfg!(feature = "ndarray"),
            Self::Wgpu => cfg!(feature = "wgpu"),
        }
    }

    /// The backend and the kernels it runs on this machine (its name, and
    /// for candle which of its matmul kernels): what a cached measurement
    /// such as a latency profile is only valid for.
    pub fn kernels(self) -> &'static str {
        match self {
            #[cfg(feature = "candle")]
            Self::Candle => arbor_backend_candle::CandleBackend::new().kernels(),
            other => other.name(),
        }
    }

    /// The backends compiled into this build.
    pub fn compiled() -> Vec<BackendKind> {
        Self::ALL.into_iter().filter(|b| b.is_compiled()).collect()
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| EngineError::UnknownBackend(s.to_string()))
    }
}

/// Evaluates `$body` with `$b` bound to a new backend of kind `$kind`, or
/// fails when that backend is not compiled in. The one place that names
/// each backend's constructor.
macro_rules! with_backend {
    ($kind:expr, $b:ident => $body:expr) => {
        match $kind {
            #[cfg(feature = "candle")]
            BackendKind::Candle => {
                let $b = arbor_backend_candle::CandleBackend::new();
                $body
            }
            #[cfg(feature = "flex")]
            BackendKind::Flex => {
                let $b = arbor_backend_burn::BurnBackend::flex();
                $body
            }
            #[cfg(feature = "ndarray")]
            BackendKind::Ndarray => {
                let $b = arbor_backend_burn::BurnBackend::ndarray();
                $body
            }
            #[cfg(feature = "wgpu")]
            BackendKind::Wgpu => {
                let $b = arbor_backend_burn::BurnBackend::wgpu();
                $body
            }
            #[allow(unreachable_patterns)]
            other => Err(EngineError::BackendNotCompiled(other)),
        }
    };
}

pub(crate) fn load(
    kind: BackendKind,
    file: &GgufFile,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<dyn LanguageModel>> {
    let _ = (&file, &progress);
    with_backend!(kind, backend => {
        let model: Box<dyn LanguageModel> =
            Box::new(arbor_pipeline::load_resident(backend, file, progress)?);
        Ok(model)
    })
}

/// A target loaded under a budget, its memory report, and its self draft
/// when one was asked for.
pub(crate) type Budgeted = (
    Box<dyn LanguageModel>,
    crate::MemoryReport,
    Option<Box<dyn LanguageModel>>,
);

/// Loads the target of `file` under `options` (see
/// [`arbor_pipeline::load_target`]), given that `draft` is loaded (or, with
/// `self_draft`, that the target will draft for itself: then the self
/// draft comes back too). `path` is the one `file` was opened from; the
/// pipeline reads `file.path()`.
pub(crate) fn load_budgeted(
    kind: BackendKind,
    file: &GgufFile,
    path: &std::path::Path,
    draft: Option<&arbor_model::Config>,
    self_draft: bool,
    options: &crate::MemoryOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Budgeted> {
    debug_assert_eq!(path, file.path());
    let _ = (&file, &draft, &self_draft, &options, &progress);
    with_backend!(kind, backend => {
        let (model, report) = arbor_pipeline::load_target(backend, file, draft, options, progress)?;
        let own: Option<Box<dyn LanguageModel>> = if self_draft {
            if report.plan.streamed() == 0 {
                return Err(crate::EngineError::Invalid(
                    "a self draft runs the target's resident layers and skips the streamed \
                     ones, but under this budget every layer is resident: use another draft"
                        .into(),
                ));
            }
            Some(Box::new(model.self_draft()?))
        } else {
            None
        };
        let model: Box<dyn LanguageModel> = Box::new(model);
        Ok((model, report, own))
    })
}

pub(crate) fn target_fits(
    kind: BackendKind,
    file: &GgufFile,
    options: &crate::MemoryOptions,
) -> Result<bool> {
    let _ = (&file, &options);
    with_backend!(kind, backend => Ok(arbor_pipeline::target_fits(&backend, file, options)?))
}

/// The plan the target of `file` would get with `extra` bytes held by a
/// draft of config `draft` (see [`arbor_pipeline::plan_with`]).
pub(crate) fn plan_with(
    kind: BackendKind,
    file: &GgufFile,
    draft: Option<&arbor_model::Config>,
    extra: u64,
    options: &crate::MemoryOptions,
) -> Result<Option<arbor_pipeline::Plan>> {
    let _ = (&file, &draft, &extra, &options);
    with_backend!(kind, backend => Ok(arbor_pipeline::plan_with(&backend, file, draft, extra, options)?))
}

/// Bytes the weights of `file` hold once loaded as a draft.
pub(crate) fn model_bytes(kind: BackendKind, file: &GgufFile) -> Result<u64> {
    let _ = &file;
    with_backend!(kind, backend => Ok(arbor_pipeline::model_bytes(&backend, file)?))
}

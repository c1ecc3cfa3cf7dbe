//! Picks a backend at run time among those compiled in.

use arbor_gguf::GgufFile;
use arbor_model::LanguageModel;

use arbor_tensor::KvFormat;

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

/// A backend and how it is set up: its kind, and how it stores KV caches
/// (`None`: the backend's own choice — f16 on candle, f32 on burn).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BackendSpec {
    pub kind: BackendKind,
    pub kv: Option<KvFormat>,
}

impl From<BackendKind> for BackendSpec {
    fn from(kind: BackendKind) -> Self {
        Self { kind, kv: None }
    }
}

impl BackendSpec {
    /// See [`BackendKind::kernels`].
    pub fn kernels(self) -> &'static str {
        self.kind.kernels()
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

/// The backend named, or the first compiled in.
pub fn pick_backend(name: Option<&str>) -> Result<BackendKind> {
    let kind = match name {
        Some(n) => n.parse()?,
        None => *BackendKind::compiled()
            .first()
            .ok_or_else(|| EngineError::Invalid("this build has no backend compiled in".into()))?,
    };
    if !kind.is_compiled() {
        return Err(EngineError::BackendNotCompiled(kind));
    }
    Ok(kind)
}

/// Evaluates `$body` with `$b` bound to a new backend as `$spec` says, or
/// fails when that backend is not compiled in. The one place that names
/// each backend's constructor.
macro_rules! with_backend {
    ($spec:expr, $b:ident => $body:expr) => {{
        let spec: BackendSpec = $spec;
        match spec.kind {
            #[cfg(feature = "candle")]
            BackendKind::Candle => {
                let $b = arbor_backend_candle::CandleBackend::new();
                let $b = match spec.kv {
                    Some(format) => $b.with_kv(format),
                    None => $b,
                };
                $body
            }
            #[cfg(feature = "flex")]
            BackendKind::Flex => {
                f32_kv(spec)?;
                let $b = arbor_backend_burn::BurnBackend::flex();
                $body
            }
            #[cfg(feature = "ndarray")]
            BackendKind::Ndarray => {
                f32_kv(spec)?;
                let $b = arbor_backend_burn::BurnBackend::ndarray();
                $body
            }
            #[cfg(feature = "wgpu")]
            BackendKind::Wgpu => {
                f32_kv(spec)?;
                let $b = arbor_backend_burn::BurnBackend::wgpu();
                $body
            }
            #[allow(unreachable_patterns)]
            other => Err(EngineError::BackendNotCompiled(other)),
        }
    }};
}

/// burn's backends keep f32 KV caches only.
#[allow(dead_code)]
fn f32_kv(spec: BackendSpec) -> Result<()> {
    match spec.kv {
        None | Some(KvFormat::F32) => Ok(()),
        Some(other) => Err(EngineError::Invalid(format!(
            "the {} backend keeps its KV caches as f32; --kv {other} needs --backend candle",
            spec.kind
        ))),
    }
}

impl BackendSpec {
    /// How the backend stores its KV caches, or a typed error when it
    /// cannot store them as asked.
    pub fn kv_format(self) -> Result<KvFormat> {
        with_backend!(self, backend => Ok(arbor_tensor::Backend::kv_format(&backend)))
    }
}

pub fn load(
    kind: BackendSpec,
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
    arbor_pipeline::MemoryReport,
    Option<Box<dyn LanguageModel>>,
);

/// Loads the target of `file` under `options` (see
/// [`arbor_pipeline::load_target`]), given that `draft` is loaded (or, with
/// `self_draft`, that the target will draft for itself: then the self
/// draft comes back too). `path` is the one `file` was opened from; the
/// pipeline reads `file.path()`.
pub(crate) fn load_budgeted(
    kind: BackendSpec,
    file: &GgufFile,
    path: &std::path::Path,
    draft: Option<&arbor_model::Config>,
    self_draft: bool,
    options: &arbor_pipeline::MemoryOptions,
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

pub fn target_fits(
    kind: BackendSpec,
    file: &GgufFile,
    options: &arbor_pipeline::MemoryOptions,
) -> Result<bool> {
    let _ = (&file, &options);
    with_backend!(kind, backend => Ok(arbor_pipeline::target_fits(&backend, file, options)?))
}

/// The plan the target of `file` would get with `extra` bytes held by a
/// draft of config `draft` (see [`arbor_pipeline::plan_with`]).
pub(crate) fn plan_with(
    kind: BackendSpec,
    file: &GgufFile,
    draft: Option<&arbor_model::Config>,
    extra: u64,
    options: &arbor_pipeline::MemoryOptions,
) -> Result<Option<arbor_pipeline::Plan>> {
    let _ = (&file, &draft, &extra, &options);
    with_backend!(kind, backend => Ok(arbor_pipeline::plan_with(&backend, file, draft, extra, options)?))
}

/// Two models of `file` that run only its first layer and its first two
/// (everything outside the layers as loaded; an untied token table read by
/// rows), for sampling its latency curve without holding it whole; `None`
/// for a model of one layer.
pub(crate) fn first_layers(
    kind: BackendSpec,
    file: &GgufFile,
) -> Result<Option<[Box<dyn LanguageModel>; 2]>> {
    let _ = &file;
    with_backend!(kind, backend => {
        let layout = arbor_model::Layout::from_gguf(file.header())?;
        let n = layout.config.n_layers;
        if n < 2 {
            return Ok(None);
        }
        let first = |k: usize| (0..n).map(|i| i < k).collect::<Vec<bool>>();
        let rows: Option<Box<dyn arbor_model::RowSource>> = match layout.head {
            Some(_) => Some(Box::new(arbor_pipeline::DiskRows::open(file.path(), &layout)?)),
            None => None,
        };
        let d = arbor_model::Decoder::load_partial(backend, file, &layout, &first(2), rows, &mut |_, _| {})?;
        let one: Box<dyn LanguageModel> = Box::new(d.self_draft_with(&first(1))?);
        let two: Box<dyn LanguageModel> = Box::new(d.self_draft_with(&first(2))?);
        Ok(Some([one, two]))
    })
}

/// Bytes the weights of `file` hold once loaded as a draft.
pub fn model_bytes(kind: BackendSpec, file: &GgufFile) -> Result<u64> {
    let _ = &file;
    with_backend!(kind, backend => Ok(arbor_pipeline::model_bytes(&backend, file)?))
}

/// Host bytes left for the host tier under `host` when every layer of
/// `layout` streams in `mode` on the backend `kind` (see
/// [`arbor_pipeline::HostBudget::room_for`]).
pub fn host_room(
    kind: BackendSpec,
    host: &arbor_pipeline::HostBudget,
    layout: &arbor_model::Layout,
    mode: arbor_pipeline::Mode,
) -> Result<u64> {
    let all: Vec<usize> = (0..layout.layers.len()).collect();
    let _ = (&host, &layout, &all, &mode);
    with_backend!(kind, backend => Ok(host.room_for(&backend, layout, &all, mode)?))
}

/// Times building the largest layer of `file` on the backend `kind` three
/// times: its bytes and the fastest build's seconds (the upload rate a GPU
/// budget's passes are planned with, [`upload_rate`]).
pub fn time_layer_builds(kind: BackendSpec, file: &GgufFile) -> Result<(u64, f64)> {
    let _ = &file;
    with_backend!(kind, backend => Ok(arbor_pipeline::time_layer_builds(&backend, file, 3)?))
}

/// The upload rate of the backend `kind` (bytes per second) from the store,
/// measured now on `target`'s largest layer when none is stored (the
/// measurement is announced).
pub fn upload_rate(
    kind: BackendSpec,
    target: &std::path::Path,
    store: &arbor_planner::ProfileStore,
    progress: &mut dyn FnMut(crate::OpenEvent<'_>),
) -> Result<f64> {
    let (record, note) = store.upload(kind.kernels(), || {
        let invalid =
            |e: &dyn std::fmt::Display| arbor_planner::PlannerError::Invalid(e.to_string());
        let file = GgufFile::open(target).map_err(|e| invalid(&e))?;
        time_layer_builds(kind, &file).map_err(|e| invalid(&e))
    })?;
    if let Some(note) = note {
        progress(crate::OpenEvent::Note(&note));
    }
    Ok(record.bytes_per_sec)
}

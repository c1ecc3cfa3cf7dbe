//! The verified cache: a file is written through a hashing writer into a
//! temporary file, checked against its pinned size and sha256, renamed
//! into place and marked with a `<file>.sha256-ok` file.

use std::fs::{self, File};
use std::io::{self, BufReader, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{FetchError, Progress};

pub(crate) fn marker_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256-ok");
    file.with_file_name(name)
}

/// Whether `dest` holds the verified file. One with the right size but no
/// marker (copied in by hand, or interrupted before the marker was written)
/// is hashed once and, if right, gets its marker.
pub(crate) fn is_cached(
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
#[cfg(feature = "download")]
pub(crate) fn install(
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
        let mut out = HashingWriter::new(io::BufWriter::with_capacity(1 << 20, file), progress);
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

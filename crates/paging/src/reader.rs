//! Reading byte ranges of a file without filling the page cache.
//!
//! [`DirectReader`] and its read paths live here; the platform system calls
//! are in `os` and the tests in `tests`.

mod os;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use crate::buf::{ALIGN, AlignedBuf};
use crate::{PagingError, Result};

use os::{EINVAL, drop_from_cache, open_direct, read_at};

/// Reads byte ranges of one file while leaving as little as possible in the
/// page cache (see the crate documentation for why that matters).
///
/// The file is opened with `O_DIRECT` where the file system allows it, and
/// reads then go straight from the device into an [`AlignedBuf`]. `O_DIRECT`
/// only moves whole aligned blocks, so a read of an arbitrary range fetches
/// the aligned span around it (see [`DirectReader::span`]) and hands back
/// the requested part. If the file system rejects `O_DIRECT` (`EINVAL` when
/// opening, or on a read), the reader switches for good to ordinary reads,
/// each followed by `posix_fadvise(POSIX_FADV_DONTNEED)` on the range just
/// read so the kernel drops the cached copy.
///
/// Reads use positioned IO (`pread`) and take `&self`, so one reader can be
/// shared by several threads, each with its own buffer.
#[derive(Debug)]
pub struct DirectReader {
    path: PathBuf,
    /// File length when it was opened.
    len: u64,
    /// The `O_DIRECT` handle, if the file system accepted one.
    direct_file: Option<File>,
    /// Whether reads still go through `direct_file`.
    direct: AtomicBool,
    /// An ordinary handle, opened when needed for the fallback.
    buffered_file: OnceLock<File>,
    /// Bytes transferred by read calls so far.
    bytes_read: AtomicU64,
    /// Nanoseconds spent in read calls so far.
    read_nanos: AtomicU64,
    /// Leave what is read in the page cache (see [`DirectReader::cached`]).
    keep_cached: bool,
}

impl DirectReader {
    /// Opens `path` for reading, with `O_DIRECT` if the file system
    /// supports it.
    pub fn open(path: impl AsRef<Path>) -> Result<DirectReader> {
        Self::open_with(path.as_ref(), true)
    }

    /// Opens `path` for ordinary reads that stay in the page cache: for
    /// weights kept in host memory and copied to a GPU on every pass
    /// (a GPU memory budget without a host one), where the cache is the
    /// host copy.
    pub fn cached(path: impl AsRef<Path>) -> Result<DirectReader> {
        Ok(DirectReader {
            keep_cached: true,
            ..Self::open_with(path.as_ref(), false)?
        })
    }

    /// Opens `path`, trying `O_DIRECT` only if `try_direct` (tests use
    /// `false` to exercise the fallback on any file system).
    fn open_with(path: &Path, try_direct: bool) -> Result<DirectReader> {
        let io_err = |source| PagingError::Io {
            path: path.to_owned(),
            source,
        };
        let direct_file = if try_direct {
            open_direct(path).map_err(io_err)?
        } else {
            None
        };
        let buffered_file = OnceLock::new();
        let len = match &direct_file {
            Some(file) => file.metadata().map_err(io_err)?.len(),
            None => {
                let file = File::open(path).map_err(io_err)?;
                let len = file.metadata().map_err(io_err)?.len();
                let _ = buffered_file.set(file);
                len
            }
        };
        Ok(DirectReader {
            path: path.to_owned(),
            len,
            direct: AtomicBool::new(direct_file.is_some()),
            direct_file,
            buffered_file,
            bytes_read: AtomicU64::new(0),
            read_nanos: AtomicU64::new(0),
            keep_cached: false,
        })
    }

    /// The path the reader was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's length when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file was empty when it was opened.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether reads currently bypass the page cache with `O_DIRECT`
    /// (`false` once the reader has fallen back to ordinary reads).
    pub fn is_direct(&self) -> bool {
        self.direct.load(Ordering::Relaxed)
    }

    /// The buffer size needed to read `len` bytes at `offset`: the length
    /// of the [`ALIGN`]-aligned span of the file that covers the range.
    /// Zero for an empty range at an aligned offset.
    pub fn span(offset: u64, len: usize) -> usize {
        let (start, end) = aligned_span(offset, len);
        usize::try_from(end - start).unwrap_or(usize::MAX)
    }

    /// Reads the first `len` bytes of the file in requests of `chunk`
    /// bytes, keeping nothing: what measuring a disk, or bringing storage
    /// to a known state, needs.
    pub fn read_through(&self, len: u64, chunk: usize) -> Result<()> {
        let chunk = chunk.max(1);
        let mut buf = AlignedBuf::new(chunk + 2 * ALIGN);
        let mut at = 0u64;
        while at < len {
            let n = chunk.min(usize::try_from(len - at).unwrap_or(usize::MAX));
            self.read_into(at, n, &mut buf)?;
            at += n as u64;
        }
        Ok(())
    }

    /// Reads the `len` bytes at `offset` and returns exactly those bytes,
    /// stored somewhere in `buf`.
    ///
    /// `buf` is replaced by a bigger one if its capacity is below
    /// [`DirectReader::span`]`(offset, len)`; reuse one buffer per thread to
    /// avoid allocating on every read. A range that reaches past the end of
    /// the file, judged by the file's current length (files can be
    /// truncated while we run), gives [`PagingError::Truncated`].
    pub fn read_into<'b>(
        &self,
        offset: u64,
        len: usize,
        buf: &'b mut AlignedBuf,
    ) -> Result<&'b [u8]> {
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|end| end > self.len) {
            // Past the length we saw at open; the file may have grown since,
            // so only the current length decides.
            let now = self.current_len()?;
            if end.is_none_or(|end| end > now) {
                return Err(self.truncated(offset, len, now));
            }
        }
        let span = Self::span(offset, len);
        if buf.capacity() < span {
            *buf = AlignedBuf::new(span);
        }
        if len == 0 {
            return Ok(&buf.as_slice()[..0]);
        }

        if self.is_direct()
            && let Some(file) = &self.direct_file
        {
            match self.read_direct(file, offset, len, buf) {
                Ok(start) => return Ok(&buf.as_slice()[start..start + len]),
                Err(DirectFailure::NotSupported) => self.direct.store(false, Ordering::Relaxed),
                Err(DirectFailure::Other(e)) => return Err(e),
            }
        }
        self.read_buffered(offset, len, buf)?;
        Ok(&buf.as_slice()[..len])
    }

    /// Total bytes transferred by read calls so far. With `O_DIRECT` this
    /// includes the alignment padding around each requested range, so it is
    /// what the device delivered rather than what callers asked for.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// Total seconds spent in read calls so far, summed over all threads.
    pub fn read_secs(&self) -> f64 {
        self.read_nanos.load(Ordering::Relaxed) as f64 * 1e-9
    }

    /// Reads the aligned span around the range through the `O_DIRECT`
    /// handle; returns where the requested bytes start in `buf`.
    fn read_direct(
        &self,
        file: &File,
        offset: u64,
        len: usize,
        buf: &mut AlignedBuf,
    ) -> Result<usize, DirectFailure> {
        // The range lies inside the file (checked by the caller), so these
        // all fit.
        let (start, end) = aligned_span(offset, len);
        let span = (end - start) as usize;
        let start = start as u64;
        let skip = (offset - start) as usize;
        let wanted = skip + len;
        let got = self
            .timed_read(file, &mut buf.as_mut_slice()[..span], start, wanted)
            .map_err(|e| {
                if e.raw_os_error() == Some(EINVAL) {
                    DirectFailure::NotSupported
                } else {
                    DirectFailure::Other(self.io_error(e))
                }
            })?;
        if got < wanted {
            let stop = start + got as u64;
            return Err(DirectFailure::Other(self.short_read(offset, len, stop)));
        }
        Ok(skip)
    }

    /// Reads the range into the start of `buf` with an ordinary read, then
    /// asks the kernel to drop it from the page cache.
    fn read_buffered(&self, offset: u64, len: usize, buf: &mut AlignedBuf) -> Result<()> {
        let file = self.buffered_file()?;
        let got = self
            .timed_read(file, &mut buf.as_mut_slice()[..len], offset, len)
            .map_err(|e| self.io_error(e));
        if !self.keep_cached {
            drop_from_cache(file, offset, len);
        }
        let got = got?;
        if got < len {
            return Err(self.short_read(offset, len, offset + got as u64));
        }
        Ok(())
    }

    /// The ordinary (page-cached) handle, opened on first use.
    fn buffered_file(&self) -> Result<&File> {
        if let Some(file) = self.buffered_file.get() {
            return Ok(file);
        }
        let file = File::open(&self.path).map_err(|e| self.io_error(e))?;
        // If another thread got here first, its handle wins and ours closes.
        Ok(self.buffered_file.get_or_init(|| file))
    }

    /// Reads into `dst` from `offset` until at least `wanted` bytes have
    /// arrived or the file ends, and records the statistics. Returns the
    /// number of bytes read.
    fn timed_read(
        &self,
        file: &File,
        dst: &mut [u8],
        offset: u64,
        wanted: usize,
    ) -> io::Result<usize> {
        let started = Instant::now();
        let mut filled = 0;
        let result = loop {
            if filled >= wanted {
                break Ok(filled);
            }
            match read_at(file, &mut dst[filled..], offset + filled as u64) {
                Ok(0) => break Ok(filled),
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.read_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.bytes_read.fetch_add(filled as u64, Ordering::Relaxed);
        result
    }

    /// The file's length now, which may differ from the one at open.
    fn current_len(&self) -> Result<u64> {
        let file = match &self.direct_file {
            Some(file) => file,
            None => self.buffered_file()?,
        };
        Ok(file.metadata().map_err(|e| self.io_error(e))?.len())
    }

    /// The error for a read that ended early at file offset `stop`: the
    /// file must have shrunk, so report its current length.
    fn short_read(&self, offset: u64, len: usize, stop: u64) -> PagingError {
        match self.current_len() {
            Ok(now) => self.truncated(offset, len, now.min(stop)),
            Err(e) => e,
        }
    }

    fn truncated(&self, offset: u64, len: usize, file_len: u64) -> PagingError {
        PagingError::Truncated {
            path: self.path.clone(),
            offset,
            len: len as u64,
            file_len,
        }
    }

    fn io_error(&self, source: io::Error) -> PagingError {
        PagingError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

/// Why a direct read did not succeed.
enum DirectFailure {
    /// `EINVAL`: the file system (or the device's block size) does not
    /// allow this `O_DIRECT` read; use ordinary reads instead.
    NotSupported,
    Other(PagingError),
}

/// The [`ALIGN`]-aligned `[start, end)` file span covering `len` bytes at
/// `offset`. Computed in `u128` so that no input can overflow; callers that
/// need `u64` offsets only pass ranges inside a file.
fn aligned_span(offset: u64, len: usize) -> (u128, u128) {
    let align = ALIGN as u128;
    let offset = u128::from(offset);
    let start = offset - offset % align;
    let end = (offset + len as u128).next_multiple_of(align);
    (start, end)
}

#[cfg(test)]
mod tests;

//! The system calls behind [`DirectReader`](super::DirectReader), per
//! platform: opening with `O_DIRECT`, dropping a range from the page cache,
//! positioned reads, and the `EINVAL` that marks an unsupported direct read.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

#[cfg(target_os = "linux")]
pub(super) const EINVAL: i32 = libc::EINVAL;
#[cfg(not(target_os = "linux"))]
pub(super) const EINVAL: i32 = 22;

/// Opens `path` with `O_DIRECT`; `Ok(None)` if the file system refuses it.
#[cfg(target_os = "linux")]
pub(super) fn open_direct(path: &Path) -> io::Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Elsewhere there is no `O_DIRECT`; always read through the page cache.
#[cfg(not(target_os = "linux"))]
pub(super) fn open_direct(path: &Path) -> io::Result<Option<File>> {
    // Still open once so that a missing file is reported here, not later.
    OpenOptions::new().read(true).open(path).map(|_| None)
}

/// Asks the kernel to drop the cached pages of a range we just read. This
/// is advice: failures are ignored.
#[cfg(target_os = "linux")]
pub(super) fn drop_from_cache(file: &File, offset: u64, len: usize) {
    use std::os::fd::AsRawFd;
    if let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) {
        // SAFETY: plain system call on a descriptor we own; no memory is
        // passed.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_DONTNEED);
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn drop_from_cache(_file: &File, _offset: u64, _len: usize) {}

#[cfg(unix)]
pub(super) fn read_at(file: &File, dst: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, dst, offset)
}

#[cfg(windows)]
pub(super) fn read_at(file: &File, dst: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, dst, offset)
}

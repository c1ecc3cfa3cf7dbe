//! Memory budgets and page-cache-free reads for weight paging.
//!
//! When a model does not fit in the memory we are allowed to use, its
//! weights are paged: read from disk into a bounded set of buffers just
//! before they are needed and dropped again afterwards. This crate holds the
//! two pieces that make that work under a hard memory limit.
//!
//! **Why not just read the file (or memory-map it)?** Under a cgroup memory
//! limit (a container, a systemd slice, a batch job) the kernel charges the
//! page cache to the group that caused it. Every byte of a weight file we
//! read through the ordinary path stays behind as cached pages that count
//! against our limit; when the group gets close to it, the kernel reclaims
//! from that page cache (and from our own anonymous memory) or, failing
//! that, invokes the OOM killer. Reading a multi-gigabyte weight file the
//! normal way therefore fills the limit with copies of data we already hold
//! in our own buffers. So paged weights are read *around* the page cache:
//!
//! * [`DirectReader`] reads byte ranges with `O_DIRECT`, straight from the
//!   device into an [`AlignedBuf`], leaving nothing cached. On file systems
//!   that refuse `O_DIRECT` (tmpfs, some network and overlay file systems)
//!   it falls back to ordinary reads followed by
//!   `posix_fadvise(POSIX_FADV_DONTNEED)` on the range, which asks the
//!   kernel to drop those cached pages again.
//! * [`Ledger`] is the memory budget itself: every buffer that holds paged
//!   weights is accounted for by a [`Reservation`] against it, so the engine
//!   can refuse (or wait) rather than overrun the limit.
//!
//! [`parse_bytes`] and [`format_bytes`] turn human sizes such as `"1.5GiB"`
//! into byte counts and back, for command-line options and messages.

mod buf;
mod bytes;
mod ledger;
mod reader;

use std::path::PathBuf;

pub use buf::{ALIGN, AlignedBuf};
pub use bytes::{format_bytes, parse_bytes};
pub use ledger::{Ledger, Reservation};
pub use reader::DirectReader;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum PagingError {
    /// A byte size that could not be parsed; the message says what was
    /// given and which forms are accepted.
    #[error("{0}")]
    BadSize(String),

    /// A reservation that does not fit in what is left of the budget.
    #[error(
        "cannot reserve {} for {what}: only {} of the {} memory budget is available",
        format_bytes(*needed),
        format_bytes(*available),
        format_bytes(*budget)
    )]
    OverBudget {
        what: String,
        needed: u64,
        available: u64,
        budget: u64,
    },

    /// The budget cannot hold even the smallest working set.
    #[error(
        "memory budget {} is too small to run: needs at least {} ({detail})",
        format_bytes(*budget),
        format_bytes(*minimum)
    )]
    TooSmall {
        budget: u64,
        minimum: u64,
        detail: String,
    },

    /// A read that reaches past the end of the file (which may have been
    /// truncated since it was opened).
    #[error(
        "{}: cannot read {len} bytes at offset {offset}: the file is only {file_len} bytes long",
        path.display()
    )]
    Truncated {
        path: PathBuf,
        offset: u64,
        len: u64,
        file_len: u64,
    },

    /// An operating-system error while opening, inspecting or reading a file.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Result type of this crate.
pub type Result<T, E = PagingError> = std::result::Result<T, E>;

/// The major and minor numbers of the block device holding `file` (Linux's
/// split of its `st_dev`), as cgroup IO limits name devices.
#[cfg(unix)]
pub fn block_device(file: &std::path::Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(file)?.dev();
    // Major in bits 8..20 (and 32..), minor in 0..8 and 20..32.
    Ok((
        ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
        (dev & 0xff) | ((dev >> 12) & !0xff),
    ))
}

/// The major and minor numbers of the block device holding `file`: none
/// off Unix.
#[cfg(not(unix))]
pub fn block_device(_: &std::path::Path) -> std::io::Result<(u64, u64)> {
    Err(std::io::ErrorKind::Unsupported.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_use_human_sizes() {
        let e = PagingError::TooSmall {
            budget: 512 << 20,
            minimum: 3 << 30,
            detail: "largest layer".into(),
        };
        assert_eq!(
            e.to_string(),
            "memory budget 512.0 MiB is too small to run: needs at least 3.00 GiB (largest layer)"
        );
        let e = PagingError::OverBudget {
            what: "layer 3".into(),
            needed: 2048,
            available: 1024,
            budget: 4096,
        };
        assert_eq!(
            e.to_string(),
            "cannot reserve 2.0 KiB for layer 3: only 1.0 KiB of the 4.0 KiB memory budget is available"
        );
    }
}

//! A cgroup v1 memory limit for a benchmark's child process, and its peak
//! usage: every engine in a memory benchmark runs under the same limit.

use std::path::{Path, PathBuf};

/// A cgroup v1 memory group that removes itself when dropped.
pub struct Cgroup {
    pub dir: PathBuf,
}

impl Cgroup {
    /// A new group limited to `bytes`, or `None` when cgroup v1 memory
    /// control is not available to this user.
    pub fn new(bytes: u64) -> Option<Self> {
        let root = Path::new("/sys/fs/cgroup/memory");
        if !root.join("memory.limit_in_bytes").exists() {
            return None;
        }
        let dir = root.join(format!("arbor-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).ok()?;
        let group = Self { dir };
        std::fs::write(group.dir.join("memory.limit_in_bytes"), bytes.to_string()).ok()?;
        // No swap to escape into, where the kernel offers the knob.
        let _ = std::fs::write(group.dir.join("memory.swappiness"), "0");
        let _ = std::fs::write(
            group.dir.join("memory.memsw.limit_in_bytes"),
            bytes.to_string(),
        );
        Some(group)
    }

    pub fn peak(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("memory.max_usage_in_bytes"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// A cgroup v1 blkio group capping read bandwidth from one block device:
/// emulates a device's storage (a phone's flash, an SD card) on a machine
/// whose disk is faster or cached below the page cache. Removes itself
/// when dropped.
pub struct ReadLimit {
    pub dir: PathBuf,
}

impl ReadLimit {
    /// A group reading at most `bytes_per_sec` from the block device
    /// holding `file`, or `None` when blkio control is not available.
    pub fn new(file: &Path, bytes_per_sec: u64) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let root = Path::new("/sys/fs/cgroup/blkio");
        if !root.join("blkio.throttle.read_bps_device").exists() {
            return None;
        }
        let dev = std::fs::metadata(file).ok()?.dev();
        // Linux's dev_t: major in bits 8..20 (and 32..), minor in 0..8 and 20..32.
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        let dir = root.join(format!("arbor-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).ok()?;
        let group = Self { dir };
        let rule = format!("{major}:{minor} {bytes_per_sec}");
        std::fs::write(group.dir.join("blkio.throttle.read_bps_device"), rule).ok()?;
        Some(group)
    }
}

impl Drop for ReadLimit {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Makes the child of `cmd` join a memory group and a read-limit group
/// (either may be absent) before it runs.
pub fn confine(
    cmd: &mut std::process::Command,
    memory: Option<&Cgroup>,
    reads: Option<&ReadLimit>,
) -> std::io::Result<()> {
    let dirs = memory
        .map(|g| &g.dir)
        .into_iter()
        .chain(reads.map(|r| &r.dir));
    let tasks: Vec<std::ffi::CString> = dirs
        .map(|d| std::ffi::CString::new(d.join("tasks").as_os_str().as_encoded_bytes()))
        .collect::<Result<_, _>>()
        .map_err(std::io::Error::other)?;
    if tasks.is_empty() {
        return Ok(());
    }
    // SAFETY: between fork and exec the child only makes raw system calls
    // on memory prepared before the fork (no allocation, no locks).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            tasks.iter().try_for_each(|t| join_cgroup(t))
        });
    }
    Ok(())
}

/// Writes the calling process's pid into a cgroup's `tasks` file using only
/// system calls (safe between fork and exec).
pub fn join_cgroup(tasks: &std::ffi::CStr) -> std::io::Result<()> {
    let mut digits = [0u8; 20];
    let mut pid = unsafe { libc::getpid() } as u64;
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (pid % 10) as u8;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    // SAFETY: plain system calls on a valid C string and stack buffer.
    unsafe {
        let fd = libc::open(tasks.as_ptr(), libc::O_WRONLY);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = digits.len() - at;
        let written = libc::write(fd, digits[at..].as_ptr().cast(), n);
        libc::close(fd);
        if written != n as isize {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

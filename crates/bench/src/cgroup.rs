//! Cgroups for a benchmark's child processes: a memory limit (without swap
//! to escape into), an optional cap on read bandwidth from one block device,
//! and the peak memory the group saw, so every engine in a memory benchmark
//! runs under the same wall.
//!
//! One interface over both cgroup versions, found under a root directory
//! (`/sys/fs/cgroup`, or a fake tree in tests):
//! - v2 (`ROOT/cgroup.controllers` exists): one group `ROOT/NAME` with
//!   `memory.max`, `memory.swap.max` = 0 and `io.max` (`MAJ:MIN rbps=N`);
//!   the `memory` / `io` controllers are enabled in `ROOT/cgroup.subtree_control`
//!   first when they are not; the child joins through `cgroup.procs`; the
//!   peak is `memory.peak` (Linux 5.19 on: older kernels lack it, and
//!   [`Group::peak`] is then `None`: callers fall back to the process's own
//!   peak RSS and label it so).
//! - v1 (`ROOT/memory/memory.limit_in_bytes` exists): `ROOT/memory/NAME`
//!   with `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`,
//!   `memory.swappiness` = 0 where offered), `ROOT/blkio/NAME` with
//!   `blkio.throttle.read_bps_device`; the child joins through `tasks`; the
//!   peak is `memory.max_usage_in_bytes`.
//!
//! No crate is used: the cgroup crates hard-code `/sys/fs/cgroup` (no fake
//! tree) and allocate when adding a task, which the child cannot do between
//! fork and exec.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where cgroup filesystems are mounted on most Linux systems.
pub const SYSTEM_ROOT: &str = "/sys/fs/cgroup";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    /// The file holding a group's peak memory use.
    pub fn peak_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.max_usage_in_bytes",
            Version::V2 => "memory.peak",
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Version::V1 => "cgroup v1",
            Version::V2 => "cgroup v2",
        })
    }
}

/// Why no group could be made.
#[derive(Debug)]
pub enum CgroupError {
    /// Neither a cgroup v2 hierarchy nor cgroup v1 memory control at `root`.
    NotFound { root: PathBuf },
    /// The hierarchy lacks a controller: v2 does not list it in
    /// `cgroup.controllers` (bound to a v1 hierarchy, or disabled at boot);
    /// v1 has no hierarchy for it mounted.
    NoController {
        version: Version,
        controller: &'static str,
        path: PathBuf,
    },
    /// Creating the group, enabling a controller or writing a limit failed
    /// (usually: not root).
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

impl fmt::Display for CgroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CgroupError::NotFound { root } => write!(
                f,
                "no cgroup at {0}: neither cgroup v2 ({0}/cgroup.controllers) nor cgroup v1 \
                 memory control ({0}/memory/memory.limit_in_bytes)",
                root.display()
            ),
            CgroupError::NoController {
                version: Version::V2,
                controller,
                path,
            } => write!(
                f,
                "cgroup v2: the {controller} controller is not available ({} does not list it; \
                 it may be bound to a cgroup v1 hierarchy or disabled at boot)",
                path.display()
            ),
            CgroupError::NoController {
                version: Version::V1,
                controller,
                path,
            } => write!(
                f,
                "cgroup v1: no {controller} hierarchy ({} is missing)",
                path.display()
            ),
            CgroupError::Io { what, path, source } => {
                write!(f, "{what} {}: {source}", path.display())?;
                match source.raw_os_error() {
                    Some(libc::EACCES | libc::EPERM) => {
                        f.write_str(" (making cgroups needs root or a delegated group)")
                    }
                    Some(libc::EBUSY) => f.write_str(
                        " (cgroup v2 enables controllers only below a group that holds no \
                         processes of its own)",
                    ),
                    _ => Ok(()),
                }
            }
        }
    }
}

impl std::error::Error for CgroupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CgroupError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// A cap on reads from one block device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadCap {
    pub major: u64,
    pub minor: u64,
    pub bytes_per_sec: u64,
}

impl ReadCap {
    /// A cap on the block device holding `file`.
    pub fn of_file(file: &Path, bytes_per_sec: u64) -> io::Result<Self> {
        let (major, minor) = arbor_paging::block_device(file)?;
        Ok(Self {
            major,
            minor,
            bytes_per_sec,
        })
    }
}

/// What a group holds its processes to.
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits {
    pub memory: Option<u64>,
    pub reads: Option<ReadCap>,
}

/// A cgroup hierarchy found under a root directory.
#[derive(Clone, Debug)]
pub struct Hierarchy {
    root: PathBuf,
    version: Version,
}

impl Hierarchy {
    /// The hierarchy at `root`: v2 where `root/cgroup.controllers` exists,
    /// else v1 where `root/memory/memory.limit_in_bytes` does (a hybrid
    /// system, v2 mounted beside v1 controllers, counts as v1).
    pub fn detect(root: &Path) -> Result<Self, CgroupError> {
        let version = if root.join("cgroup.controllers").is_file() {
            Version::V2
        } else if root.join("memory/memory.limit_in_bytes").is_file() {
            Version::V1
        } else {
            return Err(CgroupError::NotFound {
                root: root.to_path_buf(),
            });
        };
        Ok(Self {
            root: root.to_path_buf(),
            version,
        })
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A new group (`arbor-bench-PID-N`) holding its processes to `limits`;
    /// it removes itself when dropped.
    pub fn group(&self, limits: &Limits) -> Result<Group, CgroupError> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "arbor-bench-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        match self.version {
            Version::V2 => self.group_v2(&name, limits),
            Version::V1 => self.group_v1(&name, limits),
        }
    }

    fn group_v2(&self, name: &str, limits: &Limits) -> Result<Group, CgroupError> {
        let wanted = [
            ("memory", limits.memory.is_some()),
            ("io", limits.reads.is_some()),
        ];
        let available = self.root.join("cgroup.controllers");
        let subtree = self.root.join("cgroup.subtree_control");
        let listed = |path: &Path| -> Result<Vec<String>, CgroupError> {
            let text = std::fs::read_to_string(path).map_err(io_err("reading", path))?;
            Ok(text.split_whitespace().map(str::to_string).collect())
        };
        let (offered, enabled) = (listed(&available)?, listed(&subtree)?);
        for &(controller, _) in wanted.iter().filter(|(_, w)| *w) {
            if !offered.iter().any(|c| c == controller) {
                return Err(CgroupError::NoController {
                    version: Version::V2,
                    controller,
                    path: available,
                });
            }
            if !enabled.iter().any(|c| c == controller) {
                std::fs::write(&subtree, format!("+{controller}")).map_err(io_err(
                    match controller {
                        "memory" => "enabling the memory controller in",
                        _ => "enabling the io controller in",
                    },
                    &subtree,
                ))?;
            }
        }
        let dir = self.root.join(name);
        std::fs::create_dir(&dir).map_err(io_err("creating", &dir))?;
        let group = Group {
            version: Version::V2,
            dirs: vec![dir.clone()],
            memory: limits.memory.map(|_| dir.clone()),
            join: vec![dir.join("cgroup.procs")],
        };
        if let Some(bytes) = limits.memory {
            write(&dir, "memory.max", bytes.to_string())?;
            // No swap to escape into. Best effort, as v1's memsw: absent
            // where the kernel keeps no swap accounting, and then a machine
            // with swap on lets a group hold more than its limit.
            let _ = std::fs::write(dir.join("memory.swap.max"), "0");
        }
        if let Some(r) = limits.reads {
            let rule = format!("{}:{} rbps={}", r.major, r.minor, r.bytes_per_sec);
            write(&dir, "io.max", rule)?;
        }
        Ok(group)
    }

    fn group_v1(&self, name: &str, limits: &Limits) -> Result<Group, CgroupError> {
        let mut group = Group {
            version: Version::V1,
            dirs: Vec::new(),
            memory: None,
            join: Vec::new(),
        };
        if let Some(bytes) = limits.memory {
            let dir = self.v1_dir(&mut group, name, "memory", "memory.limit_in_bytes")?;
            write(&dir, "memory.limit_in_bytes", bytes.to_string())?;
            // No swap to escape into, where the kernel offers the knobs.
            let _ = std::fs::write(dir.join("memory.swappiness"), "0");
            let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), bytes.to_string());
            group.memory = Some(dir);
        }
        if let Some(r) = limits.reads {
            let dir = self.v1_dir(&mut group, name, "blkio", "blkio.throttle.read_bps_device")?;
            let rule = format!("{}:{} {}", r.major, r.minor, r.bytes_per_sec);
            write(&dir, "blkio.throttle.read_bps_device", rule)?;
        }
        Ok(group)
    }

    /// `ROOT/CONTROLLER/NAME`, made and added to `group`.
    fn v1_dir(
        &self,
        group: &mut Group,
        name: &str,
        controller: &'static str,
        knob: &str,
    ) -> Result<PathBuf, CgroupError> {
        let parent = self.root.join(controller);
        if !parent.join(knob).is_file() {
            return Err(CgroupError::NoController {
                version: Version::V1,
                controller,
                path: parent.join(knob),
            });
        }
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(io_err("creating", &dir))?;
        // Added first: a failed limit after this still removes the group.
        group.dirs.push(dir.clone());
        group.join.push(dir.join("tasks"));
        Ok(dir)
    }
}

fn write(dir: &Path, file: &str, value: String) -> Result<(), CgroupError> {
    let path = dir.join(file);
    std::fs::write(&path, value).map_err(io_err("writing", &path))
}

/// A group (v1: one directory per controller) that removes itself when
/// dropped.
#[derive(Debug)]
pub struct Group {
    version: Version,
    dirs: Vec<PathBuf>,
    /// The directory holding the memory controller's files.
    memory: Option<PathBuf>,
    /// The files a process writes its pid into to join.
    join: Vec<PathBuf>,
}

impl Group {
    pub fn version(&self) -> Version {
        self.version
    }

    /// The files a process joins the group through.
    pub fn join_files(&self) -> &[PathBuf] {
        &self.join
    }

    /// The most memory the group held, or `None` where it cannot be read
    /// (no memory limit, or a v2 kernel older than `memory.peak`).
    pub fn peak(&self) -> Option<u64> {
        let file = self.version.peak_file();
        std::fs::read_to_string(self.memory.as_ref()?.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Makes the child of `cmd` join this group before it runs.
    pub fn confine(&self, cmd: &mut std::process::Command) -> io::Result<()> {
        let files: Vec<std::ffi::CString> = self
            .join_files()
            .iter()
            .map(|f| std::ffi::CString::new(f.as_os_str().as_encoded_bytes()))
            .collect::<Result<_, _>>()
            .map_err(io::Error::other)?;
        // SAFETY: between fork and exec the child only makes raw system
        // calls on memory prepared before the fork (no allocation, no locks).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(cmd, move || {
                files.iter().try_for_each(|f| join_cgroup(f))
            });
        }
        Ok(())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Writes the calling process's pid into a cgroup's `cgroup.procs` (v2) or
/// `tasks` (v1) file using only system calls (safe between fork and exec).
pub fn join_cgroup(file: &std::ffi::CStr) -> io::Result<()> {
    let mut digits = [0u8; 20];
    // SAFETY: getpid has no preconditions.
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
        let fd = libc::open(file.as_ptr(), libc::O_WRONLY);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = digits.len() - at;
        let written = libc::write(fd, digits[at..].as_ptr().cast(), n);
        libc::close(fd);
        if written != n as isize {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;

//! The storage regime a process reads its model under: a read-bandwidth
//! limit its cgroup puts on the block device holding the file (cgroup v2
//! `io.max` `rbps=`, v1 `blkio.throttle.read_bps_device`), the way a
//! benchmark's `--read-limit` emulates a device's slower storage, or a
//! container runtime limits a tenant's disk.
//!
//! Everything learned about streaming depends on it: the disk's bandwidth,
//! the rates sources decoded at, the choice `auto` last made. A store that
//! mixed a limited regime's figures with an unlimited one's would plan
//! each with the other's, so those records carry the limit in their name
//! ([`regime_tag`]); without a limit the names are what they always were.

use std::path::Path;

/// Where the kernel lists this process's groups.
const PROC_SELF_CGROUP: &str = "/proc/self/cgroup";
/// Where cgroup filesystems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The read limit, in bytes per second, that this process's cgroups put
/// on the device holding `file` (the smallest along each group's path to
/// the root); `None` without one, or where it cannot be read.
pub fn read_limit(file: &Path) -> Option<u64> {
    let (major, minor) = arbor_paging::block_device(file).ok()?;
    let groups = std::fs::read_to_string(PROC_SELF_CGROUP).ok()?;
    read_limit_in(&groups, Path::new(CGROUP_ROOT), major, minor)
}

/// [`read_limit`] from a `/proc/self/cgroup` text and a cgroup root, for
/// device `major:minor`.
pub fn read_limit_in(groups: &str, root: &Path, major: u64, minor: u64) -> Option<u64> {
    let device = format!("{major}:{minor}");
    let mut least: Option<u64> = None;
    for line in groups.lines() {
        // `ID:CONTROLLERS:PATH`; v2's unified line has no controllers.
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (base, file, parse): (_, _, fn(&str, &str) -> Option<u64>) = if controllers.is_empty() {
            (root.to_path_buf(), "io.max", v2_rbps)
        } else if controllers.split(',').any(|c| c == "blkio") {
            (root.join("blkio"), "blkio.throttle.read_bps_device", v1_bps)
        } else {
            continue;
        };
        // The group and each of its parents up to the root.
        let mut dir = base.join(path.trim_start_matches('/'));
        loop {
            if let Ok(text) = std::fs::read_to_string(dir.join(file))
                && let Some(limit) = text.lines().find_map(|l| parse(l, &device))
            {
                least = Some(least.map_or(limit, |m| m.min(limit)));
            }
            if dir == base || !dir.pop() {
                break;
            }
        }
    }
    least
}

/// `MAJ:MIN BPS` (v1).
fn v1_bps(line: &str, device: &str) -> Option<u64> {
    let mut f = line.split_whitespace();
    (f.next()? == device).then_some(())?;
    f.next()?.parse().ok().filter(|&b| b > 0)
}

/// `MAJ:MIN rbps=N wbps=max riops=max wiops=max` (v2; `max` is no limit).
fn v2_rbps(line: &str, device: &str) -> Option<u64> {
    let mut f = line.split_whitespace();
    (f.next()? == device).then_some(())?;
    f.find_map(|kv| kv.strip_prefix("rbps="))?.parse().ok()
}

/// The suffix the store's streaming records carry under a read limit
/// (`-r250MBps`), empty without one.
pub fn regime_tag(limit: Option<u64>) -> String {
    limit.map_or(String::new(), |b| format!("-r{}MBps", b / 1_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// A fresh directory under the system's temporary one.
    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("arbor-storage-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        dir
    }

    #[test]
    fn a_v1_blkio_limit_on_the_device_is_found_up_the_path() {
        let root = scratch("v1");
        let r = root.as_path();
        let groups = "9:blkio:/bench/row\n4:memory:/bench/row\n0::/\n";
        // Another device's rule in the group, this device's in its parent.
        put(
            &r.join("blkio/bench/row/blkio.throttle.read_bps_device"),
            "8:0 1000\n",
        );
        assert_eq!(read_limit_in(groups, r, 253, 0), None);
        put(
            &r.join("blkio/bench/blkio.throttle.read_bps_device"),
            "253:0 500000000\n",
        );
        assert_eq!(read_limit_in(groups, r, 253, 0), Some(500_000_000));
        // The smaller of two along the path holds.
        put(
            &r.join("blkio/bench/row/blkio.throttle.read_bps_device"),
            "8:0 1000\n253:0 250000000\n",
        );
        assert_eq!(read_limit_in(groups, r, 253, 0), Some(250_000_000));
        assert_eq!(read_limit_in(groups, r, 253, 1), None);
        std::fs::remove_dir_all(r).ok();
    }

    #[test]
    fn a_v2_io_max_read_limit_is_found_and_max_is_none() {
        let root = scratch("v2");
        let r = root.as_path();
        let groups = "0::/bench/row\n";
        put(&r.join("bench/row/io.max"), "253:0 rbps=max wbps=1000\n");
        assert_eq!(read_limit_in(groups, r, 253, 0), None);
        put(
            &r.join("bench/row/io.max"),
            "253:0 rbps=2000000000 wbps=max\n",
        );
        assert_eq!(read_limit_in(groups, r, 253, 0), Some(2_000_000_000));
        // Nothing in a v1 hierarchy is read for a v2 line, and no groups
        // means no limit.
        assert_eq!(read_limit_in("", r, 253, 0), None);
        std::fs::remove_dir_all(r).ok();
    }

    #[test]
    fn records_under_a_limit_carry_it_in_their_name() {
        assert_eq!(regime_tag(None), "");
        assert_eq!(regime_tag(Some(250_000_000)), "-r250MBps");
        assert_eq!(regime_tag(Some(2_000_000_000)), "-r2000MBps");
    }
}

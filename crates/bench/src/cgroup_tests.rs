//! The cgroup layer against fake trees laid out as cgroup v1 and v2 (the
//! kernel makes a group's interface files on `mkdir`; a fake makes the ones
//! a test reads back, and a write makes the rest).

use super::*;

/// A temporary directory, removed when dropped.
struct Fake(PathBuf);

impl Fake {
    fn new(tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "arbor-cgroup-test-{}-{tag}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn file(&self, rel: &str, text: &str) -> &Self {
        let path = self.0.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        self
    }

    fn read(&self, path: &Path) -> String {
        std::fs::read_to_string(self.0.join(path)).unwrap()
    }

    /// A cgroup v2 root offering `controllers`, `enabled` in its subtree.
    fn v2(controllers: &str, enabled: &str) -> Self {
        let fake = Self::new("v2");
        fake.file("cgroup.controllers", controllers)
            .file("cgroup.subtree_control", enabled);
        fake
    }

    /// A cgroup v1 root with memory and blkio hierarchies.
    fn v1() -> Self {
        let fake = Self::new("v1");
        fake.file("memory/memory.limit_in_bytes", "9223372036854771712\n")
            .file("blkio/blkio.throttle.read_bps_device", "");
        fake
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const MIB800: u64 = 800 << 20;
const CAP: ReadCap = ReadCap {
    major: 259,
    minor: 3,
    bytes_per_sec: 1_000_000_000,
};

fn both() -> Limits {
    Limits {
        memory: Some(MIB800),
        reads: Some(CAP),
    }
}

#[test]
fn detects_each_version_and_neither() {
    assert_eq!(
        Hierarchy::detect(&Fake::v2("memory", "").0)
            .unwrap()
            .version(),
        Version::V2
    );
    assert_eq!(
        Hierarchy::detect(&Fake::v1().0).unwrap().version(),
        Version::V1
    );
    // Hybrid: v2 mounted beside v1 controllers (this is v1's memory).
    let hybrid = Fake::v1();
    hybrid.file("unified/cgroup.controllers", "");
    assert_eq!(Hierarchy::detect(&hybrid.0).unwrap().version(), Version::V1);
    let empty = Fake::new("none");
    let err = Hierarchy::detect(&empty.0).unwrap_err();
    assert!(matches!(err, CgroupError::NotFound { .. }));
    let text = err.to_string();
    assert!(text.contains("cgroup.controllers"), "{text}");
    assert!(text.contains("memory/memory.limit_in_bytes"), "{text}");
}

#[test]
fn v2_group_writes_its_limits_and_enables_controllers() {
    let fake = Fake::v2("cpuset cpu io memory pids", "");
    let h = Hierarchy::detect(&fake.0).unwrap();
    let g = h
        .group(&Limits {
            memory: Some(MIB800),
            reads: None,
        })
        .unwrap();
    let dir = g.join_files()[0].parent().unwrap().to_path_buf();
    assert_eq!(g.join_files(), [dir.join("cgroup.procs")]);
    assert_eq!(dir.parent().unwrap(), fake.0);
    assert_eq!(fake.read(&dir.join("memory.max")), MIB800.to_string());
    assert_eq!(fake.read(&dir.join("memory.swap.max")), "0");
    assert!(!dir.join("io.max").exists());
    // The memory controller was enabled for the root's children.
    assert_eq!(fake.read(Path::new("cgroup.subtree_control")), "+memory");

    // Memory already enabled: only io is asked for.
    let fake = Fake::v2("cpu io memory", "cpu memory\n");
    let g = Hierarchy::detect(&fake.0).unwrap().group(&both()).unwrap();
    let dir = g.join_files()[0].parent().unwrap().to_path_buf();
    assert_eq!(fake.read(&dir.join("io.max")), "259:3 rbps=1000000000");
    assert_eq!(fake.read(&dir.join("memory.max")), MIB800.to_string());
    assert_eq!(fake.read(Path::new("cgroup.subtree_control")), "+io");

    // Both enabled: the parent is left alone.
    let fake = Fake::v2("io memory", "io memory");
    let _g = Hierarchy::detect(&fake.0).unwrap().group(&both()).unwrap();
    assert_eq!(fake.read(Path::new("cgroup.subtree_control")), "io memory");
}

#[test]
fn v2_without_the_controller_says_which() {
    // As on a hybrid system's unified mount: memory and io bound to v1.
    let fake = Fake::v2("hugetlb", "");
    let h = Hierarchy::detect(&fake.0).unwrap();
    let err = h.group(&both()).unwrap_err();
    assert!(
        matches!(
            err,
            CgroupError::NoController {
                version: Version::V2,
                controller: "memory",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("memory controller is not available")
    );
    let fake = Fake::v2("memory", "memory");
    let err = Hierarchy::detect(&fake.0)
        .unwrap()
        .group(&both())
        .unwrap_err();
    assert!(matches!(
        err,
        CgroupError::NoController {
            controller: "io",
            ..
        }
    ));
    // Nothing was made.
    let left: Vec<_> = std::fs::read_dir(&fake.0).unwrap().collect();
    assert_eq!(left.len(), 2);
}

#[test]
fn v2_peak_is_memory_peak_or_none() {
    let fake = Fake::v2("memory", "memory");
    let g = Hierarchy::detect(&fake.0)
        .unwrap()
        .group(&Limits {
            memory: Some(MIB800),
            reads: None,
        })
        .unwrap();
    // A kernel before 5.19 has no memory.peak.
    assert_eq!(g.peak(), None);
    let dir = g.join_files()[0].parent().unwrap();
    std::fs::write(dir.join("memory.peak"), "838860800\n").unwrap();
    assert_eq!(g.peak(), Some(838860800));
    assert_eq!(g.version(), Version::V2);
}

#[test]
fn v1_group_writes_its_limits_in_each_hierarchy() {
    let fake = Fake::v1();
    let g = Hierarchy::detect(&fake.0).unwrap().group(&both()).unwrap();
    let [memory, blkio] = g.join_files() else {
        panic!("{:?}", g.join_files())
    };
    let (memory, blkio) = (memory.parent().unwrap(), blkio.parent().unwrap());
    assert_eq!(memory.parent().unwrap(), fake.0.join("memory"));
    assert_eq!(blkio.parent().unwrap(), fake.0.join("blkio"));
    assert_eq!(g.join_files()[0].file_name().unwrap(), "tasks");
    let limit = MIB800.to_string();
    assert_eq!(fake.read(&memory.join("memory.limit_in_bytes")), limit);
    assert_eq!(
        fake.read(&memory.join("memory.memsw.limit_in_bytes")),
        limit
    );
    assert_eq!(fake.read(&memory.join("memory.swappiness")), "0");
    assert_eq!(
        fake.read(&blkio.join("blkio.throttle.read_bps_device")),
        "259:3 1000000000"
    );
    assert_eq!(g.peak(), None);
    std::fs::write(memory.join("memory.max_usage_in_bytes"), "12345\n").unwrap();
    assert_eq!(g.peak(), Some(12345));
}

#[test]
fn v1_without_blkio_says_so() {
    let fake = Fake::new("v1-no-blkio");
    fake.file("memory/memory.limit_in_bytes", "0");
    let h = Hierarchy::detect(&fake.0).unwrap();
    assert!(
        h.group(&Limits {
            memory: Some(1),
            reads: None
        })
        .is_ok()
    );
    let err = h.group(&both()).unwrap_err();
    assert!(matches!(
        err,
        CgroupError::NoController {
            version: Version::V1,
            controller: "blkio",
            ..
        }
    ));
    assert!(err.to_string().contains("blkio"), "{err}");
}

#[test]
fn groups_remove_themselves() {
    let fake = Fake::v2("memory", "memory");
    let g = Hierarchy::detect(&fake.0)
        .unwrap()
        .group(&Limits::default())
        .unwrap();
    let dir = g.join_files()[0].parent().unwrap().to_path_buf();
    assert!(dir.is_dir());
    drop(g);
    assert!(!dir.exists());
}

#[test]
fn the_child_joins_before_it_runs() {
    for fake in [Fake::v2("io memory", ""), Fake::v1()] {
        let g = Hierarchy::detect(&fake.0).unwrap().group(&both()).unwrap();
        // The kernel makes these on mkdir.
        for f in g.join_files() {
            std::fs::write(f, "").unwrap();
        }
        let mut cmd = std::process::Command::new("true");
        g.confine(&mut cmd).unwrap();
        let mut child = cmd.spawn().unwrap();
        let pid = child.id().to_string();
        assert!(child.wait().unwrap().success());
        for f in g.join_files() {
            assert_eq!(std::fs::read_to_string(f).unwrap(), pid, "{}", f.display());
        }
    }
    // A join file that cannot be opened fails the spawn.
    let fake = Fake::v2("memory", "memory");
    let g = Hierarchy::detect(&fake.0).unwrap().group(&both());
    assert!(g.is_err());
    let g = Hierarchy::detect(&fake.0)
        .unwrap()
        .group(&Limits::default())
        .unwrap();
    let mut cmd = std::process::Command::new("true");
    g.confine(&mut cmd).unwrap();
    assert!(cmd.spawn().is_err());
}

#[test]
fn read_cap_names_the_files_device() {
    use std::os::unix::fs::MetadataExt;
    let fake = Fake::new("dev");
    fake.file("f", "x");
    let cap = ReadCap::of_file(&fake.0.join("f"), 7).unwrap();
    let dev = std::fs::metadata(fake.0.join("f")).unwrap().dev();
    assert_eq!(cap.major, libc::major(dev) as u64);
    assert_eq!(cap.minor, libc::minor(dev) as u64);
    assert_eq!(cap.bytes_per_sec, 7);
}

#[test]
fn permission_errors_say_what_is_needed() {
    let err = CgroupError::Io {
        what: "creating",
        path: "/sys/fs/cgroup/x".into(),
        source: io::Error::from_raw_os_error(libc::EACCES),
    };
    let text = err.to_string();
    assert!(text.starts_with("creating /sys/fs/cgroup/x: "), "{text}");
    assert!(text.contains("needs root"), "{text}");
    let err = CgroupError::Io {
        what: "enabling the memory controller in",
        path: "/sys/fs/cgroup/cgroup.subtree_control".into(),
        source: io::Error::from_raw_os_error(libc::EBUSY),
    };
    assert!(err.to_string().contains("holds no processes"), "{err}");
}

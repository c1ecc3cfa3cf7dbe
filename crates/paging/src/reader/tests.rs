//! Tests of [`DirectReader`] on temporary files, through `O_DIRECT` where
//! the file system allows it and through the buffered fallback always.

use std::fs::OpenOptions;
use std::sync::atomic::AtomicUsize;

use super::*;

/// A file in the temp directory, deleted on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn with_pattern(name: &str, len: usize) -> TempFile {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "arbor-paging-{}-{n}-{name}.bin",
            std::process::id()
        ));
        std::fs::write(&path, pattern(len)).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Bytes that differ between neighbouring positions and blocks, so a
/// read from the wrong offset cannot match by accident.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_right(13) as u8)
        .collect()
}

const FILE_LEN: usize = 300_000 + 123; // not a multiple of ALIGN

/// Runs `check` on a reader that tries `O_DIRECT` and on one that never
/// does, so both paths are covered whatever the file system.
fn both_modes(name: &str, check: impl Fn(&DirectReader, &TempFile)) {
    for try_direct in [true, false] {
        let file = TempFile::with_pattern(name, FILE_LEN);
        let reader = DirectReader::open_with(&file.0, try_direct).unwrap();
        if !try_direct {
            assert!(!reader.is_direct());
        }
        check(&reader, &file);
    }
}

#[test]
fn span_covers_range() {
    assert_eq!(DirectReader::span(0, 0), 0);
    assert_eq!(DirectReader::span(4096, 0), 0);
    assert_eq!(DirectReader::span(5, 0), 4096);
    assert_eq!(DirectReader::span(0, 1), 4096);
    assert_eq!(DirectReader::span(0, 4096), 4096);
    assert_eq!(DirectReader::span(4095, 2), 8192);
    assert_eq!(DirectReader::span(4096, 4097), 8192);
    assert_eq!(DirectReader::span(100, 10_000), 12_288);
    // No overflow near the top of the range.
    assert_eq!(DirectReader::span(u64::MAX - 10, 100), 8192);
    assert_eq!(DirectReader::span(u64::MAX, usize::MAX), usize::MAX);
}

#[test]
fn reads_match_file_contents() {
    let expected = pattern(FILE_LEN);
    let cases: &[(u64, usize)] = &[
        (0, 0),
        (4096, 0),
        (777, 0),
        (0, 1),
        (0, 4096),
        (1, 4095),
        (4095, 2),
        (4000, 200),
        (8191, 1),
        (12_345, 67_890),
        (100, FILE_LEN - 100),
        (0, FILE_LEN),
        (FILE_LEN as u64 - 1, 1),
        (FILE_LEN as u64 - 5000, 5000),
        (FILE_LEN as u64, 0),
        (4096 * 70, 4096 * 2),
    ];
    both_modes("contents", |reader, file| {
        assert_eq!(reader.path(), file.0);
        assert_eq!(reader.len(), FILE_LEN as u64);
        assert!(!reader.is_empty());
        let mut buf = AlignedBuf::new(0);
        for &(offset, len) in cases {
            let got = reader.read_into(offset, len, &mut buf).unwrap();
            let start = offset as usize;
            assert_eq!(got.len(), len);
            assert!(
                got == &expected[start..start + len],
                "mismatch at {offset}+{len} (direct: {})",
                reader.is_direct()
            );
            assert!(buf.capacity() >= DirectReader::span(offset, len));
        }
        // A buffer that is already big enough is kept.
        let mut big = AlignedBuf::new(1 << 20);
        let ptr = big.as_slice().as_ptr();
        reader.read_into(10, 100, &mut big).unwrap();
        assert_eq!(big.as_slice().as_ptr(), ptr);
    });
}

#[test]
fn bytes_read_grows() {
    both_modes("stats", |reader, _| {
        assert_eq!(reader.bytes_read(), 0);
        assert_eq!(reader.read_secs(), 0.0);
        let mut buf = AlignedBuf::new(0);
        // The read calls lie inside this window (a monotonic clock), so
        // their summed time cannot exceed it, however long they took.
        let window = std::time::Instant::now();
        reader.read_into(100, 5000, &mut buf).unwrap();
        let after_one = reader.bytes_read();
        assert!(after_one >= 5000, "{after_one}");
        reader.read_into(50_000, 1, &mut buf).unwrap();
        let window = window.elapsed().as_secs_f64();
        assert!(reader.bytes_read() > after_one);
        let secs = reader.read_secs();
        assert!(secs <= window + 1e-9, "{secs} s of reads in {window} s");
    });
}

#[test]
fn reading_past_end_is_truncated() {
    both_modes("past-end", |reader, file| {
        let mut buf = AlignedBuf::new(0);
        let end = FILE_LEN as u64;
        for (offset, len) in [
            (end - 10, 11),
            (end, 1),
            (end + 1, 0),
            (end + 100_000, 10),
            (u64::MAX, 1),
            (u64::MAX - 5, 100),
        ] {
            match reader.read_into(offset, len, &mut buf) {
                Err(PagingError::Truncated {
                    path,
                    offset: o,
                    len: l,
                    file_len,
                }) => {
                    assert_eq!(path, file.0);
                    assert_eq!((o, l, file_len), (offset, len as u64, end));
                }
                other => panic!("{offset}+{len}: expected Truncated, got {other:?}"),
            }
        }
        assert_eq!(reader.bytes_read(), 0);
    });
}

#[test]
fn file_truncated_after_open() {
    let expected = pattern(FILE_LEN);
    both_modes("shrunk", |reader, file| {
        let new_len = 100_000 + 7;
        OpenOptions::new()
            .write(true)
            .open(&file.0)
            .unwrap()
            .set_len(new_len)
            .unwrap();
        assert_eq!(reader.len(), FILE_LEN as u64, "len is as at open");

        let mut buf = AlignedBuf::new(0);
        for (offset, len) in [(200_000, 1000), (new_len - 10, 20), (new_len, 1)] {
            match reader.read_into(offset, len, &mut buf) {
                Err(PagingError::Truncated { file_len, .. }) => {
                    assert_eq!(file_len, new_len, "{offset}+{len}");
                }
                other => panic!("{offset}+{len}: expected Truncated, got {other:?}"),
            }
        }
        // What is still there reads fine, up to the new end.
        for (offset, len) in [(0, 1000), (new_len - 5000, 5000), (99_999, 8)] {
            let got = reader.read_into(offset, len, &mut buf).unwrap();
            let start = offset as usize;
            assert!(got == &expected[start..start + len], "{offset}+{len}");
        }
    });
}

#[test]
fn switches_to_buffered_reads_mid_way() {
    let expected = pattern(FILE_LEN);
    let file = TempFile::with_pattern("fallback", FILE_LEN);
    let reader = DirectReader::open(&file.0).unwrap();
    let mut buf = AlignedBuf::new(0);
    if let Some(direct) = &reader.direct_file {
        // A direct read into a misaligned buffer is refused with EINVAL,
        // like a file system that does not support O_DIRECT reads.
        let mut dst = AlignedBuf::new(2 * ALIGN);
        let misaligned = &mut dst.as_mut_slice()[1..=ALIGN];
        let err = read_at(direct, misaligned, 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(EINVAL));
        assert!(reader.is_direct());
        reader.direct.store(false, Ordering::Relaxed);
    }
    assert!(!reader.is_direct());
    let got = reader.read_into(4000, 10_000, &mut buf).unwrap();
    assert!(got == &expected[4000..14_000]);
}

#[test]
fn shared_between_threads() {
    let expected = pattern(FILE_LEN);
    both_modes("threads", |reader, _| {
        std::thread::scope(|s| {
            for t in 0..4usize {
                let expected = &expected;
                s.spawn(move || {
                    let mut buf = AlignedBuf::new(0);
                    for i in 0..50usize {
                        let offset = (t * 7919 + i * 4099) % (FILE_LEN - 3000);
                        let len = 1 + (i * 37 + t) % 2999;
                        let got = reader.read_into(offset as u64, len, &mut buf).unwrap();
                        assert!(got == &expected[offset..offset + len]);
                    }
                });
            }
        });
        assert!(reader.bytes_read() > 0);
    });
}

#[test]
fn missing_file_is_an_io_error() {
    let path = std::env::temp_dir().join("arbor-paging-does-not-exist.bin");
    match DirectReader::open(&path) {
        Err(PagingError::Io { path: p, source }) => {
            assert_eq!(p, path);
            assert_eq!(source.kind(), io::ErrorKind::NotFound);
        }
        other => panic!("expected Io error, got {other:?}"),
    }
}

#[test]
fn read_through_covers_a_span_and_stops_at_the_end() {
    let f = TempFile::with_pattern("through", FILE_LEN);
    let r = DirectReader::open(&f.0).unwrap();
    r.read_through(r.len(), 4096 * 3).unwrap();
    r.read_through(1000, 1 << 20).unwrap();
    r.read_through(0, 4096).unwrap();
    let err = r.read_through(r.len() + 1, 4096).unwrap_err();
    assert!(matches!(err, PagingError::Truncated { .. }), "{err:?}");
}

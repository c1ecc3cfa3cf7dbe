//! Corrupt, truncated and hostile files: every one must give the fitting
//! `GgufError`, never a panic, and never allocate more than the file could
//! justify.

use arbor_fuzz::alloc::{Allocs, Tracking, allocs_during as allocs_of};
use arbor_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Header, Value, parse_header};

// ---- allocation tracking -------------------------------------------------

#[global_allocator]
static ALLOC: Tracking = Tracking;

/// The work a parse of `len` bytes may do, counted in allocations: every
/// string, array, key and tensor it builds takes at least 8 bytes of the
/// file, and a byte of the file becomes at most one [`Value`] (an array of
/// `u8`), so both the number of allocations and their total size grow at
/// most linearly with the file, whatever its counts and lengths claim. A
/// parse that copied the file per item, or looped over a claimed count,
/// would break these bounds on the larger files below.
fn work_bound(len: usize) -> Allocs {
    Allocs {
        largest: (64 << 10).max(std::mem::size_of::<Value>() * len),
        count: len / 8 + 32,
        bytes: 2 * std::mem::size_of::<Value>() * len + (16 << 10),
    }
}

/// Parses `buf`, asserting that its allocations stayed within
/// [`work_bound`] of its length (for the small files here, none over 64 KiB).
fn parse_small(buf: &[u8]) -> Result<Header, GgufError> {
    let (r, used) = allocs_of(|| parse_header(buf));
    let bound = work_bound(buf.len());
    assert!(
        used.largest <= bound.largest,
        "parse allocated {} bytes at once",
        used.largest
    );
    assert!(
        used.count <= bound.count && used.bytes <= bound.bytes,
        "a parse of {} bytes made {used:?}, more than {bound:?}",
        buf.len()
    );
    r
}

#[test]
fn the_tracker_sees_allocations() {
    let (v, used) = allocs_of(|| Vec::<u8>::with_capacity(1 << 20));
    assert!(used.largest >= 1 << 20 && used.count >= 1 && used.bytes >= 1 << 20);
    drop(v);
    // Work per item claimed rather than per byte present breaks the bound.
    let claimed = 1000;
    let (_, used) = allocs_of(|| (0..claimed).map(|i| vec![i as u8]).collect::<Vec<_>>());
    let bound = work_bound(64);
    assert!(used.count > bound.count, "{used:?} vs {bound:?}");
}

// ---- building files byte by byte ------------------------------------------

/// A GGUF file written field by field, so any field can hold any value.
#[derive(Default, Clone)]
struct Raw(Vec<u8>);

impl Raw {
    /// Magic, version and the two counts.
    fn start(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    /// A key with a `u32` value.
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to 32 and appends `n` data bytes.
    fn data(&mut self, n: usize) -> &mut Self {
        let len = self.0.len().next_multiple_of(32);
        self.0.resize(len + n, 0xab);
        self
    }
    fn bytes(&self) -> Vec<u8> {
        self.0.clone()
    }
}

/// A small valid file touching every part of the format.
fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_meta("general.architecture", Value::String("llama".into()))
        .add_meta("llama.block_count", Value::U32(2))
        .add_meta(
            "tokenizer.ggml.tokens",
            Value::Array(vec![Value::String("a".into()), Value::String("bc".into())]),
        )
        .add_meta("k.f64", Value::F64(0.5))
        .add_meta("k.bool", Value::Bool(true))
        .add_meta(
            "k.nested",
            Value::Array(vec![Value::Array(vec![Value::I16(3)])]),
        )
        .add_tensor_f32("norm", &[3], &[1.0, 2.0, 3.0])
        .add_tensor("w", &[32, 2], GgmlType::Q8_0, vec![1u8; 68]);
    w.to_bytes()
}

fn invalid_containing(r: Result<Header, GgufError>, text: &str) {
    match r {
        Err(GgufError::Invalid(msg)) if msg.contains(text) => {}
        other => panic!("expected Invalid(..{text}..), got {other:?}"),
    }
}

fn truncated_at(r: Result<Header, GgufError>, expect_what: &str) {
    match r {
        Err(GgufError::Truncated { what, .. }) if what == expect_what => {}
        other => panic!("expected Truncated {{ what: {expect_what:?} }}, got {other:?}"),
    }
}

// ---- the cases --------------------------------------------------------------

#[test]
fn the_valid_file_parses() {
    let h = parse_small(&valid_file()).unwrap();
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.metadata.len(), 6);
}

/// Large valid files stay within the linear bound too: the densest
/// values (one byte each), many small keys, many tensors.
#[test]
fn work_grows_with_the_file() {
    let mut r = Raw::start(3, 0, 1);
    r.str("bytes").u32(9).u32(0).u64(20_000);
    r.0.extend(std::iter::repeat_n(7u8, 20_000));
    assert_eq!(parse_small(&r.bytes()).unwrap().metadata.len(), 1);

    let mut r = Raw::start(3, 0, 2_000);
    for i in 0..2_000 {
        r.kv_u32(&format!("k{i}"), i);
    }
    assert_eq!(parse_small(&r.bytes()).unwrap().metadata.len(), 2_000);

    let mut r = Raw::start(3, 500, 0);
    for i in 0..500 {
        r.tensor(&format!("t{i}"), &[8], 0, 32 * i);
    }
    r.data(32 * 500);
    assert_eq!(parse_small(&r.bytes()).unwrap().tensors.len(), 500);
}

#[test]
fn bad_magic() {
    let mut buf = valid_file();
    buf[..4].copy_from_slice(b"GGML");
    assert!(matches!(parse_small(&buf), Err(GgufError::BadMagic(m)) if &m == b"GGML"));
    assert!(matches!(
        parse_small(b"\0\0\0\0\x03\0\0\0"),
        Err(GgufError::BadMagic([0, 0, 0, 0]))
    ));
    // Big-endian GGUF: the version reads as 0x03000000.
    let mut be = valid_file();
    be[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(matches!(
        parse_small(&be),
        Err(GgufError::UnsupportedVersion(0x0300_0000))
    ));
}

#[test]
fn unsupported_versions() {
    for v in [0, 1, 4, u32::MAX] {
        let mut buf = valid_file();
        buf[4..8].copy_from_slice(&v.to_le_bytes());
        assert!(
            matches!(parse_small(&buf), Err(GgufError::UnsupportedVersion(x)) if x == v),
            "version {v}"
        );
    }
    // Version 2 has the same layout as 3.
    let mut buf = valid_file();
    buf[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(parse_small(&buf).unwrap().version, 2);
}

#[test]
fn every_prefix_is_truncated() {
    let buf = valid_file();
    let h = parse_small(&buf).unwrap();
    let end = h
        .tensors
        .iter()
        .map(|t| h.data_offset + t.offset + t.size)
        .max()
        .unwrap();
    for len in 0..buf.len() {
        let r = parse_small(&buf[..len]);
        if (len as u64) < end {
            assert!(
                matches!(r, Err(GgufError::Truncated { .. })),
                "prefix {len}: {r:?}"
            );
        } else {
            // Only the padding after the last tensor is missing.
            assert!(r.is_ok(), "prefix {len}: {r:?}");
        }
    }
}

#[test]
fn every_byte_changed_never_panics() {
    let buf = valid_file();
    let h = parse_small(&buf).unwrap();
    for i in 0..h.data_offset as usize {
        for v in [0x00, 0x01, 0x7f, 0x80, 0xff, buf[i] ^ 0x20] {
            let mut b = buf.clone();
            b[i] = v;
            let _ = parse_small(&b);
        }
    }
}

#[test]
fn absurd_tensor_and_key_counts() {
    truncated_at(
        parse_small(&Raw::start(3, 1 << 60, 0).bytes()),
        "tensor count",
    );
    truncated_at(
        parse_small(&Raw::start(3, u64::MAX, 0).bytes()),
        "tensor count",
    );
    truncated_at(
        parse_small(&Raw::start(3, 0, 1 << 63).bytes()),
        "metadata count",
    );
    truncated_at(
        parse_small(&Raw::start(3, 0, u64::MAX).bytes()),
        "metadata count",
    );
    // More tensors than the rest of the file could describe.
    let mut r = Raw::start(3, 3, 0);
    r.tensor("a", &[1], 0, 0).data(4);
    truncated_at(parse_small(&r.bytes()), "tensor count");
}

#[test]
fn absurd_string_lengths() {
    for len in [1 << 63, u64::MAX, 1 << 32] {
        let mut r = Raw::start(3, 0, 1);
        r.u64(len).0.extend_from_slice(b"key and some more bytes");
        truncated_at(parse_small(&r.bytes()), "metadata key");

        let mut r = Raw::start(3, 0, 1);
        r.str("k").u32(8).u64(len).u64(0);
        truncated_at(parse_small(&r.bytes()), "metadata string");

        let mut r = Raw::start(3, 1, 0);
        r.u64(len).u32(1).u64(1).u32(0).u64(0);
        truncated_at(parse_small(&r.bytes()), "tensor name");
    }
}

#[test]
fn absurd_array_lengths() {
    // Items of every type, with lengths that overflow or merely exceed the
    // file, at the top level and nested.
    for item_ty in [0u32, 4, 8, 9, 10, 12] {
        for len in [u64::MAX, 1 << 62, 1 << 40, 1000] {
            let mut r = Raw::start(3, 0, 1);
            r.str("a").u32(9).u32(item_ty).u64(len).u64(0).u64(0);
            truncated_at(parse_small(&r.bytes()), "metadata array");

            let mut r = Raw::start(3, 0, 1);
            r.str("a").u32(9).u32(9).u64(1).u32(item_ty).u64(len).u64(0);
            truncated_at(parse_small(&r.bytes()), "metadata array");
        }
    }
    // Nested arrays each claiming the rest of the file.
    let mut r = Raw::start(3, 0, 1);
    r.str("a").u32(9);
    for _ in 0..4 {
        r.u32(9).u64(1);
    }
    r.u32(0).u64(1 << 50);
    assert!(parse_small(&r.bytes()).is_err());
}

#[test]
fn absurd_dimensions() {
    let too_many = |n_dims: u32| {
        let mut r = Raw::start(3, 1, 0);
        r.str("t").u32(n_dims).u64(1).u32(0).u64(0).data(4);
        parse_small(&r.bytes())
    };
    invalid_containing(too_many(0), "dimensions");
    invalid_containing(too_many(5), "dimensions");
    invalid_containing(too_many(u32::MAX), "dimensions");

    let dims = |dims: &[u64], ty: u32| {
        let mut r = Raw::start(3, 1, 0);
        r.tensor("t", dims, ty, 0).data(64);
        parse_small(&r.bytes())
    };
    invalid_containing(dims(&[1 << 32, 1 << 32], 0), "bad dimensions");
    invalid_containing(dims(&[4, 0], 0), "bad dimensions");
    invalid_containing(dims(&[16], 8), "block length");
    // Fits in u64, but not in the file.
    truncated_at(dims(&[1 << 40, 1 << 20], 0), "tensor data");
    // Element count fits, byte count does not.
    invalid_containing(dims(&[1 << 62], 0), "too large");
}

#[test]
fn tensor_offsets() {
    let file = |offsets: &[(u64, u64)]| {
        // (offset, f32 element count) per tensor; 256 data bytes.
        let mut r = Raw::start(3, offsets.len() as u64, 0);
        for (i, &(off, n)) in offsets.iter().enumerate() {
            r.tensor(&format!("t{i}"), &[n], 0, off);
        }
        r.data(256);
        parse_small(&r.bytes())
    };
    assert!(file(&[(0, 8), (32, 8), (224, 8)]).is_ok());
    truncated_at(file(&[(256, 1)]), "tensor data");
    truncated_at(file(&[(224, 9)]), "tensor data");
    truncated_at(file(&[(u64::MAX - 31, 8)]), "tensor data");
    invalid_containing(file(&[(0, 9), (32, 8)]), "overlap");
    invalid_containing(file(&[(64, 8), (0, 32)]), "overlap");
    invalid_containing(file(&[(32, 1), (32, 1)]), "overlap");
    invalid_containing(file(&[(4, 1)]), "not aligned");
    invalid_containing(file(&[(0, 1), (33, 1)]), "not aligned");
}

#[test]
fn unknown_value_types() {
    for ty in [13, 14, 100, u32::MAX] {
        let mut r = Raw::start(3, 0, 1);
        r.str("k").u32(ty).u64(0);
        assert!(
            matches!(parse_small(&r.bytes()), Err(GgufError::UnknownValueType(t)) if t == ty),
            "value type {ty}"
        );
        let mut r = Raw::start(3, 0, 1);
        r.str("k").u32(9).u32(ty).u64(1).u64(0);
        assert!(
            matches!(parse_small(&r.bytes()), Err(GgufError::UnknownValueType(t)) if t == ty),
            "array item type {ty}"
        );
    }
}

#[test]
fn unknown_tensor_types() {
    // 4 and 5 were removed from ggml; 16.. are IQ and other types arbor
    // does not read.
    for ty in [4u32, 5, 16, 29, 31, 39, 1000, u32::MAX] {
        let mut r = Raw::start(3, 1, 0);
        r.tensor("t", &[256], ty, 0).data(1024);
        match parse_small(&r.bytes()) {
            Err(GgufError::UnsupportedTensorType { name, ty: shown }) => {
                assert_eq!(name, "t");
                assert_eq!(shown, format!("#{ty}"));
            }
            other => panic!("type {ty}: {other:?}"),
        }
    }
}

#[test]
fn duplicates() {
    let mut r = Raw::start(3, 0, 2);
    r.kv_u32("a", 1).kv_u32("a", 2);
    invalid_containing(parse_small(&r.bytes()), "duplicate metadata key `a`");

    let mut r = Raw::start(3, 2, 0);
    r.tensor("t", &[1], 0, 0).tensor("t", &[1], 0, 32).data(64);
    invalid_containing(parse_small(&r.bytes()), "duplicate tensor name `t`");
}

#[test]
fn bad_values() {
    let mut r = Raw::start(3, 0, 1);
    r.str("b").u32(7).u8(2);
    invalid_containing(parse_small(&r.bytes()), "boolean");

    let mut r = Raw::start(3, 0, 1);
    r.u64(2).u8(0xff).u8(0xfe).u32(4).u32(0);
    invalid_containing(parse_small(&r.bytes()), "UTF-8");

    let mut r = Raw::start(3, 0, 1);
    r.str("deep").u32(9);
    for _ in 0..5 {
        r.u32(9).u64(1);
    }
    r.u32(0).u64(1).u8(0);
    invalid_containing(parse_small(&r.bytes()), "nested");
}

#[test]
fn bad_alignment() {
    for a in [0u32, 3, 48, 1 << 21] {
        let mut r = Raw::start(3, 0, 1);
        r.kv_u32("general.alignment", a);
        invalid_containing(parse_small(&r.bytes()), "alignment");
    }
    let mut r = Raw::start(3, 0, 1);
    r.str("general.alignment").u32(8).str("32");
    invalid_containing(parse_small(&r.bytes()), "alignment");
    // A valid unusual alignment moves the data section.
    let mut r = Raw::start(3, 1, 1);
    r.kv_u32("general.alignment", 256).tensor("t", &[1], 0, 0);
    r.0.resize(256 + 4, 0);
    assert_eq!(parse_small(&r.bytes()).unwrap().data_offset, 256);
}

#[test]
fn accessor_errors() {
    let h = parse_small(&valid_file()).unwrap();
    assert!(matches!(h.get_str("nope"), Err(GgufError::MissingKey(k)) if k == "nope"));
    assert!(matches!(
        h.get_u64("general.architecture"),
        Err(GgufError::WrongType {
            expected: "unsigned integer",
            found: "string",
            ..
        })
    ));
    assert!(matches!(
        h.get_str_array("k.nested"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(h.tensor("nope"), Err(GgufError::MissingTensor(_))));
    assert_eq!(
        h.get_str_array("tokenizer.ggml.tokens").unwrap(),
        ["a", "bc"]
    );
}

#[test]
fn files_on_disk() {
    let dir = std::env::temp_dir();
    let missing = dir.join("arbor-gguf-corrupt-missing.gguf");
    assert!(matches!(
        GgufFile::open(&missing),
        Err(GgufError::Io { .. })
    ));

    let empty = dir.join(format!(
        "arbor-gguf-corrupt-empty-{}.gguf",
        std::process::id()
    ));
    std::fs::write(&empty, b"").unwrap();
    let r = GgufFile::open(&empty);
    std::fs::remove_file(&empty).unwrap();
    assert!(
        matches!(r, Err(GgufError::Truncated { what: "magic", .. })),
        "{r:?}"
    );

    let short = dir.join(format!(
        "arbor-gguf-corrupt-short-{}.gguf",
        std::process::id()
    ));
    let buf = valid_file();
    std::fs::write(&short, &buf[..buf.len() - 40]).unwrap();
    let r = GgufFile::open(&short);
    std::fs::remove_file(&short).unwrap();
    assert!(
        matches!(
            r,
            Err(GgufError::Truncated {
                what: "tensor data",
                ..
            })
        ),
        "{r:?}"
    );
}

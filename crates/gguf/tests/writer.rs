//! GgufWriter → parse_header round trips.

use std::collections::BTreeMap;

use arbor_gguf::{
    GgmlType, GgufError, GgufFile, GgufWriter, Header, Value, dequantize, parse_header,
};

fn every_kind() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String("llama".into())),
        ("k.u8", Value::U8(200)),
        ("k.i8", Value::I8(-100)),
        ("k.u16", Value::U16(60000)),
        ("k.i16", Value::I16(-30000)),
        ("k.u32", Value::U32(4_000_000_000)),
        ("k.i32", Value::I32(-2_000_000_000)),
        ("k.u64", Value::U64(u64::MAX)),
        ("k.i64", Value::I64(i64::MIN)),
        ("k.f32", Value::F32(-1.5e-3)),
        ("k.f64", Value::F64(std::f64::consts::PI)),
        ("k.true", Value::Bool(true)),
        ("k.false", Value::Bool(false)),
        ("k.empty_string", Value::String(String::new())),
        ("k.unicode", Value::String("Ġhello ▁wörld 🦀".into())),
        (
            "tokenizer.ggml.tokens",
            Value::Array(vec![
                Value::String("<s>".into()),
                Value::String("a".into()),
                Value::String(String::new()),
            ]),
        ),
        (
            "tokenizer.ggml.scores",
            Value::Array(vec![Value::F32(0.0), Value::F32(-1.25)]),
        ),
        ("k.i32s", Value::Array(vec![Value::I32(1), Value::I32(-2)])),
        ("k.empty_array", Value::Array(vec![])),
        (
            "k.nested",
            Value::Array(vec![
                Value::Array(vec![Value::U8(1), Value::U8(2)]),
                Value::Array(vec![Value::String("x".into())]),
                Value::Array(vec![]),
            ]),
        ),
    ]
}

/// Pseudo-random bytes.
fn noise(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        })
        .collect()
}

fn tensor_data<'a>(h: &Header, buf: &'a [u8], name: &str) -> &'a [u8] {
    let t = h.tensor(name).unwrap();
    let start = (h.data_offset + t.offset) as usize;
    &buf[start..start + t.size as usize]
}

#[test]
fn metadata_and_tensors_round_trip() {
    let mut w = GgufWriter::new();
    for (k, v) in every_kind() {
        w.add_meta(k, v);
    }
    let f32s: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 3.0).collect();
    let q4k = noise(2 * 144, 1);
    let q8 = noise(3 * 34, 2);
    w.add_tensor_f32("a.weight", &[4, 3], &f32s)
        .add_tensor("q4k", &[256, 2], GgmlType::Q4_K, q4k.clone())
        .add_tensor("norm", &[3], GgmlType::F32, noise(12, 3))
        .add_tensor("q8", &[32, 1, 3, 1], GgmlType::Q8_0, q8.as_slice())
        .add_tensor_f16("half", &[5], &[1.0, -2.0, 0.5, 65504.0, 0.0])
        .add_tensor_bf16("brain", &[2], &[1.5, -256.0]);
    let buf = w.to_bytes();
    let h = parse_header(&buf).unwrap();

    assert_eq!(h.version, 3);
    assert_eq!(h.alignment, 32);
    let want: BTreeMap<String, Value> = every_kind()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(h.metadata, want);

    let names: Vec<_> = h.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a.weight", "q4k", "norm", "q8", "half", "brain"]);
    assert_eq!(h.tensor("q8").unwrap().dims, [32, 1, 3, 1]);
    assert_eq!(h.tensor("q4k").unwrap().ty, GgmlType::Q4_K);
    assert_eq!(h.data_offset % 32, 0);
    for t in &h.tensors {
        assert_eq!(t.offset % 32, 0, "{}", t.name);
    }
    assert_eq!(tensor_data(&h, &buf, "q4k"), q4k);
    assert_eq!(tensor_data(&h, &buf, "q8"), q8);
    let a = tensor_data(&h, &buf, "a.weight");
    assert_eq!(dequantize(GgmlType::F32, a, 12).unwrap(), f32s);
    let half = dequantize(GgmlType::F16, tensor_data(&h, &buf, "half"), 5).unwrap();
    assert_eq!(half, [1.0, -2.0, 0.5, 65504.0, 0.0]);
    let brain = dequantize(GgmlType::BF16, tensor_data(&h, &buf, "brain"), 2).unwrap();
    assert_eq!(brain, [1.5, -256.0]);
    // The file ends with the last tensor, padded to the alignment.
    let last = h.tensors.last().unwrap();
    assert_eq!(
        buf.len() as u64,
        h.data_offset + (last.offset + last.size).next_multiple_of(32)
    );
}

#[test]
fn custom_alignment() {
    for align in [1u32, 8, 64, 4096] {
        let mut w = GgufWriter::new();
        w.alignment(align)
            .add_tensor_f32("x", &[3], &[1.0, 2.0, 3.0])
            .add_tensor_f32("y", &[1], &[4.0]);
        let buf = w.to_bytes();
        let h = parse_header(&buf).unwrap();
        assert_eq!(h.alignment, u64::from(align));
        assert_eq!(h.get("general.alignment"), Some(&Value::U32(align)));
        assert_eq!(h.data_offset % u64::from(align), 0);
        assert_eq!(
            h.tensor("y").unwrap().offset,
            12u64.next_multiple_of(align.into())
        );
        assert_eq!(tensor_data(&h, &buf, "y"), 4.0f32.to_le_bytes());
    }
}

#[test]
fn empty_file() {
    let h = parse_header(&GgufWriter::new().to_bytes()).unwrap();
    assert!(h.metadata.is_empty() && h.tensors.is_empty());
}

#[test]
fn adding_a_key_again_replaces_it() {
    let mut w = GgufWriter::new();
    w.add_meta("a", Value::U8(1))
        .add_meta("b", Value::U8(2))
        .add_meta("a", Value::String("again".into()));
    let h = parse_header(&w.to_bytes()).unwrap();
    assert_eq!(h.metadata.len(), 2);
    assert_eq!(h.get_str("a").unwrap(), "again");
}

#[test]
fn write_and_open() {
    let path = std::env::temp_dir().join(format!("arbor-gguf-writer-{}.gguf", std::process::id()));
    let mut w = GgufWriter::new();
    w.add_meta("general.architecture", Value::String("qwen2".into()))
        .add_tensor_f32(
            "token_embd.weight",
            &[2, 3],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        );
    w.write(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(file.header().architecture().unwrap(), "qwen2");
    assert_eq!(
        file.tensor_f32("token_embd.weight").unwrap(),
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    assert!(
        w.write(std::env::temp_dir().join("no/such/dir/x.gguf"))
            .is_err()
    );
}

#[test]
fn tensors_read_past_the_map_are_their_bytes() {
    let path = std::env::temp_dir().join(format!("arbor-gguf-read-{}.gguf", std::process::id()));
    let mut w = GgufWriter::new();
    let q8 = noise(5 * 34, 9);
    w.add_meta("general.architecture", Value::String("qwen2".into()))
        .add_tensor_f16("half", &[3], &[1.0, -2.0, 0.5])
        .add_tensor("q8", &[32, 5], GgmlType::Q8_0, q8.as_slice());
    w.write(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    for t in &file.header().tensors {
        let mut out = vec![0u8; t.size as usize];
        file.read_tensor(t, &mut out).unwrap();
        assert_eq!(out, file.tensor_bytes(t), "{}", t.name);
    }
    let q8_info = file.header().tensor("q8").unwrap();
    assert!(matches!(
        file.read_tensor(q8_info, &mut [0u8; 3]),
        Err(GgufError::Invalid(_))
    ));
}

#[test]
#[should_panic(expected = "need")]
fn data_must_match_dims() {
    GgufWriter::new().add_tensor_f32("x", &[4], &[1.0, 2.0]);
}

#[test]
#[should_panic(expected = "block length")]
fn rows_must_be_whole_blocks() {
    GgufWriter::new().add_tensor("x", &[16], GgmlType::Q8_0, vec![0u8; 17]);
}

#[test]
#[should_panic(expected = "added twice")]
fn tensor_names_are_unique() {
    GgufWriter::new()
        .add_tensor_f32("x", &[1], &[1.0])
        .add_tensor_f32("x", &[1], &[1.0]);
}

#[test]
#[should_panic(expected = "one type")]
fn arrays_have_one_item_type() {
    GgufWriter::new().add_meta("a", Value::Array(vec![Value::U8(1), Value::I8(1)]));
}

#[test]
#[should_panic(expected = "nested")]
fn arrays_nest_at_most_four_deep() {
    let mut v = Value::U8(0);
    for _ in 0..5 {
        v = Value::Array(vec![v]);
    }
    GgufWriter::new().add_meta("a", v);
}

#[test]
fn four_levels_of_arrays_are_fine() {
    let mut v = Value::U8(7);
    for _ in 0..4 {
        v = Value::Array(vec![v]);
    }
    let mut w = GgufWriter::new();
    w.add_meta("deep", v.clone());
    assert_eq!(parse_header(&w.to_bytes()).unwrap().get("deep"), Some(&v));
}

/// A file written a tensor at a time is the file built in memory, and
/// bytes of the wrong length are refused.
#[test]
fn tensors_given_later_write_the_same_file() {
    let q = arbor_gguf::quantize_q8_0(&(0..64).map(|i| i as f32 / 7.0).collect::<Vec<_>>());
    let f: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let mut whole = GgufWriter::new();
    whole
        .add_meta("general.architecture", Value::String("llama".into()))
        .alignment(64)
        .add_tensor("a", &[32, 2], GgmlType::Q8_0, q.clone())
        .add_tensor_f32("b", &[3, 2], &f);
    let mut later = GgufWriter::new();
    later
        .add_meta("general.architecture", Value::String("llama".into()))
        .alignment(64)
        .add_tensor_later("a", &[32, 2], GgmlType::Q8_0)
        .add_tensor_f32("b", &[3, 2], &f);
    let dir = std::env::temp_dir();
    let path = dir.join(format!("arbor-writer-later-{}.gguf", std::process::id()));
    let mut asked = Vec::new();
    later
        .write_with(&path, &mut |name: &str| -> Result<Vec<u8>, GgufError> {
            asked.push(name.to_string());
            Ok(q.clone())
        })
        .unwrap();
    assert_eq!(asked, ["a"]);
    assert_eq!(std::fs::read(&path).unwrap(), whole.to_bytes());
    let e = later
        .write_with(&path, &mut |_: &str| -> Result<Vec<u8>, GgufError> {
            Ok(vec![0; 3])
        })
        .unwrap_err();
    assert!(e.to_string().contains("3 bytes given"), "{e}");
    assert!(!path.exists(), "a failed write leaves no file");
    // Without the callback a tensor given later is an error, not a panic.
    assert!(later.write(&path).is_err());
    std::fs::remove_file(path).ok();
}

//! The GGUF reader fuzzed: header, metadata, tensor index and every quant
//! type's block sizes. Inputs are the committed seeds
//! (`fuzz/seeds/gguf_header`), every input that ever failed
//! (`fuzz/regressions/gguf_header`), files generated with `GgufWriter`
//! (every metadata kind, tensors of every type with random shapes) and
//! byte-level mutations of all of these. Whatever the reader accepts must
//! be fully usable: every tensor decodes whole and by rows, wrong sizes
//! give typed errors, and the file survives a round trip through
//! `GgufWriter`. No input may panic or allocate out of proportion to its
//! size. `cargo test` runs a fixed number of inputs; CI's fuzzing step
//! runs for a time budget (see the `arbor-fuzz` crate).

use arbor_fuzz::{Fuzzer, Rng, alloc, outcome, repo_path};
use arbor_gguf::{
    GgmlType, GgufError, GgufWriter, Header, Value, dequantize, dequantize_rows, parse_header,
};

#[global_allocator]
static ALLOC: alloc::Tracking = alloc::Tracking;

/// At most this many elements are decoded per input.
const ELEMENT_BUDGET: usize = 1 << 18;

/// The most one allocation of the parser may take for an input of `len`
/// bytes: a metadata array of one-byte items holds one `Value` per byte.
fn parse_alloc_limit(len: usize) -> usize {
    (64 << 10) + len * size_of::<Value>()
}

#[test]
fn fuzz_gguf_header() {
    let report = Fuzzer::new("gguf_header")
        .seeds_from(repo_path("fuzz/seeds/gguf_header"))
        .regressions_from(repo_path("fuzz/regressions/gguf_header"))
        .dictionary(DICTIONARY)
        .max_len(16 << 10)
        .execs(3000)
        .generator(generate)
        .run(check);
    assert!(report.outcomes > 20, "{report}");
}

/// Words of the format: the magic, type codes, key names.
const DICTIONARY: &[&[u8]] = &[
    b"GGUF",
    b"general.alignment",
    b"general.architecture",
    b"tokenizer.ggml.tokens",
    &[3, 0, 0, 0],
    &[9, 0, 0, 0],
    &[8, 0, 0, 0],
    &[12, 0, 0, 0],
    &[30, 0, 0, 0],
    &[0, 1, 0, 0, 0, 0, 0, 0],
    &[255, 255, 255, 255, 255, 255, 255, 255],
];

/// Parses `data`; for what it accepts, decodes and rewrites everything.
fn check(data: &[u8]) -> u64 {
    let (parsed, largest) = alloc::largest_during(|| parse_header(data));
    assert!(
        largest <= parse_alloc_limit(data.len()),
        "parsing {} bytes allocated {largest} bytes at once",
        data.len()
    );
    let header = match parsed {
        Ok(h) => h,
        Err(e) => return outcome(error_class(&e)),
    };
    let mut budget = ELEMENT_BUDGET;
    let mut types = Vec::new();
    for t in &header.tensors {
        types.push(t.ty.to_u32());
        let n = usize::try_from(t.n_elements()).unwrap();
        let start = usize::try_from(header.data_offset + t.offset).unwrap();
        let bytes = &data[start..start + t.size as usize];
        assert_eq!(t.ty.bytes_for(t.n_elements()), Some(t.size));
        if n > budget {
            continue;
        }
        budget -= n;
        decodes(t.ty, bytes, n, t.dims[0] as usize);
    }
    round_trip(&header, data);
    types.sort_unstable();
    types.dedup();
    let mut kinds: Vec<&str> = header.metadata.values().map(Value::type_name).collect();
    kinds.sort_unstable();
    kinds.dedup();
    // Coarse on purpose: the shape of what parsed, not its every detail
    // (one outcome per type combination would fill the corpus at once).
    outcome((
        "ok",
        types.len().min(4),
        kinds.len().min(6),
        header.tensors.len().min(4),
        header.alignment == arbor_gguf::DEFAULT_ALIGNMENT,
    ))
}

/// An error's kind: its variant, what was being read when the file ran
/// out, or the plain words of an `Invalid` message (numbers and names,
/// which come from the file, left out: one outcome per kind of failure).
fn error_class(e: &GgufError) -> String {
    let debug = format!("{e:?}");
    let variant: String = debug
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    match e {
        GgufError::Truncated { what, .. } => format!("{variant} {what}"),
        GgufError::Invalid(msg) => {
            let words = msg
                .split_whitespace()
                .filter(|w| w.chars().all(|c| c.is_ascii_lowercase()))
                .take(4);
            format!("{variant} {}", words.collect::<Vec<_>>().join(" "))
        }
        _ => variant,
    }
}

/// A tensor that parsed decodes whole and by rows, and the decoders refuse
/// sizes that are off by any amount with a typed error.
fn decodes(ty: GgmlType, bytes: &[u8], n: usize, row_len: usize) {
    let all = dequantize(ty, bytes, n).expect("a checked tensor decodes");
    assert_eq!(all.len(), n);
    let last = n / row_len - 1;
    let rows = dequantize_rows(ty, bytes, row_len, &[last, 0]).expect("rows decode");
    assert_eq!(bits(&rows[..row_len]), bits(&all[last * row_len..]));
    assert_eq!(bits(&rows[row_len..]), bits(&all[..row_len]));
    assert!(matches!(
        dequantize_rows(ty, bytes, row_len, &[last + 1]),
        Err(GgufError::RowOutOfRange { .. })
    ));
    let block = ty.block_len();
    assert!(matches!(
        dequantize(ty, &bytes[1..], n),
        Err(GgufError::DataLength { .. })
    ));
    assert!(matches!(
        dequantize(ty, bytes, n + block),
        Err(GgufError::DataLength { .. })
    ));
    if block > 1 {
        assert!(matches!(
            dequantize(ty, bytes, n - 1),
            Err(GgufError::PartialBlock { .. })
        ));
        assert!(matches!(
            dequantize_rows(ty, bytes, row_len + 1, &[0]),
            Err(GgufError::PartialBlock { .. })
        ));
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn rewrite(header: &Header, data: &[u8]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in &header.metadata {
        w.add_meta(k.as_str(), v.clone());
    }
    for t in &header.tensors {
        let start = (header.data_offset + t.offset) as usize;
        w.add_tensor(
            t.name.as_str(),
            &t.dims,
            t.ty,
            &data[start..start + t.size as usize],
        );
    }
    w.to_bytes()
}

/// Writing what was read and reading it back gives the same file again.
fn round_trip(header: &Header, data: &[u8]) {
    let once = rewrite(header, data);
    let again = parse_header(&once).expect("the writer's output parses");
    assert_eq!(again.tensors.len(), header.tensors.len());
    assert_eq!(again.metadata.len(), header.metadata.len());
    assert_eq!(rewrite(&again, &once), once);
}

// ---- regressions ------------------------------------------------------------

/// Found by the generator: `general.alignment` = 2^47 (a power of two, so
/// the writer took it) made `GgufWriter::to_bytes` pad the file to 2^47
/// bytes, aborting the process; 2^21 wrote a file the reader refuses. The
/// writer now takes exactly the alignments the reader does.
#[test]
fn the_writer_takes_only_alignments_the_reader_reads() {
    for bad in [
        Value::U64(1 << 47),
        Value::U64(1 << 21),
        Value::U32(0),
        Value::U32(48),
        Value::I32(-32),
        Value::String("32".into()),
    ] {
        let r = std::panic::catch_unwind(|| {
            GgufWriter::new().add_meta("general.alignment", bad.clone());
        });
        assert!(r.is_err(), "{bad:?} was taken");
    }
    let mut w = GgufWriter::new();
    w.add_meta("general.alignment", Value::U64(1 << 20))
        .add_tensor_f32("t", &[1], &[1.0]);
    let h = parse_header(&w.to_bytes()).unwrap();
    assert_eq!((h.alignment, h.data_offset), (1 << 20, 1 << 20));
}

// ---- generation -------------------------------------------------------------

const KEYS: &[&str] = &[
    "general.architecture",
    "general.name",
    "llama.block_count",
    "llama.context_length",
    "qwen2.embedding_length",
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.chat_template",
];

/// A valid file of random shape: a few keys of every value kind (arrays
/// nested up to the reader's limit), a few tensors of random types and
/// dimensions with random bytes, sometimes an unusual alignment.
fn generate(rng: &mut Rng) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for i in 0..rng.small(6) {
        let key = match rng.one_in(2) {
            true => rng.pick(KEYS).to_string(),
            false => format!("k{i}"),
        };
        w.add_meta(key, value(rng, 0));
    }
    if rng.one_in(4) {
        w.alignment(1 << rng.below(12));
    }
    for i in 0..rng.small(5) {
        let ty = *rng.pick(&GgmlType::ALL);
        let mut dims = vec![(ty.block_len() * rng.range(1, 3)) as u64];
        for _ in 0..rng.small(3) {
            dims.push(rng.range(1, 3) as u64);
        }
        let n: u64 = dims.iter().product();
        let bytes = rng.bytes(ty.bytes_for(n).unwrap() as usize);
        w.add_tensor(format!("t{i}.{ty}"), &dims, ty, bytes);
    }
    w.to_bytes()
}

fn value(rng: &mut Rng, depth: usize) -> Value {
    match rng.below(if depth < 3 { 14 } else { 13 }) {
        0 => Value::U8(rng.next_u64() as u8),
        1 => Value::I8(rng.next_u64() as i8),
        2 => Value::U16(rng.next_u64() as u16),
        3 => Value::I16(rng.next_u64() as i16),
        4 => Value::U32(rng.interesting_u64() as u32),
        5 => Value::I32(rng.interesting_u64() as i32),
        6 => Value::U64(rng.interesting_u64()),
        7 => Value::I64(rng.interesting_u64() as i64),
        8 => Value::F32(f32::from_bits(rng.next_u64() as u32)),
        9 => Value::F64(f64::from_bits(rng.next_u64())),
        10 => Value::Bool(rng.one_in(2)),
        11 | 12 => Value::String(text(rng)),
        _ => {
            // Arrays hold one type: the first item's kind, repeated.
            let first = value(rng, depth + 1);
            let items = (0..rng.small(4))
                .map(|_| same_kind(rng, &first, depth + 1))
                .collect();
            Value::Array(items)
        }
    }
}

/// Another value of `like`'s kind.
fn same_kind(rng: &mut Rng, like: &Value, depth: usize) -> Value {
    for _ in 0..64 {
        let v = value(rng, depth);
        if v.type_name() == like.type_name() {
            return v;
        }
    }
    like.clone()
}

fn text(rng: &mut Rng) -> String {
    let pieces = ["", "a", "é", "<|im_start|>", "\0", "{{", "\u{10ffff}", " "];
    (0..rng.small(6)).map(|_| *rng.pick(&pieces)).collect()
}

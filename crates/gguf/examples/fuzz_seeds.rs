//! Writes small GGUF files made with `GgufWriter` into a directory, as the
//! seed corpus of the `gguf_header` fuzz target:
//! `cargo run -p arbor-gguf --example fuzz_seeds -- fuzz/seeds/gguf_header`.
//! (No `.gguf` extension: the repository ignores `*.gguf`.)

use arbor_gguf::{GgmlType, GgufWriter, Value};

/// Pseudo-random bytes (xorshift64).
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: fuzz_seeds DIR")?;
    std::fs::create_dir_all(&dir)?;
    let write = |name: &str, w: &GgufWriter| w.write(format!("{dir}/{name}"));

    // One block of every tensor type, and a value of every metadata kind.
    let mut w = GgufWriter::new();
    w.add_meta("general.architecture", Value::String("llama".into()))
        .add_meta("u8", Value::U8(1))
        .add_meta("i8", Value::I8(-1))
        .add_meta("u16", Value::U16(2))
        .add_meta("i16", Value::I16(-2))
        .add_meta("u32", Value::U32(3))
        .add_meta("i32", Value::I32(-3))
        .add_meta("u64", Value::U64(4))
        .add_meta("i64", Value::I64(-4))
        .add_meta("f32", Value::F32(0.5))
        .add_meta("f64", Value::F64(-0.25))
        .add_meta("bool", Value::Bool(true))
        .add_meta(
            "tokens",
            Value::Array(vec![Value::String("a".into()), Value::String("b".into())]),
        )
        .add_meta(
            "nested",
            Value::Array(vec![
                Value::Array(vec![Value::I32(1)]),
                Value::Array(vec![]),
            ]),
        );
    for (i, ty) in GgmlType::ALL.into_iter().enumerate() {
        let bytes = noise(ty.block_bytes(), i as u64 + 1);
        w.add_tensor(format!("t.{ty}"), &[ty.block_len() as u64], ty, bytes);
    }
    write("all_types", &w)?;

    // A two-layer toy model shaped like the real ones, in F32 and F16.
    let mut w = GgufWriter::new();
    w.add_meta("general.architecture", Value::String("qwen2".into()))
        .add_meta("qwen2.block_count", Value::U32(1))
        .add_meta("qwen2.embedding_length", Value::U32(8));
    let x: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) / 16.0).collect();
    w.add_tensor_f32("token_embd.weight", &[8, 4], &x[..32])
        .add_tensor_f16("blk.0.attn_q.weight", &[8, 8], &x)
        .add_tensor_f32("blk.0.attn_q.bias", &[8], &x[..8])
        .add_tensor_bf16("output_norm.weight", &[8], &x[8..16]);
    write("toy_model", &w)?;

    // Unusual alignment and a multi-dimensional quantized tensor.
    let mut w = GgufWriter::new();
    w.alignment(1)
        .add_tensor("q", &[32, 2, 1, 2], GgmlType::Q8_0, noise(4 * 34, 99))
        .add_tensor("k", &[256, 1], GgmlType::Q4_K, noise(144, 98));
    write("align1", &w)?;

    write("empty", &GgufWriter::new())?;
    Ok(())
}

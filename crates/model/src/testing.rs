//! Tiny random models as GGUF files, for tests of everything that runs a
//! model: caches, masks, backends, and speculative decoding, where
//! deliberately good or bad drafts are needed; and an in-memory
//! [`RowSource`] ([`MemoryRows`]) for decoders whose embedding rows are not
//! resident; [`Turns`], provisional generation without thread timing.

use arbor_gguf::{GgmlType, GgufWriter, Value, quantize_q8_0};

mod turns;
pub use turns::{Drafting, Turns};

use crate::{Layout, ModelError, Result, RowSource};

/// The shape of a random model.
#[derive(Debug, Clone)]
pub struct TinyModel {
    /// `llama` or `qwen2` (qwen2 adds Q/K/V biases and rotates halves).
    pub arch: &'static str,
    pub vocab: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    pub layers: usize,
    /// Storage of the matrices: F32, F16, Q8_0, or Q4_K for Q4_K_M's
    /// layout (Q6_K for the head and for `attn_v`/`ffn_down` in every other
    /// layer) with random blocks: a file of a real model's shape and size
    /// for speed measurements, whose outputs mean nothing.
    pub weight_type: GgmlType,
    /// Without `output.weight` the head is the embedding.
    pub tied: bool,
    pub seed: u64,
}

impl Default for TinyModel {
    fn default() -> Self {
        Self {
            arch: "llama",
            vocab: 300,
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            ffn: 96,
            layers: 2,
            weight_type: GgmlType::F32,
            tied: false,
            seed: 1,
        }
    }
}

/// Uniform values in `[-scale, scale)` from a seeded xorshift generator.
struct Gen(u64);

impl Gen {
    fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * scale
            })
            .collect()
    }
}

impl TinyModel {
    /// A GGUF writer holding the model's metadata and random weights; add
    /// tokenizer metadata to it if the model will be loaded by the engine.
    pub fn writer(&self) -> GgufWriter {
        let mut w = GgufWriter::new();
        let a = self.arch;
        let key = |k: &str| format!("{a}.{k}");
        w.add_meta("general.architecture", Value::String(a.into()));
        w.add_meta(key("embedding_length"), Value::U32(self.hidden as u32));
        w.add_meta(key("feed_forward_length"), Value::U32(self.ffn as u32));
        w.add_meta(key("block_count"), Value::U32(self.layers as u32));
        w.add_meta(key("attention.head_count"), Value::U32(self.heads as u32));
        w.add_meta(
            key("attention.head_count_kv"),
            Value::U32(self.kv_heads as u32),
        );
        w.add_meta(key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5));
        w.add_meta(key("rope.freq_base"), Value::F32(10_000.0));
        w.add_meta(key("context_length"), Value::U32(512));

        let mut g = Gen(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let kv = self.hidden / self.heads * self.kv_heads;
        let mut matrix = |w: &mut GgufWriter, name: &str, rows: usize, cols: usize| {
            let dims = [cols as u64, rows as u64];
            if self.weight_type == GgmlType::Q4_K {
                let layer: usize = name
                    .split('.')
                    .nth(1)
                    .and_then(|l| l.parse().ok())
                    .unwrap_or(0);
                let more_bits = name == "output.weight"
                    || ((name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight"))
                        && layer.is_multiple_of(2));
                // Rows that are no whole number of super-blocks fall back
                // to 32-value blocks, as llama.cpp's quantizer does.
                let ty = match (more_bits, cols.is_multiple_of(256)) {
                    (true, true) => GgmlType::Q6_K,
                    (false, true) => GgmlType::Q4_K,
                    (true, false) => GgmlType::Q8_0,
                    (false, false) => GgmlType::Q5_0,
                };
                w.add_tensor(name, &dims, ty, random_blocks(ty, rows * cols, &mut g.0));
                return;
            }
            let data = g.values(rows * cols, 1.5 / (cols as f32).sqrt());
            match self.weight_type {
                GgmlType::F16 => w.add_tensor_f16(name, &dims, &data),
                GgmlType::Q8_0 => w.add_tensor(name, &dims, GgmlType::Q8_0, quantize_q8_0(&data)),
                _ => w.add_tensor_f32(name, &dims, &data),
            };
        };
        matrix(&mut w, "token_embd.weight", self.vocab, self.hidden);
        if !self.tied {
            matrix(&mut w, "output.weight", self.vocab, self.hidden);
        }
        let vector = |w: &mut GgufWriter, name: &str, len: usize, base: f32| {
            let data: Vec<f32> = Gen(len as u64 + name.len() as u64)
                .values(len, 0.2)
                .into_iter()
                .map(|v| v + base)
                .collect();
            w.add_tensor_f32(name, &[len as u64], &data);
        };
        vector(&mut w, "output_norm.weight", self.hidden, 1.0);
        for i in 0..self.layers {
            let p = |s: &str| format!("blk.{i}.{s}");
            vector(&mut w, &p("attn_norm.weight"), self.hidden, 1.0);
            vector(&mut w, &p("ffn_norm.weight"), self.hidden, 1.0);
            matrix(&mut w, &p("attn_q.weight"), self.hidden, self.hidden);
            matrix(&mut w, &p("attn_k.weight"), kv, self.hidden);
            matrix(&mut w, &p("attn_v.weight"), kv, self.hidden);
            matrix(&mut w, &p("attn_output.weight"), self.hidden, self.hidden);
            matrix(&mut w, &p("ffn_gate.weight"), self.ffn, self.hidden);
            matrix(&mut w, &p("ffn_up.weight"), self.ffn, self.hidden);
            matrix(&mut w, &p("ffn_down.weight"), self.hidden, self.ffn);
            if self.arch == "qwen2" {
                vector(&mut w, &p("attn_q.bias"), self.hidden, 0.0);
                vector(&mut w, &p("attn_k.bias"), kv, 0.0);
                vector(&mut w, &p("attn_v.bias"), kv, 0.0);
            }
        }
        w
    }
}

/// Random quantized blocks of `ty` for `n` values: random quants and 6-/8-bit
/// scales, the `f16` scales set small so dequantized weights stay within
/// about ±0.5.
fn random_blocks(ty: GgmlType, n: usize, state: &mut u64) -> Vec<u8> {
    let size = ty.block_bytes();
    let scales: &[usize] = match ty {
        GgmlType::Q6_K => &[size - 2],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        _ => &[0],
    };
    let mut out = Vec::with_capacity(n / ty.block_len() * size);
    for _ in 0..n / ty.block_len() {
        let start = out.len();
        for _ in 0..size.div_ceil(8) {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            out.extend_from_slice(&state.to_le_bytes());
        }
        out.truncate(start + size);
        for &at in scales {
            // An f16 in [2^-12, 2^-11): exponent 3, a random mantissa.
            let h = (3u16 << 10) | (out[start + at] as u16) << 2;
            out[start + at..start + at + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    out
}

/// GPT-2's byte-to-character map: every byte is one token of a byte
/// vocabulary, so any text tokenizes without merges.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut extra = 0;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or(' ')
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap_or(' ')
            }
        })
        .collect()
}

/// The chat tokens a byte vocabulary has after its 256 bytes.
pub const BYTE_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Adds tokenizer metadata for a vocabulary of the 256 bytes and
/// [`BYTE_SPECIALS`] (a model's `vocab` must be 259; its chat prompts fall
/// back to ChatML), with `eos` as the end token if given.
pub fn add_byte_tokenizer(w: &mut GgufWriter, eos: Option<u32>) {
    add_padded_byte_tokenizer(w, eos, 256 + BYTE_SPECIALS.len());
}

/// Qwen2.5-Coder's fill-in-the-middle tokens, as a byte vocabulary with
/// [`add_fim_byte_tokenizer`] has them after [`BYTE_SPECIALS`].
pub const BYTE_FIM: [&str; 6] = [
    "<|fim_prefix|>",
    "<|fim_suffix|>",
    "<|fim_middle|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
];

/// [`add_byte_tokenizer`] with [`BYTE_FIM`] after the chat tokens (a
/// model's `vocab` must be 265): a code model's vocabulary in miniature.
pub fn add_fim_byte_tokenizer(w: &mut GgufWriter, eos: Option<u32>) {
    let names: Vec<&str> = BYTE_SPECIALS.iter().chain(&BYTE_FIM).copied().collect();
    byte_tokenizer(w, eos, &names, 256 + names.len());
}

/// [`add_byte_tokenizer`] for a model of `vocab` rows: the tokens after the
/// byte vocabulary are unused control tokens `<|unused_N|>`.
pub fn add_padded_byte_tokenizer(w: &mut GgufWriter, eos: Option<u32>, vocab: usize) {
    byte_tokenizer(w, eos, &BYTE_SPECIALS, vocab);
}

fn byte_tokenizer(w: &mut GgufWriter, eos: Option<u32>, specials: &[&str], vocab: usize) {
    let mut tokens: Vec<Value> = byte_chars()
        .into_iter()
        .map(|c| Value::String(c.to_string()))
        .collect();
    tokens.extend(specials.iter().map(|s| Value::String(s.to_string())));
    let first = tokens.len();
    tokens.extend((first..vocab).map(|i| Value::String(format!("<|unused_{i}|>"))));
    let types = (0..tokens.len())
        .map(|i| Value::I32(if i < 256 { 1 } else { 3 }))
        .collect();
    w.add_meta("tokenizer.ggml.model", Value::String("gpt2".into()))
        .add_meta("tokenizer.ggml.pre", Value::String("qwen2".into()))
        .add_meta("tokenizer.ggml.tokens", Value::Array(tokens))
        .add_meta("tokenizer.ggml.token_type", Value::Array(types))
        .add_meta("tokenizer.ggml.merges", Value::Array(vec![]))
        .add_meta("tokenizer.ggml.add_bos_token", Value::Bool(false));
    if let Some(eos) = eos {
        w.add_meta("tokenizer.ggml.eos_token_id", Value::U32(eos));
    }
}

/// Writes `w` to a fresh file in the temporary directory; `tag` keeps
/// concurrent tests apart. The file is removed when the returned guard is
/// dropped (a test that panics removes it too).
pub fn write_temp(w: &GgufWriter, tag: &str) -> TempGguf {
    let path = std::env::temp_dir().join(format!("arbor-{tag}-{}.gguf", std::process::id()));
    w.write(&path).expect("temporary directory is writable");
    TempGguf(path)
}

/// A GGUF file in the temporary directory, removed on drop; derefs to its
/// path.
#[derive(Debug)]
pub struct TempGguf(std::path::PathBuf);

impl std::ops::Deref for TempGguf {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for TempGguf {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempGguf {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A [`RowSource`] over a copy of the token embedding's bytes, for tests of
/// decoders whose embedding rows do not come from a resident table.
#[derive(Clone)]
pub struct MemoryRows {
    bytes: std::sync::Arc<[u8]>,
    row_bytes: usize,
}

impl MemoryRows {
    /// The embedding of `file`, whose layout is `layout`.
    pub fn new(file: &arbor_gguf::GgufFile, layout: &Layout) -> Self {
        let e = &layout.embedding;
        let start = e.offset as usize;
        Self {
            bytes: file.bytes()[start..start + e.len].into(),
            row_bytes: e.len / e.rows,
        }
    }
}

impl RowSource for MemoryRows {
    fn row(&mut self, row: usize) -> Result<&[u8]> {
        let at = row * self.row_bytes;
        self.bytes
            .get(at..at + self.row_bytes)
            .ok_or_else(|| ModelError::Input(format!("no embedding row {row}")))
    }

    fn try_clone(&self) -> Result<Box<dyn RowSource>> {
        Ok(Box::new(self.clone()))
    }
}

//! `arbor bench random-model`: a GGUF file of a released model's shape
//! holding random weights in Q4_K_M's layout and a byte tokenizer — a file
//! of the right size to time on a machine that cannot download the real
//! one. Its text means nothing.

use std::path::Path;

use anyhow::{Result, bail};
use arbor_model::testing::{TinyModel, add_padded_byte_tokenizer};

/// Writes random weights of `shape` (qwen2.5-7b, qwen2.5-1.5b or
/// qwen2.5-0.5b) to `out`.
pub fn write(shape: &str, out: &Path) -> Result<()> {
    // (vocab, hidden, heads, kv heads, ffn, layers, tied) of the released models.
    let (vocab, hidden, heads, kv_heads, ffn, layers, tied) = match shape {
        "qwen2.5-7b" => (152_064, 3584, 28, 4, 18_944, 28, false),
        "qwen2.5-1.5b" => (151_936, 1536, 12, 2, 8960, 28, true),
        "qwen2.5-0.5b" => (151_936, 896, 14, 2, 4864, 24, true),
        _ => bail!("unknown --shape {shape} (qwen2.5-7b, qwen2.5-1.5b or qwen2.5-0.5b)"),
    };
    let model = TinyModel {
        arch: "qwen2",
        vocab,
        hidden,
        heads,
        kv_heads,
        ffn,
        layers,
        weight_type: arbor_gguf::GgmlType::Q4_K,
        tied,
        seed: 7,
    };
    eprintln!(
        "writing random {shape} weights (Q4_K_M layout) to {}",
        out.display()
    );
    let mut w = model.writer();
    add_padded_byte_tokenizer(&mut w, Some(256), vocab);
    w.write(out)?;
    let bytes = std::fs::metadata(out)?.len();
    eprintln!("wrote {}", arbor_engine::format_bytes(bytes));
    Ok(())
}

//! The tiny random model the training tests run on.

use arbor_backend_burn::BurnBackend;
use arbor_gguf::GgufFile;
use arbor_model::Decoder;
use arbor_model::testing::{TinyModel, write_temp};

/// A 2-layer qwen2-shaped random model (vocab 64, width 32) on burn flex;
/// `seed` picks its weights.
pub fn tiny(tag: &str, seed: u64) -> Decoder<BurnBackend> {
    let tiny = TinyModel {
        arch: "qwen2",
        vocab: 64,
        hidden: 32,
        heads: 4,
        kv_heads: 2,
        ffn: 48,
        layers: 2,
        seed,
        ..TinyModel::default()
    };
    let path = write_temp(&tiny.writer(), tag);
    let file = GgufFile::open(&path).unwrap();
    Decoder::load(BurnBackend::flex(), &file, &mut |_, _| {}).unwrap()
}

#[allow(dead_code)]
pub fn model(tag: &str) -> Decoder<BurnBackend> {
    tiny(tag, 5)
}

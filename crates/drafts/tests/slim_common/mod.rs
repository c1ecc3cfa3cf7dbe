//! Tiny random draft models with tokenizer metadata, derived into slim
//! drafts in the temporary directory.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use arbor_backend_candle::CandleBackend;
use arbor_drafts::slim::{TokenCounts, vocabulary_fingerprint};
use arbor_gguf::{GgmlType, GgufFile, Value};
use arbor_model::testing::TinyModel;
use arbor_model::{Decoder, LanguageModel};

pub const VOCAB: usize = 300;
/// Control tokens of the tiny vocabulary (`<|c0|>`, ...).
pub const CONTROL: [u32; 3] = [297, 298, 299];
/// Padding tokens (type unused): never kept for their type.
pub const UNUSED: [u32; 2] = [295, 296];
/// The bos id: a normal token kept because the metadata names it.
pub const BOS: u32 = 5;

/// A unique path in the temporary directory.
pub fn temp(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "arbor-drafts-{tag}-{}-{n}.gguf",
        std::process::id()
    ))
}

pub fn tiny(seed: u64, tied: bool, weight_type: GgmlType) -> TinyModel {
    TinyModel {
        arch: "qwen2",
        vocab: VOCAB,
        tied,
        weight_type,
        seed,
        ..TinyModel::default()
    }
}

/// Writes `model` with tokenizer metadata (`prefix` changes the token
/// strings, so another prefix is another tokenizer) and returns its path.
pub fn write_model(model: &TinyModel, prefix: &str) -> PathBuf {
    let mut w = model.writer();
    let tokens = (0..VOCAB as u32)
        .map(|i| Value::String(format!("{prefix}{i}")))
        .collect();
    let types = (0..VOCAB as u32)
        .map(|i| {
            Value::I32(if CONTROL.contains(&i) {
                3
            } else if UNUSED.contains(&i) {
                5
            } else {
                1
            })
        })
        .collect();
    w.add_meta("tokenizer.ggml.model", Value::String("gpt2".into()))
        .add_meta("tokenizer.ggml.tokens", Value::Array(tokens))
        .add_meta("tokenizer.ggml.token_type", Value::Array(types))
        .add_meta("tokenizer.ggml.bos_token_id", Value::U32(BOS))
        .add_meta("tokenizer.ggml.eos_token_id", Value::U32(CONTROL[2]));
    let path = temp("src");
    w.write(&path).unwrap();
    path
}

/// Counts where token `i` occurs `(i * 37) % 101` times: a ranking that is
/// neither the id order nor its reverse, with ties.
pub fn counts_for(path: &PathBuf) -> TokenCounts {
    let file = GgufFile::open(path).unwrap();
    let (vocab, fp) = vocabulary_fingerprint(file.header()).unwrap();
    let mut c = TokenCounts::new(vocab, fp, "synthetic");
    for i in 0..VOCAB as u32 {
        let n = (i as usize * 37) % 101;
        c.add(&vec![i; n]).unwrap();
    }
    c
}

/// A decoder of the GGUF at `path`, widened when it is a slim draft.
pub fn load(path: &PathBuf) -> Box<dyn LanguageModel> {
    let file = GgufFile::open(path).unwrap();
    let model = Decoder::load(CandleBackend::new(), &file, &mut |_, _| {}).unwrap();
    arbor_drafts::slim::widen_if_slim(file.header(), Box::new(model)).unwrap()
}

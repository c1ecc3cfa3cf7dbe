//! The models the speculative tests decode with: random tiny decoders,
//! reshaped into a confident target and perfect, poor or adversarial
//! drafts. Each test file uses a part of them.
#![allow(dead_code)]

use arbor_backend_candle::CandleBackend;
use arbor_gguf::GgufFile;
use arbor_model::testing::{TinyModel, write_temp};
use arbor_model::{Config, Decoder, LanguageModel, Logits, Mask, Result, Row};
use arbor_sampling::SamplingParams;
use arbor_speculative::{DecodeOptions, Strategy, Verification};

pub fn tiny(model: &TinyModel, tag: &str) -> Box<dyn LanguageModel> {
    // Tests run in parallel: every file gets its own name.
    static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = write_temp(&model.writer(), &format!("{tag}-{n}"));
    let file = GgufFile::open(&path).unwrap();
    Box::new(Decoder::load(CandleBackend::new(), &file, &mut |_, _| {}).unwrap())
}

/// Rewrites a model's logits: `scale · logits` (a sharper or flatter
/// model), negated when `adversarial` (most confident in the tokens the
/// model finds least likely).
pub struct Reshaped {
    pub inner: Box<dyn LanguageModel>,
    pub scale: f32,
}

impl LanguageModel for Reshaped {
    fn forward(&mut self, t: &[u32], p: &[u32], m: &Mask, rows: &[usize]) -> Result<Logits> {
        Ok(super::scaled(
            self.inner.forward(t, p, m, rows)?,
            self.scale,
        ))
    }
    fn forward_rows(
        &mut self,
        r: &[Row<'_>],
        p: &[u32],
        m: &Mask,
        rows: &[usize],
    ) -> Result<Logits> {
        Ok(super::scaled(
            self.inner.forward_rows(r, p, m, rows)?,
            self.scale,
        ))
    }
    delegate_to_inner!();
    fn backend_name(&self) -> &'static str {
        "reshaped"
    }
}

pub fn model(seed: u64, vocab: usize) -> TinyModel {
    TinyModel {
        arch: "qwen2",
        vocab,
        seed,
        ..TinyModel::default()
    }
}

/// The target: a random model made confident (×12) so drafts that agree
/// with it grow deep trees.
pub fn target(vocab: usize) -> Box<dyn LanguageModel> {
    Box::new(Reshaped {
        inner: tiny(&model(7, vocab), "spec-target"),
        scale: 12.0,
    })
}

#[derive(Debug, Clone, Copy)]
pub enum DraftKind {
    Perfect,
    Poor,
    Adversarial,
}

pub fn draft(kind: DraftKind, vocab: usize) -> Box<dyn LanguageModel> {
    let (seed, scale) = match kind {
        DraftKind::Perfect => (7, 12.0),
        DraftKind::Poor => (8, 4.0),
        DraftKind::Adversarial => (7, -12.0),
    };
    Box::new(Reshaped {
        inner: tiny(&model(seed, vocab), "spec-draft"),
        scale,
    })
}

pub fn opts(strategy: Strategy, max_tokens: usize, stop: Vec<u32>) -> DecodeOptions {
    DecodeOptions {
        max_tokens,
        sampling: SamplingParams::default(),
        stop_tokens: stop,
        strategy,
        verification: Verification::Exact,
    }
}

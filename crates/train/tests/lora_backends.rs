//! LoRA adapters of an elastic level on the two backends: the burn
//! backend computes the adapters' branches its own way, and what they add
//! to the logits agrees with candle's. (Here rather than in arbor-elastic,
//! whose tests would otherwise build burn wherever they run: the ARM64
//! subset cross-builds them.)

use std::path::PathBuf;

use arbor_backend_burn::BurnBackend;
use arbor_backend_candle::CandleBackend;
use arbor_elastic::LoraFile;
use arbor_gguf::{GgmlType, GgufFile};
use arbor_model::testing::TinyModel;
use arbor_model::{Decoder, LanguageModel, Proj};

/// A file in the test's temporary directory, removed when dropped.
struct Temp(PathBuf);

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn temp(tag: &str) -> Temp {
    Temp(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("arbor-train-{tag}-{}.gguf", std::process::id())),
    )
}

/// The last token's logits after each of a few steps.
fn run(m: &mut dyn LanguageModel) -> Vec<Vec<f32>> {
    m.truncate_cache(0).unwrap();
    let mut out = vec![m.step(&[3, 17, 150, 5]).unwrap()];
    for t in [9, 41, 3] {
        out.push(m.step(&[t]).unwrap());
    }
    out
}

/// What the logits moved by (the same amount on both backends, within
/// their own gap): the candle and burn backends agree with adapters.
/// (The logits themselves differ by candle's quantized activations for a
/// Q8_0 down projection, f32 on burn; f32 attention on both here.)
#[test]
fn candle_and_burn_agree_with_adapters() {
    let m = TinyModel {
        arch: "qwen2",
        vocab: 200,
        hidden: 128,
        heads: 8,
        kv_heads: 2,
        ffn: 256,
        layers: 4,
        weight_type: GgmlType::F32,
        seed: 33,
        ..TinyModel::default()
    };
    let (source, out) = (temp("lora-source"), temp("lora-elastic"));
    m.writer().write(&source.0).unwrap();
    arbor_elastic::testing::build_tiny(&m, &source.0, &out.0).unwrap();
    let file = GgufFile::open(&out.0).unwrap();
    let mut candle =
        Decoder::load(CandleBackend::with_f32_attention(), &file, &mut |_, _| {}).unwrap();
    let mut burn: Decoder<BurnBackend> =
        Decoder::load(BurnBackend::flex(), &file, &mut |_, _| {}).unwrap();
    // Large branches, so that their effect dwarfs the backends' own gap.
    let mut f = LoraFile::new(candle.config(), candle.elastic(), 0.5, 4, &Proj::ALL, 2).unwrap();
    let flat: Vec<f32> = (f.flatten().iter().enumerate())
        .map(|(i, v)| match *v {
            0.0 => (i * 7919 % 101) as f32 / 101.0 - 0.5,
            v => v * 10.0,
        })
        .collect();
    f.unflatten(&flat).unwrap();
    let effect = |model: &mut dyn LanguageModel| -> Vec<Vec<f32>> {
        model.set_level(0.5).unwrap();
        let without = run(model);
        model.attach_lora(&f.to_host()).unwrap();
        let with = run(model);
        (with.iter().zip(&without))
            .map(|(w, o)| w.iter().zip(o).map(|(a, b)| a - b).collect())
            .collect()
    };
    let (c, b) = (effect(&mut candle), effect(&mut burn));
    let moved = c.iter().flatten().fold(0f32, |a, x| a.max(x.abs()));
    let apart = (c.iter().flatten())
        .zip(b.iter().flatten())
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(moved > 1.0, "the adapters moved the logits by {moved}");
    assert!(
        apart <= 0.05 * moved,
        "their effects are {apart} apart (largest {moved})"
    );
}

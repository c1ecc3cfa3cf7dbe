//! Helpers shared by the elastic integration tests: tiny random models,
//! their elastic files, and a few steps of logits.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use arbor_backend_candle::CandleBackend;
use arbor_gguf::{GgmlType, GgufFile, GgufWriter};
use arbor_model::testing::TinyModel;
use arbor_model::{Decoder, LanguageModel};
use arbor_sampling::SamplingParams;
use arbor_speculative::{DecodeOptions, Decoding, Strategy, Verification};

pub type Model = Decoder<CandleBackend>;

/// A path in the cargo scratch directory, its file deleted on drop.
pub struct Temp(pub PathBuf);

impl Temp {
    pub fn new(tag: &str) -> Self {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        Self(Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "arbor-elastic-{tag}-{}-{n}.gguf",
            std::process::id()
        )))
    }
    pub fn write(w: &GgufWriter, tag: &str) -> Self {
        let t = Self::new(tag);
        w.write(&t.0).unwrap();
        t
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Eight 16-wide heads over two KV heads, 256 neurons: Q8_0 blocks (32)
/// hold two heads, so heads move in runs of two.
pub fn tiny(weight_type: GgmlType, seed: u64) -> TinyModel {
    TinyModel {
        arch: "qwen2",
        vocab: 200,
        hidden: 128,
        heads: 8,
        kv_heads: 2,
        ffn: 256,
        layers: 4,
        weight_type,
        seed,
        ..TinyModel::default()
    }
}

#[allow(unused_imports)]
pub use arbor_elastic::testing::{options, random_scores};

pub fn load(path: &Path) -> Model {
    Decoder::load(
        CandleBackend::new(),
        &GgufFile::open(path).unwrap(),
        &mut |_, _| {},
    )
    .unwrap()
}

/// An elastic file of `m` ranked by random scores.
pub fn elastic(m: &TinyModel, tag: &str) -> (Temp, Temp) {
    let source = Temp::write(&m.writer(), tag);
    let out = Temp::new(&format!("{tag}-elastic"));
    let report = arbor_elastic::testing::build_tiny(m, &source.0, &out.0).unwrap();
    assert_eq!(report.levels, vec![0.25, 0.5, 0.75, 1.0]);
    assert!(
        report.level_bytes.windows(2).all(|w| w[0] < w[1]),
        "{report:?}"
    );
    (source, out)
}

/// The last token's logits after each of a few steps.
pub fn run(m: &mut dyn LanguageModel) -> Vec<Vec<f32>> {
    m.truncate_cache(0).unwrap();
    let mut out = vec![m.step(&[3, 17, 150, 5]).unwrap()];
    for t in [9, 41, 3] {
        out.push(m.step(&[t]).unwrap());
    }
    out
}

pub fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    (a.iter().flatten())
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn opts(decoding: Decoding) -> DecodeOptions {
    DecodeOptions {
        max_tokens: 40,
        sampling: SamplingParams::default(),
        stop_tokens: vec![],
        strategy: Strategy::new(decoding),
        verification: Verification::Exact,
    }
}

/// `path` with `layers` split at level index `level` (their rest streamed
/// in `mode`) and every other layer resident.
pub fn split_model(
    path: &Path,
    level: usize,
    layers: &[usize],
    mode: arbor_pipeline::Mode,
) -> Model {
    use arbor_model::Layout;
    let file = GgufFile::open(path).unwrap();
    let layout = Layout::from_gguf(file.header()).unwrap();
    let cuts = &layout.elastic.as_ref().unwrap().cuts[level];
    let resident: Vec<bool> = (0..layout.layers.len())
        .map(|i| !layers.contains(&i))
        .collect();
    let mut model = Decoder::load_partial(
        CandleBackend::new(),
        &file,
        &layout,
        &resident,
        None,
        &mut |_, _| {},
    )
    .unwrap();
    model.split_layers(&file, &layout, level, layers).unwrap();
    let units = (layers.iter())
        .map(|&i| (i, layout.split_entries(i, cuts[i].neurons).unwrap().1))
        .collect();
    let streamer = arbor_pipeline::Streamer::with_units(
        CandleBackend::new(),
        file.path(),
        units,
        arbor_paging::Ledger::new(1 << 32),
        mode,
    )
    .unwrap();
    model.set_layer_source(Box::new(streamer));
    model
}

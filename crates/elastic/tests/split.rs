//! Split layers of an elastic file: each layer's prefix at the draft's
//! level held, the rest of its MLP streamed from the file. The split
//! target runs the whole model and every level bit for bit as the whole
//! file does, and an elastic draft over the held prefixes drafts for it
//! losslessly.

use crate::common;
use common::*;

use arbor_backend_candle::CandleBackend;
use arbor_gguf::{GgmlType, GgufFile};
use arbor_model::{LanguageModel, Layout};
use arbor_paging::PagingError;
use arbor_pipeline::{MemoryOptions, Mode, load_target};
use arbor_speculative::{Decoding, TreeConfig, decode};

/// `path` with every layer but the first split at level index `level`,
/// their rest streamed in `mode`.
fn split(path: &std::path::Path, level: usize, mode: Mode) -> Model {
    let n = Layout::from_gguf(GgufFile::open(path).unwrap().header())
        .unwrap()
        .layers
        .len();
    split_model(path, level, &(1..n).collect::<Vec<_>>(), mode)
}

#[test]
fn the_file_stores_down_segments_between_levels() {
    let m = tiny(GgmlType::Q8_0, 21);
    let (_source, out) = elastic(&m, "segments");
    let layout = Layout::from_gguf(GgufFile::open(&out.0).unwrap().header()).unwrap();
    let e = layout.elastic.as_ref().unwrap();
    assert!(
        layout.down_segments[0].is_empty(),
        "the anchor is never split"
    );
    for l in 1..4 {
        let ends: Vec<usize> = layout.down_segments[l]
            .iter()
            .scan(0, |end, s| {
                *end += s.cols;
                Some(*end)
            })
            .collect();
        let cuts: Vec<usize> = e.cuts.iter().map(|c| c[l].neurons).collect();
        assert_eq!(ends, cuts, "layer {l}");
        // A split reads the rest of gate and up and the later segments.
        let (hold, stream) = layout.split_entries(l, cuts[1]).unwrap();
        assert_eq!(stream.len(), 2 + 2);
        let read: usize = stream.iter().map(|t| t.len).sum();
        let held: usize = hold
            .iter()
            .filter(|t| t.name.contains("ffn_"))
            .map(|t| t.len)
            .sum();
        let whole: usize = layout.layers[l]
            .iter()
            .filter(|t| t.name.contains("ffn_"))
            .map(|t| t.len)
            .sum();
        assert_eq!(read + held, whole);
    }
    assert!(
        layout.split_entries(1, 100).is_none(),
        "not a level boundary"
    );
}

#[test]
fn a_split_model_runs_the_whole_model_and_its_levels() {
    let m = tiny(GgmlType::Q8_0, 23);
    let (_source, out) = elastic(&m, "split");
    let mut whole = load(&out.0);
    let reference = run(&mut whole);
    for mode in [Mode::OnDemand, Mode::Pipelined { depth: 1 }] {
        let mut model = split(&out.0, 1, mode);
        // Bit for bit at every level: above the split the held prefix's
        // down segments and then the lent ones are summed in the whole
        // file's order; at or below it nothing streams.
        assert_eq!(run(&mut model), reference, "{mode:?}");
        for level in [0.25, 0.5, 0.75] {
            whole.set_level(level).unwrap();
            model.set_level(level).unwrap();
            assert_eq!(run(&mut model), run(&mut whole), "level {level}, {mode:?}");
        }
        whole.set_level(1.0).unwrap();
    }
}

#[test]
fn an_elastic_draft_over_held_prefixes_is_lossless() {
    let m = tiny(GgmlType::Q8_0, 29);
    let (_source, out) = elastic(&m, "split-draft");
    let mut target = split(&out.0, 1, Mode::Pipelined { depth: 1 });
    let e = target
        .elastic_draft(0.75)
        .err()
        .expect("0.75 is above the split");
    assert!(e.to_string().contains("holds"), "{e}");
    let prompt: Vec<u32> = (0..20).map(|i| i * 31 % 29 + 1).collect();
    let plain = decode(
        &mut target,
        None,
        &prompt,
        &opts(Decoding::Autoregressive),
        &mut |_| {},
    )
    .unwrap();
    let mut accepted = 0;
    for level in [0.25, 0.5] {
        let mut draft = target.elastic_draft(level).unwrap();
        for d in [
            Decoding::Chain { gamma: 4 },
            Decoding::Tree(TreeConfig::default()),
        ] {
            let spec = decode(
                &mut target,
                Some(&mut draft),
                &prompt,
                &opts(d.clone()),
                &mut |_| {},
            )
            .unwrap();
            assert_eq!(spec.tokens, plain.tokens, "level {level}, {d:?}");
            accepted += spec.stats.accepted_draft_tokens;
        }
    }
    assert!(accepted > 0);
}

#[test]
fn a_budget_splits_layers_and_says_its_minimum() {
    // Enough layers that splitting saves more than the streaming reserve
    // costs.
    let m = arbor_model::testing::TinyModel {
        layers: 12,
        ..tiny(GgmlType::Q8_0, 31)
    };
    let (_source, out) = elastic(&m, "split-budget");
    let file = GgufFile::open(&out.0).unwrap();
    let config = Layout::from_gguf(file.header()).unwrap().config;
    let options = |budget| MemoryOptions {
        base: Some(0),
        context: 64,
        logit_rows: 8,
        draft_logit_rows: 8,
        split: Some(1),
        ..MemoryOptions::new(budget, true)
    };
    let e = load_target(
        CandleBackend::new(),
        &file,
        Some(&config),
        &options(1),
        &mut |_, _| {},
    )
    .err()
    .expect("one byte is too small");
    let Some(PagingError::TooSmall { minimum, .. }) = e.source_as::<PagingError>() else {
        panic!("expected TooSmall, got {e}");
    };
    let (mut model, report) = load_target(
        CandleBackend::new(),
        &file,
        Some(&config),
        &options(*minimum),
        &mut |_, _| {},
    )
    .unwrap();
    let (level, split) = report.plan.split.clone().unwrap();
    assert_eq!(level, 1);
    assert!(!split[0], "the anchor is never split");
    assert!(split.iter().filter(|&&s| s).count() > 6, "{split:?}");
    let more = load_target(
        CandleBackend::new(),
        &file,
        Some(&config),
        &options(*minimum - 1),
        &mut |_, _| {},
    );
    assert!(more.is_err(), "below the minimum");
    assert!(report.plan.read_per_pass > 0);
    let mut whole = load(&out.0);
    assert_eq!(run(&mut model), run(&mut whole));
    assert!(model.elastic_draft(0.5).is_ok());
}

/// A real elastic file: SmolLM2 (the CI model) made elastic here by
/// magnitude (levels 0.25/0.5/0.75, layer 0 the anchor, Q8_0 down), or the
/// file `ARBOR_ELASTIC_FILE` names (an elastic Qwen, say).
/// The built file is deleted when its `Temp` drops.
fn real_elastic() -> Option<(std::path::PathBuf, Option<Temp>)> {
    if let Ok(path) = std::env::var("ARBOR_ELASTIC_FILE") {
        return Some((path.into(), None));
    }
    let source = arbor_fetch::testing::cached_model("smollm2-135m")?;
    let file = GgufFile::open(&source).unwrap();
    let layout = Layout::from_gguf(file.header()).unwrap();
    let scores = arbor_elastic::magnitude_scores(&file, &layout).unwrap();
    let out = Temp::new("smollm2");
    let report = arbor_elastic::build(
        &source,
        &out.0,
        Some(&scores),
        &options(arbor_elastic::Order::Magnitude),
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(report.levels, vec![0.25, 0.5, 0.75, 1.0]);
    Some((out.0.clone(), Some(out)))
}

/// The non-anchor layers of a real elastic file split at level 0.5 (or
/// `ARBOR_SPLIT_LEVEL`): the whole level's logits of a prompt and a few
/// steps equal the unsplit file's bit for bit, in both streaming modes.
#[test]
fn a_real_split_model_against_the_whole_file() {
    let Some((path, _built)) = real_elastic() else {
        return;
    };
    let path = path.as_path();
    let level: f64 = std::env::var("ARBOR_SPLIT_LEVEL").map_or(0.5, |v| v.parse().unwrap());
    let file = GgufFile::open(path).unwrap();
    let layout = Layout::from_gguf(file.header()).unwrap();
    let e = layout.elastic.as_ref().unwrap();
    let at = e.level_index(level).unwrap();
    let layers: Vec<usize> = (0..layout.layers.len())
        .filter(|i| !e.anchors.contains(i))
        .collect();
    assert!(!layers.is_empty());
    let prompt: Vec<u32> = (0..40).map(|i| 100 + i * 37 % 5000).collect();
    let steps = |m: &mut Model| -> Vec<Vec<f32>> {
        m.truncate_cache(0).unwrap();
        let mut out = vec![m.step(&prompt).unwrap()];
        for t in [9u32, 41, 3, 1000, 77] {
            out.push(m.step(&[t]).unwrap());
        }
        out
    };
    let mut whole = load(path);
    let want = steps(&mut whole);
    for mode in [Mode::OnDemand, Mode::Pipelined { depth: 1 }] {
        let mut model = split_model(path, at, &layers, mode);
        assert_eq!(steps(&mut model), want, "{mode:?}");
        // And at the split's own level, where only held prefixes run.
        model.set_level(level).unwrap();
        whole.set_level(level).unwrap();
        assert_eq!(steps(&mut model), steps(&mut whole), "{mode:?} at {level}");
        whole.set_level(1.0).unwrap();
    }
}

/// Lends split layers' suffixes built from the mapped file (no streamer):
/// separates the reader from the weights when a split model disagrees.
struct Mapped {
    file: GgufFile,
    units: Vec<(usize, Vec<arbor_model::TensorEntry>)>,
    streamed: bool,
}

impl arbor_model::LayerSource<CandleBackend> for Mapped {
    fn layer(&mut self, layer: usize) -> arbor_model::Result<arbor_model::Lease<CandleBackend>> {
        panic!("layer {layer} asked whole");
    }
    fn mlp_suffix(
        &mut self,
        layer: usize,
    ) -> arbor_model::Result<arbor_model::SuffixLease<CandleBackend>> {
        let (_, entries) = self.units.iter().find(|(l, _)| *l == layer).unwrap();
        let bytes: Vec<&[u8]> = (entries.iter())
            .map(|t| &self.file.bytes()[t.offset as usize..t.offset as usize + t.len])
            .collect();
        let mlp = arbor_model::Mlp::suffix_from_bytes(
            &CandleBackend::new(),
            entries,
            &bytes,
            self.streamed,
        )?;
        Ok(arbor_model::SuffixLease {
            mlp,
            hold: Box::new(()),
        })
    }
}

/// `a_real_split_model_against_the_whole_file` with the suffixes built from
/// the mapped file, as resident (`false`) and as streamed weights (`true`):
/// the reader is not what makes a split model equal.
#[test]
fn a_real_split_model_from_the_mapped_file() {
    let Some((path, _built)) = real_elastic() else {
        return;
    };
    let path = path.as_path();
    let file = GgufFile::open(path).unwrap();
    let layout = Layout::from_gguf(file.header()).unwrap();
    let e = layout.elastic.as_ref().unwrap().clone();
    let at = e.level_index(0.5).unwrap();
    let layers: Vec<usize> = (0..layout.layers.len())
        .filter(|i| !e.anchors.contains(i))
        .collect();
    let prompt: Vec<u32> = (0..40).map(|i| 100 + i * 37 % 5000).collect();
    let mut whole = load(path);
    whole.truncate_cache(0).unwrap();
    let want = whole.step(&prompt).unwrap();
    for streamed in [false, true] {
        let mut model = split_model(path, at, &layers, Mode::OnDemand);
        let units = (layers.iter())
            .map(|&i| (i, layout.split_entries(i, e.cuts[at][i].neurons).unwrap().1))
            .collect();
        model.set_layer_source(Box::new(Mapped {
            file: GgufFile::open(path).unwrap(),
            units,
            streamed,
        }));
        model.truncate_cache(0).unwrap();
        let got = model.step(&prompt).unwrap();
        assert_eq!(
            got, want,
            "suffixes from the mapped file, streamed {streamed}"
        );
    }
}

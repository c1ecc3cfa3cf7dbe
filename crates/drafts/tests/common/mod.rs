//! Helpers shared by the drafts tests: tiny random models in temporary
//! files, decoders whose layers are partly streamed from the file (with
//! reported weight waits, in which a draft takes turns, so provisional
//! rounds happen), and the same
//! model rewritten with only some of its layers.

// Each test file uses its own subset of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;

use arbor_backend_candle::CandleBackend;
use arbor_gguf::{GgufFile, GgufWriter, Value};
use arbor_model::testing::{MemoryRows, TinyModel, Turns};
use arbor_model::{
    Decoder, LayerSource, LayerWeights, Layout, Lease, Result, RowSource, WeightWait,
};

pub type Model = Decoder<CandleBackend>;

/// A GGUF file in the cargo scratch directory, deleted on drop.
pub struct TempFile(PathBuf);

impl TempFile {
    pub fn write(w: &GgufWriter, tag: &str) -> Self {
        // Tests run in parallel: every file gets its own name.
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "arbor-drafts-{tag}-{}-{n}.gguf",
            std::process::id()
        ));
        w.write(&path).unwrap();
        Self(path)
    }
    pub fn open(&self) -> GgufFile {
        GgufFile::open(&self.0).unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub fn tiny(layers: usize, tied: bool, seed: u64) -> TinyModel {
    TinyModel {
        arch: "qwen2",
        vocab: 256,
        layers,
        tied,
        seed,
        ..TinyModel::default()
    }
}

/// Every weight of `file` resident.
pub fn load_full(file: &GgufFile) -> Model {
    Decoder::load(CandleBackend::new(), file, &mut |_, _| {}).unwrap()
}

/// Layers read from the file on every pass, each read reporting a wait
/// like a layer streamed from disk: with `turns`, one in which the draft
/// takes a turn of one pass (see [`Turns`]); without, one that ends at
/// once.
pub struct FileLayers {
    file: GgufFile,
    layout: Layout,
    backend: CandleBackend,
    waits: Option<Sender<WeightWait>>,
    turns: Option<Arc<Turns>>,
}

impl LayerSource<CandleBackend> for FileLayers {
    fn layer(&mut self, layer: usize) -> Result<Lease<CandleBackend>> {
        match (&self.waits, &self.turns) {
            (Some(tx), Some(turns)) => turns.wait(tx, 1),
            (Some(tx), None) => {
                let _ = tx.send(WeightWait::Waiting);
                let _ = tx.send(WeightWait::Resumed);
            }
            (None, _) => {}
        }
        let entries = &self.layout.layers[layer];
        let bytes = entries
            .iter()
            .map(|e| Ok(self.file.tensor(&e.name)?.1))
            .collect::<Result<Vec<&[u8]>>>()?;
        Ok(Lease {
            weights: LayerWeights::from_bytes(&self.backend, entries, &bytes, true)?,
            hold: Box::new(()),
        })
    }

    fn notify_waits(&mut self, tx: Option<Sender<WeightWait>>) {
        self.waits = tx;
    }
}

/// The model in `tmp` with the layers marked in `resident` loaded and the
/// others streamed from the file; an untied embedding is read by rows.
pub fn load_streamed(tmp: &TempFile, resident: &[bool]) -> Model {
    load_streamed_with(tmp, resident, None)
}

/// [`load_streamed`] whose streamed layers' waits give a draft wrapped in
/// [`arbor_model::testing::Drafting`] over `turns` a turn each.
pub fn load_streamed_with(tmp: &TempFile, resident: &[bool], turns: Option<Arc<Turns>>) -> Model {
    let file = tmp.open();
    let layout = Layout::from_gguf(file.header()).unwrap();
    let rows = layout
        .head
        .is_some()
        .then(|| Box::new(MemoryRows::new(&file, &layout)) as Box<dyn RowSource>);
    let backend = CandleBackend::new();
    let mut m = Decoder::load_partial(
        backend.clone(),
        &file,
        &layout,
        resident,
        rows,
        &mut |_, _| {},
    )
    .unwrap();
    m.set_layer_source(Box::new(FileLayers {
        file: tmp.open(),
        layout,
        backend,
        waits: None,
        turns,
    }));
    m
}

/// `file` rewritten with only the layers marked in `keep`, renumbered.
pub fn with_layers(file: &GgufFile, keep: &[bool]) -> GgufWriter {
    let h = file.header();
    let arch = h.architecture().unwrap().to_string();
    let mut w = GgufWriter::new();
    for (k, v) in &h.metadata {
        w.add_meta(k.clone(), v.clone());
    }
    let kept: Vec<usize> = (0..keep.len()).filter(|&i| keep[i]).collect();
    w.add_meta(format!("{arch}.block_count"), Value::U32(kept.len() as u32));
    for t in &h.tensors {
        let name = match t.name.strip_prefix("blk.") {
            Some(rest) => {
                let (layer, suffix) = rest.split_once('.').unwrap();
                let layer: usize = layer.parse().unwrap();
                match kept.iter().position(|&k| k == layer) {
                    Some(j) => format!("blk.{j}.{suffix}"),
                    None => continue,
                }
            }
            None => t.name.clone(),
        };
        w.add_tensor(name, &t.dims, t.ty, file.tensor_bytes(t).to_vec());
    }
    w
}

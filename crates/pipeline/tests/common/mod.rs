//! Helpers shared by the streaming tests: tiny models in temporary files,
//! decoders with streamed layers, a session whose every logit is compared,
//! and a watchdog that turns a hang into a failure.

// Each test file uses its own subset of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use arbor_backend_candle::CandleBackend;
use arbor_gguf::{GgmlType, GgufFile};
use arbor_model::testing::TinyModel;
use arbor_model::{
    Decoder, LanguageModel, Layout, Mask, Result, RowSource, TensorEntry, copied_bytes, held_bytes,
};
use arbor_paging::Ledger;
use arbor_pipeline::{
    DiskRows, Mode, Monitor, Streamer, buffer_sets_for, keeps_in_place, load_resident,
    read_buffer_bytes,
};

pub type Model = Decoder<CandleBackend>;

pub const LAYERS: usize = 6;
pub const MODES: [Mode; 3] = [
    Mode::OnDemand,
    Mode::Pipelined { depth: 1 },
    Mode::Pipelined { depth: 2 },
];

/// A tiny model written to its own file, deleted on drop.
pub struct TempModel(PathBuf);

impl TempModel {
    pub fn new(tiny: &TinyModel, tag: &str) -> Self {
        // Tests run in parallel: every file gets its own name. The cargo
        // scratch directory is on the build disk, which is more likely than
        // /tmp to allow O_DIRECT.
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "arbor-pipeline-{tag}-{}-{n}.gguf",
            std::process::id()
        ));
        tiny.writer().write(&path).unwrap();
        Self(path)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Rows and columns are multiples of 32 so that Q8_0 weights quantize.
pub fn tiny(arch: &'static str, weight_type: GgmlType, tied: bool, seed: u64) -> TinyModel {
    TinyModel {
        arch,
        vocab: 256,
        hidden: 64,
        heads: 4,
        kv_heads: 2,
        ffn: 128,
        layers: LAYERS,
        weight_type,
        tied,
        seed,
    }
}

pub fn tinies() -> Vec<TinyModel> {
    vec![
        tiny("llama", GgmlType::Q8_0, false, 11),
        tiny("llama", GgmlType::F32, true, 12),
        tiny("qwen2", GgmlType::Q8_0, false, 13),
        tiny("qwen2", GgmlType::F32, false, 14),
    ]
}

pub fn slots(mode: Mode) -> u64 {
    match mode {
        Mode::OnDemand => 1,
        Mode::Pipelined { depth } => depth as u64 + 1,
    }
}

/// A file's layout and the layers streamed from it, in layer order.
#[derive(Clone)]
pub struct Layers {
    pub layout: Layout,
    pub streamed: Vec<usize>,
}

impl Layers {
    /// Index and tensors of each streamed layer.
    pub fn entries(&self) -> impl Iterator<Item = (usize, &[TensorEntry])> {
        self.streamed
            .iter()
            .map(|&i| (i, self.layout.layers[i].as_slice()))
    }
}

/// The layers `resident` leaves out.
pub fn streamed_layers(path: &Path, resident: &[bool]) -> Layers {
    let file = GgufFile::open(path).unwrap();
    Layers {
        layout: Layout::from_gguf(file.header()).unwrap(),
        streamed: (0..resident.len()).filter(|&i| !resident[i]).collect(),
    }
}

pub fn buffer_bytes(layers: &Layers) -> u64 {
    read_buffer_bytes(&layers.layout, &layers.streamed)
}

pub fn max_held(layers: &Layers) -> u64 {
    let backend = CandleBackend::new();
    layers
        .entries()
        .map(|(_, s)| held_bytes(&backend, s))
        .max()
        .unwrap_or(0)
}

/// Whether a streamer in `mode` keeps these layers' weights in its read
/// buffers (see [`keeps_in_place`]).
pub fn in_place(layers: &Layers, mode: Mode) -> bool {
    let lists: Vec<&[TensorEntry]> = layers.entries().map(|(_, s)| s).collect();
    keeps_in_place(&CandleBackend::new(), mode, &lists)
}

/// Read buffer sets a streamer of `layers` in `mode` holds.
pub fn sets(layers: &Layers, mode: Mode) -> u64 {
    buffer_sets_for(mode, in_place(layers, mode))
}

/// What a built layer holds beside its read buffers, at most: the whole
/// layer, or what is copied where the weights stay in the buffers.
pub fn max_slot(layers: &Layers, mode: Mode) -> u64 {
    let backend = CandleBackend::new();
    let kept = in_place(layers, mode);
    layers
        .entries()
        .map(|(_, s)| match kept {
            true => copied_bytes(&backend, s),
            false => held_bytes(&backend, s),
        })
        .max()
        .unwrap_or(0)
}

/// The streamer's share as the engine plans it: read buffers plus `slots`
/// of the largest streamed layer, not a byte more.
pub fn exact_budget(layers: &Layers, mode: Mode) -> u64 {
    buffer_bytes(layers) * sets(layers, mode) + slots(mode) * max_slot(layers, mode)
}

pub fn read_per_pass(layers: &Layers) -> u64 {
    layers
        .entries()
        .flat_map(|(_, s)| s.iter().map(|t| t.len as u64))
        .sum()
}

/// Every layer resident; an untied embedding read row by row from the
/// file, as the engine loads it.
pub fn resident_model(path: &Path) -> Model {
    let file = GgufFile::open(path).unwrap();
    load_resident(CandleBackend::new(), &file, &mut |_, _| {}).unwrap()
}

pub struct Streamed {
    pub model: Model,
    pub ledger: Arc<Ledger>,
    pub monitor: Monitor,
}

/// A decoder holding the layers marked in `resident`, the others streamed
/// from `path` under a ledger of `budget` bytes (an untied embedding read
/// row by row). The GGUF file (and its map) is closed once loading is done.
pub fn load_streamed(path: &Path, resident: &[bool], mode: Mode, budget: u64) -> Result<Streamed> {
    load_streaming(
        path,
        resident,
        &streamed_layers(path, resident),
        mode,
        budget,
    )
}

/// [`load_streamed`] with the streamer given `layers` (which may differ
/// from what the decoder leaves out).
pub fn load_streaming(
    path: &Path,
    resident: &[bool],
    layers: &Layers,
    mode: Mode,
    budget: u64,
) -> Result<Streamed> {
    let backend = CandleBackend::new();
    let layout = &layers.layout;
    let mut model = {
        let file = GgufFile::open(path)?;
        let rows = match layout.head {
            Some(_) => Some(Box::new(DiskRows::open(path, layout)?) as Box<dyn RowSource>),
            None => None,
        };
        Decoder::load_partial(
            backend.clone(),
            &file,
            layout,
            resident,
            rows,
            &mut |_, _| {},
        )?
    };
    assert_eq!(model.resident_layers(), resident);
    let ledger = Ledger::new(budget);
    let streamer = Streamer::new(
        backend,
        path,
        layout,
        &layers.streamed,
        ledger.clone(),
        mode,
    )?;
    let monitor = streamer.monitor();
    model.set_layer_source(Box::new(streamer));
    Ok(Streamed {
        model,
        ledger,
        monitor,
    })
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

pub const PROMPT: [u32; 7] = [1, 17, 42, 200, 3, 99, 7];

/// Every logit a short session produces: a prompt, ten greedy steps, a
/// three-token tree (token 2 is token 1's sibling: it sees the cache, token
/// 0 and itself, not token 1), keeping the path 0 → 2, and one more step.
pub fn session(m: &mut dyn LanguageModel) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::new();
    let mut logits = m.step(&PROMPT)?;
    out.push(logits.clone());
    for _ in 0..10 {
        logits = m.step(&[argmax(&logits)])?;
        out.push(logits.clone());
    }
    let past = m.cache_len();
    assert_eq!(past, PROMPT.len() + 10);
    let mut mask = Mask::causal(past, 3);
    let cols = past + 3;
    mask.allowed[2 * cols + past + 1] = false;
    assert!(mask.get(2, past) && mask.get(2, past + 2) && !mask.get(2, past + 1));
    let p = past as u32;
    let tree = m.forward(&[5, 9, 11], &[p, p + 1, p + 1], &mask, &[0, 1, 2])?;
    assert_eq!(tree.rows, 3);
    out.push(tree.data);
    let keep: Vec<usize> = (0..=past).chain([past + 2]).collect();
    m.keep_cache(&keep)?;
    out.push(m.step(&[13])?);
    Ok(out)
}

pub fn bits(session: &[Vec<f32>]) -> Vec<Vec<u32>> {
    session
        .iter()
        .map(|l| l.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// Runs `f` on another thread; fails the test if it panics, or if it is
/// still blocked after a minute (the tiny models here take milliseconds,
/// so only a hang gets near that).
pub fn without_hanging<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (what, outcome) = all_without_hanging(vec![(what.to_string(), Box::new(f))]).remove(0);
    outcome.unwrap_or_else(|e| panic!("{what}: {e}"))
}

pub type Case<T> = (String, Box<dyn FnOnce() -> T + Send>);

/// Runs every case on its own thread at once; each outcome is its value,
/// or why there is none (a panic, or still blocked after a minute).
pub fn all_without_hanging<T: Send + 'static>(
    cases: Vec<Case<T>>,
) -> Vec<(String, std::result::Result<T, &'static str>)> {
    let running: Vec<_> = cases
        .into_iter()
        .map(|(what, f)| {
            let (tx, rx) = channel();
            std::thread::spawn(move || {
                let _ = tx.send(f());
            });
            (what, rx)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    running
        .into_iter()
        .map(|(what, rx)| {
            let left = deadline.saturating_duration_since(Instant::now());
            let outcome = match rx.recv_timeout(left) {
                Ok(v) => Ok(v),
                Err(RecvTimeoutError::Timeout) => Err("still blocked after a minute"),
                Err(RecvTimeoutError::Disconnected) => Err("panicked"),
            };
            (what, outcome)
        })
        .collect()
}

/// Fails the test with every case that did not end as `ok` says.
pub fn check_all<T: Send + 'static>(
    cases: Vec<Case<T>>,
    ok: impl Fn(&T) -> std::result::Result<(), String>,
) {
    let failures: Vec<String> = all_without_hanging(cases)
        .into_iter()
        .filter_map(|(what, outcome)| match outcome {
            Ok(v) => ok(&v).err().map(|e| format!("{what}: {e}")),
            Err(e) => Some(format!("{what}: {e}")),
        })
        .collect();
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

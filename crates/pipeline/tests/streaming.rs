//! Streamed decoder layers on random tiny models: the output is bit for bit
//! the fully resident model's whatever is streamed and however; the
//! streamer stays within its ledger and gives everything back; and a budget
//! or a file that cannot serve a layer is an error, never a hang or a panic.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use arbor_backend_candle::CandleBackend;
use arbor_gguf::{GgmlType, GgufFile};
use arbor_model::decoder::held_bytes;
use arbor_model::testing::TinySpec;
use arbor_model::{Config, Decoder, LanguageModel, Mask, ModelError, Result, TensorSpec};
use arbor_paging::{Ledger, PagingError};
use arbor_pipeline::{Mode, Monitor, SpanKind, Streamer, buffer_sets, read_buffer_bytes};

type Model = Decoder<CandleBackend>;
type Layers = Vec<(usize, Vec<TensorSpec>)>;

const LAYERS: usize = 6;
const MODES: [Mode; 3] = [
    Mode::OnDemand,
    Mode::Pipelined { depth: 1 },
    Mode::Pipelined { depth: 2 },
];

/// A tiny model written to its own file, deleted on drop.
struct TempModel(PathBuf);

impl TempModel {
    fn new(spec: &TinySpec, tag: &str) -> Self {
        // Tests run in parallel: every file gets its own name. The cargo
        // scratch directory is on the build disk, which is more likely than
        // /tmp to allow O_DIRECT.
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "arbor-pipeline-{tag}-{}-{n}.gguf",
            std::process::id()
        ));
        spec.writer().write(&path).unwrap();
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Rows and columns are multiples of 32 so that Q8_0 weights quantize.
fn spec(arch: &'static str, weight_type: GgmlType, tied: bool, seed: u64) -> TinySpec {
    TinySpec {
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

fn specs() -> Vec<TinySpec> {
    vec![
        spec("llama", GgmlType::Q8_0, false, 11),
        spec("llama", GgmlType::F32, true, 12),
        spec("qwen2", GgmlType::Q8_0, false, 13),
        spec("qwen2", GgmlType::F32, false, 14),
    ]
}

fn slots(mode: Mode) -> u64 {
    match mode {
        Mode::OnDemand => 1,
        Mode::Pipelined { depth } => depth as u64 + 1,
    }
}

/// Index and tensors of the layers `resident` leaves out, in layer order.
fn streamed_layers(path: &Path, resident: &[bool]) -> Layers {
    let file = GgufFile::open(path).unwrap();
    let cfg = Config::from_gguf(file.header()).unwrap();
    resident
        .iter()
        .enumerate()
        .filter(|(_, r)| !**r)
        .map(|(i, _)| (i, cfg.layer_tensors(file.header(), i).unwrap()))
        .collect()
}

fn buffer_bytes(layers: &Layers) -> u64 {
    let refs: Vec<&[TensorSpec]> = layers.iter().map(|(_, s)| s.as_slice()).collect();
    read_buffer_bytes(&refs)
}

fn max_held(layers: &Layers) -> u64 {
    let backend = CandleBackend::new();
    layers
        .iter()
        .map(|(_, s)| held_bytes(&backend, s))
        .max()
        .unwrap_or(0)
}

/// The streamer's share as the engine plans it: read buffers plus `slots`
/// of the largest streamed layer, not a byte more.
fn exact_budget(layers: &Layers, mode: Mode) -> u64 {
    buffer_bytes(layers) * buffer_sets(mode) + slots(mode) * max_held(layers)
}

fn read_per_pass(layers: &Layers) -> u64 {
    layers
        .iter()
        .flat_map(|(_, s)| s.iter().map(|t| t.len as u64))
        .sum()
}

fn resident_model(path: &Path) -> Model {
    let file = GgufFile::open(path).unwrap();
    Decoder::load(CandleBackend::new(), &file, &mut |_, _| {}).unwrap()
}

struct Streamed {
    model: Model,
    ledger: Arc<Ledger>,
    monitor: Monitor,
}

/// A decoder holding the layers marked in `resident`, the others streamed
/// from `path` under a ledger of `budget` bytes. The GGUF file (and its
/// map) is closed once loading is done.
fn load_streamed(path: &Path, resident: &[bool], mode: Mode, budget: u64) -> Result<Streamed> {
    let layers = streamed_layers(path, resident);
    let backend = CandleBackend::new();
    let mut model = {
        let file = GgufFile::open(path)?;
        Decoder::load_partial(backend.clone(), &file, resident, &mut |_, _| {})?
    };
    assert_eq!(model.resident_layers(), resident);
    let ledger = Ledger::new(budget);
    let streamer = Streamer::new(backend, path, layers, ledger.clone(), mode)?;
    let monitor = streamer.monitor();
    model.set_layer_source(Box::new(streamer));
    Ok(Streamed {
        model,
        ledger,
        monitor,
    })
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

const PROMPT: [u32; 7] = [1, 17, 42, 200, 3, 99, 7];

/// Every logit a short session produces: a prompt, ten greedy steps, a
/// three-token tree (token 2 is token 1's sibling: it sees the cache, token
/// 0 and itself, not token 1), keeping the path 0 → 2, and one more step.
fn session(m: &mut dyn LanguageModel) -> Result<Vec<Vec<f32>>> {
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

fn bits(session: &[Vec<f32>]) -> Vec<Vec<u32>> {
    session
        .iter()
        .map(|l| l.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// Runs `f` on another thread; fails the test if it panics, or if it is
/// still blocked after a minute (the tiny models here take milliseconds,
/// so only a hang gets near that).
fn without_hanging<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (what, outcome) = all_without_hanging(vec![(what.to_string(), Box::new(f))]).remove(0);
    outcome.unwrap_or_else(|e| panic!("{what}: {e}"))
}

type Case<T> = (String, Box<dyn FnOnce() -> T + Send>);

/// Runs every case on its own thread at once; each outcome is its value,
/// or why there is none (a panic, or still blocked after a minute).
fn all_without_hanging<T: Send + 'static>(
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

#[test]
fn streamed_logits_are_bit_identical_to_resident_ones() {
    let patterns: [[bool; LAYERS]; 4] = [
        [true, false, true, false, false, true],
        [false; LAYERS],
        [true, true, true, true, true, false],
        [false, true, true, true, true, true],
    ];
    for (s, spec) in specs().iter().enumerate() {
        let file = TempModel::new(spec, "lossless");
        let want = bits(&session(&mut resident_model(file.path())).unwrap());
        for pattern in &patterns {
            let layers = streamed_layers(file.path(), pattern);
            for mode in MODES {
                let budget = exact_budget(&layers, mode);
                let mut st = load_streamed(file.path(), pattern, mode, budget).unwrap();
                let got = bits(&session(&mut st.model).unwrap());
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g == w,
                        "spec {s} ({} {:?}), resident {pattern:?}, {mode:?}: logits {i} of the session differ",
                        spec.arch,
                        spec.weight_type
                    );
                }
                assert_eq!(got.len(), want.len());
                assert!(st.monitor.stats().layers >= (13 * layers.len()) as u64);
            }
        }
    }
}

#[test]
fn streaming_stays_within_the_exact_budget() {
    let pattern = [true, false, true, false, false, true];
    for spec in specs() {
        let file = TempModel::new(&spec, "budget");
        let layers = streamed_layers(file.path(), &pattern);
        let one_set = buffer_bytes(&layers);
        let held = max_held(&layers);
        // Every streamed layer has the same shape here, so every one of
        // them needs the whole slot.
        assert!(
            layers
                .iter()
                .all(|(_, s)| held_bytes(&CandleBackend::new(), s) == held)
        );
        for mode in MODES {
            let buffers = one_set * buffer_sets(mode);
            let budget = exact_budget(&layers, mode);
            assert_eq!(budget, buffers + slots(mode) * held);
            let mut st = load_streamed(file.path(), &pattern, mode, budget).unwrap();
            // The read buffers are reserved up front.
            assert!(st.ledger.used() >= buffers);
            st.model.step(&PROMPT).unwrap();
            if mode == Mode::OnDemand {
                // Between passes only the buffers are held: each layer was
                // given back once the pass was done with it.
                assert_eq!(st.ledger.used(), buffers, "{mode:?}");
                assert_eq!(st.ledger.peak(), budget, "{mode:?}");
            }
            st.model.truncate_cache(0).unwrap();
            session(&mut st.model).unwrap();
            let (used, peak) = (st.ledger.used(), st.ledger.peak());
            assert!(peak <= budget, "{mode:?}: peak {peak} > budget {budget}");
            assert!(peak >= buffers + held, "{mode:?}: peak {peak}");
            assert!(used <= budget, "{mode:?}");
            if mode == Mode::OnDemand {
                assert_eq!((used, peak), (buffers, budget));
                assert!(!st.monitor.waiting());
            }
            // Dropping the model stops the loader and frees everything.
            let ledger = st.ledger.clone();
            drop(st);
            assert_eq!(
                ledger.used(),
                0,
                "{mode:?}: reservations outlived the streamer"
            );
        }
    }
}

#[test]
fn a_budget_without_room_for_the_read_buffers_is_refused() {
    let pattern = [true, false, true, false, false, true];
    let file = TempModel::new(&spec("llama", GgmlType::Q8_0, false, 21), "buffers");
    let layers = streamed_layers(file.path(), &pattern);
    for mode in MODES {
        let buffers = buffer_bytes(&layers) * buffer_sets(mode);
        let ledger = Ledger::new(buffers - 1);
        let got = Streamer::new(
            CandleBackend::new(),
            file.path(),
            layers.clone(),
            ledger.clone(),
            mode,
        );
        match got {
            Err(ModelError::Paging(PagingError::OverBudget { needed, budget, .. })) => {
                assert_eq!((needed, budget), (buffers, buffers - 1), "{mode:?}");
            }
            Err(e) => panic!("{mode:?}: expected OverBudget, got {e}"),
            Ok(_) => panic!("{mode:?}: a streamer was built without room for its buffers"),
        }
        assert_eq!(ledger.used(), 0);
        // With room for the buffers and the layers it is built. (Room for
        // the buffers alone builds one too; a pipelined one's loader then
        // fails at once, which the next test checks under a watchdog.)
        let enough = match mode {
            Mode::OnDemand => buffers,
            Mode::Pipelined { .. } => exact_budget(&layers, mode),
        };
        let ledger = Ledger::new(enough);
        let streamer = Streamer::new(
            CandleBackend::new(),
            file.path(),
            layers.clone(),
            ledger.clone(),
            mode,
        );
        assert!(streamer.is_ok(), "{mode:?}");
        drop(streamer);
        assert_eq!(ledger.used(), 0, "{mode:?}");
    }
}

/// Fails the test with every case that did not end as `ok` says.
fn check_all<T: Send + 'static>(
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

/// A ledger that holds the read buffers but not a layer beside them: the
/// forward pass (or already the streamer) must fail, not wait forever for
/// bytes that only the streamer itself could give back.
#[test]
fn a_budget_without_room_for_a_layer_is_an_error_not_a_hang() {
    let pattern = [true, false, true, false, false, true];
    let file = TempModel::new(&spec("llama", GgmlType::Q8_0, false, 22), "nolayer");
    let path = file.path().to_path_buf();
    let layers = streamed_layers(&path, &pattern);
    let one_set = buffer_bytes(&layers);
    let held = max_held(&layers);
    let mut cases: Vec<Case<Result<Vec<f32>>>> = Vec::new();
    for mode in MODES {
        let buffers = one_set * buffer_sets(mode);
        let mut budgets = vec![buffers, buffers + held - 1];
        if held > buffers {
            // Smaller than the layer itself: `reserve_blocking` refuses at once.
            budgets.push(held - 1);
        }
        for budget in budgets {
            let path = path.clone();
            let what = format!("{mode:?}, budget {budget} (buffers {buffers}, layer {held})");
            cases.push((
                what,
                Box::new(move || {
                    let mut st = load_streamed(&path, &pattern, mode, budget)?;
                    let got = st.model.step(&PROMPT);
                    let again = st.model.step(&PROMPT);
                    drop(st);
                    got.and(again)
                }),
            ));
        }
    }
    // Not even a forward pass: building a pipelined streamer and dropping
    // it again must not hang either (its loader is stuck waiting for the
    // ledger, and the drop joins it).
    for depth in [1, 2] {
        let path = path.clone();
        let layers = layers.clone();
        let buffers = one_set * buffer_sets(Mode::Pipelined { depth });
        cases.push((
            format!("Pipelined {{ depth: {depth} }}, budget {buffers}, dropped unused"),
            Box::new(move || {
                let streamer = Streamer::new(
                    CandleBackend::new(),
                    &path,
                    layers,
                    Ledger::new(buffers),
                    Mode::Pipelined { depth },
                )?;
                drop(streamer);
                Err(ModelError::Paging(PagingError::TooSmall {
                    budget: buffers,
                    minimum: buffers + held,
                    detail: "dropped".into(),
                }))
            }),
        ));
    }
    check_all(cases, |outcome| match outcome {
        Err(ModelError::Paging(PagingError::OverBudget { .. }))
        | Err(ModelError::Paging(PagingError::TooSmall { .. })) => Ok(()),
        Err(e) => Err(format!("expected a budget error, got {e}")),
        Ok(_) => Err("a layer was streamed without room for it".into()),
    });
}

/// The decoder asks for a layer the streamer was not given: an error.
#[test]
fn a_layer_the_streamer_does_not_have_is_an_error_not_a_hang() {
    let pattern = [true, false, true, false, true, true];
    let file = TempModel::new(&spec("llama", GgmlType::Q8_0, false, 23), "missing");
    let path = file.path().to_path_buf();
    // Layer 3 is streamed by the decoder, but not by the streamer.
    let mut layers = streamed_layers(&path, &pattern);
    layers.retain(|(i, _)| *i != 3);
    let budget = exact_budget(&layers, Mode::Pipelined { depth: 2 });
    let mut cases: Vec<Case<Result<()>>> = Vec::new();
    for mode in MODES {
        let (path, layers) = (path.clone(), layers.clone());
        cases.push((
            format!("{mode:?}"),
            Box::new(move || {
                let backend = CandleBackend::new();
                let mut model = {
                    let file = GgufFile::open(&path)?;
                    Decoder::load_partial(backend.clone(), &file, &pattern, &mut |_, _| {})?
                };
                let streamer = Streamer::new(backend, &path, layers, Ledger::new(budget), mode)?;
                model.set_layer_source(Box::new(streamer));
                model.step(&PROMPT).map(|_| ())
            }),
        ));
    }
    check_all(cases, |outcome| match outcome {
        Err(_) => Ok(()),
        Ok(()) => Err("layer 3 came from nowhere".into()),
    });
}

/// Truncates the file inside the last streamed layer (the last tensors of
/// the file); returns the new length.
fn cut_last_layer(path: &Path, layers: &Layers) -> u64 {
    let (last, specs) = layers.last().unwrap();
    assert_eq!(*last, LAYERS - 1, "the last layer must be streamed");
    let start = specs.iter().map(|s| s.offset).min().unwrap();
    let end = specs.iter().map(|s| s.offset + s.len as u64).max().unwrap();
    // Nothing that is read after loading lies past the cut: the other
    // streamed layers and the token embedding (read row by row when the
    // head is untied) come first in the file.
    for (_, s) in &layers[..layers.len() - 1] {
        assert!(s.iter().all(|t| t.offset + t.len as u64 <= start));
    }
    {
        let file = GgufFile::open(path).unwrap();
        let h = file.header();
        let embd = h.tensor("token_embd.weight").unwrap();
        assert!(h.data_offset + embd.offset + embd.size <= start);
        assert!(end <= file.bytes().len() as u64);
    }
    let cut = start + (end - start) / 2;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(cut)
        .unwrap();
    cut
}

fn assert_truncated(e: &ModelError, cut: u64, what: &str) {
    match e {
        ModelError::Paging(PagingError::Truncated {
            offset,
            len,
            file_len,
            ..
        }) => {
            assert_eq!(*file_len, cut, "{what}");
            assert!(offset + len > cut, "{what}: {e}");
        }
        e => panic!("{what}: expected Truncated, got {e}"),
    }
}

#[test]
fn a_file_truncated_under_the_streamer_is_an_error() {
    let pattern = [true, true, false, true, true, false];
    for (s, spec) in [
        spec("llama", GgmlType::Q8_0, false, 31),
        spec("qwen2", GgmlType::F32, true, 32),
    ]
    .iter()
    .enumerate()
    {
        for mode in MODES {
            let file = TempModel::new(spec, "truncated");
            let path = file.path().to_path_buf();
            let layers = streamed_layers(&path, &pattern);
            let budget = exact_budget(&layers, mode);
            let what = format!("spec {s}, {mode:?}");
            let msg = what.clone();
            without_hanging(&what, move || {
                let what = msg;
                let mut st = load_streamed(&path, &pattern, mode, budget).unwrap();
                let m = &mut st.model;
                m.step(&PROMPT).unwrap();
                let cut = cut_last_layer(&path, &layers);
                let len = m.cache_len();
                match mode {
                    Mode::OnDemand => {
                        let e = m.step(&[5]).expect_err("read past the end of the file");
                        assert_truncated(&e, cut, &what);
                        // Still an error, with or without the cache the failed
                        // pass left behind.
                        assert!(m.step(&[5]).is_err(), "{what}");
                        m.truncate_cache(len).unwrap();
                        let e = m.step(&[5]).expect_err("read past the end again");
                        assert_truncated(&e, cut, &what);
                    }
                    Mode::Pipelined { .. } => {
                        // Layers loaded before the cut are still good; the
                        // loader is at most `depth + 1` layers (under two
                        // passes) ahead.
                        let mut first = None;
                        for _ in 0..4 {
                            match m.step(&[5]) {
                                Ok(_) => {}
                                Err(e) => {
                                    first = Some(e);
                                    break;
                                }
                            }
                            m.truncate_cache(len).unwrap();
                        }
                        let e = first.expect("the cut was never noticed");
                        assert_truncated(&e, cut, &what);
                        for _ in 0..3 {
                            m.truncate_cache(len).unwrap();
                            assert!(m.step(&[5]).is_err(), "{what}: worked after an error");
                        }
                    }
                }
                assert!(st.ledger.peak() <= budget);
                let ledger = st.ledger.clone();
                drop(st);
                assert_eq!(ledger.used(), 0, "{what}");
            });
        }
    }
}

#[test]
fn the_monitor_counts_layers_and_bytes() {
    let pattern = [true, false, true, false, false, true];
    let file = TempModel::new(&spec("llama", GgmlType::Q8_0, false, 41), "monitor");
    let layers = streamed_layers(file.path(), &pattern);
    let k = layers.len() as u64;
    let per_pass = read_per_pass(&layers);
    // All streamed layers read the same number of bytes.
    let per_layer = per_pass / k;
    assert_eq!(per_layer * k, per_pass);
    const N: u64 = 5;
    for mode in MODES {
        let budget = exact_budget(&layers, mode);
        let st = load_streamed(file.path(), &pattern, mode, budget).unwrap();
        let mut m = st.model;
        st.monitor.record_from(Instant::now());
        m.step(&PROMPT).unwrap();
        for t in 0..N - 1 {
            m.step(&[t as u32]).unwrap();
        }
        let stats = st.monitor.stats();
        assert!(!st.monitor.waiting());
        match mode {
            Mode::OnDemand => {
                assert_eq!(stats.layers, N * k);
                assert_eq!(stats.bytes, N * per_pass);
                let spans = st.monitor.spans();
                for kind in [SpanKind::Io, SpanKind::Build, SpanKind::Wait] {
                    let of_kind: Vec<_> = spans.iter().filter(|s| s.kind == kind).collect();
                    assert_eq!(of_kind.len() as u64, N * k, "{kind:?}");
                    let want: Vec<usize> = (0..N).flat_map(|_| [1, 3, 4]).collect();
                    let got: Vec<usize> = of_kind.iter().map(|s| s.layer).collect();
                    assert_eq!(got, want, "{kind:?}");
                }
            }
            Mode::Pipelined { depth } => {
                // Every layer the passes used, plus what the loader got
                // ahead: at most `depth` queued and one waiting to be.
                assert!(stats.layers >= N * k, "{mode:?}: {stats:?}");
                assert!(
                    stats.layers <= N * k + depth as u64 + 1,
                    "{mode:?}: {stats:?}"
                );
                // The reader may be up to two layers ahead of the builder
                // (one handed over, one waiting to be).
                assert!(stats.bytes >= stats.layers * per_layer, "{mode:?}");
                assert!(stats.bytes <= (stats.layers + 2) * per_layer, "{mode:?}");
                // A pass only waits for layers not loaded yet.
                let spans = st.monitor.spans();
                let waits = spans.iter().filter(|s| s.kind == SpanKind::Wait).count();
                assert!(waits as u64 <= N * k, "{mode:?}");
            }
        }
        for s in st.monitor.spans() {
            assert!(s.start <= s.end, "{s:?}");
        }
        assert!(stats.io_secs >= 0.0 && stats.build_secs >= 0.0 && stats.wait_secs >= 0.0);
    }
}

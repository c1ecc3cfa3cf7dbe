//! The output head read a slice at a time ([`DiskHead`]) on random tiny
//! models: logits bit for bit the resident head's, for tied and untied
//! heads of every weight type; and a budget that cannot hold the head
//! with the rest plans it streamed, runs, and says so.

use crate::common;

use arbor_backend_candle::CandleBackend;
use arbor_gguf::{GgmlType, GgufFile};
use arbor_model::{Decoder, Layout, RowSource};
use arbor_paging::DirectReader;
use arbor_pipeline::{DiskHead, DiskRows, MemoryOptions, Monitor, load_target, plan_with};
use common::*;

/// A vocabulary large enough that the head is cut into several slices.
fn wide(
    arch: &'static str,
    weight_type: GgmlType,
    tied: bool,
    seed: u64,
) -> arbor_model::testing::TinyModel {
    let hidden = if weight_type == GgmlType::Q4_K {
        256
    } else {
        64
    };
    arbor_model::testing::TinyModel {
        vocab: 2048,
        hidden,
        ffn: 2 * hidden,
        ..tiny(arch, weight_type, tied, seed)
    }
}

fn wides() -> Vec<arbor_model::testing::TinyModel> {
    vec![
        wide("llama", GgmlType::F32, true, 21),
        wide("qwen2", GgmlType::F16, true, 22),
        wide("llama", GgmlType::Q8_0, false, 23),
        wide("qwen2", GgmlType::Q4_K, false, 24),
    ]
}

#[test]
fn a_head_read_by_slices_gives_the_resident_heads_bits() {
    for (tiny, held) in wides().into_iter().zip([0, 3, 7, 20]) {
        let file = TempModel::new(&tiny, "head-slices");
        let want = bits(&session(&mut resident_model(file.path())).unwrap());
        let gguf = GgufFile::open(file.path()).unwrap();
        let layout = Layout::from_gguf(gguf.header()).unwrap();
        let backend = CandleBackend::new();
        let rows: Box<dyn RowSource> = Box::new(DiskRows::open(file.path(), &layout).unwrap());
        let resident = vec![true; LAYERS];
        let mut model = Decoder::load_parts(
            backend.clone(),
            &gguf,
            &layout,
            &resident,
            false,
            Some(rows),
            &mut |_, _| {},
        )
        .unwrap();
        assert!(model.resident_bytes() < resident_model(file.path()).resident_bytes());
        let monitor = Monitor::default();
        let reader = DirectReader::open(file.path()).unwrap();
        let mut head = DiskHead::new(backend, reader, &layout, monitor.clone());
        head.hold(held).unwrap();
        // Every slice but the last at most: 2,048 rows in slices of 256.
        assert_eq!(head.held_rows(), held.min(7) * 256);
        let held_rows = head.held_rows();
        model.set_head_source(Box::new(head)).unwrap();
        assert!(model.head_streamed());
        assert!(
            model.self_draft().is_err(),
            "a self draft needs the head held"
        );
        let got = bits(&session(&mut model).unwrap());
        assert!(
            got == want,
            "{} {:?} tied {}, {held_rows} rows held: logits differ with the head read by slices",
            tiny.arch,
            tiny.weight_type,
            tiny.tied
        );
        // Every pass that returned logits read the head but its held rows.
        let entry = layout.head_tensor();
        let per_pass = (entry.len - held_rows * (entry.len / entry.rows)) as u64;
        let stats = monitor.stats();
        assert_eq!(stats.bytes % per_pass, 0);
        assert!(stats.bytes >= 13 * per_pass, "{} bytes read", stats.bytes);
    }
}

/// The rows `first..first + rows` a slice of a head of f32 rows of
/// `hidden` values holds, read back through the backend: an identity times
/// the slice is its transpose, exactly.
fn slice_values(
    backend: &CandleBackend,
    head: &mut DiskHead<CandleBackend>,
    hidden: usize,
    first: usize,
    rows: usize,
) -> arbor_model::Result<Vec<f32>> {
    use arbor_model::HeadSource;
    use arbor_tensor::Backend;
    let mut eye = vec![0f32; hidden * hidden];
    eye.iter_mut().step_by(hidden + 1).for_each(|v| *v = 1.0);
    let x = backend.tensor(&eye, hidden, hidden).unwrap();
    let w = head.slice(first, rows)?;
    let out = backend.take_vec(backend.matmul(&x, &w).unwrap()).unwrap();
    // out[i][r] = w[r][i]: back to row order.
    Ok((0..rows * hidden)
        .map(|k| out[(k % hidden) * rows + k / hidden])
        .collect())
}

#[test]
fn slices_asked_in_any_order_hold_the_files_rows() {
    let tiny = wide("llama", GgmlType::F32, true, 27);
    let file = TempModel::new(&tiny, "head-order");
    let gguf = GgufFile::open(file.path()).unwrap();
    let layout = Layout::from_gguf(gguf.header()).unwrap();
    let entry = layout.head_tensor().clone();
    let raw = std::fs::read(file.path()).unwrap();
    let values: Vec<f32> = raw[entry.offset as usize..entry.offset as usize + entry.len]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let hidden = entry.cols;
    let backend = CandleBackend::new();
    let monitor = Monitor::default();
    let reader = DirectReader::open(file.path()).unwrap();
    let mut head = DiskHead::new(backend.clone(), reader, &layout, monitor.clone());
    head.hold(1).unwrap();
    // In order, out of order, again, held, partial and the short last
    // slice: the read ahead guesses wrong on most of these.
    let asks = [
        (256, 256),
        (512, 256),
        (1792, 256),
        (0, 256),
        (1024, 256),
        (1024, 256),
        (300, 17),
        (0, 100),
        (1536, 256),
        (256, 256),
        (1280, 256),
        (2000, 48),
        (768, 256),
    ];
    let mut asked = 0;
    for (first, rows) in asks {
        let got = slice_values(&backend, &mut head, hidden, first, rows).unwrap();
        assert!(
            got == values[first * hidden..(first + rows) * hidden],
            "rows {first}+{rows} differ from the file's"
        );
        asked += rows;
        // The slice is dropped: its buffer is back, and no other was made.
        assert_eq!(head.buffers_home(), 2, "after rows {first}+{rows}");
    }
    let held = 256 * hidden * 4;
    let stats = monitor.stats();
    assert!(stats.bytes as usize >= asked * hidden * 4 - 2 * held);
    use arbor_model::HeadSource;
    assert!(head.slice(2000, 49).is_err(), "rows past the head");
    assert!(head.slice(5, 0).is_err(), "an empty slice");

    // A file cut short after opening: the rows past its end are a typed
    // error, and the rows before it still arrive.
    let cut = entry.offset as usize + 1024 * hidden * 4;
    std::fs::OpenOptions::new()
        .write(true)
        .open(file.path())
        .unwrap()
        .set_len(cut as u64)
        .unwrap();
    for _ in 0..2 {
        assert!(slice_values(&backend, &mut head, hidden, 1536, 256).is_err());
        assert_eq!(head.buffers_home(), 2, "a failed read keeps its buffer");
        let got = slice_values(&backend, &mut head, hidden, 512, 256).unwrap();
        assert!(got == values[512 * hidden..768 * hidden]);
        assert_eq!(head.buffers_home(), 2);
    }
}

#[test]
fn passes_in_order_find_their_slices_read_ahead() {
    use arbor_model::HeadSource;
    let tiny = wide("qwen2", GgmlType::F16, true, 28);
    let file = TempModel::new(&tiny, "head-ahead");
    let gguf = GgufFile::open(file.path()).unwrap();
    let layout = Layout::from_gguf(gguf.header()).unwrap();
    let entry = layout.head_tensor().clone();
    let slice_bytes = (entry.len / entry.rows * 256) as u64;
    let backend = CandleBackend::new();
    let monitor = Monitor::default();
    let reader = DirectReader::open(file.path()).unwrap();
    let mut head = DiskHead::new(backend, reader, &layout, monitor.clone());
    head.hold(2).unwrap();
    // Whole passes over 2,048 rows in slices of 256, the first two held:
    // only the first pass's first read is not ahead, and nothing is read
    // twice or in vain (the read started by the last pass is not done).
    let pass = |head: &mut DiskHead<CandleBackend>, end: usize| {
        for first in (0..end).step_by(256) {
            head.slice(first, 256).unwrap();
        }
    };
    for _ in 0..3 {
        pass(&mut head, 2048);
    }
    assert_eq!(head.reads_ahead(), (18, 17));
    assert_eq!(monitor.stats().bytes, 18 * slice_bytes);
    // A head run in part (an elastic file's first rows): the pass after
    // the first partial one learns where passes end and wraps there.
    for _ in 0..3 {
        pass(&mut head, 1280);
    }
    let (asked, ahead) = head.reads_ahead();
    assert_eq!(
        (asked, ahead),
        (18 + 9, 17 + 8),
        "the first partial pass wraps late"
    );
    // The read past the partial pass's end was wasted once, and counted.
    assert_eq!(monitor.stats().bytes, (27 + 1) * slice_bytes);
    assert_eq!(head.buffers_home(), 2);
}

#[test]
fn a_head_without_a_row_source_is_refused() {
    let tiny = wide("llama", GgmlType::F32, true, 25);
    let file = TempModel::new(&tiny, "head-no-rows");
    let gguf = GgufFile::open(file.path()).unwrap();
    let layout = Layout::from_gguf(gguf.header()).unwrap();
    let backend = CandleBackend::new();
    let resident = vec![true; LAYERS];
    let r = Decoder::load_parts(
        backend,
        &gguf,
        &layout,
        &resident,
        false,
        None,
        &mut |_, _| {},
    );
    assert!(r.is_err());
}

/// The smallest budget (bytes) under which `fits` holds, by bisection.
fn smallest(mut lo: u64, mut hi: u64, fits: impl Fn(u64) -> bool) -> u64 {
    assert!(fits(hi) && !fits(lo));
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match fits(mid) {
            true => hi = mid,
            false => lo = mid,
        }
    }
    hi
}

#[test]
fn a_budget_too_small_for_the_head_reads_it_per_pass() {
    for tiny in wides() {
        let file = TempModel::new(&tiny, "head-budget");
        let gguf = GgufFile::open(file.path()).unwrap();
        let backend = CandleBackend::new();
        let options = |budget: u64| MemoryOptions {
            base: Some(0),
            context: 64,
            logit_rows: 3,
            draft_logit_rows: 1,
            ..MemoryOptions::new(budget, true)
        };
        let plan = |budget: u64| plan_with(&backend, &gguf, None, 0, &options(budget)).unwrap();
        let held = smallest(0, 1 << 30, |b| plan(b).is_some_and(|p| p.head_read == 0));
        let any = smallest(0, 1 << 30, |b| plan(b).is_some());
        assert!(
            any < held,
            "{:?}: streaming the head should lower the minimum",
            tiny.weight_type
        );
        let layout = Layout::from_gguf(gguf.header()).unwrap();
        let entry = layout.head_tensor();
        let head_bytes = entry.len as u64;
        let row_bytes = head_bytes / entry.rows as u64;
        let p = plan(held - 1).expect("the head streams below its held minimum");
        assert!(p.head_read > 0 && p.read_per_pass >= p.head_read);
        // Between the two minimums, what is left once whole layers are
        // planned holds the head's first slices (all but the last at most):
        // never more than fits, and as many as fit.
        let mut holding = None;
        let step = ((held - any) / 200).max(1);
        for budget in (any..held).step_by(step as usize) {
            let p = plan(budget).unwrap();
            let (rows, bytes) = p.head_held;
            assert_eq!(p.head_read, head_bytes - rows as u64 * row_bytes);
            assert!(p.fixed + p.stream_reserve + p.resident_bytes <= budget);
            assert!(rows < entry.rows && p.fixed >= bytes);
            if rows > 0 {
                let slice = bytes / (rows / 256) as u64;
                let spare = budget - p.fixed - p.stream_reserve - p.resident_bytes;
                assert!(
                    spare < slice || rows == entry.rows - 256,
                    "{spare} bytes left"
                );
                holding.get_or_insert(budget);
            }
        }
        let budget = holding.expect("some budget holds part of the head");
        let (mut model, report) = load_target(
            backend.clone(),
            &gguf,
            None,
            &options(budget),
            &mut |_, _| {},
        )
        .unwrap();
        assert!(model.head_streamed());
        assert!(report.summary().contains("rows, "), "{}", report.summary());
        let got = bits(&session(&mut model).unwrap());
        assert!(
            got == bits(&session(&mut resident_model(file.path())).unwrap()),
            "{:?}: logits differ with part of the head held",
            tiny.weight_type
        );

        let want = bits(&session(&mut resident_model(file.path())).unwrap());
        let (mut model, report) =
            load_target(backend.clone(), &gguf, None, &options(any), &mut |_, _| {}).unwrap();
        assert!(model.head_streamed());
        assert!(report.summary().contains("head"), "{}", report.summary());
        let got = bits(&session(&mut model).unwrap());
        assert!(
            got == want,
            "{:?}: logits differ under the budget",
            tiny.weight_type
        );
        assert!(
            report
                .monitor
                .expect("streaming is monitored")
                .stats()
                .bytes
                > 0
        );

        let err = load_target(
            backend.clone(),
            &gguf,
            None,
            &options(any - 1),
            &mut |_, _| {},
        )
        .err()
        .expect("below the minimum nothing loads");
        assert!(err.to_string().contains("too small"), "{err}");
    }
}

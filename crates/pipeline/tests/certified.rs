//! A streamed float head with a held Q8_0 (or Q5_0) copy gives greedy
//! passes their argmax ([`arbor_model::certified`]) on random tiny models:
//! every logit is the resident head's bits or below both maxima, passes
//! read a fraction of the head, and passes that read every value get the
//! resident head's logits.

use crate::common;

use arbor_backend_candle::CandleBackend;
use arbor_gguf::{GgmlType, GgufFile};
use arbor_model::{Decoder, LanguageModel, Layout, RowSource};
use arbor_paging::DirectReader;
use arbor_pipeline::{DiskHead, DiskRows, Monitor};
use common::*;

/// A tiny model with a vocabulary of several head slices.
fn wide(arch: &'static str, weight_type: GgmlType, seed: u64) -> arbor_model::testing::TinyModel {
    arbor_model::testing::TinyModel {
        vocab: 2048,
        hidden: 64,
        ffn: 128,
        ..tiny(arch, weight_type, true, seed)
    }
}

/// The model of `path` with its layers held and its head read from the
/// file, given its `copy` copy; and the head's monitor.
fn with_copy(path: &std::path::Path, copy: GgmlType) -> (Decoder<CandleBackend>, Monitor, u64) {
    let gguf = GgufFile::open(path).unwrap();
    let layout = Layout::from_gguf(gguf.header()).unwrap();
    let backend = CandleBackend::new();
    let rows: Box<dyn RowSource> = Box::new(DiskRows::open(path, &layout).unwrap());
    let mut model = Decoder::load_parts(
        backend.clone(),
        &gguf,
        &layout,
        &[true; LAYERS],
        false,
        Some(rows),
        &mut |_, _| {},
    )
    .unwrap();
    let monitor = Monitor::default();
    let reader = DirectReader::open(path).unwrap();
    let mut head = DiskHead::new(backend, reader, &layout, monitor.clone());
    head.small_slices().unwrap();
    let approx = head.approx(copy).unwrap();
    assert_eq!(approx.rows(), layout.head_rows());
    model.set_head_source(Box::new(head)).unwrap();
    model.set_approx_head(approx).unwrap();
    // Building the copy read the head once.
    let head_bytes = layout.head_tensor().len as u64;
    assert_eq!(monitor.stats().bytes, 0, "the copy's read is not a pass's");
    (model, monitor, head_bytes)
}

/// Every row of `got` against `want`: each value is `want`'s bits, or it
/// and `want`'s value are both below `want`'s row maximum (so the argmax
/// and its ties are the same). Returns how many values were exact.
fn certified_rows(got: &[f32], want: &[f32], vocab: usize, what: &str) -> usize {
    assert_eq!(got.len(), want.len(), "{what}");
    let mut exact = 0;
    for (r, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
        let top = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for (j, (&a, &b)) in g.iter().zip(w).enumerate() {
            if a.to_bits() == b.to_bits() {
                exact += 1;
                continue;
            }
            assert!(
                a < top && b < top,
                "{what}, row {r}, token {j}: {a} given for {b} under a maximum of {top}"
            );
        }
        assert_eq!(argmax(g), argmax(w), "{what}, row {r}");
    }
    exact
}

#[test]
fn a_held_copy_gives_greedy_passes_the_exact_argmax() {
    let cases = [
        (wide("qwen2", GgmlType::F16, 31), GgmlType::Q8_0),
        (wide("llama", GgmlType::F32, 32), GgmlType::Q8_0),
        (wide("qwen2", GgmlType::F16, 33), GgmlType::Q5_0),
    ];
    for (tiny, copy) in cases {
        let what = format!("{} {:?} with a {copy:?} copy", tiny.arch, tiny.weight_type);
        let file = TempModel::new(&tiny, "certified");
        let want = session(&mut resident_model(file.path())).unwrap();

        // Passes that read every value get the resident head's bits.
        let (mut model, _, _) = with_copy(file.path(), copy);
        model.set_argmax_only(false);
        let got = session(&mut model).unwrap();
        assert!(
            bits(&got) == bits(&want),
            "{what}: logits differ without argmax_only"
        );

        // Greedy passes: exact where the maximum may be, and the head's
        // rows read only there.
        let (mut model, monitor, head_bytes) = with_copy(file.path(), copy);
        assert!(model.set_argmax_only(true), "{what}: the copy is used");
        let got = session(&mut model).unwrap();
        let mut exact = 0;
        let mut values = 0;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            exact += certified_rows(g, w, tiny.vocab, &format!("{what}, pass {i}"));
            values += g.len();
        }
        let passes = want.len() as u64;
        let read = monitor.stats().bytes;
        assert!(
            read < passes * head_bytes / 4,
            "{what}: {read} bytes read in {passes} passes of a {head_bytes}-byte head"
        );
        assert!(
            exact < values / 4,
            "{what}: {exact} of {values} values exact"
        );
        assert!(exact > 0);
    }
}

#[test]
fn a_copy_is_refused_where_it_cannot_stand_for_the_head() {
    let tiny = wide("qwen2", GgmlType::F16, 34);
    let file = TempModel::new(&tiny, "certified-refused");
    let gguf = GgufFile::open(file.path()).unwrap();
    let layout = Layout::from_gguf(gguf.header()).unwrap();
    let backend = CandleBackend::new();
    let reader = DirectReader::open(file.path()).unwrap();
    let mut head = DiskHead::new(backend.clone(), reader, &layout, Monitor::default());
    let approx = head.approx(GgmlType::Q8_0).unwrap();
    // Slices are sized before any is read.
    use arbor_model::HeadSource;
    let _ = head.slice(0, 256).unwrap();
    assert!(head.small_slices().is_err());
    // A model whose head is held has no use for a copy.
    let mut held = resident_model(file.path());
    assert!(held.set_approx_head(approx).is_err());
    assert!(!held.set_argmax_only(true), "nothing to use");
    // Only Q8_0 and Q5_0 copies over whole blocks.
    assert!(head.approx(GgmlType::Q4_K).is_err());
    assert!(arbor_model::certified::ApproxHead::<CandleBackend>::new(GgmlType::Q8_0, 40).is_err());
}

#[test]
fn a_budget_plans_the_copy_only_where_it_reads_less() {
    use arbor_pipeline::{MemoryOptions, load_target, plan_with};
    // A head large beside the layers, as a 150k vocabulary's is.
    let tiny = arbor_model::testing::TinyModel {
        vocab: 16384,
        hidden: 256,
        ffn: 512,
        ..wide("qwen2", GgmlType::F16, 35)
    };
    let file = TempModel::new(&tiny, "certified-plan");
    let gguf = GgufFile::open(file.path()).unwrap();
    let backend = CandleBackend::new();
    let options = |budget: u64, approx_head: bool| MemoryOptions {
        base: Some(0),
        context: 64,
        logit_rows: 3,
        draft_logit_rows: 1,
        approx_head,
        ..MemoryOptions::new(budget, true)
    };
    let plan =
        |budget, approx| plan_with(&backend, &gguf, None, 0, &options(budget, approx)).unwrap();
    let mut chosen = None;
    // Beyond the plan's slack for the allocator and stacks.
    let slack = arbor_pipeline::SLACK;
    for budget in (slack..slack + (24 << 20)).step_by(64 << 10) {
        let (Some(with), without) = (plan(budget, true), plan(budget, false)) else {
            continue;
        };
        let without = without.expect("the copy does not lower the minimum below the plain one");
        match with.head_approx {
            0 => assert_eq!(with.read_per_pass, without.read_per_pass, "{budget}"),
            copy => {
                assert!(with.read_per_pass < without.read_per_pass, "{budget}");
                assert!(with.head_read == 0 && with.head_held == (0, 0));
                assert!(with.fixed >= copy);
                assert!(with.fixed + with.stream_reserve + with.resident_bytes <= budget);
                chosen.get_or_insert(budget);
            }
        }
    }
    let budget = chosen.expect("some budget holds the copy");
    let (mut model, report) =
        load_target(backend, &gguf, None, &options(budget, true), &mut |_, _| {}).unwrap();
    assert!(
        report.summary().contains("Q8_0 copy"),
        "{}",
        report.summary()
    );
    assert!(model.set_argmax_only(true));
    let want = session(&mut resident_model(file.path())).unwrap();
    let got = session(&mut model).unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        certified_rows(g, w, tiny.vocab, &format!("pass {i} under {budget} bytes"));
    }
}

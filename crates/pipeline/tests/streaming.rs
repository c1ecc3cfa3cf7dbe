//! Streamed decoder layers on random tiny models: the output is bit for bit
//! the fully resident model's whatever is streamed and however; the
//! streamer stays within its ledger and gives everything back; and its
//! monitor counts what it did. (Streaming that cannot go on: `failures.rs`.)

use crate::common;

use std::time::Instant;

use arbor_backend_candle::CandleBackend;
use arbor_gguf::GgmlType;
use arbor_model::{LanguageModel, held_bytes};
use arbor_pipeline::{Mode, Span, SpanKind, StreamStats};
use common::*;

#[test]
fn streamed_logits_are_bit_identical_to_resident_ones() {
    let patterns: [[bool; LAYERS]; 4] = [
        [true, false, true, false, false, true],
        [false; LAYERS],
        [true, true, true, true, true, false],
        [false, true, true, true, true, true],
    ];
    for (s, tiny) in tinies().iter().enumerate() {
        let file = TempModel::new(tiny, "lossless");
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
                        "model {s} ({} {:?}), resident {pattern:?}, {mode:?}: logits {i} of the session differ",
                        tiny.arch,
                        tiny.weight_type
                    );
                }
                assert_eq!(got.len(), want.len());
                assert!(st.monitor.stats().layers >= (13 * layers.streamed.len()) as u64);
            }
        }
    }
}

#[test]
fn streaming_stays_within_the_exact_budget() {
    let pattern = [true, false, true, false, false, true];
    for tiny in tinies() {
        let file = TempModel::new(&tiny, "budget");
        let layers = streamed_layers(file.path(), &pattern);
        let one_set = buffer_bytes(&layers);
        let held = max_held(&layers);
        // Every streamed layer has the same shape here, so every one of
        // them needs the whole slot.
        assert!(
            layers
                .entries()
                .all(|(_, s)| held_bytes(&CandleBackend::new(), s) == held)
        );
        for mode in MODES {
            let buffers = one_set * sets(&layers, mode);
            let budget = exact_budget(&layers, mode);
            // Where the weights stay in the read buffers a built layer
            // holds only its copies (norm vectors) beside them.
            let held = max_slot(&layers, mode);
            // F32 matrices stay in a pipelined streamer's buffers on every
            // CPU (Q8_0 ones where our kernels run): a built layer then
            // holds its norms alone.
            let kept = in_place(&layers, mode);
            assert!(!kept || mode != Mode::OnDemand, "{mode:?}");
            if tiny.weight_type == GgmlType::F32 {
                assert_eq!(kept, mode != Mode::OnDemand, "{mode:?}");
            }
            assert!(match kept {
                true => held * 10 < max_held(&layers),
                false => held == max_held(&layers),
            });
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
fn the_monitor_counts_layers_and_bytes() {
    let pattern = [true, false, true, false, false, true];
    let file = TempModel::new(&tiny("llama", GgmlType::Q8_0, false, 41), "monitor");
    let layers = streamed_layers(file.path(), &pattern);
    let k = layers.streamed.len() as u64;
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
        check_spans(&st.monitor.spans(), &stats, mode);
    }
}

/// What a monotonic clock guarantees of the spans, however long each took:
/// each kind's spans come from one thread, one after another; the seconds
/// in the statistics are their durations (all of them on demand; in a
/// pipeline the loader may have worked before recording began); and on
/// demand a pass waits exactly while its layer is read and built.
fn check_spans(spans: &[Span], stats: &StreamStats, mode: Mode) {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9;
    for (kind, secs) in [
        (SpanKind::Io, stats.io_secs),
        (SpanKind::Build, stats.build_secs),
        (SpanKind::Wait, stats.wait_secs),
    ] {
        let of_kind: Vec<&Span> = spans.iter().filter(|s| s.kind == kind).collect();
        for s in &of_kind {
            assert!(s.start <= s.end, "{s:?}");
        }
        for w in of_kind.windows(2) {
            assert!(
                w[0].end <= w[1].start,
                "{mode:?}: {kind:?} spans overlap: {w:?}"
            );
        }
        let total: f64 = of_kind.iter().map(|s| s.end - s.start).sum();
        match mode {
            Mode::OnDemand => assert!(close(total, secs), "{kind:?}: {total} vs {secs}"),
            Mode::Pipelined { .. } => assert!(total <= secs + 1e-9, "{kind:?}: {total} > {secs}"),
        }
    }
    if mode == Mode::OnDemand {
        let of = |kind| spans.iter().filter(move |s: &&Span| s.kind == kind);
        for ((wait, io), build) in of(SpanKind::Wait)
            .zip(of(SpanKind::Io))
            .zip(of(SpanKind::Build))
        {
            assert!(
                wait.start <= io.start
                    && io.end <= build.start
                    && build.end <= wait.end
                    && wait.layer == io.layer
                    && io.layer == build.layer,
                "{wait:?} {io:?} {build:?}"
            );
        }
    }
}

/// Each generation beyond the first running over the target (a server's
/// slots) takes `SEQUENCE_SLACK` more before the layers are placed, and
/// several of them a second copy of the target's logits (a batched pass's
/// split into each sequence's).
#[test]
fn every_further_sequence_is_planned_its_slack() {
    use arbor_pipeline::{MemoryOptions, SEQUENCE_SLACK, plan_with};
    let tiny = &tinies()[0];
    let file = TempModel::new(tiny, "sequences");
    let gguf = arbor_gguf::GgufFile::open(file.path()).unwrap();
    let fixed = |sequences: usize, logit_rows: usize| {
        let options = MemoryOptions {
            base: Some(0),
            sequences,
            logit_rows,
            ..MemoryOptions::new(1 << 30, true)
        };
        (plan_with(&CandleBackend::new(), &gguf, None, 0, &options).unwrap())
            .expect("a tiny model fits a GiB")
            .fixed
    };
    let copy = |rows: usize| (rows * tiny.vocab * 4) as u64;
    assert_eq!(fixed(0, 1), fixed(1, 1));
    assert_eq!(fixed(8, 1) - fixed(1, 1), 7 * SEQUENCE_SLACK + copy(1));
    // One sequence's logits are planned once: the head hands them over and
    // a constraint masks them in place.
    assert_eq!(fixed(1, 33) - fixed(1, 1), copy(32));
    assert_eq!(fixed(2, 33) - fixed(2, 1), 2 * copy(32));
}

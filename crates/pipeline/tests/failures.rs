//! Streaming that cannot go on: a budget without room for the read buffers
//! or a layer, a layer the streamer was not given, a file truncated under
//! the streamer. Each is an error, never a hang or a panic, and the ledger
//! gets everything back.

use crate::common;

use std::path::Path;

use arbor_backend_candle::CandleBackend;
use arbor_gguf::GgmlType;
use arbor_model::{LanguageModel, ModelError, Result};
use arbor_paging::{Ledger, PagingError};
use arbor_pipeline::{Mode, Streamer};
use common::*;

#[test]
fn a_budget_without_room_for_the_read_buffers_is_refused() {
    let pattern = [true, false, true, false, false, true];
    let file = TempModel::new(&tiny("llama", GgmlType::Q8_0, false, 21), "buffers");
    let layers = streamed_layers(file.path(), &pattern);
    for mode in MODES {
        let buffers = buffer_bytes(&layers) * sets(&layers, mode);
        let ledger = Ledger::new(buffers - 1);
        let got = Streamer::new(
            CandleBackend::new(),
            file.path(),
            &layers.layout,
            &layers.streamed,
            ledger.clone(),
            mode,
        );
        match got {
            Err(e) => match e.source_as::<PagingError>() {
                Some(&PagingError::OverBudget { needed, budget, .. }) => {
                    assert_eq!((needed, budget), (buffers, buffers - 1), "{mode:?}");
                }
                _ => panic!("{mode:?}: expected OverBudget, got {e}"),
            },
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
            &layers.layout,
            &layers.streamed,
            ledger.clone(),
            mode,
        );
        assert!(streamer.is_ok(), "{mode:?}");
        drop(streamer);
        assert_eq!(ledger.used(), 0, "{mode:?}");
    }
}

/// A ledger that holds the read buffers but not a layer beside them: the
/// forward pass (or already the streamer) must fail, not wait forever for
/// bytes that only the streamer itself could give back.
#[test]
fn a_budget_without_room_for_a_layer_is_an_error_not_a_hang() {
    let pattern = [true, false, true, false, false, true];
    let file = TempModel::new(&tiny("llama", GgmlType::Q8_0, false, 22), "nolayer");
    let path = file.path().to_path_buf();
    let layers = streamed_layers(&path, &pattern);
    let one_set = buffer_bytes(&layers);
    let mut cases: Vec<Case<Result<Vec<f32>>>> = Vec::new();
    for mode in MODES {
        let held = max_slot(&layers, mode);
        let buffers = one_set * sets(&layers, mode);
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
        let mode = Mode::Pipelined { depth };
        let (buffers, held) = (one_set * sets(&layers, mode), max_slot(&layers, mode));
        cases.push((
            format!("Pipelined {{ depth: {depth} }}, budget {buffers}, dropped unused"),
            Box::new(move || {
                let streamer = Streamer::new(
                    CandleBackend::new(),
                    &path,
                    &layers.layout,
                    &layers.streamed,
                    Ledger::new(buffers),
                    Mode::Pipelined { depth },
                )?;
                drop(streamer);
                Err(ModelError::from_source(PagingError::TooSmall {
                    budget: buffers,
                    minimum: buffers + held,
                    detail: "dropped".into(),
                }))
            }),
        ));
    }
    check_all(cases, |outcome| match outcome {
        Err(e) => match e.source_as::<PagingError>() {
            Some(PagingError::OverBudget { .. } | PagingError::TooSmall { .. }) => Ok(()),
            _ => Err(format!("expected a budget error, got {e}")),
        },
        Ok(_) => Err("a layer was streamed without room for it".into()),
    });
}

/// The decoder asks for a layer the streamer was not given: an error.
#[test]
fn a_layer_the_streamer_does_not_have_is_an_error_not_a_hang() {
    let pattern = [true, false, true, false, true, true];
    let file = TempModel::new(&tiny("llama", GgmlType::Q8_0, false, 23), "missing");
    let path = file.path().to_path_buf();
    // Layer 3 is streamed by the decoder, but not by the streamer.
    let mut layers = streamed_layers(&path, &pattern);
    layers.streamed.retain(|&i| i != 3);
    let budget = exact_budget(&layers, Mode::Pipelined { depth: 2 });
    let mut cases: Vec<Case<Result<()>>> = Vec::new();
    for mode in MODES {
        let (path, layers) = (path.clone(), layers.clone());
        cases.push((
            format!("{mode:?}"),
            Box::new(move || {
                let mut st = load_streaming(&path, &pattern, &layers, mode, budget)?;
                st.model.step(&PROMPT).map(|_| ())
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
    let (last, entries) = layers.entries().last().unwrap();
    assert_eq!(last, LAYERS - 1, "the last layer must be streamed");
    let start = entries.iter().map(|s| s.offset).min().unwrap();
    let end = entries
        .iter()
        .map(|s| s.offset + s.len as u64)
        .max()
        .unwrap();
    // Nothing that is read after loading lies past the cut: the other
    // streamed layers and the token embedding (read row by row when the
    // head is untied) come first in the file.
    for (_, s) in layers.entries().take(layers.streamed.len() - 1) {
        assert!(s.iter().all(|t| t.offset + t.len as u64 <= start));
    }
    let embd = &layers.layout.embedding;
    assert!(embd.offset + embd.len as u64 <= start);
    assert!(end <= std::fs::metadata(path).unwrap().len());
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
    match e.source_as::<PagingError>() {
        Some(PagingError::Truncated {
            offset,
            len,
            file_len,
            ..
        }) => {
            assert_eq!(*file_len, cut, "{what}");
            assert!(offset + len > cut, "{what}: {e}");
        }
        _ => panic!("{what}: expected Truncated, got {e}"),
    }
}

#[test]
fn a_file_truncated_under_the_streamer_is_an_error() {
    let pattern = [true, true, false, true, true, false];
    for (s, tiny) in [
        tiny("llama", GgmlType::Q8_0, false, 31),
        tiny("qwen2", GgmlType::F32, true, 32),
    ]
    .iter()
    .enumerate()
    {
        for mode in MODES {
            let file = TempModel::new(tiny, "truncated");
            let path = file.path().to_path_buf();
            let layers = streamed_layers(&path, &pattern);
            let budget = exact_budget(&layers, mode);
            let what = format!("model {s}, {mode:?}");
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

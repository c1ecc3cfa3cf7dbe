//! Requantizing whole tiny models: every matrix takes the new storage,
//! values stay within its rounding, the model runs, and bad requests are
//! typed errors that write nothing.

use crate::slim_common as common;

use arbor_drafts::DraftError;
use arbor_drafts::requant::{KEY_SOURCE, requantize};
use arbor_drafts::slim::Quant;
use arbor_gguf::{GgmlType, GgufFile};
use common::*;

#[test]
fn every_matrix_takes_the_new_storage_and_stays_close() {
    for (tied, source_type) in [
        (false, GgmlType::Q8_0),
        (true, GgmlType::Q8_0),
        (false, GgmlType::F32),
    ] {
        let src = write_model(&tiny(7, tied, source_type), "t");
        let source = GgufFile::open(&src).unwrap();
        for (quant, step) in [
            (Quant::F16, 1e-3),
            (Quant::Q8_0, 1.0 / 127.0),
            (Quant::Q5_0, 1.0 / 8.0),
        ] {
            let out = temp("requant");
            let r = requantize(&src, &out, quant, &mut |_, _| {}).unwrap();
            let file = GgufFile::open(&out).unwrap();
            let h = file.header();
            assert_eq!(
                h.get_str(KEY_SOURCE).unwrap(),
                src.file_name().unwrap().to_str().unwrap()
            );
            assert_eq!(h.tensors.len(), source.header().tensors.len());
            let want = quant.target(source_type);
            // A copy is exact; a conversion is within its rounding.
            let bound = if want == source_type { 0.0 } else { step };
            for info in &h.tensors {
                let before = source.header().tensor(&info.name).unwrap();
                match info.dims.len() {
                    2 => assert_eq!(info.ty, want, "{}", info.name),
                    _ => assert_eq!(info.ty, before.ty, "{} kept", info.name),
                }
                let a = source.tensor_f32(&info.name).unwrap();
                let b = file.tensor_f32(&info.name).unwrap();
                let amax = a.iter().fold(0f32, |m, v| m.max(v.abs()));
                let err = a
                    .iter()
                    .zip(&b)
                    .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    err <= amax * bound as f32,
                    "{quant} {}: {err} of {amax}",
                    info.name
                );
            }
            // Q8_0 → Q8_0 copies; the others convert every matrix.
            match want == source_type {
                true => assert_eq!(r.converted, 0),
                false => assert!(r.converted > 0 && r.copied == 0),
            }
            let file_type = h.get("general.file_type").and_then(|v| v.as_u64());
            let code = match quant {
                Quant::F16 => 1,
                Quant::Q8_0 => 7,
                _ => 8,
            };
            assert_eq!(file_type, Some(code));
            // The file runs; F16 of an F32 model stays within a rounding of
            // it (both multiply float activations, where Q8_0 rounds them).
            let logits = load(&out).step(&[1, 2, 3]).unwrap();
            let want = load(&src).step(&[1, 2, 3]).unwrap();
            assert_eq!(logits.len(), VOCAB);
            if quant == Quant::F16 && source_type == GgmlType::F32 {
                let diff = logits
                    .iter()
                    .zip(&want)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(diff < 1e-2, "f16 logits moved by {diff}");
            }
            std::fs::remove_file(out).ok();
        }
        std::fs::remove_file(src).ok();
    }
}

#[test]
fn bad_requests_are_typed_errors_and_write_nothing() {
    let src = write_model(&tiny(8, false, GgmlType::F32), "t");
    let out = temp("requant-keep");
    let e = requantize(&src, &out, Quant::Keep, &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, DraftError::RequantKeep), "{e}");
    assert!(!out.exists());
    let missing = temp("missing");
    assert!(requantize(&missing, &out, Quant::F16, &mut |_, _| {}).is_err());
    assert!(!out.exists());
    std::fs::remove_file(src).ok();
}

//! Deriving slim drafts from tiny random models: the head keeps the special
//! tokens and then the most frequent ones, its rows are the source's rows,
//! and bad requests are typed errors.

use crate::slim_common as common;

use arbor_drafts::DraftError;
use arbor_drafts::slim::{
    KEY_K, Quant, SlimOptions, TokenCounts, derive, kept_ids, slim_token_ids, special_ids,
};
use arbor_gguf::{GgmlType, GgufFile, dequantize};
use arbor_model::Layout;
use common::*;

fn head_values(path: &std::path::Path) -> (usize, Vec<f32>) {
    let file = GgufFile::open(path).unwrap();
    let name = if file.header().tensor("output.weight").is_ok() {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    let (info, bytes) = file.tensor(name).unwrap();
    let cols = info.dims[0] as usize;
    (
        cols,
        dequantize(info.ty, bytes, info.n_elements() as usize).unwrap(),
    )
}

#[test]
fn the_head_keeps_specials_then_the_most_frequent_tokens() {
    for (tied, ty) in [(false, GgmlType::Q8_0), (true, GgmlType::F32)] {
        let src = write_model(&tiny(3, tied, ty), "t");
        let counts = counts_for(&src);
        let out = temp("slim");
        let report = derive(
            &src,
            &out,
            &SlimOptions::new(40, Quant::Keep),
            &counts,
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(report.head_rows, 40);
        assert_eq!(report.specials, 4, "three control tokens and bos");
        assert!(report.covered_tokens > 0 && report.covered_tokens <= report.corpus_tokens);

        let file = GgufFile::open(&out).unwrap();
        let ids = slim_token_ids(file.header()).unwrap().unwrap();
        assert_eq!(ids.len(), 40);
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        for id in CONTROL.iter().chain([&BOS]) {
            assert!(ids.contains(id), "special {id} dropped");
        }
        for id in UNUSED {
            assert!(!ids.contains(&id), "unused {id} kept");
        }
        // The other 36 are the most frequent normal tokens.
        let c = counts.counts();
        let least_kept = ids
            .iter()
            .filter(|i| !CONTROL.contains(i) && **i != BOS)
            .map(|&i| c[i as usize])
            .min()
            .unwrap();
        let most_left = (0..VOCAB as u32)
            .filter(|i| !ids.contains(i) && !UNUSED.contains(i))
            .map(|i| c[i as usize])
            .max()
            .unwrap();
        assert!(least_kept >= most_left);
        assert_eq!(file.header().get(KEY_K).and_then(|v| v.as_u64()), Some(40));

        let layout = Layout::from_gguf(file.header()).unwrap();
        assert_eq!(layout.config.vocab_size, VOCAB);
        assert_eq!(layout.head_rows(), 40);
        // Row i of the new head is row ids[i] of the source head.
        let (cols, full) = head_values(&src);
        let (_, slim) = head_values(&out);
        for (i, &id) in ids.iter().enumerate() {
            let id = id as usize;
            assert_eq!(
                slim[i * cols..(i + 1) * cols],
                full[id * cols..(id + 1) * cols]
            );
        }
        std::fs::remove_file(src).ok();
        std::fs::remove_file(out).ok();
    }
}

#[test]
fn layers_are_requantized_and_stay_close() {
    let src = write_model(&tiny(4, false, GgmlType::F32), "t");
    let counts = counts_for(&src);
    for quant in [Quant::Q8_0, Quant::Q5_0] {
        let out = temp("slim-q");
        let r = derive(
            &src,
            &out,
            &SlimOptions::new(64, quant),
            &counts,
            &mut |_, _| {},
        )
        .unwrap();
        assert!(r.output_bytes < r.input_bytes);
        let file = GgufFile::open(&out).unwrap();
        let ty = quant.target(GgmlType::F32);
        assert_eq!(file.header().tensor("blk.0.ffn_up.weight").unwrap().ty, ty);
        assert_eq!(file.header().tensor("output.weight").unwrap().ty, ty);
        // Norms and biases are untouched; the token table is kept.
        assert_eq!(
            file.header().tensor("blk.0.attn_norm.weight").unwrap().ty,
            GgmlType::F32
        );
        assert_eq!(
            file.header().tensor("token_embd.weight").unwrap().ty,
            GgmlType::F32
        );
        let a = GgufFile::open(&src)
            .unwrap()
            .tensor_f32("blk.1.attn_q.weight")
            .unwrap();
        let b = file.tensor_f32("blk.1.attn_q.weight").unwrap();
        let amax = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = a
            .iter()
            .zip(&b)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            err > 0.0 && err < amax / 8.0,
            "{quant}: error {err} of {amax}"
        );
        // The slim model runs and its widened logits cover the vocabulary.
        let mut m = load(&out);
        let logits = m.step(&[1, 2, 3]).unwrap();
        assert_eq!(logits.len(), VOCAB);
        std::fs::remove_file(out).ok();
    }
    std::fs::remove_file(src).ok();
}

#[test]
fn bad_requests_are_typed_errors() {
    let src = write_model(&tiny(5, false, GgmlType::F32), "t");
    let counts = counts_for(&src);
    let out = temp("slim-bad");
    let run =
        |opts: SlimOptions, counts: &TokenCounts| derive(&src, &out, &opts, counts, &mut |_, _| {});
    assert!(matches!(
        run(SlimOptions::new(0, Quant::Keep), &counts),
        Err(DraftError::ZeroK)
    ));
    assert!(matches!(
        run(SlimOptions::new(VOCAB + 1, Quant::Keep), &counts),
        Err(DraftError::KTooLarge {
            k: 301,
            vocab: VOCAB
        })
    ));
    assert!(matches!(
        run(SlimOptions::new(3, Quant::Keep), &counts),
        Err(DraftError::TooManySpecials { specials: 4, k: 3 })
    ));
    // Counts made with another tokenizer (same size, other strings).
    let other = write_model(&tiny(5, false, GgmlType::F32), "u");
    assert!(matches!(
        run(SlimOptions::new(64, Quant::Keep), &counts_for(&other)),
        Err(DraftError::TokenizerMismatch { .. })
    ));
    // A file that is not a GGUF.
    let junk = temp("junk");
    std::fs::write(&junk, b"not a model at all").unwrap();
    assert!(matches!(
        derive(
            &junk,
            &out,
            &SlimOptions::new(64, Quant::Keep),
            &counts,
            &mut |_, _| {}
        ),
        Err(DraftError::Gguf(_))
    ));
    // A slim draft is not derived again.
    derive(
        &src,
        &out,
        &SlimOptions::new(64, Quant::Keep),
        &counts,
        &mut |_, _| {},
    )
    .unwrap();
    let again = temp("slim-again");
    assert!(matches!(
        derive(
            &out,
            &again,
            &SlimOptions::new(32, Quant::Keep),
            &counts,
            &mut |_, _| {}
        ),
        Err(DraftError::AlreadySlim(_))
    ));
    assert!(!again.exists());
    for p in [src, other, junk, out] {
        std::fs::remove_file(p).ok();
    }
}

#[test]
fn special_ids_follow_the_metadata() {
    let src = write_model(&tiny(6, false, GgmlType::F32), "t");
    let file = GgufFile::open(&src).unwrap();
    assert_eq!(
        special_ids(file.header(), VOCAB).unwrap(),
        vec![BOS, 297, 298, 299]
    );
    let counts = counts_for(&src);
    assert_eq!(
        kept_ids(counts.counts(), 4, &[BOS, 297, 298, 299]).unwrap(),
        vec![BOS, 297, 298, 299]
    );
    std::fs::remove_file(src).ok();
}

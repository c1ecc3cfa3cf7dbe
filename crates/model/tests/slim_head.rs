//! A head with fewer rows than the vocabulary (a slim draft's): the
//! layout accepts it, the decoder's logits have one column per head row and
//! equal those columns of the full head's logits; a head with more rows
//! than the vocabulary is refused.

use arbor_backend_candle::CandleBackend;
use arbor_gguf::{GgufFile, GgufWriter};
use arbor_model::testing::{TinyModel, write_temp};
use arbor_model::{Decoder, LanguageModel, Layout};

/// A copy of `file` whose `output.weight` holds only its first `rows` rows
/// (or `rows` rows repeating the first ones when `rows` is larger).
fn with_head_rows(file: &GgufFile, rows: usize) -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in &file.header().metadata {
        w.add_meta(k.clone(), v.clone());
    }
    for info in &file.header().tensors {
        let bytes = file.tensor_bytes(info);
        if info.name == "output.weight" {
            let row_bytes = bytes.len() / info.dims[1] as usize;
            let data: Vec<u8> = bytes
                .iter()
                .copied()
                .cycle()
                .take(rows * row_bytes)
                .collect();
            w.add_tensor(&info.name, &[info.dims[0], rows as u64], info.ty, data);
        } else {
            w.add_tensor(&info.name, &info.dims, info.ty, bytes.to_vec());
        }
    }
    w
}

#[test]
fn a_short_head_gives_its_rows_logits() {
    let tiny = TinyModel {
        vocab: 256,
        ..TinyModel::default()
    };
    let full_path = write_temp(&tiny.writer(), "slim-head-full");
    let full_file = GgufFile::open(&full_path).unwrap();
    let slim_path = write_temp(&with_head_rows(&full_file, 100), "slim-head-short");
    let slim_file = GgufFile::open(&slim_path).unwrap();

    let layout = Layout::from_gguf(slim_file.header()).unwrap();
    assert_eq!(layout.config.vocab_size, 256);
    assert_eq!(layout.head_rows(), 100);

    let mut full = Decoder::load(CandleBackend::new(), &full_file, &mut |_, _| {}).unwrap();
    let mut slim = Decoder::load(CandleBackend::new(), &slim_file, &mut |_, _| {}).unwrap();
    assert_eq!(slim.head_rows(), 100);
    assert_eq!(slim.config().vocab_size, 256);
    // Tokens past the head's rows are still valid inputs.
    let a = full.step(&[3, 250, 17]).unwrap();
    let b = slim.step(&[3, 250, 17]).unwrap();
    assert_eq!(a.len(), 256);
    assert_eq!(b.len(), 100);
    for (x, y) in a[..100].iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{x} vs {y}");
    }
}

#[test]
fn a_head_longer_than_the_vocabulary_is_refused() {
    let path = write_temp(&TinyModel::default().writer(), "slim-head-long-src");
    let file = GgufFile::open(&path).unwrap();
    let long = write_temp(&with_head_rows(&file, 301), "slim-head-long");
    let err = Layout::from_gguf(GgufFile::open(&long).unwrap().header()).unwrap_err();
    assert!(err.to_string().contains("301 rows"), "{err}");
}

//! Rows that are embedding vectors instead of tokens (what parallel prompt
//! decoding feeds its trained prompt tokens through): a token's own
//! embedding fed as a vector gives that token's logits bit for bit, also
//! mixed with tokens and beside a cache; other vectors change the output;
//! malformed rows are typed errors.

use arbor_backend_candle::CandleBackend;
use arbor_gguf::{GgmlType, GgufFile};
use arbor_model::testing::{TinyModel, write_temp};
use arbor_model::{Decoder, LanguageModel, Mask, ModelError, Row};

fn load(arch: &'static str, weight_type: GgmlType, seed: u64) -> Decoder<CandleBackend> {
    let tiny = TinyModel {
        arch,
        weight_type,
        vocab: 256,
        layers: 3,
        seed,
        ..TinyModel::default()
    };
    let path = write_temp(&tiny.writer(), &format!("embedding-rows-{arch}-{seed}"));
    let file = GgufFile::open(&path).unwrap();
    Decoder::load(CandleBackend::new(), &file, &mut |_, _| {}).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const PROMPT: [u32; 4] = [5, 77, 130, 9];
const NEXT: [u32; 3] = [200, 3, 41];

/// Runs `PROMPT` causally, then `rows` as a causal continuation; logits of
/// every continuation row.
fn continue_with(m: &mut Decoder<CandleBackend>, rows: &[Row<'_>]) -> Vec<f32> {
    m.truncate_cache(0).unwrap();
    m.step(&PROMPT).unwrap();
    let past = m.cache_len();
    let positions: Vec<u32> = (past..past + rows.len()).map(|p| p as u32).collect();
    let all: Vec<usize> = (0..rows.len()).collect();
    let mask = Mask::causal(past, rows.len());
    m.forward_rows(rows, &positions, &mask, &all).unwrap().data
}

#[test]
fn a_tokens_embedding_as_a_vector_gives_the_tokens_logits() {
    for (i, (arch, ty)) in [("llama", GgmlType::Q8_0), ("qwen2", GgmlType::F32)]
        .into_iter()
        .enumerate()
    {
        let mut m = load(arch, ty, 11 + i as u64);
        let hidden = m.config().hidden;
        let emb = m.embeddings(&NEXT).unwrap();
        assert_eq!(emb.len(), NEXT.len() * hidden);
        let tokens: Vec<Row<'_>> = NEXT.iter().map(|&t| Row::Token(t)).collect();
        let want = continue_with(&mut m, &tokens);
        // Every row a vector, and vectors mixed with tokens.
        let vectors: Vec<Row<'_>> = emb.chunks_exact(hidden).map(Row::Vector).collect();
        assert_eq!(
            bits(&continue_with(&mut m, &vectors)),
            bits(&want),
            "{arch}"
        );
        let mixed = [
            Row::Token(NEXT[0]),
            Row::Vector(&emb[hidden..2 * hidden]),
            Row::Token(NEXT[2]),
        ];
        assert_eq!(bits(&continue_with(&mut m, &mixed)), bits(&want), "{arch}");
        // The cache the vectors left behind continues like the tokens'.
        let after_vectors = m.step(&[17]).unwrap();
        continue_with(&mut m, &tokens);
        assert_eq!(bits(&m.step(&[17]).unwrap()), bits(&after_vectors));
        // A different vector is a different input.
        let other: Vec<f32> = emb[hidden..2 * hidden].iter().map(|x| x + 0.5).collect();
        let changed = [
            Row::Token(NEXT[0]),
            Row::Vector(&other),
            Row::Token(NEXT[2]),
        ];
        assert_ne!(bits(&continue_with(&mut m, &changed)), bits(&want));
    }
}

#[test]
fn malformed_rows_are_input_errors() {
    let mut m = load("llama", GgmlType::F32, 3);
    let hidden = m.config().hidden;
    let short = vec![0.0f32; hidden - 1];
    let ok = vec![0.0f32; hidden];
    let cases: [Vec<Row<'_>>; 2] = [
        vec![Row::Token(1), Row::Vector(&short)],
        vec![Row::Vector(&ok), Row::Token(256)],
    ];
    for rows in cases {
        let positions: Vec<u32> = (0..rows.len() as u32).collect();
        let mask = Mask::causal(0, rows.len());
        let e = m.forward_rows(&rows, &positions, &mask, &[0]).unwrap_err();
        assert!(matches!(e, ModelError::Input(_)), "{e}");
    }
    assert!(matches!(m.embeddings(&[999]), Err(ModelError::Input(_))));
    // Nothing was appended by the refused passes.
    assert_eq!(m.cache_len(), 0);
}

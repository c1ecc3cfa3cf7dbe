//! A token's logits do not depend on what else is in its pass: fed one at a
//! time, all in one pass, or as one branch of a tree, every weight type
//! gives the same bits. Speculative decoding is only lossless because of
//! this (a verification pass must reproduce one-token decoding exactly,
//! near ties included).

use arbor_backend_candle::CandleBackend;
use arbor_gguf::{GgmlType, GgufFile};
use arbor_model::testing::{TinyModel, write_temp};
use arbor_model::{Decoder, LanguageModel, Mask};

const PROMPT: [u32; 7] = [1, 17, 42, 200, 3, 99, 5];
const NEXT: [u32; 9] = [8, 250, 31, 31, 7, 120, 64, 2, 199];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn load(model: &TinyModel, tag: &str) -> Decoder<CandleBackend> {
    let path = write_temp(&model.writer(), tag);
    let file = GgufFile::open(&path).unwrap();
    Decoder::load(CandleBackend::new(), &file, &mut |_, _| {}).unwrap()
}

fn prefill(d: &mut Decoder<CandleBackend>) {
    let n = PROMPT.len();
    let pos: Vec<u32> = (0..n as u32).collect();
    d.forward(&PROMPT, &pos, &Mask::causal(0, n), &[n - 1])
        .unwrap();
}

#[test]
fn one_token_at_a_time_in_one_pass_or_in_a_tree_gives_the_same_bits() {
    let n = PROMPT.len();
    for (i, (arch, ty, tied)) in [
        ("llama", GgmlType::F32, false),
        ("qwen2", GgmlType::F32, true),
        ("qwen2", GgmlType::F16, false),
        ("llama", GgmlType::Q8_0, true),
        ("qwen2", GgmlType::Q8_0, false),
    ]
    .into_iter()
    .enumerate()
    {
        let model = TinyModel {
            arch,
            weight_type: ty,
            tied,
            vocab: 256,
            seed: 11 + i as u64,
            ..TinyModel::default()
        };
        let what = format!("{arch} {ty:?} tied={tied}");

        // One token per pass.
        let mut d = load(&model, &format!("inv-one-{i}"));
        prefill(&mut d);
        let alone: Vec<Vec<u32>> = NEXT
            .iter()
            .enumerate()
            .map(|(k, &t)| {
                let l = d
                    .forward(&[t], &[(n + k) as u32], &Mask::causal(n + k, 1), &[0])
                    .unwrap();
                bits(l.row(0))
            })
            .collect();

        // All in one pass.
        let mut d = load(&model, &format!("inv-all-{i}"));
        prefill(&mut d);
        let k = NEXT.len();
        let pos: Vec<u32> = (n as u32..(n + k) as u32).collect();
        let rows: Vec<usize> = (0..k).collect();
        let l = d.forward(&NEXT, &pos, &Mask::causal(n, k), &rows).unwrap();
        for (r, want) in alone.iter().enumerate() {
            assert_eq!(&bits(l.row(r)), want, "{what}: row {r} of one pass");
        }

        // The first four as one branch of a tree whose other branch (three
        // made-up tokens) sits in between them in the pass.
        let mut d = load(&model, &format!("inv-tree-{i}"));
        prefill(&mut d);
        let tokens = [NEXT[0], 77, NEXT[1], 78, 79, NEXT[2], NEXT[3]];
        let parents = [None, None, Some(0), Some(1), Some(3), Some(2), Some(5)];
        let cols = n + tokens.len();
        let mut allowed = vec![false; tokens.len() * cols];
        for (r, row) in allowed.chunks_exact_mut(cols).enumerate() {
            row[..n].fill(true);
            let mut at = Some(r);
            while let Some(a) = at {
                row[n + a] = true;
                at = parents[a];
            }
        }
        let mask = Mask {
            rows: tokens.len(),
            cols,
            allowed,
        };
        let depth = [0u32, 0, 1, 1, 2, 2, 3];
        let pos: Vec<u32> = depth.iter().map(|d| n as u32 + d).collect();
        let l = d.forward(&tokens, &pos, &mask, &[0, 2, 5, 6]).unwrap();
        for (r, want) in alone.iter().take(4).enumerate() {
            assert_eq!(&bits(l.row(r)), want, "{what}: branch node {r} of a tree");
        }
    }
}

#[test]
fn a_kept_pass_gives_any_of_its_rows_logits_later() {
    let model = TinyModel {
        arch: "qwen2",
        weight_type: GgmlType::Q8_0,
        vocab: 256,
        seed: 3,
        ..TinyModel::default()
    };
    let n = PROMPT.len();
    let k = NEXT.len();
    let pos: Vec<u32> = (n as u32..(n + k) as u32).collect();
    let all: Vec<usize> = (0..k).collect();
    let mut d = load(&model, "later-all");
    prefill(&mut d);
    let want = d.forward(&NEXT, &pos, &Mask::causal(n, k), &all).unwrap();

    let mut d = load(&model, "later-some");
    // Nothing kept unless asked.
    prefill(&mut d);
    assert!(d.later_logits(&[0]).unwrap().is_none());
    assert!(d.keep_last_pass(true));
    d.forward(&NEXT, &pos, &Mask::causal(n, k), &[1]).unwrap();
    let later = d.later_logits(&[5, 0, 8]).unwrap().unwrap();
    assert_eq!(later, want.select(&[5, 0, 8]));
    assert!(d.later_logits(&[k]).is_err(), "row out of the pass");
    // Turned off, the kept rows are dropped.
    d.keep_last_pass(false);
    assert!(d.later_logits(&[0]).unwrap().is_none());
}

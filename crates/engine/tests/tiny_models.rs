//! Random tiny models on every compiled backend: the KV cache, masks and
//! compaction behave as the maths says, backends agree, bad input is an
//! error.

use arbor_engine::{BackendKind, LanguageModel, Mask, load_model};
use arbor_gguf::{GgmlType, GgufFile};
use arbor_model::testing::{TinyModel, write_temp};

fn load(kind: BackendKind, model: &TinyModel, tag: &str) -> Box<dyn LanguageModel> {
    let path = write_temp(&model.writer(), &format!("{tag}-{kind}"));
    let file = GgufFile::open(&path).unwrap();
    load_model(kind, &file, &mut |_, _| {}).unwrap()
}

fn models() -> Vec<TinyModel> {
    vec![
        TinyModel::default(),
        TinyModel {
            arch: "qwen2",
            tied: true,
            weight_type: GgmlType::Q8_0,
            seed: 2,
            ..TinyModel::default()
        },
        TinyModel {
            arch: "qwen2",
            heads: 4,
            kv_heads: 4,
            weight_type: GgmlType::F16,
            seed: 3,
            ..TinyModel::default()
        },
    ]
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

const TOKENS: [u32; 9] = [5, 17, 42, 250, 3, 99, 0, 299, 64];

#[test]
fn prefill_at_once_equals_token_by_token() {
    for kind in BackendKind::compiled() {
        for (i, model) in models().iter().enumerate() {
            let mut m = load(kind, model, &format!("prefill{i}"));
            let all = m.step(&TOKENS).unwrap();
            m.truncate_cache(0).unwrap();
            let mut last = Vec::new();
            for &t in &TOKENS {
                last = m.step(&[t]).unwrap();
            }
            assert_eq!(m.cache_len(), TOKENS.len());
            let d = max_diff(&all, &last);
            assert!(
                d < 1e-3,
                "{kind} model {i}: batch vs incremental differ by {d}"
            );
        }
    }
}

/// Two branches decoded together under a tree mask, then the cache keeps
/// only one branch: continuing must equal having decoded that branch alone.
#[test]
fn tree_mask_and_cache_compaction_equal_the_plain_path() {
    for kind in BackendKind::compiled() {
        for (i, model) in models().iter().enumerate() {
            let mut m = load(kind, model, &format!("tree{i}"));
            let prefix = &TOKENS[..4];
            let (branch_a, branch_b) = ([7u32, 8], [11u32, 12]);

            // Reference: prefix + branch b, causally, then one more token.
            m.step(prefix).unwrap();
            let b_logits = m.step(&branch_b).unwrap();
            let next_ref = m.step(&[13]).unwrap();

            // Tree: prefix, then [a0, a1, b0, b1] with a0→a1 and b0→b1.
            m.truncate_cache(0).unwrap();
            m.step(prefix).unwrap();
            let past = prefix.len();
            let tree = [branch_a[0], branch_a[1], branch_b[0], branch_b[1]];
            let parents: [Option<usize>; 4] = [None, Some(0), None, Some(2)];
            let mut mask = Mask::causal(past, 4);
            mask.allowed.fill(false);
            for r in 0..4 {
                mask.allowed[r * mask.cols..r * mask.cols + past].fill(true);
                let mut node = Some(r);
                while let Some(n) = node {
                    mask.allowed[r * mask.cols + past + n] = true;
                    node = parents[n];
                }
            }
            let positions: Vec<u32> = [0u32, 1, 0, 1].iter().map(|d| past as u32 + d).collect();
            let logits = m.forward(&tree, &positions, &mask, &[1, 3]).unwrap();
            let d = max_diff(logits.row(1), &b_logits);
            assert!(
                d < 1e-3,
                "{kind} model {i}: tree branch logits differ by {d}"
            );

            let keep: Vec<usize> = (0..past).chain([past + 2, past + 3]).collect();
            m.keep_cache(&keep).unwrap();
            assert_eq!(m.cache_len(), past + 2);
            let next = m.step(&[13]).unwrap();
            let d = max_diff(&next, &next_ref);
            assert!(
                d < 1e-3,
                "{kind} model {i}: after compaction logits differ by {d}"
            );
        }
    }
}

#[test]
fn backends_agree_on_logits() {
    let kinds = BackendKind::compiled();
    for (i, model) in models().iter().enumerate() {
        let outs: Vec<(BackendKind, Vec<f32>)> = kinds
            .iter()
            .map(|&k| {
                (
                    k,
                    load(k, model, &format!("agree{i}")).step(&TOKENS).unwrap(),
                )
            })
            .collect();
        for (k, o) in &outs[1..] {
            // candle quantizes activations to 8 bits for quantized weights;
            // the burn backends multiply dequantized f32 weights.
            let tol = if model.weight_type == GgmlType::Q8_0 {
                0.1
            } else {
                2e-3
            };
            let d = max_diff(&outs[0].1, o);
            assert!(
                d < tol,
                "model {i}: {} vs {k} logits differ by {d}",
                outs[0].0
            );
        }
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let kind = BackendKind::compiled()[0];
    let mut m = load(kind, &TinyModel::default(), "bad");
    assert!(m.step(&[]).is_err());
    assert!(m.step(&[300]).is_err(), "token past the vocabulary");
    assert!(m.forward(&[1, 2], &[0], &Mask::causal(0, 2), &[1]).is_err());
    assert!(
        m.forward(&[1, 2], &[0, 1], &Mask::causal(0, 3), &[1])
            .is_err()
    );
    assert!(
        m.forward(&[1, 2], &[0, 1], &Mask::causal(0, 2), &[2])
            .is_err()
    );
    assert!(m.truncate_cache(5).is_err());
    assert!(m.keep_cache(&[1, 0]).is_err());
}

#[test]
fn corrupt_files_are_errors() {
    let bytes = TinyModel::default().writer().to_bytes();
    let path = std::env::temp_dir().join(format!("arbor-corrupt-{}.gguf", std::process::id()));
    for cut in [3, 100, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        assert!(GgufFile::open(&path).is_err(), "file cut at {cut} opened");
    }
    // A model whose metadata lies about its shapes.
    let mut w = TinyModel::default().writer();
    w.add_meta("llama.embedding_length", arbor_gguf::Value::U32(128));
    std::fs::write(&path, w.to_bytes()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let err = load_model(BackendKind::compiled()[0], &file, &mut |_, _| {})
        .err()
        .unwrap();
    assert!(err.to_string().contains("token_embd"), "{err}");
    std::fs::remove_file(path).ok();
}

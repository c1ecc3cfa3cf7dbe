//! Several sequences in one pass: each sequence's logits are bit for bit
//! those of a pass of its own over its own cache, whatever the others hold
//! (tokens, tree rows, prompt lengths); the one-sequence methods work on
//! the selected slot; bad passes are typed errors; a fork shares weights
//! with a cache of its own.

use arbor_backend_candle::CandleBackend;
use arbor_gguf::{GgmlType, GgufFile};
use arbor_model::testing::{TinyModel, write_temp};
use arbor_model::{Decoder, LanguageModel, Mask, Row, SlotPass};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn load(ty: GgmlType, tag: &str) -> Decoder<CandleBackend> {
    let model = TinyModel {
        arch: "qwen2",
        weight_type: ty,
        vocab: 256,
        seed: 5,
        ..TinyModel::default()
    };
    let path = write_temp(&model.writer(), tag);
    let file = GgufFile::open(&path).unwrap();
    Decoder::load(CandleBackend::new(), &file, &mut |_, _| {}).unwrap()
}

/// Prompt, then passes of (tokens, parents within the pass) per sequence.
type Script = (Vec<u32>, Vec<(Vec<u32>, Vec<Option<usize>>)>);

/// One pass of one sequence: tokens, positions, mask, logit rows.
type Step = (Vec<u32>, Vec<u32>, Mask, Vec<usize>);

fn scripts() -> Vec<Script> {
    vec![
        (
            vec![1, 2, 3, 4, 5],
            vec![
                (vec![9], vec![None]),
                (vec![7, 8, 9], vec![None, Some(0), Some(0)]),
            ],
        ),
        (
            vec![200, 100],
            vec![(vec![3, 4], vec![None, Some(0)]), (vec![11], vec![None])],
        ),
        (
            vec![42; 9],
            vec![
                (vec![1, 2, 3, 4], vec![None, Some(0), Some(1), Some(1)]),
                (vec![5], vec![None]),
            ],
        ),
    ]
}

fn tree_pass(prefix: usize, parents: &[Option<usize>]) -> (Vec<u32>, Mask) {
    let positions =
        arbor_mask::positions(prefix, parents, &(0..parents.len()).collect::<Vec<_>>()).unwrap();
    (positions, arbor_mask::tree_mask(prefix, parents).unwrap())
}

#[test]
fn sequences_batched_together_get_their_own_logits() {
    for (i, ty) in [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_0]
        .into_iter()
        .enumerate()
    {
        // Each sequence alone, in a model of its own.
        let mut alone: Vec<Vec<Vec<u32>>> = vec![];
        for (j, (prompt, passes)) in scripts().into_iter().enumerate() {
            let mut d = load(ty, &format!("slots-alone-{i}-{j}"));
            let mut out = vec![];
            let n = prompt.len();
            let pos: Vec<u32> = (0..n as u32).collect();
            let l = d
                .forward(&prompt, &pos, &Mask::causal(0, n), &[n - 1])
                .unwrap();
            out.push(bits(&l.data));
            for (tokens, parents) in passes {
                let (pos, mask) = tree_pass(d.cache_len(), &parents);
                let rows: Vec<usize> = (0..tokens.len()).collect();
                out.push(bits(&d.forward(&tokens, &pos, &mask, &rows).unwrap().data));
            }
            alone.push(out);
        }
        // All three in one model, one pass per step for all of them.
        let mut d = load(ty, &format!("slots-together-{i}"));
        d.set_slots(3).unwrap();
        let scripts = scripts();
        let mut steps: Vec<Vec<Step>> = vec![];
        for (prompt, passes) in &scripts {
            let n = prompt.len();
            let mut s = vec![(
                prompt.clone(),
                (0..n as u32).collect(),
                Mask::causal(0, n),
                vec![n - 1],
            )];
            let mut len = n;
            for (tokens, parents) in passes {
                let (pos, mask) = tree_pass(len, parents);
                s.push((tokens.clone(), pos, mask, (0..tokens.len()).collect()));
                len += tokens.len();
            }
            steps.push(s);
        }
        for step in 0..3 {
            let rows: Vec<Vec<Row<'_>>> = (steps.iter())
                .map(|s| s[step].0.iter().map(|&t| Row::Token(t)).collect())
                .collect();
            let passes: Vec<SlotPass<'_>> = (0..3)
                .map(|slot| SlotPass {
                    slot,
                    rows: &rows[slot],
                    positions: &steps[slot][step].1,
                    mask: &steps[slot][step].2,
                    logit_rows: &steps[slot][step].3,
                })
                .collect();
            let out = d.forward_slots(&passes).unwrap();
            for slot in 0..3 {
                assert_eq!(
                    bits(&out[slot].data),
                    alone[slot][step],
                    "{ty:?} slot {slot} step {step}"
                );
            }
        }
        // The one-sequence methods work on the selected slot.
        d.select_slot(2).unwrap();
        assert_eq!(d.cache_len(), 9 + 4 + 1);
        d.truncate_cache(9).unwrap();
        assert_eq!(d.cache_len(), 9);
        d.select_slot(0).unwrap();
        assert_eq!(d.cache_len(), 5 + 1 + 3);
    }
}

#[test]
fn bad_slot_passes_are_errors_and_forks_share_weights() {
    let mut d = load(GgmlType::Q8_0, "slots-bad");
    d.set_slots(2).unwrap();
    let rows = [Row::Token(1)];
    let mask = Mask::causal(0, 1);
    let pass = |slot| SlotPass {
        slot,
        rows: &rows,
        positions: &[0],
        mask: &mask,
        logit_rows: &[0],
    };
    assert!(d.forward_slots(&[pass(2)]).is_err(), "no slot 2");
    assert!(
        d.forward_slots(&[pass(0), pass(0)]).is_err(),
        "slot 0 twice"
    );
    assert!(d.select_slot(5).is_err());
    assert!(d.set_slots(0).is_err());
    let out = d.forward_slots(&[pass(1)]).unwrap();
    let mut fork = d.fork().unwrap();
    assert_eq!(fork.cache_len(), 0);
    let alone = fork.forward(&[1], &[0], &mask, &[0]).unwrap();
    assert_eq!(bits(&alone.data), bits(&out[0].data));
    assert_eq!(
        fork.weight_bytes(),
        Some(0),
        "a fork holds no weights of its own"
    );
}

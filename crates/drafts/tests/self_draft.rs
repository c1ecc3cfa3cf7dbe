//! Self drafts (`Decoder::self_draft`): with every layer kept they are the
//! target; with layers skipped they are the model without those layers,
//! bit for bit; they share the target's weights and keep their own cache.

use crate::common;

use arbor_model::{LanguageModel, Mask};
use common::{Model, TempFile, load_full, load_streamed, tiny, with_layers};

/// Logits of the last token after each of a few steps.
fn run(m: &mut dyn LanguageModel) -> Vec<Vec<f32>> {
    let mut out = vec![m.step(&[3, 17, 200, 5]).unwrap()];
    for t in [9, 41, 3] {
        out.push(m.step(&[t]).unwrap());
    }
    out
}

#[test]
fn keeping_every_layer_gives_the_targets_logits() {
    for tied in [false, true] {
        let tmp = TempFile::write(&tiny(4, tied, 3).writer(), "all");
        let mut target = load_full(&tmp.open());
        let mut draft = target.self_draft().unwrap();
        assert_eq!(draft.running_layers(), vec![true; 4]);
        assert_eq!(draft.resident_bytes(), 0);
        // Interleaved: the two caches are independent.
        let t0 = target.step(&[3, 17, 200, 5]).unwrap();
        let d0 = draft.step(&[3, 17, 200, 5]).unwrap();
        assert_eq!(t0, d0);
        let t1 = target.step(&[9]).unwrap();
        assert_eq!(draft.cache_len(), 4);
        let d1 = draft.step(&[9]).unwrap();
        assert_eq!(t1, d1);
        draft.truncate_cache(0).unwrap();
        assert_eq!(target.cache_len(), 5);
        assert_eq!(run(&mut draft), {
            target.truncate_cache(0).unwrap();
            run(&mut target)
        });
    }
}

#[test]
fn skipped_layers_give_the_model_without_them() {
    let resident = [true, false, true, false, false, true];
    for tied in [false, true] {
        let tmp = TempFile::write(&tiny(6, tied, 5).writer(), "skip");
        let mut target = load_streamed(&tmp, &resident);
        let mut draft = target.self_draft().unwrap();
        assert_eq!(draft.running_layers(), resident.to_vec());
        let small = TempFile::write(&with_layers(&tmp.open(), &resident), "skip-ref");
        let mut reference: Model = load_full(&small.open());
        let d = run(&mut draft);
        assert_eq!(d, run(&mut reference), "tied: {tied}");
        assert_ne!(d, run(&mut target), "skipping layers changes nothing");
        // An explicit subset of the resident layers.
        let keep = [false, false, true, false, false, true];
        let mut fewer = target.self_draft_with(&keep).unwrap();
        let small = TempFile::write(&with_layers(&tmp.open(), &keep), "skip-ref2");
        assert_eq!(run(&mut fewer), run(&mut load_full(&small.open())));
    }
}

#[test]
fn tree_rows_of_a_self_draft_match_the_reference() {
    let resident = [false, true, true, false];
    let tmp = TempFile::write(&tiny(4, false, 8).writer(), "tree");
    let target = load_streamed(&tmp, &resident);
    let mut draft = target.self_draft().unwrap();
    let small = TempFile::write(&with_layers(&tmp.open(), &resident), "tree-ref");
    let mut reference = load_full(&small.open());
    for m in [&mut draft as &mut dyn LanguageModel, &mut reference] {
        m.step(&[1, 2, 3]).unwrap();
    }
    // Two siblings at position 3 and a child of the first at 4.
    let mut mask = Mask::causal(3, 3);
    mask.allowed[2 * 6 + 4] = false;
    mask.allowed[6 + 3] = false;
    mask.allowed[2 * 6 + 3] = true;
    let args = ([7u32, 8, 9], [3u32, 3, 4]);
    let a = draft.forward(&args.0, &args.1, &mask, &[0, 1, 2]).unwrap();
    let b = reference
        .forward(&args.0, &args.1, &mask, &[0, 1, 2])
        .unwrap();
    assert_eq!(a, b);
    draft.keep_cache(&[0, 1, 2, 3, 5]).unwrap();
    reference.keep_cache(&[0, 1, 2, 3, 5]).unwrap();
    assert_eq!(draft.step(&[4]).unwrap(), reference.step(&[4]).unwrap());
}

#[test]
fn bad_layer_choices_are_errors() {
    let resident = [true, false, true];
    let tmp = TempFile::write(&tiny(3, false, 2).writer(), "bad");
    let target = load_streamed(&tmp, &resident);
    for keep in [&[true, true, true][..], &[false; 3], &[true, false]] {
        assert!(target.self_draft_with(keep).is_err(), "{keep:?}");
    }
    assert!(target.self_draft_with(&[false, false, true]).is_ok());
}

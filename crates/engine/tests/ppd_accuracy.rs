//! The PPD accuracy pass (prompt tokens inserted at many points of a text
//! in one pass, ensemble prompt tokens as one chain each) counts the same
//! guesses as one pass per insertion point and EPT.

use arbor_engine::{BackendKind, Mask, load_model};
use arbor_gguf::GgufFile;
use arbor_model::Row;
use arbor_model::testing::{TinyModel, write_temp};
use arbor_ppd::{Accuracy, AccuracyTally, rank_of};
use arbor_speculative::PromptTokens;

#[test]
fn one_pass_over_many_points_counts_as_one_pass_per_point() {
    let tiny = TinyModel {
        arch: "qwen2",
        seed: 11,
        ..TinyModel::default()
    };
    let path = write_temp(&tiny.writer(), "ppd-accuracy");
    let file = GgufFile::open(&path).unwrap();
    let mut m = load_model(BackendKind::Candle, &file, &mut |_, _| {}).unwrap();
    let (hidden, vocab) = (m.config().hidden, m.config().vocab_size);
    let count = 3;
    let seq: Vec<u32> = (0..40u32).map(|i| (i * 11 + 3) % vocab as u32).collect();
    let from = 7;
    // Plain prompt tokens, then two ensemble prompt tokens each.
    for epts in [1, 2] {
        let prompts = PromptTokens {
            hidden,
            epts,
            vectors: (0..count * epts * hidden)
                .map(|i| ((i * 29 % 97) as f32 / 97.0 - 0.5) * 2.0)
                .collect(),
            accuracy: Accuracy::new(vec![vec![0.5]; count]).unwrap(),
        };
        let mut batched = AccuracyTally::new(count, 10);
        arbor_engine::ppd::tally_guesses(m.as_mut(), &seq, from, &prompts, &mut batched).unwrap();
        assert_eq!(m.cache_len(), 0);

        // One point at a time, each EPT chain in a pass of its own after
        // the text, its logits averaged over the EPTs.
        let mut single = AccuracyTally::new(count, 10);
        for p in from..seq.len() - count {
            let mut sum = vec![vec![0f32; vocab]; count];
            for j in 0..epts {
                m.truncate_cache(0).unwrap();
                let pos: Vec<u32> = (0..p as u32).collect();
                m.forward(&seq[..p], &pos, &Mask::causal(0, p), &[p - 1])
                    .unwrap();
                let rows: Vec<Row<'_>> = (0..count)
                    .map(|i| Row::Vector(prompts.vector(i, j)))
                    .collect();
                let pos: Vec<u32> = (p as u32..(p + count) as u32).collect();
                let logits = m
                    .forward_rows(&rows, &pos, &Mask::causal(p, count), &[0, 1, 2])
                    .unwrap();
                for (i, s) in sum.iter_mut().enumerate() {
                    s.iter_mut().zip(logits.row(i)).for_each(|(s, x)| *s += x);
                }
            }
            for (i, s) in sum.iter_mut().enumerate() {
                if epts > 1 {
                    s.iter_mut().for_each(|x| *x /= epts as f32);
                }
                single.add(i + 1, rank_of(s, seq[p + i + 1], 10));
            }
        }
        assert_eq!(batched.seen(1), (seq.len() - count - from) as u64);
        assert_eq!(batched, single, "{epts} EPTs");
    }
}

//! Prompt lookup: predictions copy the text after the latest earlier match
//! of the longest suffix n-gram; tree rows see only their ancestors; the
//! cache (truncate, keep) behaves like a model's, checked against a
//! from-scratch reference over random edits.

use arbor_drafts::PromptLookup;
use arbor_drafts::lookup::confidence;
use arbor_model::{Config, LanguageModel, Mask};

const VOCAB: usize = 50;

fn config() -> Config {
    static CONFIG: std::sync::OnceLock<Config> = std::sync::OnceLock::new();
    CONFIG.get_or_init(read_config).clone()
}

fn read_config() -> Config {
    let tmp = arbor_model::testing::TinyModel {
        vocab: VOCAB,
        ..Default::default()
    };
    let path = arbor_model::testing::write_temp(&tmp.writer(), "lookup-config");
    let file = arbor_gguf::GgufFile::open(&path).unwrap();
    arbor_model::Layout::from_gguf(file.header())
        .unwrap()
        .config
}

/// The predicted token and its probability, `None` for a uniform row.
fn prediction(row: &[f32]) -> Option<(u32, f32)> {
    let (i, &max) = row
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .unwrap();
    (row.iter().any(|&v| v != max)).then(|| (i as u32, max.exp()))
}

/// From scratch: the longest suffix n-gram (`max` down to `min`) of
/// `context` seen earlier, and the token after its latest earlier
/// occurrence.
fn reference(context: &[u32], min: usize, max: usize) -> Option<(u32, usize)> {
    let l = context.len();
    for n in (min..=max).rev() {
        if l < n + 1 {
            continue;
        }
        let gram = &context[l - n..];
        for e in (n - 1..l - 1).rev() {
            if &context[e + 1 - n..=e] == gram {
                return Some((context[e + 1], n));
            }
        }
    }
    None
}

#[test]
fn a_repeated_phrase_is_predicted() {
    let mut m = PromptLookup::new(config());
    let row = m.step(&[1, 2, 3, 4, 5, 9, 1, 2, 3]).unwrap();
    assert_eq!(prediction(&row).unwrap().0, 4);
    let p = prediction(&row).unwrap().1;
    assert!((p - confidence(3)).abs() < 1e-4, "{p}");
    // Fed one at a time, the index takes over from the scan.
    let row = m.step(&[4]).unwrap();
    assert_eq!(prediction(&row).unwrap().0, 5);
    // The latest occurrence wins: `8` was followed by 5, then by 4 (and
    // `4 8` is new).
    let mut m = PromptLookup::new(config()).with_ngrams(1, 3).unwrap();
    for t in [2, 3, 8, 5, 7, 8, 4] {
        m.step(&[t]).unwrap();
    }
    let (t, p) = prediction(&m.step(&[8]).unwrap()).unwrap();
    assert_eq!(t, 4);
    assert!((p - confidence(1)).abs() < 1e-4, "{p}");
    // Without one-token matches.
    let mut m = PromptLookup::new(config()).with_ngrams(2, 3).unwrap();
    assert_eq!(prediction(&m.step(&[2, 3, 8, 5, 7, 8]).unwrap()), None);
    // Nothing repeated: a uniform row.
    let mut m = PromptLookup::new(config());
    assert_eq!(prediction(&m.step(&[1, 2, 3]).unwrap()), None);
}

#[test]
fn tree_rows_see_only_their_ancestors() {
    let mut m = PromptLookup::new(config()).with_ngrams(1, 3).unwrap();
    m.step(&[1, 2, 3]).unwrap();
    // x = 9 and y = 9 are siblings at position 3; w = 1 is x's child.
    let mut mask = Mask::causal(3, 3);
    mask.allowed[6 + 3] = false;
    mask.allowed[2 * 6 + 4] = false;
    let out = m
        .forward(&[9, 9, 1], &[3, 3, 4], &mask, &[0, 1, 2])
        .unwrap();
    assert_eq!(prediction(out.row(0)), None, "x sees no repeat");
    assert_eq!(prediction(out.row(1)), None, "y must not see its sibling");
    assert_eq!(prediction(out.row(2)).unwrap().0, 2, "w: `1` → 2");
    // Keeping the path 1 2 3 x w and growing from it.
    m.keep_cache(&[0, 1, 2, 3, 5]).unwrap();
    assert_eq!(m.cache_len(), 5);
    assert_eq!(prediction(&m.step(&[2]).unwrap()).unwrap().0, 3);
}

/// A tiny xorshift generator.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[test]
fn random_edits_match_a_from_scratch_reference() {
    let cfg = config();
    for (seed, (min, max)) in [(1u64, (1, 3)), (2, (2, 4)), (3, (1, 1)), (4, (3, 3))] {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut m = PromptLookup::new(cfg.clone())
            .with_ngrams(min, max)
            .unwrap();
        // The committed text, as a model's cache would hold it.
        let mut text: Vec<u32> = Vec::new();
        for _ in 0..300 {
            let small = |r: &mut Rng| r.below(6) as u32;
            match rng.below(5) {
                // Committed tokens, causal.
                0 | 1 => {
                    let n = 1 + rng.below(4);
                    let new: Vec<u32> = (0..n).map(|_| small(&mut rng)).collect();
                    let row = m.step(&new).unwrap();
                    text.extend(&new);
                    let want = reference(&text, min, max);
                    assert_eq!(prediction(&row).map(|p| p.0), want.map(|w| w.0));
                }
                // A random tree over the text, then truncated or kept.
                2 | 3 if !text.is_empty() => {
                    let n = 1 + rng.below(6);
                    let past = text.len();
                    let parents: Vec<Option<usize>> = (0..n)
                        .map(|i| (i > 0 && rng.below(3) > 0).then(|| rng.below(i)))
                        .collect();
                    let tokens: Vec<u32> = (0..n).map(|_| small(&mut rng)).collect();
                    let mut mask = Mask::causal(past, n);
                    let mut depth = vec![0u32; n];
                    let mut paths: Vec<Vec<usize>> = Vec::new();
                    for i in 0..n {
                        let mut path = parents[i].map_or(Vec::new(), |p| paths[p].clone());
                        path.push(i);
                        depth[i] = path.len() as u32 - 1;
                        for j in 0..n {
                            mask.allowed[i * (past + n) + past + j] = path.contains(&j);
                        }
                        paths.push(path);
                    }
                    let positions: Vec<u32> = depth.iter().map(|d| past as u32 + d).collect();
                    let rows: Vec<usize> = (0..n).collect();
                    let out = m.forward(&tokens, &positions, &mask, &rows).unwrap();
                    for i in 0..n {
                        let mut ctx = text.clone();
                        ctx.extend(paths[i].iter().map(|&j| tokens[j]));
                        let want = reference(&ctx, min, max);
                        let got = prediction(out.row(i));
                        assert_eq!(got.map(|p| p.0), want.map(|w| w.0), "row {i} of {paths:?}");
                        if let (Some(g), Some(w)) = (got, want) {
                            assert!((g.1 - confidence(w.1)).abs() < 1e-4);
                        }
                    }
                    if rng.below(2) == 0 {
                        // Accept one path.
                        let path = &paths[rng.below(n)];
                        let keep: Vec<usize> =
                            (0..past).chain(path.iter().map(|&j| past + j)).collect();
                        m.keep_cache(&keep).unwrap();
                        text.extend(path.iter().map(|&j| tokens[j]));
                    } else {
                        let cut = rng.below(past + 1);
                        m.truncate_cache(cut).unwrap();
                        text.truncate(cut);
                    }
                }
                _ => {
                    let cut = rng.below(text.len() + 1);
                    m.truncate_cache(cut).unwrap();
                    text.truncate(cut);
                }
            }
            assert_eq!(m.cache_len(), text.len());
        }
    }
}

#[test]
fn bad_input_is_an_error() {
    let mut m = PromptLookup::new(config());
    assert!(m.step(&[VOCAB as u32]).is_err());
    m.step(&[1, 2]).unwrap();
    assert!(m.keep_cache(&[1, 0]).is_err());
    assert!(m.keep_cache(&[2]).is_err());
    assert!(m.forward(&[1], &[2], &Mask::causal(1, 1), &[0]).is_err());
    assert!(m.forward(&[1], &[2], &Mask::causal(2, 1), &[1]).is_err());
    assert!(PromptLookup::new(config()).with_ngrams(0, 2).is_err());
    assert!(PromptLookup::new(config()).with_ngrams(3, 2).is_err());
    assert!(PromptLookup::new(config()).with_ngrams(1, 9).is_err());
    assert_eq!(m.backend_name(), "lookup");
}

use super::*;

/// One-hot-ish logits: `top` gets 5, the others 0.
fn logits_with_top(vocab: usize, top: u32) -> Vec<f32> {
    let mut l = vec![0.0; vocab];
    l[top as usize] = 5.0;
    l
}

fn rows(rows: &[Vec<f32>]) -> Vec<f32> {
    rows.concat()
}

#[test]
fn greedy_follows_the_target_argmax_through_the_tree() {
    // root ─ 1 ─ 3
    //      └ 2 ─ 4
    let mut t = TokenTree::new(0);
    let a = t.push(0, 1, 0.5);
    let b = t.push(0, 2, 0.4);
    t.push(a, 3, 0.9);
    let d = t.push(b, 4, 0.9);
    let v = 6;
    // Target: after root → 2, after 2 → 4, after 4 → 5 (bonus).
    let l = rows(&[
        logits_with_top(v, 2),
        logits_with_top(v, 0),
        logits_with_top(v, 4),
        logits_with_top(v, 0),
        logits_with_top(v, 5),
    ]);
    assert_eq!(
        greedy(&t, &l, v),
        Verdict {
            accepted: vec![b, d],
            next: 5
        }
    );
    // Target wants 3 first: nothing accepted, 3 is the correction.
    let mut l2 = l.clone();
    l2[..v].copy_from_slice(&logits_with_top(v, 3));
    assert_eq!(
        greedy(&t, &l2, v),
        Verdict {
            accepted: vec![],
            next: 3
        }
    );
}

#[test]
fn typical_threshold_follows_the_entropy() {
    let policy = Typical::default();
    // A peaked distribution has low entropy: threshold = ε = 0.09.
    let peaked = [0.97, 0.01, 0.01, 0.01];
    assert!((policy.threshold(&peaked) - 0.09).abs() < 1e-6);
    assert!(policy.accepts(&peaked, 0));
    assert!(!policy.accepts(&peaked, 1));
    // Uniform over 100: H = ln 100, δ·e^(−H) = 0.3/100 = 0.003 < ε.
    let flat = vec![0.01f32; 100];
    assert!((policy.threshold(&flat) - 0.003).abs() < 1e-5);
    assert!(policy.accepts(&flat, 42), "0.01 > 0.003");
    // Two tokens at 0.5: H = ln 2, δ/2 = 0.15 > ε → 0.09; 0.5 passes.
    let two = [0.5, 0.5, 0.0];
    assert!((policy.threshold(&two) - 0.09).abs() < 1e-6);
    assert!(policy.accepts(&two, 1));
    assert!(!policy.accepts(&two, 2));
    assert!(!policy.accepts(&two, 9), "out of range");
}

#[test]
fn typical_is_greedy_first_then_accepts_plausible_tokens() {
    // root ─ 1 ─ 2 ─ 3
    let mut t = TokenTree::new(0);
    let a = t.push(0, 1, 0.9);
    let b = t.push(a, 2, 0.9);
    t.push(b, 3, 0.9);
    let v = 4;
    // After node 1 the target is split between 2 and 3 (2 is not the
    // argmax but is plausible); after node 2 it strongly wants 0.
    let split = vec![0.0, 0.0, 2.0, 2.1];
    let l = rows(&[
        logits_with_top(v, 1),
        split,
        logits_with_top(v, 0),
        logits_with_top(v, 0),
    ]);
    let mut rng = Rng::new(1);
    let got = typical(&t, &l, v, &Typical::default(), &mut rng);
    assert_eq!(got.accepted, vec![a, b], "greedy would stop after node 1");
    assert_eq!(got.next, 0);
    assert_eq!(greedy(&t, &l, v).accepted, vec![a]);
    // The first token is always greedy: a root child that is merely
    // plausible is not accepted.
    let mut l2 = l.clone();
    l2[..v].copy_from_slice(&[0.0, 2.0, 2.1, 0.0]);
    let got = typical(&t, &l2, v, &Typical::default(), &mut rng);
    assert_eq!(
        got,
        Verdict {
            accepted: vec![],
            next: 2
        }
    );
}

fn normalise(v: &[f32]) -> Vec<f32> {
    let s: f32 = v.iter().sum();
    v.iter().map(|x| x / s).collect()
}

/// Pearson's χ² of observed counts against expected probabilities.
fn chi_square(counts: &[u64], expected: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(expected)
        .filter(|(_, e)| **e > 0.0)
        .map(|(&c, &e)| {
            let e = e * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

/// The cell (`first × vocab + second`) of the first two tokens a verdict
/// commits; when it commits one, the next round would draw the second from
/// the target.
fn first_two(t: &TokenTree, v: &Verdict, p1: &[Vec<f32>], rng: &mut Rng) -> usize {
    let mut seq: Vec<u32> = v.accepted.iter().map(|&i| t.node(i).token).collect();
    seq.push(v.next);
    if seq.len() == 1 {
        seq.push(draw(&p1[seq[0] as usize], rng));
    }
    seq[0] as usize * p1.len() + seq[1] as usize
}

/// χ² of 36 cells against the expected pairs, and the proposals were used.
fn check_pairs(counts: &[u64], expected: &[f64], used: usize, what: &str) {
    let chi2 = chi_square(counts, expected);
    // 35 degrees of freedom: P(χ² > 66.6) = 0.001.
    assert!(chi2 < 66.6, "{what}: χ² = {chi2:.1} over 36 cells");
    assert!(used > 1000, "{what}: no proposal was accepted");
}

/// A 6-token target for the sampling tests: its first-token distribution,
/// its second-token distribution after each first token, and the expected
/// share of each pair (`first × vocab + second`).
fn target_pairs() -> (usize, Vec<f32>, Vec<Vec<f32>>, Vec<f64>) {
    let vocab = 6;
    let p0 = normalise(&[0.30, 0.25, 0.20, 0.15, 0.07, 0.03]);
    // The target's second-token distribution depends on the first token.
    let p1: Vec<Vec<f32>> = (0..vocab)
        .map(|a| {
            normalise(
                &(0..vocab)
                    .map(|b| 1.0 + ((a * 7 + b * 3) % 5) as f32)
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let mut expected = vec![0f64; vocab * vocab];
    for a in 0..vocab {
        for b in 0..vocab {
            expected[a * vocab + b] = p0[a] as f64 * p1[a][b] as f64;
        }
    }
    (vocab, p0, p1, expected)
}

/// The tree sampler must produce the target's distribution over the first
/// two tokens, whatever the draft: χ² over the 36 pairs of a 6-token
/// vocabulary, 40,000 rounds, two drafts (a poor one and a good one), two
/// children per node drawn without replacement, depth 2.
#[test]
fn tree_sampling_follows_the_target_distribution() {
    let (vocab, p0, p1, expected) = target_pairs();
    let drafts = [
        // Poor: mass on what the target dislikes.
        (
            normalise(&[0.02, 0.03, 0.05, 0.1, 0.4, 0.4]),
            normalise(&[0.4, 0.3, 0.1, 0.1, 0.05, 0.05]),
        ),
        // Close to the target.
        (
            normalise(&[0.28, 0.27, 0.2, 0.14, 0.08, 0.03]),
            normalise(&[0.2, 0.2, 0.2, 0.15, 0.15, 0.1]),
        ),
    ];
    for (d, (q0, q1)) in drafts.iter().enumerate() {
        let mut rng = Rng::new(0xC0FFEE + d as u64);
        let mut counts = vec![0u64; vocab * vocab];
        let mut accepted_any = 0;
        for _ in 0..40_000 {
            let mut t = TokenTree::new(99);
            let mut draft: Vec<Option<Vec<f32>>> = vec![Some(q0.clone())];
            for x in draw_without_replacement(q0, 2, &mut rng) {
                let c = t.push(0, x, q0[x as usize]);
                draft.resize(c + 1, None);
                draft[c] = Some(q1.clone());
                for y in draw_without_replacement(q1, 2, &mut rng) {
                    t.push(c, y, q1[y as usize]);
                }
            }
            draft.resize(t.len(), None);
            let mut target = |i: usize| -> Vec<f32> {
                if i == 0 {
                    p0.clone()
                } else if t.node(i).depth == 1 {
                    p1[t.node(i).token as usize].clone()
                } else {
                    vec![1.0 / vocab as f32; vocab]
                }
            };
            let v = sampling(&t, &mut target, &draft, &mut rng);
            accepted_any += usize::from(!v.accepted.is_empty());
            counts[first_two(&t, &v, &p1, &mut rng)] += 1;
        }
        check_pairs(&counts, &expected, accepted_any, &format!("draft {d}"));
    }
}

/// The same test is able to fail: accepting every drafted child outright
/// (no rejection step) is visibly off the target distribution.
#[test]
fn the_chi_square_check_detects_a_biased_sampler() {
    let vocab = 6;
    let p0 = normalise(&[0.30, 0.25, 0.20, 0.15, 0.07, 0.03]);
    let q0 = normalise(&[0.02, 0.03, 0.05, 0.1, 0.4, 0.4]);
    let mut rng = Rng::new(3);
    let mut counts = vec![0u64; vocab];
    for _ in 0..40_000 {
        counts[draw(&q0, &mut rng) as usize] += 1;
    }
    let expected: Vec<f64> = p0.iter().map(|&v| v as f64).collect();
    assert!(chi_square(&counts, &expected) > 1000.0);
}

#[test]
fn drawing_without_replacement_never_repeats() {
    let mut rng = Rng::new(5);
    let q = normalise(&[0.5, 0.3, 0.2, 0.0]);
    for _ in 0..100 {
        let d = draw_without_replacement(&q, 5, &mut rng);
        assert_eq!(d.len(), 3, "only three tokens have mass");
        let mut s = d.clone();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), 3);
    }
}

/// Point-mass candidates verified by [`matching`] commit the target's
/// distribution: χ² of the first two tokens over a 6-token vocabulary,
/// 40,000 rounds, with the candidates the target likes and with ones it
/// does not; the candidates are used.
#[test]
fn matching_follows_the_target_distribution() {
    let (vocab, p0, p1, expected) = target_pairs();
    // Candidate trees: root children with grandchildren, as PPD's top-k.
    for (d, guesses) in [([0u32, 1], [2u32, 0]), ([5, 4], [5, 3])]
        .into_iter()
        .enumerate()
    {
        let mut t = TokenTree::new(99);
        for &x in &guesses.0 {
            let c = t.push(0, x, 1.0);
            for &y in &guesses.1 {
                t.push(c, y, 1.0);
            }
        }
        let mut rng = Rng::new(0xBEEF + d as u64);
        let mut counts = vec![0u64; vocab * vocab];
        let mut used = 0;
        for _ in 0..40_000 {
            let mut sample = |i: usize| -> Result<u32, ()> {
                let p = if i == 0 {
                    &p0
                } else {
                    &p1[t.node(i).token as usize]
                };
                Ok(draw(p, &mut rng))
            };
            let v = matching(&t, &mut sample).unwrap();
            used += usize::from(!v.accepted.is_empty());
            counts[first_two(&t, &v, &p1, &mut rng)] += 1;
        }
        check_pairs(&counts, &expected, used, &format!("guesses {d}"));
    }
}

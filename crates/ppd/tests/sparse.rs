//! The sparse-tree planner against brute force on small tables, its tree
//! invariants on random ones; the dynamic plans' limits, their sizing by
//! pass cost, their gain over full sparse trees; refusals.

use arbor_ppd::{Accuracy, CandidateTree, Plan, PpdError, optimal_tree, plan};
use proptest::prelude::*;

/// The thesis' MobileLLaMA-like shape: distance 1 top-1 0.47, top-5 0.77.
fn thesis_like() -> Accuracy {
    Accuracy::new(vec![
        vec![0.47, 0.58, 0.66, 0.72, 0.77],
        vec![0.25, 0.36, 0.45, 0.52, 0.58],
        vec![0.14, 0.22, 0.29, 0.35, 0.40],
    ])
    .unwrap()
}

/// Every candidate path (as rank lists) up to `depth`, with its value.
fn all_paths(acc: &Accuracy, depth: usize) -> Vec<(Vec<usize>, f64)> {
    let mut out = Vec::new();
    let mut stack: Vec<(Vec<usize>, f64)> = vec![(Vec::new(), 1.0)];
    while let Some((path, v)) = stack.pop() {
        if path.len() == depth {
            continue;
        }
        for r in 0..acc.ranks() {
            let mut p = path.clone();
            p.push(r);
            let value = v * acc.at(p.len(), r);
            out.push((p.clone(), value));
            stack.push((p, value));
        }
    }
    out
}

/// The best sum over prefix-closed sets of `n` paths, by enumeration.
fn brute_best(acc: &Accuracy, depth: usize, n: usize) -> f64 {
    let paths = all_paths(acc, depth);
    assert!(paths.len() <= 16, "brute force over {} paths", paths.len());
    let mut best = 0.0f64;
    for mask in 0u32..(1 << paths.len()) {
        if mask.count_ones() as usize > n {
            continue;
        }
        let chosen: Vec<&Vec<usize>> = (0..paths.len())
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| &paths[i].0)
            .collect();
        let closed = chosen
            .iter()
            .all(|p| p.len() == 1 || chosen.iter().any(|q| q[..] == p[..p.len() - 1]));
        if closed {
            let sum: f64 = (0..paths.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| paths[i].1)
                .sum();
            best = best.max(sum);
        }
    }
    best
}

fn check_tree(tree: &CandidateTree, acc: &Accuracy, depth: usize) {
    let nodes = tree.nodes();
    for (i, c) in nodes.iter().enumerate() {
        assert!(c.depth >= 1 && c.depth <= depth);
        let base = match c.parent {
            None => {
                assert_eq!(c.depth, 1);
                1.0
            }
            Some(p) => {
                assert!(p < i, "parents come first");
                assert_eq!(nodes[p].depth + 1, c.depth);
                nodes[p].value
            }
        };
        assert!((c.value - base * acc.at(c.depth, c.rank)).abs() < 1e-12);
        assert!(c.value > 0.0);
        if i > 0 {
            assert!(c.value <= nodes[i - 1].value + 1e-15, "taken best first");
        }
        // No two siblings share a rank.
        assert!(
            !nodes[..i]
                .iter()
                .any(|o| o.parent == c.parent && o.rank == c.rank)
        );
    }
    // Exit masses: non-negative, and they add up to the chance that at
    // least the first candidate is accepted.
    let exit = tree.exit_mass();
    assert!(exit.iter().all(|&m| m >= -1e-12));
    let first: f64 = nodes
        .iter()
        .filter(|c| c.parent.is_none())
        .map(|c| c.value)
        .sum();
    assert!((exit.iter().sum::<f64>() - first).abs() < 1e-9);
}

fn table() -> impl Strategy<Value = Accuracy> {
    (1usize..=3, 1usize..=4)
        .prop_flat_map(|(d, k)| prop::collection::vec(prop::collection::vec(0.0f64..0.5, k), d))
        .prop_map(|rows| {
            // Increments to cumulative top-k accuracies, capped at 1.
            let topk = rows
                .into_iter()
                .map(|inc| {
                    let mut acc = 0.0f64;
                    inc.into_iter()
                        .map(|x| {
                            acc = (acc + x).min(1.0);
                            acc
                        })
                        .collect()
                })
                .collect();
            Accuracy::new(topk).unwrap()
        })
}

proptest! {
    #[test]
    fn trees_are_prefix_closed_best_first_and_nested(acc in table(), n in 0usize..12) {
        let depth = acc.distances();
        let tree = optimal_tree(&acc, depth, n).unwrap();
        prop_assert!(tree.len() <= n);
        check_tree(&tree, &acc, depth);
        // The best tree of fewer candidates is a prefix of this one.
        for m in 0..tree.len() {
            prop_assert_eq!(optimal_tree(&acc, depth, m).unwrap(), tree.prefix(m));
        }
    }

    #[test]
    fn no_tree_of_the_same_size_keeps_more(acc in table(), n in 1usize..6) {
        // Small enough to enumerate every set of paths.
        let depth = acc.distances().min(if acc.ranks() > 3 { 1 } else { 2 });
        let tree = optimal_tree(&acc, depth, n).unwrap();
        let best = brute_best(&acc, depth, n);
        prop_assert!((tree.expected_accepted() - best).abs() < 1e-9,
            "planned {} against {}", tree.expected_accepted(), best);
    }
}

/// A plan's shape: states as deep as their index, 1..=m prompt tokens per
/// row, rows and logit rows within the limits, shares a distribution, and
/// the figures it reports its own.
fn check_plan(p: &Plan, acc: &Accuracy, max_rows: usize, max_logits: usize) {
    if p.prompts == 0 {
        assert!(p.states.is_empty() && p.tokens_per_pass == 1.0 && p.rows == 1);
        return;
    }
    assert_eq!(p.states.len(), p.prompts);
    assert!((p.share.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    assert!(p.share.iter().all(|&x| x >= -1e-12));
    let mut tokens = 0.0;
    for (k, (s, share)) in p.states.iter().zip(&p.share).enumerate() {
        check_tree(&s.tree, acc, k + 1);
        assert_eq!(s.prompts.len(), s.tree.len() + 1);
        assert!(s.prompts.iter().all(|&q| (1..=p.prompts).contains(&q)));
        assert!(s.rows() <= max_rows && s.rows() <= p.rows);
        assert!(s.logit_rows() <= max_logits.max(1 + p.prompts));
        assert!((s.exit_mass().iter().sum::<f64>() - 1.0).abs() < 1e-9);
        tokens += share * (1.0 + s.tree.expected_accepted());
    }
    assert!((tokens - p.tokens_per_pass).abs() < 1e-9);
}

proptest! {
    #[test]
    fn plans_keep_their_limits(acc in table(), rows in 1usize..40, logits in 1usize..12, steep in any::<bool>()) {
        let m = acc.distances();
        let cost = |r: usize, l: usize| if steep { 0.03 + 0.01 * r as f64 + 0.002 * l as f64 } else { 1.0 };
        let p = plan(&acc, m, 1, rows, logits, cost).unwrap();
        check_plan(&p, &acc, rows, logits);
        prop_assert!(p.tokens_per_sec >= 1.0 / cost(1, 1) - 1e-12);
    }
}

#[test]
fn a_flat_pass_cost_buys_the_largest_tree_and_a_steep_one_plain_decoding() {
    let acc = thesis_like();
    // Rows cost nothing extra (a pass waits on its reads): the most rows.
    let flat = plan(&acc, 3, 1, 48, 19, |_, _| 1.0).unwrap();
    check_plan(&flat, &acc, 48, 19);
    assert_eq!(flat.prompts, 3);
    assert!(flat.rows > 40, "{}", flat.rows);
    // Against the full sparse tree (every row with all 3 prompt tokens,
    // so always the deepest state) in as many rows: more tokens per pass.
    let full = optimal_tree(&acc, 3, 48 / 4 - 1).unwrap();
    let full_tokens = 1.0 + full.expected_accepted();
    assert!(
        flat.tokens_per_pass > full_tokens + 0.05,
        "{} against {full_tokens}",
        flat.tokens_per_pass
    );
    // Every row costs as much as the first: nothing beats one-row passes.
    let steep = plan(&acc, 3, 1, 64, 19, |r, _| r as f64).unwrap();
    assert!(steep.states.is_empty());
    assert_eq!((steep.rows, steep.prompts), (1, 0));
    assert_eq!(steep.tokens_per_pass, 1.0);
    // Resident on this CPU (the 1.5B: 27 ms a row, 12 ms each more, a
    // sixth of it the head's): plain decoding wins.
    let cpu = |r: usize, l: usize| 0.027 + 0.0098 * (r as f64 - 1.0) + 0.0017 * (l as f64 - 1.0);
    assert!(plan(&acc, 3, 1, 64, 19, cpu).unwrap().states.is_empty());
    // Streaming (a fixed read time, then the rows' compute): a smaller
    // plan than the flat one, which beats plain passes.
    let streamed = |r: usize, l: usize| 0.4 + cpu(r, l);
    let mid = plan(&acc, 3, 1, 64, 19, streamed).unwrap();
    check_plan(&mid, &acc, 64, 19);
    assert!(mid.prompts == 3 && mid.rows < 64);
    assert!(mid.tokens_per_sec > 1.2 / streamed(1, 1));
    // Where rows cost, nodes carry fewer prompt tokens than all three
    // (here one each: a pass guesses one token deep).
    let common = &mid.states[mid.share.iter().position(|&p| p > 0.5).unwrap()];
    assert!(common.prompts.iter().sum::<usize>() < 3 * common.prompts.len());
}

#[test]
fn bad_tables_and_requests_are_refused() {
    let bad = [
        vec![],
        vec![vec![]],
        vec![vec![0.5, 0.4]],
        vec![vec![0.5, 1.2]],
        vec![vec![0.5, 0.6], vec![0.3]],
        vec![vec![f64::NAN]],
    ];
    for t in bad {
        assert!(matches!(Accuracy::new(t), Err(PpdError::Accuracy(_))));
    }
    let acc = thesis_like();
    assert!(matches!(
        optimal_tree(&acc, 4, 5),
        Err(PpdError::Request(_))
    ));
    assert!(matches!(
        plan(&acc, 0, 1, 64, 19, |_, _| 1.0),
        Err(PpdError::Request(_))
    ));
    assert!(matches!(
        plan(&acc, 4, 1, 64, 19, |_, _| 1.0),
        Err(PpdError::Request(_))
    ));
    assert!(matches!(
        plan(&acc, 3, 1, 0, 19, |_, _| 1.0),
        Err(PpdError::Request(_))
    ));
    assert!(optimal_tree(&acc, 0, 5).unwrap().is_empty());
}

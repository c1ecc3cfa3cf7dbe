//! An elastic file whose output head is stored in frequency order: its
//! logits are the token-order file's, token for token; a share of its head
//! gives the same logits for the tokens it keeps and `-inf` for the rest;
//! tied heads and orders that are not orders of the vocabulary are refused.

use arbor_elastic::{ElasticError, Order, build};
use arbor_gguf::{GgmlType, GgufFile};
use arbor_model::{LanguageModel, Layout};

use crate::common;
use common::*;

/// Token `i`'s place: a permutation of the 200 tokens (7 is prime to 200).
fn order(vocab: u32) -> Vec<u32> {
    (0..vocab).map(|i| (i * 7 + 3) % vocab).collect()
}

fn build_with(
    m: &arbor_model::testing::TinyModel,
    source: &Temp,
    vocab: Option<Vec<u32>>,
    tag: &str,
) -> Result<Temp, ElasticError> {
    let out = Temp::new(tag);
    let mut o = options(Order::Importance);
    o.vocab = vocab;
    build(
        &source.0,
        &out.0,
        Some(&random_scores(m, m.seed)),
        &o,
        &mut |_, _| {},
    )?;
    Ok(out)
}

#[test]
fn a_frequency_ordered_head_gives_the_same_logits_and_its_prefix_the_kept_tokens() {
    let m = tiny(GgmlType::Q8_0, 5);
    let source = Temp::write(&m.writer(), "head-src");
    let plain = build_with(&m, &source, None, "head-plain").unwrap();
    let order = order(m.vocab as u32);
    let ranked = build_with(&m, &source, Some(order.clone()), "head-ranked").unwrap();
    let layout = Layout::from_gguf(GgufFile::open(&ranked.0).unwrap().header()).unwrap();
    assert_eq!(layout.elastic.unwrap().vocab.as_deref(), Some(&order[..]));

    let (mut a, mut b) = (load(&plain.0), load(&ranked.0));
    for level in [0.5, 1.0] {
        a.set_level(level).unwrap();
        b.set_level(level).unwrap();
        let (la, lb) = (run(&mut a), run(&mut b));
        assert_eq!(la, lb, "level {level}: the same rows, in another order");
        let scale = la.iter().flatten().map(|x| x.abs()).fold(0.0, f32::max);
        assert!(scale > 1.0, "logits too small to tell: {scale}");
    }

    // Half the head: 100 rows, rounded up to 104 (groups of eight).
    assert_eq!(b.set_head_share(0.5).unwrap(), 104);
    let whole = run(&mut a);
    let part = run(&mut b);
    let kept: std::collections::HashSet<u32> = order[..104].iter().copied().collect();
    for (w, p) in whole.iter().zip(&part) {
        assert_eq!(w.len(), p.len());
        for (t, (x, y)) in w.iter().zip(p).enumerate() {
            match kept.contains(&(t as u32)) {
                true => assert_eq!(x, y, "token {t}"),
                false => assert_eq!(*y, f32::NEG_INFINITY, "token {t}"),
            }
        }
    }
    // Each token's logit sits at its head row in `head`'s output.
    assert_eq!(b.head_columns(&[order[0], order[150]]), vec![0, 150]);
    assert_eq!(a.head_columns(&[3, 150]), vec![3, 150]);
    assert_eq!(b.set_head_share(1.0).unwrap(), m.vocab);
    assert_eq!(run(&mut b), whole);

    // Out of range, or a head in token order: refused; the trait says None.
    assert!(b.set_head_share(0.0).is_err() && b.set_head_share(1.5).is_err());
    assert!(a.set_head_share(0.5).is_err());
    assert_eq!(LanguageModel::set_head_share(&mut a, 0.5).unwrap(), None);
    assert_eq!(
        LanguageModel::set_head_share(&mut b, 0.2).unwrap(),
        Some(40)
    );
}

#[test]
fn tied_heads_and_broken_orders_are_refused() {
    let tied = arbor_model::testing::TinyModel {
        tied: true,
        ..tiny(GgmlType::Q8_0, 6)
    };
    let source = Temp::write(&tied.writer(), "head-tied");
    let e = build_with(
        &tied,
        &source,
        Some(order(tied.vocab as u32)),
        "head-tied-out",
    )
    .err()
    .expect("a tied head cannot be reordered");
    assert!(e.to_string().contains("tied"), "{e}");

    let m = tiny(GgmlType::Q8_0, 7);
    let source = Temp::write(&m.writer(), "head-bad");
    let mut twice = order(m.vocab as u32);
    twice[1] = twice[0];
    let short = order(m.vocab as u32)[..100].to_vec();
    for bad in [twice, short] {
        let e = build_with(&m, &source, Some(bad), "head-bad-out")
            .err()
            .expect("not an order of the vocabulary");
        assert!(e.to_string().contains("token order"), "{e}");
    }
}

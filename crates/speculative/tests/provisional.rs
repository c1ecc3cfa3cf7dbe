//! Provisional generation: a target that waits for its weights lets the
//! draft show tokens early; they are kept, extended or rolled back, and the
//! confirmed output never differs from the target's own.

use crate::common;

use std::sync::Arc;
use std::sync::mpsc::Sender;

use arbor_model::testing::{Drafting, Turns};
use arbor_model::{Config, LanguageModel, Logits, Mask, Result, WeightWait};
use arbor_speculative::{Decoding, Event, Phase, Strategy, TreeConfig, decode};
use common::models::{DraftKind, draft, opts, target};

/// A target whose passes wait for weights, like one streamed from disk:
/// each reports a wait and stays in it for the draft's turn of `steps`
/// passes (fewer when the draft has nothing to extend), then computes.
struct Loading {
    inner: Box<dyn LanguageModel>,
    waits: Option<Sender<WeightWait>>,
    turns: Arc<Turns>,
    steps: usize,
}

impl LanguageModel for Loading {
    fn forward(&mut self, t: &[u32], p: &[u32], m: &Mask, rows: &[usize]) -> Result<Logits> {
        if let Some(tx) = &self.waits {
            self.turns.wait(tx, self.steps);
        }
        self.inner.forward(t, p, m, rows)
    }
    delegate_to_inner!();
    fn backend_name(&self) -> &'static str {
        "loading"
    }
    fn notify_waits(&mut self, tx: Option<Sender<WeightWait>>) {
        self.waits = tx;
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Owned {
    Confirm(Vec<u32>),
    Provisional(Vec<u32>),
    Rollback(usize),
}

/// Plays events as a consumer would (see [`Event`]), checking that
/// confirmations agree with the provisional tokens they replace; returns
/// the confirmed tokens.
fn replay(events: &[Owned]) -> Vec<u32> {
    let (mut confirmed, mut shown) = (Vec::new(), Vec::<u32>::new());
    for e in events {
        match e {
            Owned::Confirm(t) => {
                let k = t.len().min(shown.len());
                assert_eq!(
                    &shown[..k],
                    &t[..k],
                    "a confirmation contradicts what was shown"
                );
                shown.drain(..k);
                confirmed.extend_from_slice(t);
            }
            Owned::Provisional(t) => shown.extend_from_slice(t),
            Owned::Rollback(n) => {
                assert!(*n <= shown.len(), "rolled back more than was shown");
                shown.truncate(shown.len() - n);
            }
        }
    }
    assert!(shown.is_empty(), "provisional tokens left shown at the end");
    confirmed
}

#[test]
fn provisional_tokens_are_streamed_kept_or_rolled_back_and_never_change_the_output() {
    let cfg = TreeConfig {
        max_nodes: 8,
        provisional: true,
        ..TreeConfig::default()
    };
    for kind in [DraftKind::Perfect, DraftKind::Poor, DraftKind::Adversarial] {
        for (prompt, stop) in [(vec![1, 2, 3], vec![]), (vec![5, 9], vec![17, 40])] {
            let mut t = target(300);
            let plain = decode(
                t.as_mut(),
                None,
                &prompt,
                &opts(Strategy::default(), 60, stop.clone()),
                &mut |_| {},
            )
            .unwrap();
            let turns = Turns::new();
            let mut t = Loading {
                inner: t,
                waits: None,
                turns: turns.clone(),
                steps: 3,
            };
            let mut d = Drafting {
                inner: draft(kind, 300),
                turns,
            };
            let mut events = Vec::new();
            let out = decode(
                &mut t,
                Some(&mut d),
                &prompt,
                &opts(Strategy::new(Decoding::Tree(cfg.clone())), 60, stop),
                &mut |e| {
                    events.push(match e {
                        Event::Confirm(t) => Owned::Confirm(t.to_vec()),
                        Event::Provisional(t) => Owned::Provisional(t.to_vec()),
                        Event::Rollback(n) => Owned::Rollback(n),
                    })
                },
            )
            .unwrap();
            let what = format!("{kind:?} draft, prompt {prompt:?}");
            assert_eq!(out.tokens, plain.tokens, "{what}");
            assert_eq!(out.stats.stop, plain.stats.stop, "{what}");
            assert_eq!(replay(&events), out.tokens, "{what}");
            let s = &out.stats;
            let p_spans = out
                .trace
                .iter()
                .filter(|p| p.phase == Phase::Provisional)
                .count();
            assert_eq!(p_spans > 0, s.provisional_tokens > 0, "{what}");
            assert!(s.provisional_accepted <= s.provisional_tokens, "{what}");
            assert!(s.accepted_draft_tokens <= s.draft_tokens, "{what}");
            let shown = events.iter().any(|e| matches!(e, Owned::Provisional(_)));
            match kind {
                DraftKind::Perfect => {
                    assert!(s.provisional_tokens > 0, "{what}: {s:?}");
                    assert!(s.provisional_accepted > 0, "{what}: {s:?}");
                    assert!(shown, "{what}");
                }
                DraftKind::Adversarial => {
                    assert_eq!(s.provisional_accepted, 0, "{what}: {s:?}");
                    let rolled = events.iter().any(|e| matches!(e, Owned::Rollback(_)));
                    assert_eq!(shown, rolled, "{what}: shown guesses must be taken back");
                }
                DraftKind::Poor => {}
            }
        }
    }
}

#[test]
fn without_weight_waits_nothing_is_provisional() {
    let mut t = target(300);
    let mut d = draft(DraftKind::Perfect, 300);
    let cfg = TreeConfig {
        max_nodes: 8,
        provisional: true,
        ..TreeConfig::default()
    };
    let mut shown = 0;
    let out = decode(
        t.as_mut(),
        Some(d.as_mut()),
        &[1, 2, 3],
        &opts(Strategy::new(Decoding::Tree(cfg)), 40, vec![]),
        &mut |e| shown += usize::from(!matches!(e, Event::Confirm(_))),
    )
    .unwrap();
    assert_eq!(out.stats.provisional_tokens, 0);
    // The branch is shown while the target verifies, then confirmed.
    assert!(shown > 0);
    assert!(out.trace.iter().all(|p| p.phase != Phase::Provisional));
}

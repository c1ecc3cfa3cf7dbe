//! Decoding tells the target when its logits are read for their argmax
//! only (greedy, exact, no constraint, no log-probabilities) and takes it
//! back when it ends: a target with an approximate head may then give
//! exact values only where the maximum may be.

use crate::common;

use std::sync::{Arc, Mutex};

use arbor_model::{Config, LanguageModel, Logits, Mask, Result, Row};
use arbor_sampling::SamplingParams;
use arbor_speculative::{
    Control, Decoding, Strategy, TreeConfig, Typical, Verification, decode_with,
};
use common::models::{DraftKind, draft, model, opts, tiny};

/// A target that records what it is told, and what was in force at each
/// pass.
struct Watching {
    inner: Box<dyn LanguageModel>,
    told: Arc<Mutex<Vec<bool>>>,
    on: bool,
    passes_on: Arc<Mutex<usize>>,
}

impl LanguageModel for Watching {
    fn forward(&mut self, t: &[u32], p: &[u32], m: &Mask, rows: &[usize]) -> Result<Logits> {
        *self.passes_on.lock().unwrap() += usize::from(self.on);
        self.inner.forward(t, p, m, rows)
    }
    fn forward_rows(
        &mut self,
        r: &[Row<'_>],
        p: &[u32],
        m: &Mask,
        rows: &[usize],
    ) -> Result<Logits> {
        *self.passes_on.lock().unwrap() += usize::from(self.on);
        self.inner.forward_rows(r, p, m, rows)
    }
    fn set_argmax_only(&mut self, on: bool) -> bool {
        self.told.lock().unwrap().push(on);
        self.on = on;
        true
    }
    delegate_to_inner!();
    fn backend_name(&self) -> &'static str {
        "watching"
    }
}

/// Never allows token 0 (a rule that needs every value of a row).
struct NoZero;

impl arbor_sampling::Constraint for NoZero {
    fn mask(&self, _path: &[u32], logits: &mut [f32]) -> std::result::Result<(), String> {
        logits[0] = f32::NEG_INFINITY;
        Ok(())
    }
    fn commit(&self, _tokens: &[u32]) -> std::result::Result<(), String> {
        Ok(())
    }
}

#[test]
fn only_greedy_exact_unconstrained_passes_are_argmax_only() {
    let vocab = 64;
    let tree = Strategy::new(Decoding::Tree(TreeConfig::default()));
    let greedy = opts(tree.clone(), 12, vec![]);
    let sampled = arbor_speculative::DecodeOptions {
        sampling: SamplingParams {
            temperature: 0.8,
            ..SamplingParams::default()
        },
        ..greedy.clone()
    };
    let typical = arbor_speculative::DecodeOptions {
        verification: Verification::Typical(Typical::default()),
        ..greedy.clone()
    };
    let no_zero = NoZero;
    let cases: [(&str, _, Control<'_>, bool); 4] = [
        ("greedy", &greedy, Control::default(), true),
        ("sampled", &sampled, Control::default(), false),
        ("typical", &typical, Control::default(), false),
        (
            "log-probabilities",
            &greedy,
            Control {
                logprobs: Some(2),
                ..Control::default()
            },
            false,
        ),
    ];
    let constrained = Control {
        constraint: Some(&no_zero),
        ..Control::default()
    };
    for (what, options, control, argmax) in
        cases
            .into_iter()
            .chain([("constrained", &greedy, constrained, false)])
    {
        let told = Arc::new(Mutex::new(Vec::new()));
        let passes_on = Arc::new(Mutex::new(0));
        let mut target = Watching {
            inner: tiny(&model(7, vocab), "argmax-target"),
            told: told.clone(),
            on: false,
            passes_on: passes_on.clone(),
        };
        let mut d = draft(DraftKind::Poor, vocab);
        let out = decode_with(
            &mut target,
            Some(d.as_mut()),
            &[1, 2, 3],
            options,
            control,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(out.tokens.len(), 12, "{what}");
        assert_eq!(*told.lock().unwrap(), vec![argmax, false], "{what}");
        let on = *passes_on.lock().unwrap();
        assert_eq!(on > 0, argmax, "{what}: {on} passes argmax-only");
    }
}

//! The GPU backend end to end (lavapipe in CI): speculative decoding on
//! wgpu equals wgpu target-only decoding token for token. Random tiny
//! models have many near-ties, so a row that got other bits in a tree's
//! pass than alone would show here.
#![cfg(feature = "wgpu")]

use arbor_engine::{BackendKind, Decoding, Engine, GenerateOptions, Strategy, TreeConfig};
use arbor_gguf::GgmlType;
use arbor_model::testing::{TempGguf, TinyModel, add_byte_tokenizer, write_temp};

fn file(model: &TinyModel, tag: &str) -> TempGguf {
    let mut w = model.writer();
    add_byte_tokenizer(&mut w, None);
    write_temp(&w, tag)
}

fn tiny(seed: u64, layers: usize, weight_type: GgmlType) -> TinyModel {
    TinyModel {
        arch: "qwen2",
        vocab: 259,
        hidden: 128,
        heads: 4,
        kv_heads: 2,
        ffn: 256,
        layers,
        weight_type,
        seed,
        ..TinyModel::default()
    }
}

#[test]
fn speculative_strategies_on_wgpu_equal_wgpu_target_only() {
    let target = file(&tiny(5, 2, GgmlType::Q8_0), "wgpu-target");
    // The target itself (every guess right) and an unrelated model in
    // another format (mostly wrong): verification passes of every size.
    let drafts = [
        file(&tiny(5, 2, GgmlType::Q8_0), "wgpu-same"),
        file(&tiny(9, 1, GgmlType::F16), "wgpu-other"),
    ];
    let prompt: Vec<u32> = b"def f(x):".iter().map(|&b| b as u32).collect();
    for draft in &drafts {
        let mut engine = Engine::load(&target, BackendKind::Wgpu, &mut |_, _| {}).unwrap();
        engine
            .load_draft(draft, BackendKind::Wgpu, &mut |_, _| {})
            .unwrap();
        let mut run = |strategy: Strategy| {
            let options = GenerateOptions {
                max_tokens: 40,
                stop_tokens: Some(vec![]),
                strategy,
                ..GenerateOptions::default()
            };
            engine.generate(&prompt, &options, &mut |_| {}).unwrap()
        };
        let plain = run(Strategy::default());
        assert_eq!(plain.tokens.len(), 40);
        for strategy in [
            Strategy::new(Decoding::Chain { gamma: 4 }),
            Strategy::new(Decoding::Tree(TreeConfig::default())),
            Strategy::new(Decoding::StaticTree { width: 3, depth: 3 }),
        ] {
            let g = run(strategy.clone());
            assert_eq!(g.tokens, plain.tokens, "{} {strategy:?}", draft.display());
            assert!(g.stats.verifications > 0);
        }
    }
}

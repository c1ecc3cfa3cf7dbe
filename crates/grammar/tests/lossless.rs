//! Constrained decoding end to end on tiny random models (every byte a
//! token, so the grammar has the most choices to police): the output is
//! JSON that fits its schema, and chain, tree and static-tree speculation
//! under the schema give exactly the constrained target-only tokens, with
//! a perfect draft and with an unrelated one.

use arbor_engine::{BackendKind, Control, Decoding, Engine, GenerateOptions, Strategy, TreeConfig};
use arbor_grammar::Grammars;
use arbor_model::testing::{TempGguf, TinyModel, add_byte_tokenizer, write_temp};
use serde_json::{Value, json};

fn file(seed: u64, layers: usize, tag: &str) -> TempGguf {
    let model = TinyModel {
        arch: "qwen2",
        vocab: 259,
        hidden: 64,
        heads: 4,
        kv_heads: 2,
        ffn: 128,
        layers,
        seed,
        ..TinyModel::default()
    };
    let mut w = model.writer();
    add_byte_tokenizer(&mut w, Some(258));
    write_temp(&w, tag)
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "kind": {"enum": ["cat", "dog"]},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}
        },
        "required": ["name", "age", "kind", "tags"],
        "additionalProperties": false
    })
}

/// What the schema asks, checked by hand on the parsed value.
fn fits(v: &Value) -> bool {
    let o = v.as_object().unwrap();
    o.len() == 4
        && o["name"].as_str().is_some_and(|s| s.chars().count() <= 6)
        && o["age"].as_u64().is_some_and(|a| a <= 120)
        && ["cat", "dog"].contains(&o["kind"].as_str().unwrap_or(""))
        && o["tags"]
            .as_array()
            .is_some_and(|t| t.len() <= 3 && t.iter().all(|x| x == "a" || x == "b"))
}

#[test]
fn constrained_speculation_equals_constrained_target_only() {
    let target = file(5, 2, "grammar-target");
    let drafts = [file(5, 2, "grammar-same"), file(9, 1, "grammar-other")];
    let prompt: Vec<u32> = b"person: ".iter().map(|&b| b as u32).collect();
    for draft in &drafts {
        let mut engine = Engine::load(&target, BackendKind::Candle, &mut |_, _| {}).unwrap();
        engine
            .load_draft(draft, BackendKind::Candle, &mut |_, _| {})
            .unwrap();
        let grammars = Grammars::new(engine.tokenizer(), 259).unwrap();
        let mut run = |strategy: Strategy| {
            let grammar = grammars.json_schema(&schema()).unwrap();
            let options = GenerateOptions {
                max_tokens: 200,
                strategy,
                ..GenerateOptions::default()
            };
            let control = Control {
                constraint: Some(&grammar),
                ..Control::default()
            };
            let g = engine
                .generate_controlled(&prompt, &options, control, &mut |_| {})
                .unwrap();
            assert!(grammar.is_accepting(), "the JSON is complete");
            g
        };
        let plain = run(Strategy::default());
        let text = String::from_utf8(plain.tokens.iter().map(|&t| t as u8).collect()).unwrap();
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(fits(&value), "{text}");
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

/// Without the constraint the same model does not write JSON: the mask is
/// what makes it.
#[test]
fn the_unconstrained_model_writes_no_json() {
    let target = file(5, 2, "grammar-free");
    let mut engine = Engine::load(&target, BackendKind::Candle, &mut |_, _| {}).unwrap();
    let prompt: Vec<u32> = b"person: ".iter().map(|&b| b as u32).collect();
    let options = GenerateOptions {
        max_tokens: 60,
        ..GenerateOptions::default()
    };
    let g = engine.generate(&prompt, &options, &mut |_| {}).unwrap();
    let text = String::from_utf8_lossy(&g.tokens.iter().map(|&t| t as u8).collect::<Vec<_>>())
        .into_owned();
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text}");
}

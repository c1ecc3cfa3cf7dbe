//! Latency objectives over a tiny random elastic model: the tables are
//! measured, cached and read back; a full objective runs the full model on
//! the whole prompt (the same tokens as plain generation); a chosen pair
//! keeps the tokens it says and never the template's; an objective no pair
//! meets is refused when asked; a model without levels is refused.

use std::path::{Path, PathBuf};

use arbor_engine::slo::{Calibration, OnMiss, Pair, Slo, SloTables};
use arbor_engine::{Engine, ProfileStore, Run, RunConfig};
use arbor_gguf::GgmlType;
use arbor_model::testing::{TinyModel, add_byte_tokenizer};

struct Files {
    dir: PathBuf,
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tiny() -> TinyModel {
    TinyModel {
        arch: "qwen2",
        vocab: 259,
        hidden: 128,
        heads: 8,
        kv_heads: 2,
        ffn: 256,
        layers: 4,
        weight_type: GgmlType::Q8_0,
        seed: 11,
        ..TinyModel::default()
    }
}

/// A plain and an elastic file of the tiny model, and a profile store, in
/// a fresh directory.
fn files(tag: &str) -> (Files, PathBuf, PathBuf, ProfileStore) {
    let dir = std::env::temp_dir().join(format!("arbor-slo-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let m = tiny();
    let mut w = m.writer();
    add_byte_tokenizer(&mut w, None);
    let plain = dir.join("tiny.gguf");
    w.write(&plain).unwrap();
    let elastic = dir.join("tiny.elastic.gguf");
    arbor_elastic::testing::build_tiny(&m, &plain, &elastic).unwrap();
    let store = ProfileStore::new(dir.join("profiles"));
    (Files { dir }, plain, elastic, store)
}

fn open(path: &Path, store: &ProfileStore) -> Run {
    let config = RunConfig {
        target: Some(path.display().to_string()),
        backend: Some("candle".into()),
        max_tokens: Some(12),
        ..RunConfig::default()
    };
    Engine::open_with_store(&config, store.clone(), &mut |_| {}).unwrap()
}

const TEXT: &str = "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun. ";

fn calibration_prompts() -> Vec<String> {
    vec![
        "Tell me about the weather in the mountains during the winter months.".into(),
        "Write a short note to a friend about the book you read last week.".into(),
    ]
}

fn try_tables(run: &mut Run, refresh: bool) -> arbor_engine::Result<SloTables> {
    let text = TEXT.repeat(8);
    let prompts = calibration_prompts();
    let c = Calibration {
        prompts: &prompts,
        text: &text,
        answer_tokens: 8,
        reference: None,
    };
    run.slo_tables(&c, refresh, &mut |_| {})
}

fn tables(run: &mut Run, refresh: bool) -> SloTables {
    try_tables(run, refresh).unwrap()
}

#[test]
fn a_profile_with_the_original_model_holds_objectives_against_it() {
    let (_files, plain, elastic, store) = files("reference");
    let mut run = open(&elastic, &store);
    let own = tables(&mut run, false);
    assert!(own.profile.reference.is_none());
    let (text, prompts) = (TEXT.repeat(8), calibration_prompts());
    let c = Calibration {
        prompts: &prompts,
        text: &text,
        answer_tokens: 8,
        reference: Some(&plain),
    };
    // The cached profile has no reference: measured again, with one.
    let t = run.slo_tables(&c, false, &mut |_| {}).unwrap();
    let r = t
        .profile
        .reference
        .as_ref()
        .expect("the original was measured");
    assert_eq!(r.prefill.len(), 5);
    assert!(r.tpot > 0.0);
    // Measured as the levels are, and what objectives are fractions of.
    let lengths = |p: &[(usize, f64)]| -> Vec<usize> { p.iter().map(|x| x.0).collect() };
    let full_level = t.profile.levels.last().unwrap();
    assert_eq!(lengths(&r.prefill), lengths(&full_level.prefill));
    assert_eq!(r.level, 1.0);
    assert_eq!(t.profile.full(100).tpot, r.tpot);
    // Now cached with its reference: read back, not measured again.
    let again = run.slo_tables(&c, false, &mut |_| {}).unwrap().profile;
    assert_eq!(again.measured, t.profile.measured);
    assert!(again.reference.is_some());
}

#[test]
fn tables_are_measured_once_and_read_back() {
    let (_files, _, elastic, store) = files("tables");
    let mut run = open(&elastic, &store);
    let t = tables(&mut run, false);
    let levels: Vec<f64> = t.profile.levels.iter().map(|l| l.level).collect();
    assert_eq!(levels, [0.25, 0.5, 0.75, 1.0]);
    assert_eq!(t.quality.model_levels, levels);
    assert_eq!(t.quality.prompt_levels, arbor_engine::slo::PROMPT_LEVELS);
    // The full model with the whole prompt is its own answer, teacher-forced.
    assert_eq!(t.quality.get(1.0, 1.0), 1.0);
    assert!(
        t.profile
            .levels
            .iter()
            .all(|l| l.prefill.len() == 5 && l.tpot > 0.0)
    );
    // Cached: the same measurement comes back.
    // (JSON floats may come back a last bit apart.)
    let again = tables(&mut run, false);
    assert_eq!(again.profile.measured, t.profile.measured);
    assert_eq!(again.quality.measured, t.quality.measured);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * a.abs().max(b.abs());
    for (a, b) in again.profile.levels.iter().zip(&t.profile.levels) {
        assert!(close(a.tpot, b.tpot));
        for (x, y) in a.prefill.iter().zip(&b.prefill) {
            assert!(x.0 == y.0 && close(x.1, y.1));
        }
    }
    for (a, b) in again
        .quality
        .quality
        .iter()
        .flatten()
        .zip(t.quality.quality.iter().flatten())
    {
        assert!(close(*a, *b));
    }
    // A cache that cannot be read is measured again, not an error.
    let dir = store.dir().to_path_buf();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "json") {
            std::fs::write(&p, "{ not json").unwrap();
        }
    }
    let remeasured = tables(&mut run, false);
    assert_ne!(remeasured.profile.measured, "");
    assert_eq!(remeasured.quality.get(1.0, 1.0), 1.0);
}

#[test]
fn a_full_objective_is_plain_generation_and_pairs_keep_the_template() {
    let (_files, _, elastic, store) = files("serve");
    let mut run = open(&elastic, &store);
    let t = tables(&mut run, false);
    let text = "Explain how the tide rises and falls along the coast each day.";
    let prompt = run.slo_prompt(text, true).unwrap();
    let plain_tokens = run.prompt_tokens(text, true).unwrap();
    assert_eq!(prompt.tokens, plain_tokens);
    let options = run.options().clone();
    let plain = run.generate(&plain_tokens, &mut |_| {}).unwrap();
    let (g, r) = run
        .generate_slo(
            &prompt,
            (&Slo::FULL, OnMiss::Refuse),
            &t,
            &options,
            None,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(r.choice.pair, Pair::FULL);
    assert_eq!(r.choice.kept, prompt.tokens.len());
    assert_eq!(g.tokens, plain.tokens, "a full objective changes nothing");
    assert!(
        r.line()
            .starts_with("slo ttft=1 tpot=1 -> model 1, prompt 1: ")
    );

    // Any objective: the prompt run is what the choice kept, template included.
    let slo = Slo::new(0.5, 0.9).unwrap();
    let (g, r) = run
        .generate_slo(
            &prompt,
            (&slo, OnMiss::Fastest),
            &t,
            &options,
            None,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(g.stats.prompt_tokens, r.choice.kept);
    assert!(r.choice.kept >= prompt.protected_count());
    let kept = prompt.compress(&t.scorer, r.choice.pair.prompt).unwrap();
    assert_eq!(kept.len(), r.choice.kept);
    let template = prompt
        .tokens
        .iter()
        .zip(&prompt.protected)
        .filter(|(_, p)| **p);
    let mut rest = kept.iter();
    for (tok, _) in template {
        assert!(rest.any(|k| k == tok), "template token {tok} was dropped");
    }
    if r.choice.met {
        assert!(r.choice.predicted.ttft <= r.choice.budget.ttft);
        assert!(r.choice.predicted.tpot <= r.choice.budget.tpot);
    }
    let line = r.line();
    assert!(
        line.ends_with(')') && (line.contains(": met") || line.contains(": missed")),
        "{line}"
    );
}

#[test]
fn unmeetable_objectives_are_refused_when_asked_and_plain_models_always() {
    let (_files, plain, elastic, store) = files("refuse");
    let mut run = open(&elastic, &store);
    let t = tables(&mut run, false);
    let prompt = run
        .slo_prompt("Hello there, how are you today?", true)
        .unwrap();
    let options = run.options().clone();
    let impossible = Slo::new(0.001, 0.001).unwrap();
    let e = run
        .generate_slo(
            &prompt,
            (&impossible, OnMiss::Refuse),
            &t,
            &options,
            None,
            &mut |_| {},
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no (model level, prompt level) pair meets"),
        "{e}"
    );
    let (_, r) = run
        .generate_slo(
            &prompt,
            (&impossible, OnMiss::Fastest),
            &t,
            &options,
            None,
            &mut |_| {},
        )
        .unwrap();
    assert!(!r.choice.met && !r.met());
    assert!(
        r.line()
            .contains("missed (no pair was predicted to meet it"),
        "{}",
        r.line()
    );

    let mut run = open(&plain, &store);
    let e = try_tables(&mut run, false).unwrap_err().to_string();
    assert!(e.contains("not an elastic model"), "{e}");
}

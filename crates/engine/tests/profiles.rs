//! Latency profiles that heal: a run whose plain target passes disagree
//! with the cached curve for a sustained stretch measures it again.
//!
//! Uses SmolLM2-135M when it is in the cache (CI fetches it first; see
//! `real_models.rs` for `ARBOR_REQUIRE_MODELS`).

use arbor_engine::{
    BackendKind, Engine, LatencyRecord, PROFILE_SIZES, ProfileStore, RunConfig, Tuning, now_utc,
};
use arbor_fetch::testing::cached_model as model;

#[test]
fn a_stale_latency_profile_is_measured_again() {
    let Some(path) = model("smollm2-135m") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("arbor-heal-{}", std::process::id()));
    let store = ProfileStore::new(dir.clone());
    let kernels = BackendKind::Candle.kernels();
    let threads = rayon::current_num_threads();
    // A curve as if measured while something else held the cores, a day
    // per pass (no pass that finishes is that slow, however loaded the
    // machine): target and draft (the same file) alike, so the tree
    // strategy judges drafting not worth it and makes plain one-token
    // passes, which the run compares with the curve.
    const DAY: f64 = 86_400.0;
    let slow = LatencyRecord {
        model: "smollm2-135m".into(),
        kernels: kernels.into(),
        threads,
        repetitions: 3,
        measured: now_utc(),
        points: vec![(1, DAY), (2, 1.1 * DAY), (4, 1.3 * DAY), (64, 8.0 * DAY)],
        method: None,
    };
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        store.latency_path(&path, kernels, threads),
        serde_json::to_string(&slow).unwrap(),
    )
    .unwrap();
    let name = path.to_str().unwrap().to_string();
    let config = RunConfig {
        target: Some(name.clone()),
        draft: Some(name),
        backend: Some("candle".into()),
        strategy: Some("tree".into()),
        max_tokens: Some(24),
        tuning: Tuning::default(),
        ..RunConfig::default()
    };
    let mut run = Engine::open_with_store(&config, store.clone(), &mut |_| {}).unwrap();
    assert_eq!(
        run.profiles().unwrap().target.at(1),
        DAY,
        "the cached curve"
    );
    let prompt = run
        .prompt_tokens("The three primary colours are", false)
        .unwrap();
    let g = run.generate(&prompt, &mut |_| {}).unwrap();
    assert!(g.stats.target_steps >= 16, "{:?}", g.stats);
    let notes = run.take_notes();
    assert!(notes.iter().any(|n| n.contains("re-measured")), "{notes:?}");
    // Measured again at every size, cached, and in use.
    let fresh = store.cached_latency(&path, kernels, threads).unwrap();
    let sizes: Vec<usize> = fresh.points.iter().map(|p| p.0).collect();
    assert_eq!(sizes, PROFILE_SIZES, "{:?}", fresh.points);
    assert_eq!(run.profiles().unwrap().target.points, fresh.points);
    std::fs::remove_dir_all(dir).ok();
}

/// `auto` plans with the rate a source measured under the same budget:
/// runs record each generation's decoding rate by source and strategy,
/// and a measured rate outranks the model's estimate (said in --explain).
#[test]
fn auto_plans_with_the_rates_runs_measured() {
    let Some(path) = model("smollm2-135m") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("arbor-rates-{}", std::process::id()));
    let store = ProfileStore::new(dir.clone());
    let kernels = BackendKind::Candle.kernels();
    let threads = rayon::current_num_threads();
    let name = path.to_str().unwrap().to_string();
    let config = |strategy: &str| RunConfig {
        target: Some(name.clone()),
        backend: Some("candle".into()),
        strategy: Some(strategy.into()),
        max_tokens: Some(24),
        ..RunConfig::default()
    };
    // A plain run records its rate under no budget, one sequence.
    let mut run =
        Engine::open_with_store(&config("autoregressive"), store.clone(), &mut |_| {}).unwrap();
    let prompt = run
        .prompt_tokens("The three primary colours are", false)
        .unwrap();
    let g = run.generate(&prompt, &mut |_| {}).unwrap();
    let rates = store.rates(&path, kernels, threads, "none-s1");
    let plain = (rates.rates.iter())
        .find(|r| r.source == "none" && r.strategy == "autoregressive")
        .expect("the plain run's rate");
    assert_eq!(plain.tokens, (g.stats.generated_tokens - 1) as f64);
    assert!((plain.secs - g.stats.decode_secs).abs() < 1e-9);
    // Runs of prompt lookup measured it far faster than plain decoding
    // (faster than any model of it): auto drafts with it and says why.
    for _ in 0..3 {
        store
            .observe_rate(
                &path, kernels, threads, "none-s1", "lookup", "tree", 128, 0.01,
            )
            .unwrap();
    }
    let mut notes = Vec::new();
    let run = Engine::open_with_store(&config("auto"), store.clone(), &mut |e| match e {
        arbor_engine::OpenEvent::Note(n) | arbor_engine::OpenEvent::Explain(n) => {
            notes.push(n.to_string())
        }
        _ => {}
    })
    .unwrap();
    assert_eq!(run.strategy().name(), "tree", "{notes:?}");
    assert!(
        notes.iter().any(|n| n.contains("drafting with lookup")),
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.contains("lookup") && n.contains("measured 12800.00 tok/s")),
        "{notes:?}"
    );
    std::fs::remove_dir_all(dir).ok();
}

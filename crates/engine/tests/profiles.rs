//! Latency profiles that heal: a run whose plain target passes disagree
//! with the cached curve for a sustained stretch measures it again.
//!
//! Uses SmolLM2-135M when it is in the cache (CI fetches it first; see
//! `real_models.rs` for `ARBOR_REQUIRE_MODELS`).

use arbor_engine::{
    BackendKind, Engine, LatencyRecord, ProfileStore, RunConfig, Tuning, profiles::now_utc,
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
    // A curve as if measured while something else held the cores, far
    // slower than any real pass: target and draft (the same file) alike,
    // so the tree strategy judges drafting not worth it and makes plain
    // one-token passes, which the run compares with the curve.
    let slow = LatencyRecord {
        model: "smollm2-135m".into(),
        kernels: kernels.into(),
        threads,
        repetitions: 3,
        measured: now_utc(),
        points: vec![(1, 10.0), (2, 11.0), (4, 13.0), (64, 80.0)],
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
        10.0,
        "the cached curve"
    );
    let prompt = run
        .prompt_tokens("The three primary colours are", false)
        .unwrap();
    let g = run.generate(&prompt, &mut |_| {}).unwrap();
    assert!(g.stats.target_steps >= 16, "{:?}", g.stats);
    let notes = run.take_notes();
    assert!(notes.iter().any(|n| n.contains("re-measured")), "{notes:?}");
    let fresh = store.cached_latency(&path, kernels, threads).unwrap();
    assert!(fresh.points[0].1 < 1.0, "{:?}", fresh.points);
    assert!(run.profiles().unwrap().target.at(1) < 1.0);
    std::fs::remove_dir_all(dir).ok();
}

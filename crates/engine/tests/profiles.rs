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

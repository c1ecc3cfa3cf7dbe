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

/// A real file's weights take about the file's bytes on the GPU by the
/// backend's own count (blocks as they are; f32 would be 4 bytes a value).
#[test]
fn smollm2_weights_on_wgpu_take_their_file_bytes() {
    let Some(path) = arbor_fetch::testing::cached_model("smollm2-135m") else {
        return;
    };
    let file = arbor_gguf::GgufFile::open(&path).unwrap();
    let tensors = &file.header().tensors;
    let file_bytes: u64 = tensors.iter().map(|t| t.size).sum();
    let values: u64 = tensors.iter().map(|t| t.dims.iter().product::<u64>()).sum();
    let engine = Engine::load(&path, BackendKind::Wgpu, &mut |_, _| {}).unwrap();
    let held = engine.model().weight_bytes().unwrap();
    // Padding adds at most 2 bytes per 32-value block and rounds rows up
    // to tiles of 32; the decoder's count leaves out a norm vector or so.
    assert!(
        held >= file_bytes * 99 / 100 && held <= file_bytes * 11 / 10,
        "{held} bytes held for {file_bytes} in the file"
    );
    assert!(
        held * 3 < values * 4,
        "{held} bytes held for {values} values"
    );
    // The device's pools hold at least the weights (other tests of this
    // binary share the device, so only the floor is certain here; the
    // pools' overhead is `backends/burn/tests/pool.rs`'s).
    let reserved = engine.model().device_reserved_bytes().unwrap();
    assert!(reserved >= held, "{reserved} reserved for {held}");
}

/// Under a GPU budget the layers that do not fit are read from host memory
/// (the page cache) and copied to the GPU on every pass; the output is
/// the unbudgeted wgpu output.
#[test]
fn a_gpu_budget_streams_layers_without_changing_the_output() {
    use arbor_engine::MemoryOptions;
    let Some(path) = arbor_fetch::testing::cached_model("smollm2-135m") else {
        return;
    };
    let greedy = |engine: &mut Engine| {
        let ids = engine
            .prompt_tokens("The three primary colours are", false)
            .unwrap();
        let options = GenerateOptions {
            max_tokens: 6,
            stop_tokens: Some(vec![]),
            ..GenerateOptions::default()
        };
        engine.generate(&ids, &options, &mut |_| {}).unwrap().tokens
    };
    let mut full = Engine::load(&path, BackendKind::Wgpu, &mut |_, _| {}).unwrap();
    let expected = greedy(&mut full);
    drop(full);
    let gpu = |budget: u64, pipelined: bool| MemoryOptions {
        base: Some(0),
        host_cache: true,
        ..MemoryOptions::new(budget, pipelined)
    };
    let probe = Engine::load_budgeted(
        &path,
        None,
        BackendKind::Wgpu,
        &gpu(8 << 30, true),
        &mut |_, _| {},
    )
    .unwrap();
    let plan = probe.memory().unwrap().plan.clone();
    assert_eq!(plan.streamed(), 0, "8 GiB holds smollm2 whole");
    drop(probe);
    let budget = plan.fixed + plan.resident_bytes / 3;
    let mut engine = Engine::load_budgeted(
        &path,
        None,
        BackendKind::Wgpu,
        &gpu(budget, true),
        &mut |_, _| {},
    )
    .unwrap();
    let report = engine.memory().unwrap().clone();
    assert!(report.plan.streamed() > 0, "{}", report.summary());
    assert!(report.plan.fixed + report.plan.stream_reserve + report.plan.resident_bytes <= budget);
    assert_eq!(greedy(&mut engine), expected);
    let stats = report.monitor.unwrap().stats();
    assert!(stats.layers >= 6 * report.plan.streamed() as u64);
}

/// Parallel prompt decoding on wgpu equals wgpu target-only decoding:
/// prompt tokens that are the target's embeddings of tokens it writes
/// (guessed often: passes of many rows with accepted guesses) and random
/// ones (guessed wrong).
#[test]
fn ppd_on_wgpu_equals_wgpu_target_only() {
    use arbor_load::arbor_backend_burn::BurnBackend;
    use arbor_model::{Decoder, LanguageModel};
    use arbor_sampling::SamplingParams;
    use arbor_speculative::{DecodeOptions, PpdConfig, PromptTokens, Verification, decode};
    let path = file(&tiny(11, 2, GgmlType::Q4_0), "wgpu-ppd");
    let gguf = arbor_gguf::GgufFile::open(&path).unwrap();
    let mut target = Decoder::load(BurnBackend::wgpu(), &gguf, &mut |_, _| {}).unwrap();
    let prompt: Vec<u32> = b"fn main() {".iter().map(|&b| b as u32).collect();
    let opts = |decoding: Decoding| DecodeOptions {
        max_tokens: 32,
        sampling: SamplingParams::default(),
        stop_tokens: vec![],
        strategy: Strategy::new(decoding),
        verification: Verification::Exact,
    };
    let plain = decode(
        &mut target,
        None,
        &prompt,
        &opts(Decoding::Autoregressive),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(plain.tokens.len(), 32);
    let hidden = target.config().hidden;
    let accuracy =
        arbor_ppd::Accuracy::new(vec![vec![0.6, 0.7], vec![0.4, 0.5], vec![0.3, 0.35]]).unwrap();
    let written = target.embeddings(&plain.tokens[4..7]).unwrap();
    let random: Vec<f32> = (0..3 * hidden)
        .map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * 0.2)
        .collect();
    let mut accepted = 0;
    for vectors in [written, random] {
        let prompts = PromptTokens {
            hidden,
            epts: 1,
            vectors,
            accuracy: accuracy.clone(),
        };
        let ppd = Decoding::Ppd(PpdConfig {
            prompts: Some(std::sync::Arc::new(prompts)),
            max_rows: 12,
            profile: None,
        });
        let g = decode(&mut target, None, &prompt, &opts(ppd), &mut |_| {}).unwrap();
        assert_eq!(g.tokens, plain.tokens);
        assert!(g.stats.verifications > 0);
        accepted += g.stats.accepted_draft_tokens;
    }
    assert!(accepted > 0, "no guess was ever accepted");
}

/// A level of an elastic target drafts for the whole target on wgpu (the
/// level's weights are prefixes of the target's blocks: `matmul_part`
/// over column ranges) and the output is the target's own.
#[test]
fn elastic_levels_on_wgpu_draft_losslessly() {
    let m = arbor_model::testing::TinyModel {
        vocab: 259,
        heads: 8,
        ..tiny(13, 3, GgmlType::Q8_0)
    };
    let source = file(&m, "wgpu-elastic-source");
    let out = arbor_model::testing::write_temp(&m.writer(), "wgpu-elastic");
    arbor_elastic::testing::build_tiny(&m, &source, &out).unwrap();
    let prompt: Vec<u32> = b"def f(x):".iter().map(|&b| b as u32).collect();
    let mut engine = Engine::load(&out, BackendKind::Wgpu, &mut |_, _| {}).unwrap();
    let run = |engine: &mut Engine, strategy: Strategy| {
        let options = GenerateOptions {
            max_tokens: 32,
            stop_tokens: Some(vec![]),
            strategy,
            ..GenerateOptions::default()
        };
        engine.generate(&prompt, &options, &mut |_| {}).unwrap()
    };
    let plain = run(&mut engine, Strategy::default());
    for level in [0.25, 0.75] {
        engine.attach_elastic(level).unwrap();
        for strategy in [
            Strategy::new(Decoding::Chain { gamma: 3 }),
            Strategy::new(Decoding::Tree(TreeConfig::default())),
        ] {
            let g = run(&mut engine, strategy.clone());
            assert_eq!(g.tokens, plain.tokens, "level {level} {strategy:?}");
            assert!(g.stats.verifications > 0);
        }
    }
}

/// A GPU budget with a host budget beside it, opened as a run: host memory
/// holds the streamed layers it has room for (all of them here), a pass is
/// priced by the upload rate (probed once, then learned from the
/// generation), and the output is the unbudgeted wgpu output.
#[test]
fn gpu_and_host_budgets_together_plan_with_uploads_losslessly() {
    use arbor_engine::{LatencyRecord, OpenEvent, ProfileStore, RunConfig, now_utc};
    let Some(path) = arbor_fetch::testing::cached_model("smollm2-135m") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("arbor-gpu-host-{}", std::process::id()));
    let store = ProfileStore::new(dir.clone());
    // A latency curve for the tree's sizing, so that none is measured on
    // lavapipe here.
    let kernels = BackendKind::Wgpu.kernels();
    let threads = rayon::current_num_threads();
    let curve = LatencyRecord {
        model: "smollm2-135m".into(),
        kernels: kernels.into(),
        threads,
        repetitions: 1,
        measured: now_utc(),
        points: vec![(1, 0.02), (2, 0.021), (4, 0.023), (64, 0.08)],
        method: None,
    };
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        store.latency_path(&path, kernels, threads),
        serde_json::to_string(&curve).unwrap(),
    )
    .unwrap();
    let plain = RunConfig {
        target: Some(path.to_str().unwrap().into()),
        backend: Some("wgpu".into()),
        strategy: Some("autoregressive".into()),
        max_tokens: Some(8),
        ..RunConfig::default()
    };
    let tokens = |config: &RunConfig, notes: &mut Vec<String>| {
        let mut run = Engine::open_with_store(config, store.clone(), &mut |e| {
            if let OpenEvent::Note(n) = e {
                notes.push(n.to_string());
            }
        })
        .unwrap();
        let prompt = run
            .prompt_tokens("The three primary colours are", false)
            .unwrap();
        let g = run.generate(&prompt, &mut |_| {}).unwrap();
        (g.tokens, run)
    };
    let (expected, run) = tokens(&plain, &mut Vec::new());
    drop(run);
    // A third of the layers' bytes on the GPU.
    let probe = Engine::load_budgeted(
        &path,
        None,
        BackendKind::Wgpu,
        &arbor_engine::MemoryOptions {
            base: Some(0),
            host_cache: true,
            ..arbor_engine::MemoryOptions::new(8 << 30, true)
        },
        &mut |_, _| {},
    )
    .unwrap();
    let plan = probe.memory().unwrap().plan.clone();
    drop(probe);
    let both = RunConfig {
        draft: Some("lookup".into()),
        strategy: Some("tree".into()),
        gpu_memory_budget: Some((plan.fixed + plan.resident_bytes / 3).to_string()),
        memory_budget: Some("64GiB".into()),
        ..plain.clone()
    };
    let mut notes = Vec::new();
    let (got, run) = tokens(&both, &mut notes);
    assert_eq!(got, expected);
    let report = run.engine().memory().unwrap().clone();
    let streamed = report.plan.streamed();
    assert!(streamed > 0, "{}", report.summary());
    assert_eq!(report.host_held.0, streamed, "{}", report.summary());
    assert!(
        notes.iter().any(|n| n.contains("measured uploading")),
        "{notes:?}"
    );
    let record = store.cached_upload(kernels).expect("the probe is stored");
    assert!(
        record.generations >= 1,
        "the generation's uploads: {record:?}"
    );
    let io = run.profiles().unwrap().io_per_pass;
    let upload = report.plan.read_per_pass as f64 / record.probed;
    assert!(
        (io - upload).abs() <= 1e-9 * upload.max(1.0),
        "{io} against {upload}"
    );
    drop(run);
    // `auto` under the same budgets: it prices passes by the learned
    // upload rate, keeps its choice under a GPU budget's own key, and is
    // lossless too.
    let auto = RunConfig {
        draft: None,
        strategy: Some("auto".into()),
        ..both.clone()
    };
    let mut notes = Vec::new();
    let (got, _) = tokens(&auto, &mut notes);
    assert_eq!(got, expected);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("a pass uploads the layers it streams")),
        "{notes:?}"
    );
    let key = auto.budget_key(&path).unwrap();
    assert!(
        key.starts_with("gpu") && key.ends_with("-host65536MiB"),
        "{key}"
    );
    assert!(
        store.previous_choice(&path, &key).is_some(),
        "the choice is kept under {key}"
    );
    std::fs::remove_dir_all(dir).ok();
}

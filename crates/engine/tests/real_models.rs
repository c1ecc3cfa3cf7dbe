//! Greedy outputs of the real GGUF models against llama.cpp's on the same
//! files, and the backends against each other.
//!
//! A test whose model is not in the cache prints a note and passes, unless
//! the model's name is listed in `ARBOR_REQUIRE_MODELS` (comma-separated;
//! CI lists `smollm2-135m`, which it fetches first), in which case it fails.

use arbor_engine::{BackendKind, Engine, GenerateOptions, TextEvent};

use arbor_fetch::testing::cached_model as model;

fn greedy(engine: &mut Engine, prompt: &str, n: usize) -> (Vec<u32>, String) {
    let ids = engine.prompt_tokens(prompt, false).unwrap();
    let options = GenerateOptions {
        max_tokens: n,
        stop_tokens: Some(vec![]),
        ..GenerateOptions::default()
    };
    let mut streamed = String::new();
    let g = engine
        .generate(&ids, &options, &mut |s| streamed.push_str(s))
        .unwrap();
    assert_eq!(g.tokens.len(), n);
    assert_eq!(streamed, g.text, "streamed text equals the final text");
    (g.tokens, g.text)
}

/// Greedy output of every fetched model equals llama.cpp's (SmolLM2
/// wherever CI runs; the Qwen 0.5B where fetched).
#[test]
fn greedy_output_matches_llama_cpp() {
    smollm2_matches_llama_cpp();
    qwen_0_5b_matches_llama_cpp();
}

/// llama.cpp, same file, raw prompt, greedy. Its text ends in a second
/// "\n" that is the 21st token here (a margin of 3.6 logits over the
/// next candidate): the reference counted one more token than it says.
fn smollm2_matches_llama_cpp() {
    let Some(path) = model("smollm2-135m") else {
        return;
    };
    let expected =
        " Paris.\n\nThe United States has a population of approximately 311 million people.\n\n";
    let mut engine = Engine::load(&path, BackendKind::Candle, &mut |_, _| {}).unwrap();
    let (tokens, text) = greedy(&mut engine, "The capital of France is", 21);
    assert_eq!(text, expected);
    let first20 = engine.tokenizer().decode(&tokens[..20]).unwrap();
    assert_eq!(first20, expected.strip_suffix('\n').unwrap());
}

/// Teacher-forced: every backend reads the same text; their logits at each
/// position must be close, and wherever the top two candidates are more than
/// half a logit apart they must pick the same token. (Free-running greedy
/// outputs may part ways at near-ties: candle quantizes activations to 8
/// bits and rounds attention to f16, the burn backends multiply dequantized
/// weights in f32.)
#[test]
fn smollm2_backends_agree() {
    let Some(path) = model("smollm2-135m") else {
        return;
    };
    let text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\nThe capital of France is Paris.";
    let mut runs = Vec::new();
    for kind in BackendKind::compiled() {
        let mut engine = Engine::load(&path, kind, &mut |_, _| {}).unwrap();
        let ids = engine.prompt_tokens(text, false).unwrap();
        let rows: Vec<usize> = (0..ids.len()).collect();
        let positions: Vec<u32> = (0..ids.len() as u32).collect();
        let mask = arbor_engine::Mask::causal(0, ids.len());
        let logits = engine
            .model_mut()
            .forward(&ids, &positions, &mask, &rows)
            .unwrap();
        runs.push((kind, logits));
    }
    let (k0, l0) = &runs[0];
    for (k, l) in &runs[1..] {
        let mut decided = 0;
        for r in 0..l0.rows {
            let (a, b) = (l0.row(r), l.row(r));
            let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            // Measured: at most 5.7% of the largest logit on this text.
            assert!(
                d < 0.08 * scale,
                "{k0} vs {k} row {r}: logits differ by {d} (max |logit| {scale})"
            );
            let mut order: Vec<usize> = (0..a.len()).collect();
            order.sort_by(|&i, &j| a[j].total_cmp(&a[i]));
            if a[order[0]] - a[order[1]] > 0.5 {
                decided += 1;
                assert_eq!(
                    arbor_engine::argmax(b),
                    Some(order[0] as u32),
                    "{k0} vs {k} row {r}"
                );
            }
        }
        assert!(
            decided * 2 > l0.rows,
            "most positions have a clear winner ({decided} of {})",
            l0.rows
        );
    }
}

fn qwen_0_5b_matches_llama_cpp() {
    let Some(path) = model("qwen2.5-coder-0.5b") else {
        return;
    };
    let mut engine = Engine::load(&path, BackendKind::Candle, &mut |_, _| {}).unwrap();
    let cases = [
        (
            "The capital of France is",
            " Paris. Paris is located in the northwestern part of France. The capital of France is located in",
        ),
        (
            "def quicksort(arr):",
            "\n    if len(arr) <= 1:\n        return arr\n    else:\n        pivot =",
        ),
    ];
    for (prompt, expected) in cases {
        assert_eq!(
            greedy(&mut engine, prompt, 20).1,
            expected,
            "prompt {prompt:?}"
        );
    }
}

#[test]
fn generation_stops_at_a_stop_token_and_rejects_bad_options() {
    let Some(path) = model("smollm2-135m") else {
        return;
    };
    let mut engine = Engine::load(&path, BackendKind::Candle, &mut |_, _| {}).unwrap();
    let (tokens, _) = greedy(&mut engine, "The capital of France is", 6);
    let ids = engine
        .prompt_tokens("The capital of France is", false)
        .unwrap();
    let options = GenerateOptions {
        max_tokens: 50,
        stop_tokens: Some(vec![tokens[4]]),
        ..GenerateOptions::default()
    };
    let g = engine.generate(&ids, &options, &mut |_| {}).unwrap();
    assert_eq!(g.tokens, tokens[..4]);
    assert_eq!(g.stats.stop, arbor_engine::StopReason::StopToken);

    let bad = GenerateOptions {
        sampling: arbor_engine::SamplingParams {
            temperature: -1.0,
            ..Default::default()
        },
        ..GenerateOptions::default()
    };
    assert!(engine.generate(&ids, &bad, &mut |_| {}).is_err());
    assert!(engine.prompt_tokens("", false).is_err());

    // Seeded sampling is reproducible.
    let sampled = |engine: &mut Engine, seed| {
        let options = GenerateOptions {
            max_tokens: 8,
            stop_tokens: Some(vec![]),
            sampling: arbor_engine::SamplingParams {
                temperature: 0.9,
                top_p: 0.95,
                seed,
                ..Default::default()
            },
            ..GenerateOptions::default()
        };
        engine.generate(&ids, &options, &mut |_| {}).unwrap().tokens
    };
    assert_eq!(sampled(&mut engine, 3), sampled(&mut engine, 3));
}

/// Greedy speculative decoding on real files equals target-only decoding:
/// SmolLM2 drafting for itself (CI), and the Qwen pair when cached.
#[test]
fn speculative_strategies_reproduce_target_only_output() {
    let pairs = [
        ("smollm2-135m", "smollm2-135m"),
        ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"),
    ];
    for (t, d) in pairs {
        let (Some(tp), Some(dp)) = (model(t), model(d)) else {
            continue;
        };
        let prompts = ["def quicksort(xs):", "Write a haiku about the sea."];
        assert_lossless(BackendKind::Candle, &tp, &dp, &prompts, 40);
    }
}

/// The same on the GPU backend (lavapipe in CI): SmolLM2 drafting for
/// itself on wgpu equals wgpu target-only decoding, which needs kernels
/// that give a row the same bits in a pass of one row or of a tree's.
#[cfg(feature = "wgpu")]
#[test]
fn speculative_strategies_on_wgpu_reproduce_wgpu_target_only_output() {
    let Some(path) = model("smollm2-135m") else {
        return;
    };
    assert_lossless(BackendKind::Wgpu, &path, &path, &["def quicksort(xs):"], 24);
}

/// Chain, tree and static-tree speculation with `draft` equal
/// target-only decoding of `target` on `kind`, for each chat prompt.
fn assert_lossless(
    kind: BackendKind,
    target: &std::path::Path,
    draft: &std::path::Path,
    prompts: &[&str],
    max_tokens: usize,
) {
    use arbor_engine::{Decoding, Strategy, TreeConfig};
    let mut engine = Engine::load(target, kind, &mut |_, _| {}).unwrap();
    engine.load_draft(draft, kind, &mut |_, _| {}).unwrap();
    for prompt in prompts {
        let ids = engine.prompt_tokens(prompt, true).unwrap();
        let run = |engine: &mut Engine, strategy: Strategy| {
            let options = GenerateOptions {
                max_tokens,
                strategy,
                ..GenerateOptions::default()
            };
            engine.generate(&ids, &options, &mut |_| {}).unwrap()
        };
        let plain = run(&mut engine, Strategy::default());
        for strategy in [
            Strategy::new(Decoding::Chain { gamma: 4 }),
            Strategy::new(Decoding::Tree(TreeConfig::default())),
            Strategy::new(Decoding::StaticTree { width: 2, depth: 3 }),
        ] {
            let g = run(&mut engine, strategy.clone());
            let what = format!("{kind} {} {strategy:?} on {prompt:?}", target.display());
            assert_eq!(g.tokens, plain.tokens, "{what}");
            assert!(g.stats.verifications > 0);
        }
    }
}

/// A draft with another vocabulary is refused when loading: a byte-level
/// tiny model under SmolLM2 (CI), and SmolLM2 under Qwen when fetched.
#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    use arbor_model::testing::{TinyModel, add_byte_tokenizer, write_temp};
    let Some(smol) = model("smollm2-135m") else {
        return;
    };
    let mut w = TinyModel {
        vocab: 259,
        ..TinyModel::default()
    }
    .writer();
    add_byte_tokenizer(&mut w, Some(0));
    let bytes = write_temp(&w, "another-vocabulary");
    let mut pairs = vec![(smol.clone(), bytes.to_path_buf())];
    pairs.extend(model("qwen2.5-coder-0.5b").map(|qwen| (qwen, smol)));
    for (target, draft) in pairs {
        let mut engine = Engine::load(&target, BackendKind::Candle, &mut |_, _| {}).unwrap();
        let err = engine
            .load_draft(&draft, BackendKind::Candle, &mut |_, _| {})
            .unwrap_err();
        assert!(
            matches!(err, arbor_engine::EngineError::VocabularyMismatch { .. }),
            "{err}"
        );
    }
}

/// Under a budget that leaves part of the layers on disk the output is the
/// resident model's, token for token, in both loading modes; a budget too
/// small to run is a typed error that names the minimum.
#[test]
fn a_memory_budget_streams_layers_without_changing_the_output() {
    use arbor_engine::{MemoryOptions, StreamMode};
    let Some(path) = model("smollm2-135m") else {
        return;
    };
    let prompt = "The three primary colours are";
    let mut full = Engine::load(&path, BackendKind::Candle, &mut |_, _| {}).unwrap();
    let (expected, _) = greedy(&mut full, prompt, 12);
    drop(full);

    // Other tests load models in this process at the same time: plan
    // against a fixed base instead of the measured resident memory.
    let base = Some(64 << 20);
    let roomy = MemoryOptions {
        base,
        ..MemoryOptions::new(8 << 30, true)
    };
    let probe =
        Engine::load_budgeted(&path, None, BackendKind::Candle, &roomy, &mut |_, _| {}).unwrap();
    let plan = probe.memory().unwrap().plan.clone();
    assert_eq!(plan.streamed(), 0, "8 GiB holds smollm2 whole");
    drop(probe);
    // The planning-only check agrees with what loading did, at both ends.
    assert!(Engine::target_fits(&path, BackendKind::Candle, &roomy).unwrap());
    let whole = plan.fixed + plan.resident_bytes;
    for (budget, fits) in [(whole, true), (whole - 1, false), (plan.fixed / 2, false)] {
        let options = MemoryOptions {
            base,
            ..MemoryOptions::new(budget, false)
        };
        let got = Engine::target_fits(&path, BackendKind::Candle, &options).unwrap();
        assert_eq!(got, fits, "budget {budget}");
    }

    for pipelined in [false, true] {
        let budget = plan.fixed + plan.resident_bytes / 2;
        let options = MemoryOptions {
            base,
            ..MemoryOptions::new(budget, pipelined)
        };
        let mut engine =
            Engine::load_budgeted(&path, None, BackendKind::Candle, &options, &mut |_, _| {})
                .unwrap();
        let report = engine.memory().unwrap().clone();
        assert!(report.plan.streamed() > 0, "{}", report.summary());
        assert!(
            report.plan.fixed + report.plan.stream_reserve + report.plan.resident_bytes <= budget
        );
        let mode = if pipelined {
            StreamMode::Pipelined { depth: 1 }
        } else {
            StreamMode::OnDemand
        };
        assert_eq!(options.mode, mode);
        let (tokens, _) = greedy(&mut engine, prompt, 12);
        assert_eq!(tokens, expected, "pipelined: {pipelined}");
        let stats = report.monitor.unwrap().stats();
        assert!(stats.layers >= 12 * report.plan.streamed() as u64);
        if pipelined {
            // Provisional generation (the model is its own draft here): the
            // text events replay to the final text, and the tokens are the
            // target's.
            engine
                .load_draft(&path, BackendKind::Candle, &mut |_, _| {})
                .unwrap();
            let ids = engine.prompt_tokens(prompt, false).unwrap();
            let options = GenerateOptions {
                max_tokens: 12,
                stop_tokens: Some(vec![]),
                strategy: "tree-provisional".parse().unwrap(),
                ..GenerateOptions::default()
            };
            let (mut confirmed, mut shown) = (String::new(), String::new());
            let g = engine
                .generate_events(&ids, &options, &mut |e| match e {
                    TextEvent::Confirmed(t) => {
                        let n = t.chars().count().min(shown.chars().count());
                        assert!(shown.chars().take(n).eq(t.chars().take(n)));
                        shown = shown.chars().skip(n).collect();
                        confirmed.push_str(t);
                    }
                    TextEvent::Provisional(t) => shown.push_str(t),
                    TextEvent::Rollback { chars } => {
                        let keep = shown.chars().count() - chars;
                        shown = shown.chars().take(keep).collect();
                    }
                })
                .unwrap();
            assert_eq!(g.tokens, expected, "tree-provisional under a budget");
            assert_eq!(confirmed, g.text);
            assert!(shown.is_empty());
            assert!(g.trace.any(arbor_engine::Activity::Verify));
        }
    }

    let tiny = MemoryOptions {
        base,
        ..MemoryOptions::new(1 << 20, false)
    };
    let err = Engine::load_budgeted(&path, None, BackendKind::Candle, &tiny, &mut |_, _| {})
        .err()
        .expect("1 MiB cannot hold a model");
    let text = err.to_string();
    assert!(
        text.contains("too small") && text.contains("at least"),
        "{text}"
    );
}

/// Every draft source that costs no weights runs under a budget: the plan
/// counts the draft's KV cache and logits before placing target layers,
/// the reservations stay within the budget, and greedy output is the
/// unlimited target's with every tree strategy.
#[test]
fn cheap_drafts_fit_the_budget_and_keep_the_output() {
    use arbor_engine::{DraftSource, MemoryOptions};
    let Some(path) = model("smollm2-135m") else {
        return;
    };
    let prompt = "A list of fruits: apple, banana, cherry. Another list of fruits: apple,";
    let mut full = Engine::load(&path, BackendKind::Candle, &mut |_, _| {}).unwrap();
    let (expected, _) = greedy(&mut full, prompt, 16);
    drop(full);
    let base = Some(64 << 20);
    let roomy = MemoryOptions {
        base,
        logit_rows: 33,
        draft_logit_rows: 1,
        context: 256,
        ..MemoryOptions::new(8 << 30, true)
    };
    let probe =
        Engine::load_budgeted(&path, None, BackendKind::Candle, &roomy, &mut |_, _| {}).unwrap();
    let whole = probe.memory().unwrap().plan.clone();
    drop(probe);
    let budget = whole.fixed + whole.resident_bytes * 3 / 5;
    let options = MemoryOptions { budget, ..roomy };
    let plain = Engine::load_budgeted(&path, None, BackendKind::Candle, &options, &mut |_, _| {})
        .unwrap()
        .memory()
        .unwrap()
        .plan
        .clone();
    for source in [DraftSource::Lookup, DraftSource::SelfLayers] {
        let mut engine = Engine::load_budgeted(
            &path,
            Some(&source),
            BackendKind::Candle,
            &options,
            &mut |_, _| {},
        )
        .unwrap();
        let plan = engine.memory().unwrap().plan.clone();
        assert!(
            plan.fixed + plan.stream_reserve + plan.resident_bytes <= budget,
            "{source:?}"
        );
        assert!(plan.streamed() > 0, "{source:?}: the budget streams layers");
        if source == DraftSource::SelfLayers {
            // Its own KV cache and logits are reserved before the target's
            // layers are placed.
            let config = engine.model().config().clone();
            let kv = arbor_engine::BackendSpec::from(BackendKind::Candle)
                .kv_format()
                .unwrap();
            let own = arbor_pipeline::kv_bytes(&config, 256, kv)
                + arbor_pipeline::logit_scratch(&config, 1);
            assert!(
                plan.fixed >= plain.fixed + own,
                "{} < {} + {own}",
                plan.fixed,
                plain.fixed
            );
        } else {
            assert_eq!(plan.fixed, plain.fixed, "prompt lookup reserves nothing");
        }
        for strategy in ["tree", "tree-provisional", "chain"] {
            let ids = engine.prompt_tokens(prompt, false).unwrap();
            let options = GenerateOptions {
                max_tokens: 16,
                stop_tokens: Some(vec![]),
                strategy: strategy.parse().unwrap(),
                ..GenerateOptions::default()
            };
            let g = engine.generate_events(&ids, &options, &mut |_| {}).unwrap();
            assert_eq!(g.tokens, expected, "{strategy} with {source:?}");
        }
    }
    // A self draft where nothing streams would be the target itself.
    let err = Engine::load_budgeted(
        &path,
        Some(&DraftSource::SelfLayers),
        BackendKind::Candle,
        &roomy,
        &mut |_, _| {},
    )
    .err()
    .expect("nothing streams");
    assert!(err.to_string().contains("self draft"), "{err}");
}

//! The `arbor` command's contract: what goes to stdout, what to stderr, and
//! clear errors (non-zero exit, no panic) for bad input.

use std::process::{Command, Output};

fn arbor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(args)
        .output()
        .expect("arbor runs")
}

fn smollm2() -> Option<std::path::PathBuf> {
    arbor_fetch::testing::cached_model("smollm2-135m")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn tokenize_prints_one_json_array() {
    let Some(_) = smollm2() else { return };
    let o = arbor(&[
        "tokenize",
        "--model",
        "smollm2-135m",
        "--text",
        "Hello, world! The quick brown fox.",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        String::from_utf8(o.stdout).unwrap().trim(),
        "[19556,28,905,17,378,2365,6354,16438,30]"
    );
}

#[test]
fn generate_streams_only_the_text_to_stdout() {
    let Some(_) = smollm2() else { return };
    let o = arbor(&[
        "generate",
        "--model",
        "smollm2-135m",
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        " Paris.\n\nThe United States has\n"
    );
    let err = stderr(&o);
    assert!(err.contains("tok/s") && err.contains("peak RSS"), "{err}");
}

#[test]
fn bad_input_exits_with_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("arbor-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let junk = junk.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["tokenize", "--model", "no-such-model", "--text", "x"],
            "no-such-model",
        ),
        (
            vec!["tokenize", "--model", junk, "--text", "x"],
            "truncated",
        ),
        (
            vec![
                "generate",
                "--model",
                junk,
                "--prompt",
                "x",
                "--backend",
                "tpu",
            ],
            "unknown backend",
        ),
        (
            vec![
                "generate",
                "--model",
                junk,
                "--prompt",
                "x",
                "--threads",
                "0",
            ],
            "--threads",
        ),
    ];
    for (args, needle) in cases {
        let o = arbor(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("error:") && err.contains(needle),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    if smollm2().is_some() {
        let o = arbor(&[
            "generate",
            "--model",
            "smollm2-135m",
            "--prompt",
            "x",
            "--temperature=-1",
        ]);
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).contains("temperature"), "{}", stderr(&o));
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn speculative_generate_needs_a_draft_and_matches_plain_output() {
    let o = arbor(&[
        "generate",
        "--strategy",
        "chain",
        "--prompt",
        "hi",
        "--model",
        "x.gguf",
    ]);
    assert!(!o.status.success());
    let Some(_) = smollm2() else { return };
    let o = arbor(&[
        "generate",
        "--model",
        "smollm2-135m",
        "--strategy",
        "chain",
        "--prompt",
        "hi",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("needs a draft model"), "{}", stderr(&o));
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            "smollm2-135m",
            "--prompt",
            "The three primary colours are",
            "--max-tokens",
            "24",
        ];
        args.extend_from_slice(extra);
        let o = arbor(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        (String::from_utf8(o.stdout.clone()).unwrap(), stderr(&o))
    };
    let (plain, _) = run(&[]);
    // SmolLM2 drafting for itself: every draft token is accepted.
    for strategy in ["chain", "tree", "static-tree"] {
        let (text, err) = run(&["--draft", "smollm2-135m", "--strategy", strategy]);
        assert_eq!(text, plain, "{strategy}");
        assert!(err.contains("verifications"), "{strategy}: {err}");
    }
}

/// `arbor bench spec` over SmolLM2 drafting for itself, on the prompts in
/// `prompts`, JSON rows to stdout, the chart to `plot`, and `rest`.
fn bench_spec(prompts: &std::path::Path, plot: &std::path::Path, rest: &[&str]) -> Output {
    let mut args = vec![
        "bench",
        "spec",
        "--target",
        "smollm2-135m",
        "--draft",
        "smollm2-135m",
        "--prompts",
        prompts.to_str().unwrap(),
        "--no-profile",
        "--json",
        "--plot",
        plot.to_str().unwrap(),
    ];
    args.extend_from_slice(rest);
    arbor(&args)
}

#[test]
fn bench_spec_prints_one_json_object_per_strategy() {
    let Some(_) = smollm2() else { return };
    let dir = std::env::temp_dir().join(format!("arbor-bench-spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = dir.join("prompts.jsonl");
    std::fs::write(&prompts, "\"Name a fruit.\"\n\"Count to five.\"\n").unwrap();
    let plot = dir.join("chart.png");
    let o = bench_spec(
        &prompts,
        &plot,
        &["--max-tokens", "12", "--strategies", "chain,tree"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = String::from_utf8(o.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["autoregressive", "chain", "tree"]);
    for r in &rows {
        for key in [
            "prompts",
            "identical",
            "tok_s",
            "ms_per_token",
            "mean_accepted",
            "verifications_per_100",
            "speedup_vs_autoregressive",
            "peak_bytes",
        ] {
            assert!(r.get(key).is_some(), "missing {key} in {r}");
        }
        assert_eq!(r["prompts"], 2);
        assert_eq!(r["identical"], 2, "greedy speculation is lossless: {r}");
    }
    assert!(
        rows[1]["mean_accepted"].as_f64().unwrap() > 1.5,
        "a perfect draft is accepted"
    );
    let png = std::fs::read(&plot).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    assert!(
        stderr(&o).contains("| strategy |"),
        "the table goes to stderr with --json"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn budgeted_rounds_sum_each_row_over_its_shares_of_the_prompts() {
    let Some(_) = smollm2() else { return };
    let dir = std::env::temp_dir().join(format!("arbor-bench-rounds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = dir.join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "\"Name a fruit.\"\n\"Count to five.\"\n\"Say hello.\"\n",
    )
    .unwrap();
    let plot = dir.join("chart.png");
    let o = bench_spec(
        &prompts,
        &plot,
        &[
            "--max-tokens",
            "6",
            "--memory-budget",
            "600MiB",
            "--unconfined",
            "--rounds",
            "2",
            "--strategies",
            "tree@lookup",
        ],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    // Two rounds (1 prompt, then 2), the second in reverse order.
    let starts: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(" inside ") && l.contains(", round "))
        .collect();
    assert_eq!(starts.len(), 4, "{err}");
    assert!(
        starts[0].starts_with("autoregressive-pipelined") && starts[0].ends_with("round 1 of 2")
    );
    assert!(starts[2].starts_with("tree@lookup") && starts[2].ends_with("round 2 of 2"));
    let rows: Vec<serde_json::Value> = String::from_utf8(o.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(rows.len(), 2);
    for r in &rows {
        // Every prompt once, in order: the rounds' tokens line up with the
        // unlimited run's.
        assert_eq!(r["prompts"], 3, "{r}");
        assert_eq!(r["identical"], 3, "{r}");
        let rate = r["generated"].as_f64().unwrap() / r["decode_secs"].as_f64().unwrap();
        assert!(
            (r["tok_s"].as_f64().unwrap() - rate).abs() < 1e-6 * rate,
            "{r}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn strategy_help_comes_from_the_registry_and_every_name_is_accepted() {
    let o = arbor(&["generate", "--help"]);
    let help = String::from_utf8(o.stdout).unwrap();
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    for name in [
        "autoregressive,",
        "autoregressive-pipelined,",
        "chain,",
        "tree-provisional,",
        "tree-no-fallback",
        "static-tree",
    ] {
        assert!(help.contains(name), "{name} missing from: {help}");
    }
    let o = arbor(&[
        "generate",
        "--model",
        "x.gguf",
        "--prompt",
        "x",
        "--strategy",
        "treee",
    ]);
    let err = stderr(&o);
    assert!(
        err.contains("unknown strategy") && err.contains("static-tree"),
        "{err}"
    );
    let Some(_) = smollm2() else { return };
    let run = |strategy: &str| {
        let o = arbor(&[
            "generate",
            "--model",
            "smollm2-135m",
            "--draft",
            "smollm2-135m",
            "--prompt",
            "Hello",
            "--max-tokens",
            "6",
            "--strategy",
            strategy,
        ]);
        assert!(o.status.success(), "{strategy}: {}", stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let plain = run("autoregressive");
    for name in [
        "ar",
        "autoregressive-pipelined",
        "tree-no-fallback",
        "chain-on-demand",
    ] {
        assert_eq!(run(name), plain, "{name}");
    }
}

#[test]
fn profile_reports_cached_facts_as_json() {
    let Some(_) = smollm2() else { return };
    let o = arbor(&["profile", "--model", "smollm2-135m", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(rows.len(), 2, "a latency curve and the disk: {rows:?}");
    let points = rows[0]["points"].as_array().unwrap();
    assert!(points.len() >= 10 && rows[0]["repetitions"].as_u64() >= Some(2));
    assert!(rows[0]["kernels"].is_string() && rows[0]["measured"].is_string());
    assert!(rows[1]["bytes_per_sec"].as_f64().unwrap() > 0.0);
}

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

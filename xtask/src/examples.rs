//! CI's checks of the `arbor` library as users meet it: every example of
//! `crates/arbor` runs on SmolLM2 (from the test build, nothing rebuilt),
//! and a crate outside the workspace that depends on `arbor` with default
//! features off plus `candle` and `fetch` (the Python package's features,
//! so its build reuses this one) builds and streams a reply.

use std::path::{Path, PathBuf};

/// Runs `exe ARGS`; a non-zero exit is an error.
fn run(exe: &Path, args: &[&str]) -> Result<(), String> {
    crate::run_with(exe, args, &[])
}

/// Every example of `crates/arbor`, built by the test build in `target`.
pub fn run_examples(target: &str) -> Result<(), String> {
    let debug = Path::new(target).join("debug");
    let example = |name: &str| debug.join("examples").join(name);
    let model = "smollm2-135m";
    run(&example("generate"), &[model])?;
    run(&example("stream"), &[model])?;
    run(&example("chat"), &[model])?;
    // SmolLM2 has no smaller sibling: its own resident layers draft.
    run(&example("budget_auto"), &[model, "self", "200"])?;
    // An elastic SmolLM2 by weight magnitude (no calibration: seconds).
    let dir = Path::new(target).join("xtask-examples");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let elastic = dir.join("smollm2-135m.elastic-magnitude.gguf");
    let elastic = elastic.to_str().ok_or("target dir is not UTF-8")?;
    run(
        &debug.join("arbor"),
        &[
            "elastic",
            "build",
            "--model",
            model,
            "--order",
            "magnitude",
            "--anchors",
            "0",
            "--vocab-corpus",
            "none",
            "--levels",
            "0.5,1.0",
            "--out",
            elastic,
        ],
    )?;
    run(&example("elastic_level"), &[elastic, "0.5"])?;
    run(&example("axum_server"), &[model, "--once"])
}

const DOWNSTREAM_MAIN: &str = r#"//! Written by `cargo xtask ci`: a program outside the workspace using arbor.
fn main() -> Result<(), arbor::Error> {
    assert_eq!(arbor::Backend::compiled(), [arbor::Backend::Candle]);
    let model = std::env::args().nth(1).expect("a model");
    let mut session = arbor::Builder::new().model(model).max_tokens(24).build()?;
    let messages = [arbor::Message::user("What is Rust?")];
    let mut streamed = String::new();
    let mut stream = session.chat(&messages)?;
    for piece in &mut stream {
        streamed.push_str(&piece?);
    }
    let reply = stream.finish()?;
    assert!(reply.stats.generated_tokens > 0);
    assert_eq!(streamed, reply.text);
    println!("{streamed}");
    Ok(())
}
"#;

/// A crate in `target/xtask-downstream` with a path dependency on
/// `crates/arbor` (default features off, `candle` and `fetch` on, as the
/// Python package has them), the workspace's lock
/// file and no network, built into the same target directory and run.
pub fn downstream(target: &str, root: &Path) -> Result<(), String> {
    let dir = PathBuf::from(target).join("xtask-downstream");
    let write = |path: PathBuf, text: &str| {
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    std::fs::create_dir_all(dir.join("src")).map_err(|e| format!("{}: {e}", dir.display()))?;
    let arbor = root.join("crates/arbor");
    write(
        dir.join("Cargo.toml"),
        &format!(
            "[package]\nname = \"downstream\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
             [dependencies]\narbor = {{ path = {:?}, default-features = false, features = [\"candle\", \"fetch\"] }}\n\n\
             [workspace]\n\n\
             # The workspace's profiles (dependencies without debug information),\n\
             # so that what it built is reused.\n\
             [profile.dev]\nopt-level = 1\ndebug = \"line-tables-only\"\n\n\
             [profile.dev.package.\"*\"]\nopt-level = 2\ndebug = false\n",
            arbor.display().to_string()
        ),
    )?;
    write(dir.join("src/main.rs"), DOWNSTREAM_MAIN)?;
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock"))
        .map_err(|e| format!("copying Cargo.lock: {e}"))?;
    let manifest = dir.join("Cargo.toml");
    let manifest = manifest.to_str().ok_or("target dir is not UTF-8")?;
    crate::step(&[
        "run",
        "--offline",
        "--manifest-path",
        manifest,
        "--",
        "smollm2-135m",
    ])
}

//! `cargo xtask build --device cpu|wgpu|arm64 [--release]` builds the
//! `arbor` binary (`arm64`: for `aarch64-unknown-linux-gnu`, cross-linked
//! from another host);
//! `cargo xtask ci` runs the checks of `.ci/run`;
//! `cargo xtask examples` runs the `arbor` library's examples and builds a
//! crate outside the workspace against it (after the test build);
//! `cargo xtask imports` lists the edges between each crate's files and
//! fails on two files that name each other (see [`imports`]);
//! `cargo xtask fuzz [SECS]` runs every fuzz target for SECS seconds each
//! (default 60), as CI's fuzzing step does;
//! `cargo xtask test --device arm64` runs the ARM64 test subset (under
//! qemu from another host, see [`test_arm64`]);
//! `cargo xtask fetch [--release] [ARGS...]` runs `arbor fetch ARGS...`.

mod examples;
mod imports;

use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Instant;

const USAGE: &str = "usage: cargo xtask build --device cpu|wgpu|arm64 [--release]
       cargo xtask ci
       cargo xtask examples
       cargo xtask imports
       cargo xtask fuzz [SECS]
       cargo xtask test --device arm64 [--cpu NAME,...]
       cargo xtask fetch [--release] [ARGS...]";

/// The ARM64 target: phones, Jetsons, Raspberry Pis, ARM laptops on Linux.
const ARM64: &str = "aarch64-unknown-linux-gnu";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["build", rest @ ..] => build(rest),
        ["ci"] => ci(),
        ["examples"] => library_checks(),
        ["imports"] => imports::check(&workspace_root(), true),
        ["fuzz"] => fuzz("60"),
        ["fuzz", secs] => fuzz(secs),
        ["test", rest @ ..] => test(rest),
        ["fetch", rest @ ..] => fetch(rest),
        _ => Err(USAGE.to_owned()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn build(args: &[&str]) -> Result<(), String> {
    let (mut device, mut release) = (None, false);
    let mut it = args.iter();
    while let Some(&arg) = it.next() {
        match arg {
            "--release" => release = true,
            "--device" => device = it.next().copied(),
            _ => match arg.strip_prefix("--device=") {
                Some(d) => device = Some(d),
                None => return Err(format!("unexpected argument `{arg}`\n{USAGE}")),
            },
        }
    }
    let features = match device {
        Some(d) => {
            device_features(d).ok_or(format!("--device must be cpu, wgpu or arm64\n{USAGE}"))?
        }
        None => return Err(format!("--device must be cpu, wgpu or arm64\n{USAGE}")),
    };
    let mut cargo = vec![
        "build",
        "-p",
        "arbor-cli",
        "--no-default-features",
        "--features",
    ];
    cargo.push(&features);
    if device == Some("arm64") {
        cargo.extend(["--target", ARM64]);
    }
    if release {
        cargo.push("--release");
    }
    if device == Some("arm64") {
        step_with(&cargo, &arm64_env()?)?;
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
        let profile = if release { "release" } else { "debug" };
        eprintln!("xtask: built {target}/{ARM64}/{profile}/arbor");
        return Ok(());
    }
    step(&cargo)
}

/// The `arbor` command's features besides its backends: every command.
const CLI_COMMANDS: &str = "fetch,plot,serve,train,bench";

/// Exactly the features a device's `arbor` build needs: its backends and
/// every command (`cargo xtask build --device D` builds with these alone).
fn device_features(device: &str) -> Option<String> {
    let backends = match device {
        // candle (our x86 kernels) and burn flex.
        "cpu" => "candle,flex",
        // burn on wgpu alone: no CPU backend is linked.
        "wgpu" => "wgpu",
        // The CPU backends, our NEON kernels chosen at run time.
        "arm64" => "candle,flex",
        _ => return None,
    };
    Some(format!("{backends},{CLI_COMMANDS}"))
}

/// The `arbor` library's feature combinations CI checks: each backend
/// alone, and none (a build that says so at run time); beside two of them
/// the `arbor` command built the same way, in the same cargo call so that
/// what they share is checked once: candle with no other feature (no
/// training, serving, plotting, downloads or benchmarks), and the wgpu
/// device build (no CPU backend; its `fetch` reaches the library's engine
/// too, the empty row checks the library without it).
fn feature_matrix() -> [(&'static str, Option<String>); 5] {
    [
        ("candle", Some("candle".into())),
        ("flex", None),
        ("ndarray", None),
        ("wgpu", device_features("wgpu")),
        ("", None),
    ]
}

/// The features of CI's one build (see [`ci`]).
const FEATURES: &str = "arbor-engine/ndarray,arbor-engine/wgpu";
/// Whether this machine is itself ARM64 (then nothing is cross-built).
fn native_arm64() -> bool {
    cfg!(target_arch = "aarch64")
}

/// Environment for a cargo command building ARM64 code on this host: on
/// another host, Debian's cross linker (`gcc-aarch64-linux-gnu`), unless
/// the variable is set already; on an ARM64 host, nothing.
fn arm64_env() -> Result<Vec<(String, String)>, String> {
    const LINKER: &str = "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER";
    if native_arm64() || std::env::var_os(LINKER).is_some() {
        return Ok(Vec::new());
    }
    if !on_path("aarch64-linux-gnu-gcc") {
        return Err(format!(
            "aarch64-linux-gnu-gcc is missing: install Debian's gcc-aarch64-linux-gnu \
             and libc6-dev-arm64-cross (or set {LINKER})"
        ));
    }
    Ok(vec![(LINKER.into(), "aarch64-linux-gnu-gcc".into())])
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// `cargo xtask test --device arm64 [--cpu NAME,...]`.
fn test(args: &[&str]) -> Result<(), String> {
    let (mut device, mut cpus) = (None, None);
    let mut it = args.iter();
    while let Some(&arg) = it.next() {
        match arg {
            "--device" => device = it.next().copied(),
            "--cpu" => cpus = it.next().copied(),
            _ => return Err(format!("unexpected argument `{arg}`\n{USAGE}")),
        }
    }
    if device != Some("arm64") {
        return Err(format!("only --device arm64 has a test subset\n{USAGE}"));
    }
    let cpus: Vec<&str> = cpus.unwrap_or("max,cortex-a72").split(',').collect();
    test_arm64(&cpus)
}

/// The ARM64 test subset: (package directory, test target, label,
/// test-name filters; most integration tests are modules of a crate's
/// `all` binary, so a filter names the module). The kernels against the
/// lane reference (every type and variant, 1-17 tokens, parts and segment
/// sums) and the backend's ops; batch invariance and row forwards on tiny
/// models; speculative output equal to the target's alone (proptest, with
/// [`QEMU_PROPTEST_CASES`] cases a property under emulation); split
/// elastic layers equal to whole ones; SmolLM2-135M's greedy text against
/// llama.cpp's.
const ARM64_TESTS: &[(&str, &str, &str, &[&str])] = &[
    ("backends/candle", "arbor_backend_candle", "candle-lib", &[]),
    // Known: candle-core's own aarch64 kernels (Q5_K here, which no
    // shipped model uses) are not batch-invariant; ours are tested above.
    (
        "backends/candle",
        "ops",
        "candle-ops",
        &["--skip", "batched_rows_equal_single_rows_bit_for_bit"],
    ),
    ("crates/model", "arbor_model", "model-lib", &[]),
    // Batch invariance, rows, embedding rows and the slim head: all but
    // the KV slots.
    ("crates/model", "all", "model", &["--skip", "slots::"]),
    (
        "crates/speculative",
        "all",
        "lossless",
        &["lossless::", "provisional::"],
    ),
    // The tiny-model split tests; the real-file ones build an elastic
    // SmolLM2 and run it three ways, minutes under emulation.
    (
        "crates/elastic",
        "all",
        "split",
        &["split::", "--skip", "a_real_split"],
    ),
    (
        "crates/engine",
        "all",
        "real_models",
        &["real_models::greedy_output_matches_llama_cpp", "--exact"],
    ),
];

/// Cases a speculative-decoding property runs under emulation (48 and 24
/// natively): the same code paths, a quarter of the inputs.
const QEMU_PROPTEST_CASES: &str = "12";

/// The tests of [`ARM64_TESTS`] (by label) that also run on a core without
/// dotprod (`cortex-a72`, a Raspberry Pi 4). candle-core 0.11's own aarch64
/// kernels for Q4_0, Q8_0 and the K-quants issue `sdot` without asking the
/// CPU; the candle backend holds such weights as F32 there when our kernels
/// do not take them (see `weight::candle_runs`), so the ops tests of
/// candle's types and the SmolLM2 greedy run are here too. The tiny-model
/// lossless tests run on `max` only.
const PLAIN_NEON_TESTS: &[&str] = &[
    "candle-lib",
    "candle-ops",
    "model-lib",
    "model",
    "split",
    "real_models",
];

/// [`ARM64_TESTS`] built for `aarch64-unknown-linux-gnu` in one cargo
/// invocation (one feature resolution, so no crate is built twice; the
/// engine with the candle backend only: burn is built only for the
/// elastic tests' dev-dependency) and run once per emulated CPU (`-cpu
/// max`: dotprod, i8mm, SVE; `cortex-a72`: plain NEON), so the `smmla`
/// and the plain-NEON kernels run the models (the kernel tests run every
/// variant the CPU has, `sdot` included); on an ARM64 host, once,
/// natively. A subset, not a second build of the workspace: emulation is
/// slow, and the rest has no ARM-specific code.
fn test_arm64(cpus: &[&str]) -> Result<(), String> {
    let start = Instant::now();
    // The NEON kernels are compiled only there: lint them there too.
    let env = arm64_env()?;
    step_with(
        &[
            "clippy",
            "--target",
            ARM64,
            "-p",
            "arbor-backend-candle",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &env,
    )?;
    let mut cargo = vec!["test", "--no-run", "--target", ARM64];
    cargo.extend(["--message-format", "json-render-diagnostics"]);
    for p in [
        "arbor-backend-candle",
        "arbor-model",
        "arbor-speculative",
        "arbor-elastic",
        "arbor-engine",
    ] {
        cargo.extend(["-p", p]);
    }
    cargo.extend(["--no-default-features", "--features", "arbor-engine/candle"]);
    cargo.push("--lib");
    for (_, target, _, _) in ARM64_TESTS {
        if !target.starts_with("arbor_") && !cargo.windows(2).any(|w| w == ["--test", *target]) {
            cargo.extend(["--test", target]);
        }
    }
    if !native_arm64() && !on_path("qemu-aarch64") {
        return Err("qemu-aarch64 is missing: install Debian's qemu-user".into());
    }
    let line = format!("cargo {}", cargo.join(" "));
    eprintln!("==> {line}");
    let built = Command::new("cargo")
        .args(&cargo)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("{line}: {e}"))?;
    if !built.status.success() {
        return Err(format!("`{line}` failed ({})", built.status));
    }
    eprintln!("<== built in {:.1?}", start.elapsed());
    let binaries = test_binaries(&String::from_utf8_lossy(&built.stdout))?;
    let cpus: &[&str] = if native_arm64() { &["native"] } else { cpus };
    for cpu in cpus {
        for ((dir, _, label, filters), exe) in ARM64_TESTS.iter().zip(&binaries) {
            if *cpu != "max" && !native_arm64() && !PLAIN_NEON_TESTS.contains(label) {
                eprintln!("--- [{cpu}] {dir}: {label} not run here (see PLAIN_NEON_TESTS)");
                continue;
            }
            let mut cmd = if native_arm64() {
                Command::new(exe)
            } else {
                let mut c = Command::new("qemu-aarch64");
                c.args(["-L", "/usr/aarch64-linux-gnu", exe])
                    .env("QEMU_CPU", cpu)
                    .env("PROPTEST_CASES", QEMU_PROPTEST_CASES);
                // Which kernel variant must run there (a kernel test checks).
                match *cpu {
                    "max" => c.env("ARBOR_EXPECT_KERNELS", "candle-qmm8-i8mm"),
                    "cortex-a76" | "neoverse-n1" => {
                        c.env("ARBOR_EXPECT_KERNELS", "candle-qmm8-dotprod")
                    }
                    "cortex-a72" | "cortex-a53" | "cortex-a57" => {
                        c.env("ARBOR_EXPECT_KERNELS", "candle-qmm8-neon")
                    }
                    _ => &mut c,
                };
                c
            };
            cmd.args(*filters).current_dir(dir);
            let t = Instant::now();
            eprintln!("==> [{cpu}] {dir}: {label} {}", filters.join(" "));
            let status = cmd.status().map_err(|e| format!("running {exe}: {e}"))?;
            eprintln!("<== [{cpu}] {label}: {status} in {:.1?}", t.elapsed());
            if !status.success() {
                return Err(format!("[{cpu}] {dir} {label} failed ({status})"));
            }
        }
    }
    eprintln!(
        "xtask test --device arm64: passed in {:.1?}",
        start.elapsed()
    );
    Ok(())
}

/// The test executables of [`ARM64_TESTS`], in order, from cargo's JSON
/// messages.
fn test_binaries(messages: &str) -> Result<Vec<String>, String> {
    let mut found: Vec<Option<String>> = vec![None; ARM64_TESTS.len()];
    for line in messages.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(name), Some(manifest)) = (
            v["executable"].as_str(),
            v["target"]["name"].as_str(),
            v["manifest_path"].as_str(),
        ) else {
            continue;
        };
        for (i, (dir, target, _, _)) in ARM64_TESTS.iter().enumerate() {
            if *target == name && manifest.ends_with(&format!("{dir}/Cargo.toml")) {
                found[i] = Some(exe.to_owned());
            }
        }
    }
    found
        .into_iter()
        .zip(ARM64_TESTS)
        .map(|(exe, (dir, target, _, _))| {
            exe.ok_or(format!("cargo built no test {target} in {dir}"))
        })
        .collect()
}

/// The test part of `.ci/run`; keep the two in sync.
fn ci() -> Result<(), String> {
    // Every backend is compiled, linted and tested in one build: the CPU
    // ones (candle, burn flex, burn ndarray) and wgpu, whose tests run on
    // whatever Vulkan driver the machine has (lavapipe in CI). One feature
    // set for clippy, the test build and the test run, so nothing is built
    // twice (a separate wgpu test build cost ~17 of a cold run's minutes).
    let features = FEATURES;
    let start = Instant::now();
    step(&["fmt", "--all", "--", "--check"])?;
    // No two files of a crate name each other (a text scan, instant).
    eprintln!("==> cargo xtask imports");
    imports::check(&workspace_root(), false)?;
    step(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--features",
        features,
        "--",
        "-D",
        "warnings",
    ])?;
    // Each backend alone, and none, compiles (checked, not built; the
    // dependencies' metadata is shared between combinations).
    for (lib, cli) in feature_matrix() {
        let prefixed = |package: &str, features: &str| {
            features
                .split(',')
                .filter(|f| !f.is_empty())
                .map(|f| format!("{package}/{f}"))
                .collect::<Vec<_>>()
        };
        let mut features = prefixed("arbor", lib);
        let mut args = vec!["check", "-p", "arbor", "--lib"];
        if let Some(cli) = cli {
            features.extend(prefixed("arbor-cli", &cli));
            args.extend(["-p", "arbor-cli", "--bins"]);
        }
        let features = features.join(",");
        args.extend(["--no-default-features", "--features", &features]);
        step(&args)?;
    }
    // Every crate's documentation, warnings denied (broken or private
    // links among them; the dependencies were just checked by clippy with
    // these features).
    step_with(
        &["doc", "--workspace", "--no-deps", "--features", features],
        &[("RUSTDOCFLAGS".into(), "-D warnings".into())],
    )?;
    // Build the tests first: that also builds the `arbor` binary the CLI
    // tests run, with the same features, which then fetches the smoke-test
    // model (cached in $ARBOR_HOME) without a build of its own.
    step(&["test", "--workspace", "--features", features, "--no-run"])?;
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let arbor = Path::new(&target).join("debug/arbor");
    run_with(&arbor, &["fetch", "smollm2-135m"], &[])?;
    step(&["test", "--workspace", "--features", features])?;
    library_checks()?;
    eprintln!("xtask ci: all steps passed in {:.1?}", start.elapsed());
    Ok(())
}

/// The library as users meet it: the examples of `crates/arbor` (from the
/// test build, which must have run) and a crate outside the workspace.
fn library_checks() -> Result<(), String> {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    examples::run_examples(&target)?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    examples::downstream(&target, &root)
}

/// Runs the fuzz targets (the `fuzz_*` tests: the GGUF reader, the
/// server's request parser and the chat-template renderer) for
/// `secs` seconds each, from the test build `ci` made (same features:
/// nothing is rebuilt). The
/// seed is the commit, so a failure reproduces with the printed seed; each
/// target prints its executions and corpus size. With `ARBOR_HOME` set,
/// grown corpora and running totals are kept in `$ARBOR_HOME/fuzz`.
fn fuzz(secs: &str) -> Result<(), String> {
    secs.parse::<f64>()
        .map_err(|_| format!("fuzz: SECS must be a number, got `{secs}`\n{USAGE}"))?;
    let mut env = vec![("ARBOR_FUZZ_SECS".to_string(), secs.to_string())];
    let head = Command::new("git").args(["rev-parse", "HEAD"]).output();
    if let Ok(out) = head
        && out.status.success()
    {
        let seed = String::from_utf8_lossy(&out.stdout).trim().to_string();
        env.push(("ARBOR_FUZZ_SEED".into(), seed));
    }
    if let Some(home) = std::env::var_os("ARBOR_HOME") {
        let dir = std::path::Path::new(&home).join("fuzz");
        env.push((
            "ARBOR_FUZZ_CORPUS".into(),
            dir.join("corpus").display().to_string(),
        ));
        env.push((
            "ARBOR_FUZZ_TOTALS".into(),
            dir.join("totals").display().to_string(),
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    for (k, v) in &env {
        eprintln!("{k}={v}");
    }
    let args = [
        "test",
        "--workspace",
        "--features",
        FEATURES,
        "--lib",
        "--test",
        "fuzz",
        "--",
        "fuzz_",
        "--nocapture",
        "--test-threads=1",
    ];
    let line = format!("cargo {}", args.join(" "));
    eprintln!("==> {line}");
    let status = Command::new("cargo")
        .args(args)
        .envs(env)
        .status()
        .map_err(|e| format!("{line}: {e}"))?;
    match status.success() {
        true => Ok(()),
        false => Err(format!("`{line}` failed ({status})")),
    }
}

fn fetch(args: &[&str]) -> Result<(), String> {
    let (release, args) = match args {
        ["--release", rest @ ..] => (true, rest),
        _ => (false, args),
    };
    let mut cargo = vec!["run", "-p", "arbor-cli"];
    if release {
        cargo.push("--release");
    }
    cargo.extend(["--", "fetch"]);
    cargo.extend(args);
    step(&cargo)
}

/// Runs `cargo ARGS`, printing the command and how long it took.
fn step(args: &[&str]) -> Result<(), String> {
    step_with(args, &[])
}

/// [`step`] with environment variables `env` set.
fn step_with(args: &[&str], env: &[(String, String)]) -> Result<(), String> {
    run_with(Path::new("cargo"), args, env)
}

/// Runs `program ARGS` with environment variables `env` set, printing the
/// command and how long it took; a non-zero exit is an error.
fn run_with(program: &Path, args: &[&str], env: &[(String, String)]) -> Result<(), String> {
    let vars: Vec<String> = env.iter().map(|(k, v)| format!("{k}='{v}' ")).collect();
    let line = format!("{}{} {}", vars.concat(), program.display(), args.join(" "));
    eprintln!("==> {line}");
    let start = Instant::now();
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .status()
        .map_err(|e| format!("{line}: {e}"))?;
    eprintln!("<== {line}: {status} in {:.1?}", start.elapsed());
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{line}` failed ({status})"))
    }
}

/// The workspace root (xtask's parent directory).
fn workspace_root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

//! `cargo xtask build --device cpu|wgpu|arm64 [--release]` builds the
//! `arbor` binary (`arm64`: for `aarch64-unknown-linux-gnu`, cross-linked
//! from another host);
//! `cargo xtask ci` runs the checks of `.ci/run`;
//! `cargo xtask test --device arm64` runs the ARM64 test subset (under
//! qemu from another host, see [`test_arm64`]);
//! `cargo xtask fetch [--release] [ARGS...]` runs `arbor fetch ARGS...`.

use std::process::{Command, ExitCode};
use std::time::Instant;

const USAGE: &str = "usage: cargo xtask build --device cpu|wgpu|arm64 [--release]
       cargo xtask ci
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
    let mut cargo = vec!["build", "-p", "arbor-cli"];
    match device {
        Some("cpu") => {} // default features: candle + burn flex
        Some("wgpu") => cargo.extend(["--features", "wgpu"]),
        // The CPU backends, our NEON kernels chosen at run time.
        Some("arm64") => cargo.extend(["--target", ARM64]),
        _ => return Err(format!("--device must be cpu, wgpu or arm64\n{USAGE}")),
    }
    if release {
        cargo.push("--release");
    }
    if device == Some("arm64") {
        step_with(&cargo, &arm64_env(false)?)?;
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
        let profile = if release { "release" } else { "debug" };
        eprintln!("xtask: built {target}/{ARM64}/{profile}/arbor");
        return Ok(());
    }
    step(&cargo)
}

/// Whether this machine is itself ARM64 (then nothing is cross-built).
fn native_arm64() -> bool {
    cfg!(target_arch = "aarch64")
}

/// Environment for a cargo command building (and, with `run`, running)
/// ARM64 code on this host: on another host, Debian's cross linker
/// (`gcc-aarch64-linux-gnu`) and, to run, `qemu-aarch64` with the cross
/// libraries (`qemu-user`; the CPU it emulates comes from `QEMU_CPU`).
/// A variable already set is left alone; on an ARM64 host, nothing is set.
fn arm64_env(run: bool) -> Result<Vec<(String, String)>, String> {
    if native_arm64() {
        return Ok(Vec::new());
    }
    let mut env = Vec::new();
    let mut want = vec![(
        "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
        "aarch64-linux-gnu-gcc",
        "gcc-aarch64-linux-gnu",
    )];
    if run {
        want.push((
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER",
            "qemu-aarch64 -L /usr/aarch64-linux-gnu",
            "qemu-user",
        ));
    }
    for (var, value, package) in want {
        if std::env::var_os(var).is_some() {
            continue;
        }
        let tool = value.split(' ').next().unwrap_or(value);
        if !on_path(tool) {
            return Err(format!(
                "{tool} is missing: install Debian's {package} (or set {var})"
            ));
        }
        env.push((var.to_owned(), value.to_owned()));
    }
    Ok(env)
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

/// The ARM64 test subset, built for `aarch64-unknown-linux-gnu` and run
/// once per emulated CPU (`-cpu max`: dotprod, i8mm, SVE; `cortex-a72`:
/// plain NEON), so both kernel variants run; on an ARM64 host, once,
/// natively. A subset of the crates (the kernels, the model, the lossless
/// and split properties, SmolLM2's greedy output), not a second build of
/// the workspace: emulation is slow, and the rest has no ARM-specific code.
fn test_arm64(cpus: &[&str]) -> Result<(), String> {
    let env = arm64_env(true)?;
    let target = ["--target", ARM64];
    // (packages and test targets, test-name filter)
    let runs: [(&[&str], &[&str]); 4] = [
        // Every kernel variant against the lane reference, every type,
        // 1-17 tokens, parts and segment sums; the backend's ops; batch
        // invariance and row forwards on tiny models.
        (&["-p", "arbor-backend-candle", "-p", "arbor-model"], &[]),
        // Speculative output equals the target's alone (proptest).
        (&["-p", "arbor-speculative", "--test", "lossless"], &[]),
        // Split layers give the whole layer's bits.
        (&["-p", "arbor-elastic", "--test", "split"], &[]),
        // SmolLM2-135M greedy, against llama.cpp's text.
        (
            &["-p", "arbor-engine", "--test", "real_models"],
            &["smollm2_matches_llama_cpp"],
        ),
    ];
    let start = Instant::now();
    for (select, _) in &runs {
        let mut cargo = vec!["test", "--no-run"];
        cargo.extend(target);
        cargo.extend(select.iter());
        step_with(&cargo, &env)?;
    }
    let cpus: &[&str] = if native_arm64() { &["native"] } else { cpus };
    for cpu in cpus {
        let mut env = env.clone();
        if !native_arm64() {
            env.push(("QEMU_CPU".into(), (*cpu).into()));
            // Which kernel variant must run there (a kernel test checks).
            let kernels = match *cpu {
                "max" => Some("candle-qmm4-dotprod"),
                "cortex-a72" | "cortex-a53" | "cortex-a57" => Some("candle-qmm4-neon"),
                _ => None,
            };
            if let Some(k) = kernels {
                env.push(("ARBOR_EXPECT_KERNELS".into(), k.into()));
            }
        }
        for (select, filter) in &runs {
            let mut cargo = vec!["test"];
            cargo.extend(target);
            cargo.extend(select.iter());
            cargo.push("--");
            cargo.extend(filter.iter());
            eprintln!("xtask: on {cpu}");
            step_with(&cargo, &env)?;
        }
    }
    eprintln!(
        "xtask test --device arm64: passed in {:.1?}",
        start.elapsed()
    );
    Ok(())
}

/// The test part of `.ci/run`; keep the two in sync.
fn ci() -> Result<(), String> {
    // Every backend is compiled, linted and tested in one build: the CPU
    // ones (candle, burn flex, burn ndarray) and wgpu, whose tests run on
    // whatever Vulkan driver the machine has (lavapipe in CI). One feature
    // set for clippy, the test build and the test run, so nothing is built
    // twice (a separate wgpu test build cost ~17 of a cold run's minutes).
    let features = "arbor-engine/ndarray,arbor-engine/wgpu";
    let start = Instant::now();
    step(&["fmt", "--all", "--", "--check"])?;
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
    // Build the tests first: that also builds the `arbor` binary the CLI
    // tests run, with the same features, which then fetches the smoke-test
    // model (cached in $ARBOR_HOME) without a build of its own.
    step(&["test", "--workspace", "--features", features, "--no-run"])?;
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let arbor = format!("{target}/debug/arbor");
    eprintln!("$ {arbor} fetch smollm2-135m");
    let status = Command::new(&arbor)
        .args(["fetch", "smollm2-135m"])
        .status()
        .map_err(|e| format!("running {arbor}: {e}"))?;
    if !status.success() {
        return Err(format!("{arbor} fetch smollm2-135m failed: {status}"));
    }
    step(&["test", "--workspace", "--features", features])?;
    eprintln!("xtask ci: all steps passed in {:.1?}", start.elapsed());
    Ok(())
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
    let vars: Vec<String> = env.iter().map(|(k, v)| format!("{k}='{v}' ")).collect();
    let line = format!("{}cargo {}", vars.concat(), args.join(" "));
    eprintln!("==> {line}");
    let start = Instant::now();
    let status = Command::new("cargo")
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

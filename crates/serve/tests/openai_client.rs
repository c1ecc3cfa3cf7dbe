//! The official `openai` Python package against real servers on 127.0.0.1
//! (`openai_client.py`): streaming and whole chat and text completions,
//! stop sequences, usage, errors (400/401/404/429), two concurrent
//! streams, a client that leaves mid-stream, and a draft that changes no
//! output at temperature 0. Skipped where Python lacks the package unless
//! `ARBOR_REQUIRE_OPENAI` is set (CI installs it and sets it).

use crate::common;
use common::*;

use arbor_engine::RunConfig;
use arbor_serve::ServeOptions;

#[test]
fn the_official_openai_client_passes() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let has_openai = std::process::Command::new(&python)
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_openai {
        assert!(
            std::env::var_os("ARBOR_REQUIRE_OPENAI").is_none(),
            "ARBOR_REQUIRE_OPENAI is set but `{python} -c 'import openai'` fails"
        );
        eprintln!("skipped: no `openai` package for {python}");
        return;
    }
    // SmolLM2 when cached (CI fetches it), else a tiny random model; the
    // same file is the draft.
    let tiny = tiny_model("openai-main", false);
    let main_model = arbor_fetch::testing::cached_model("smollm2-135m").unwrap_or(tiny.clone());
    let name = main_model.to_str().unwrap().to_string();
    let main = serve(
        &main_model,
        RunConfig {
            draft: Some(name),
            strategy: Some("autoregressive".into()),
            max_tokens: Some(32),
            ..RunConfig::default()
        },
        ServeOptions {
            api_key: Some("sesame".into()),
            // Room for both of the two concurrent streams whatever the
            // order: with a queue of 1 the second could arrive before the
            // worker had taken the first and be refused (429).
            queue: 4,
            ..ServeOptions::default()
        },
    );
    // The full-queue test's server holds its first pass until the third
    // request has been answered (refused or, wrongly, queued): the long
    // generation cannot end before the queue is full, however slow or fast
    // the machine.
    let slow_model = tiny_model("openai-slow", true);
    let gate = Gate::allowing(0);
    let slow = serve_paced(
        &slow_model,
        RunConfig {
            strategy: Some("autoregressive".into()),
            ..RunConfig::default()
        },
        ServeOptions {
            queue: 1,
            ..ServeOptions::default()
        },
        &gate,
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
    let mut child = std::process::Command::new(&python)
        .arg(script)
        .env("ARBOR_MAIN", main.addr().to_string())
        .env("ARBOR_SLOW", slow.addr().to_string())
        .env("ARBOR_KEY", "sesame")
        .spawn()
        .unwrap();
    let addr = slow.addr();
    let count = |m: &str| arbor_serve::client::metric(addr, m).unwrap_or(0.0);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        // Three requests reached the slow server and one was refused, or
        // all three were taken: either way the test has its answer.
        if count("requests_rejected_total") >= 1.0 || count("requests_total") >= 3.0 {
            gate.open();
            break child.wait().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    gate.open();
    main.shutdown().unwrap();
    slow.shutdown().unwrap();
    for p in [tiny, slow_model] {
        std::fs::remove_file(p).ok();
    }
    assert!(status.success(), "the openai client tests failed: {status}");
}

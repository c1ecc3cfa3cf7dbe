//! Where a target's PPD prompt tokens come from: the file `arbor train ppd`
//! writes (`$ARBOR_HOME/ppd/<model>.ppd.safetensors`), else the ones shipped
//! with arbor for the catalog's models (`assets/ppd/`, compiled in).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arbor_mask::insertion_mask;
use arbor_model::{LanguageModel, Mask, Row};
use arbor_ppd::{AccuracyTally, PromptFile, rank_of};
use arbor_speculative::{PromptTokens, ensemble};

use crate::{EngineError, Result};

/// The name PPD's guesses are counted under (see
/// [`arbor_planner::source_key`]).
pub const SOURCE: &str = "ppd";

/// Prompt tokens shipped for catalog models, by short name (how each was
/// trained: `assets/ppd/README.md`).
const SHIPPED: &[(&str, &[u8])] = &[
    (
        "qwen2.5-coder-0.5b",
        include_bytes!("../../../assets/ppd/qwen2.5-coder-0.5b.ppd.safetensors"),
    ),
    (
        "qwen2.5-coder-1.5b",
        include_bytes!("../../../assets/ppd/qwen2.5-coder-1.5b.ppd.safetensors"),
    ),
];

/// The file `arbor train ppd` writes for the model at `target`.
pub fn trained_path(target: &Path) -> PathBuf {
    let stem = target
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy().into_owned());
    arbor_fetch::arbor_home()
        .join("ppd")
        .join(format!("{stem}.ppd.safetensors"))
}

/// The catalog name of the model at `target`: its file name, or its size;
/// for an elastic file (`arbor elastic build`) or a requantized one
/// (`arbor requant`), its source model's — both keep the token embeddings
/// and the model's function, so the source's prompt tokens fit.
fn catalog_name(target: &Path) -> Option<&'static str> {
    let name = target.file_name()?.to_string_lossy().into_owned();
    let size = std::fs::metadata(target).ok()?.len();
    let by = |name: &str, size: u64| {
        (arbor_fetch::MODELS.iter())
            .find(|m| m.file_name == name || m.size == size)
            .map(|m| m.name)
    };
    by(&name, size).or_else(|| {
        let file = arbor_gguf::GgufFile::open(target).ok()?;
        let h = file.header();
        let source = (h.get_str(ELASTIC_SOURCE))
            .or_else(|_| h.get_str(arbor_drafts::requant::KEY_SOURCE))
            .ok()?;
        by(source, 0)
    })
}

/// The metadata key in which `arbor elastic build` names its source file.
const ELASTIC_SOURCE: &str = "arbor.elastic.source";

/// The prompt tokens for the model at `target` (`hidden` wide) and where
/// they came from; an error when none exist or they do not fit.
pub fn prompt_tokens_for(target: &Path, hidden: usize) -> Result<(Arc<PromptTokens>, String)> {
    let trained = trained_path(target);
    let (file, source) = if trained.exists() {
        let f = PromptFile::load(&trained)
            .map_err(|e| EngineError::Invalid(format!("prompt tokens: {e}")))?;
        (f, trained.display().to_string())
    } else {
        let shipped = catalog_name(target)
            .and_then(|name| SHIPPED.iter().find(|(n, _)| *n == name))
            .ok_or_else(|| {
                EngineError::Invalid(format!(
                    "no PPD prompt tokens for {}: train them with `arbor train ppd --model {}`",
                    target.display(),
                    target.display()
                ))
            })?;
        let f = PromptFile::from_bytes(shipped.1)
            .map_err(|e| EngineError::Invalid(format!("shipped prompt tokens: {e}")))?;
        (f, format!("shipped prompt tokens for {}", shipped.0))
    };
    into_tokens(file, hidden)
        .map(|p| (Arc::new(p), source.clone()))
        .map_err(|m| EngineError::Invalid(format!("prompt tokens from {source}: {m}")))
}

/// Insertion points per accuracy pass (each carries every prompt token).
const POINTS_PER_PASS: usize = 16;

/// Counts how well `prompts` guess the tokens of `seq` from `from` on (the
/// target's own greedy text after a prompt of `from` tokens): prompt token
/// `i`, inserted after the first `p` tokens, guesses token `p + i + 1`,
/// ranked among the tally's ranks (the thesis' top-k accuracy by
/// distance). The model's cache is left empty.
pub fn tally_guesses(
    model: &mut dyn LanguageModel,
    seq: &[u32],
    from: usize,
    prompts: &PromptTokens,
    tally: &mut AccuracyTally,
) -> Result<()> {
    let (len, count) = (seq.len(), prompts.count().min(tally.distances()));
    model.truncate_cache(0)?;
    let positions: Vec<u32> = (0..len as u32).collect();
    model.forward(seq, &positions, &Mask::causal(0, len), &[len - 1])?;
    let points: Vec<usize> = (from.max(1)..len.saturating_sub(count)).collect();
    let e = prompts.epts;
    for chunk in points.chunks(POINTS_PER_PASS) {
        // One chain per EPT at each point (the ensemble mask).
        let starts: Vec<usize> = chunk
            .iter()
            .flat_map(|&p| std::iter::repeat_n(p, e))
            .collect();
        let (mask, pos) = insertion_mask(len, &starts, count);
        let rows: Vec<Row<'_>> = (0..starts.len())
            .flat_map(|c| (0..count).map(move |i| Row::Vector(prompts.vector(i, c % e))))
            .collect();
        let all: Vec<usize> = (0..rows.len()).collect();
        let logits = model.forward_rows(&rows, &pos, &mask, &all)?;
        model.truncate_cache(len)?;
        for (b, &p) in chunk.iter().enumerate() {
            let guesses = ensemble(&logits, count, e, |i, j| (b * e + j) * count + i);
            for (i, row) in guesses.iter().enumerate() {
                let rank = rank_of(row, seq[p + i + 1], tally.ranks());
                tally.add(i + 1, rank);
            }
        }
    }
    model.truncate_cache(0)?;
    Ok(())
}

fn into_tokens(file: PromptFile, hidden: usize) -> std::result::Result<PromptTokens, String> {
    if file.hidden != hidden {
        return Err(format!("they are {} wide, the model {hidden}", file.hidden));
    }
    let accuracy = file
        .accuracy
        .ok_or("they carry no accuracy table (a checkpoint, not a finished run?)")?;
    Ok(PromptTokens {
        hidden,
        epts: file.epts.max(1),
        vectors: file.vectors,
        accuracy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_elastic_file_takes_its_source_models_prompt_tokens() {
        use arbor_gguf::{GgufWriter, Value};
        let entry = arbor_fetch::model_entry("qwen2.5-coder-1.5b").unwrap();
        let mut w = GgufWriter::new();
        w.add_meta(ELASTIC_SOURCE, Value::String(entry.file_name.to_string()));
        let path = arbor_model::testing::write_temp(&w, "ppd-elastic-source");
        assert_eq!(catalog_name(&path), Some("qwen2.5-coder-1.5b"));
        let mut w = GgufWriter::new();
        w.add_meta(ELASTIC_SOURCE, Value::String("elsewhere.gguf".into()));
        let other = arbor_model::testing::write_temp(&w, "ppd-elastic-other");
        assert_eq!(catalog_name(&other), None);
    }

    #[test]
    fn every_shipped_file_reads_and_names_a_catalog_model() {
        for (name, bytes) in SHIPPED {
            let f = PromptFile::from_bytes(bytes).unwrap();
            assert!(f.accuracy.is_some(), "{name}");
            assert!(arbor_fetch::model_entry(name).is_some(), "{name}");
        }
    }

    #[test]
    fn a_file_of_another_width_or_without_accuracy_is_refused() {
        let f = PromptFile {
            hidden: 4,
            vectors: vec![0.0; 8],
            accuracy: Some(arbor_ppd::Accuracy::new(vec![vec![0.5], vec![0.25]]).unwrap()),
            ..PromptFile::default()
        };
        assert!(into_tokens(f.clone(), 8).is_err());
        assert_eq!(into_tokens(f.clone(), 4).unwrap().count(), 2);
        let bare = PromptFile {
            accuracy: None,
            ..f
        };
        assert!(into_tokens(bare, 4).is_err());
    }
}

//! Attaching an elastic level's LoRA adapters (`arbor elastic lora`) to an
//! opened target.

use std::path::Path;

use arbor_elastic::LoraFile;
use arbor_model::LanguageModel;

use crate::{EngineError, Result};

/// Reads the adapters at `path`, runs `model` at their level (which must
/// be `level` when one is asked for) and attaches them; returns the level.
pub fn attach(model: &mut dyn LanguageModel, path: &Path, level: Option<f64>) -> Result<f64> {
    let bytes = std::fs::read(path)
        .map_err(|e| EngineError::Invalid(format!("reading {}: {e}", path.display())))?;
    let file = LoraFile::from_bytes(&bytes)
        .map_err(|e| EngineError::Invalid(format!("{}: {e}", path.display())))?;
    let at = model.set_level(level.unwrap_or(file.level))?;
    if at != file.level {
        return Err(EngineError::Invalid(format!(
            "{} holds adapters for level {}, but the target runs at level {at}",
            path.display(),
            file.level
        )));
    }
    model.attach_lora(&file.to_host())?;
    Ok(at)
}

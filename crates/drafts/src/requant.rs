//! Rewriting a whole model in another storage: every matrix (layers, token
//! table, head) as Q8_0, Q5_0 or F16 blocks made from the source's values,
//! norms and biases as they are. `arbor requant` turns the released
//! Q4_K_M target into the larger Q8_0 and F16 files that real deployments
//! run when quality matters, with the same tokenizer.

use std::path::Path;
use std::time::Instant;

use arbor_gguf::{GgmlType, GgufFile, GgufWriter, Value};

use crate::DraftError;
use crate::slim::Quant;

/// Metadata key naming the file a requantized model was made from.
pub const KEY_SOURCE: &str = "arbor.requant.source";

/// llama.cpp's `general.file_type` for a model whose matrices are all of
/// `ty` (`None`: a type it has no whole-file code for).
fn file_type(ty: GgmlType) -> Option<u32> {
    match ty {
        GgmlType::F16 => Some(1),
        GgmlType::Q8_0 => Some(7),
        GgmlType::Q5_0 => Some(8),
        _ => None,
    }
}

/// What [`requantize`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct RequantReport {
    pub input_bytes: u64,
    pub output_bytes: u64,
    /// Matrices rewritten, and those already of the type (copied).
    pub converted: usize,
    pub copied: usize,
    pub secs: f64,
}

/// Writes to `output` the model `input` with every 2-D tensor stored as
/// `quant` (Keep is refused: nothing would change) and every metadata key
/// kept (`general.file_type` follows the new type). `progress(done,
/// total)` counts tensors.
pub fn requantize(
    input: &Path,
    output: &Path,
    quant: Quant,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<RequantReport, DraftError> {
    if quant == Quant::Keep {
        return Err(DraftError::RequantKeep);
    }
    let start = Instant::now();
    let file = GgufFile::open(input)?;
    let h = file.header();
    // Check every matrix's width first: a refusal writes nothing.
    for info in h.tensors.iter().filter(|i| i.dims.len() == 2) {
        let cols = info.dims[0] as usize;
        if !cols.is_multiple_of(quant.block_len(info.ty)) {
            return Err(DraftError::RowWidth {
                tensor: info.name.clone(),
                cols,
                quant: quant.name(),
            });
        }
    }
    let mut w = GgufWriter::new();
    for (key, value) in &h.metadata {
        w.add_meta(key.clone(), value.clone());
    }
    if let Some(t) = file_type(quant.target(GgmlType::F32)) {
        w.add_meta("general.file_type", Value::U32(t));
    }
    let source = input.file_name().map(|n| n.to_string_lossy().into_owned());
    w.add_meta(KEY_SOURCE, Value::String(source.unwrap_or_default()));
    let mut report = RequantReport {
        input_bytes: file.bytes().len() as u64,
        output_bytes: 0,
        converted: 0,
        copied: 0,
        secs: 0.0,
    };
    let total = h.tensors.len();
    // Declared with their new types, then written a tensor at a time: only
    // one converted tensor is held at once.
    for info in &h.tensors {
        let ty = match info.dims.len() {
            2 => quant.target(info.ty),
            _ => info.ty,
        };
        w.add_tensor_later(&info.name, &info.dims, ty);
    }
    let mut done = 0;
    let mut fill = |name: &str| -> Result<Vec<u8>, DraftError> {
        let info = h.tensor(name)?;
        let bytes = file.tensor_bytes(info);
        let data = if info.dims.len() == 2 {
            let (ty, data) = quant.convert(&info.name, info.ty, info.dims[0] as usize, bytes)?;
            match ty == info.ty {
                true => report.copied += 1,
                false => report.converted += 1,
            }
            data
        } else {
            bytes.to_vec()
        };
        file.release(info);
        done += 1;
        progress(done, total);
        Ok(data)
    };
    // A failed write leaves no file behind.
    w.write_with(output, &mut fill)?;
    report.output_bytes = std::fs::metadata(output).map_or(0, |m| m.len());
    report.secs = start.elapsed().as_secs_f64();
    Ok(report)
}

//! What [`super::derive`] stores each part of the model as.

use std::str::FromStr;

use arbor_gguf::{GgmlType, dequantize, quantize_q5_0, quantize_q8_0, repack_q5_0_to_q8_0};

use crate::DraftError;

/// The storage a tensor is rewritten in. Q8_0 and Q5_0 are the quantized
/// types the candle backend multiplies fast whose blocks (32 values) fit
/// the 0.5B draft's 896-wide rows (K-quants need rows that are multiples of
/// 256); F16 holds any width (`arbor requant` makes larger targets with
/// it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Quant {
    /// The source's bytes, unchanged.
    #[default]
    Keep,
    Q8_0,
    Q5_0,
    F16,
}

impl Quant {
    pub fn name(self) -> &'static str {
        match self {
            Self::Keep => "keep",
            Self::Q8_0 => "q8_0",
            Self::Q5_0 => "q5_0",
            Self::F16 => "f16",
        }
    }

    /// The GGML type of the result for a source of type `source`.
    pub fn target(self, source: GgmlType) -> GgmlType {
        match self {
            Self::Keep => source,
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q5_0 => GgmlType::Q5_0,
            Self::F16 => GgmlType::F16,
        }
    }

    /// Values per block of the result's type: rows must hold whole blocks.
    pub fn block_len(self, source: GgmlType) -> usize {
        self.target(source).block_len()
    }

    /// `bytes` (rows of `cols` values of type `ty`) rewritten in this
    /// storage: copied when the type does not change, repacked exactly for
    /// Q5_0 → Q8_0, else dequantized and quantized again.
    pub(crate) fn convert(
        self,
        name: &str,
        ty: GgmlType,
        cols: usize,
        bytes: &[u8],
    ) -> Result<(GgmlType, Vec<u8>), DraftError> {
        let out = self.target(ty);
        if out == ty {
            return Ok((ty, bytes.to_vec()));
        }
        if !cols.is_multiple_of(out.block_len()) {
            return Err(DraftError::RowWidth {
                tensor: name.to_string(),
                cols,
                quant: self.name(),
            });
        }
        if ty == GgmlType::Q5_0 && out == GgmlType::Q8_0 {
            return Ok((out, repack_q5_0_to_q8_0(bytes)?));
        }
        let n = (bytes.len() as u64 / ty.block_bytes() as u64 * ty.block_len() as u64) as usize;
        let values = dequantize(ty, bytes, n)?;
        Ok((out, quantize(out, &values)))
    }
}

/// `values` as `ty` blocks (`ty` is Q8_0, Q5_0 or F16).
pub(crate) fn quantize(ty: GgmlType, values: &[f32]) -> Vec<u8> {
    match ty {
        GgmlType::Q5_0 => quantize_q5_0(values),
        GgmlType::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => quantize_q8_0(values),
    }
}

impl FromStr for Quant {
    type Err = DraftError;

    fn from_str(s: &str) -> Result<Self, DraftError> {
        match s.to_ascii_lowercase().as_str() {
            "keep" => Ok(Self::Keep),
            "q8_0" | "q8" => Ok(Self::Q8_0),
            "q5_0" | "q5" => Ok(Self::Q5_0),
            "f16" => Ok(Self::F16),
            _ => Err(DraftError::UnknownQuant(s.to_string())),
        }
    }
}

impl std::fmt::Display for Quant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How to derive a slim draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlimOptions {
    /// Rows of the output head: special tokens first, then the most
    /// frequent tokens of the corpus.
    pub k: usize,
    /// Storage of the layers' matrices (norms and biases stay as they are).
    pub layers: Quant,
    /// Storage of the output head's kept rows.
    pub head: Quant,
    /// Storage of the token table (read by rows at run time; its size
    /// costs disk, not memory).
    pub embedding: Quant,
}

impl SlimOptions {
    /// K rows, layers and head in `quant`, the token table kept.
    pub fn new(k: usize, quant: Quant) -> Self {
        Self {
            k,
            layers: quant,
            head: quant,
            embedding: Quant::Keep,
        }
    }
}

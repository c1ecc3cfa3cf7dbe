//! Dequantization of every supported block format to `f32`.
//! (Being filled in.)
use crate::{GgmlType, GgufError, Result};

/// Converts `n` elements stored as `ty` blocks in `bytes` to `f32`.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
    let _ = (ty, bytes, n);
    Err(GgufError::Invalid("dequantize: not yet written".into()))
}

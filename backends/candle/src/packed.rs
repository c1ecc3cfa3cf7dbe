//! Weights held only in candle's repacked tile form.
//!
//! On x86-64 candle multiplies Q4_K (and, with AVX-VNNI/AVX-512 VNNI, Q8_0)
//! matrices through tiles it builds from the GGUF blocks on first use and
//! caches inside the tensor. From then on the blocks are never read again,
//! yet the tensor keeps them: every such weight is held twice (Q4_K tiles
//! are 4/3 of the blocks, so 7/3 of the file in all). Under a memory budget
//! that is the difference between a model fitting or not.
//!
//! [`pack`] builds the tensor over storage we keep a handle to, forces the
//! tiles to be built with one zero row, and then frees the blocks. It is only
//! used when candle is certain to take the tile path for every batch size
//! (see [`tiles_for`]); otherwise weights keep candle's ordinary storage.

use std::sync::{Arc, Mutex};

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor, QuantizedType};
use candle_core::{CpuStorage, DType, Device, Module, Tensor};
use half::f16;

/// Rows per tile and values per K-superblock in candle's x86 tile kernels.
const TILE_ROWS: usize = 16;
const SUPERBLOCK: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Level {
    Avx2,
    Vnni,
}

/// The x86 kernel level candle picks (mirrors its own detection, including
/// its override variables).
fn level() -> Option<Level> {
    #[cfg(target_arch = "x86_64")]
    {
        let force_avx2 = std::env::var("MISTRALRS_FORCE_AVX2").as_deref() == Ok("1");
        let force_vnni = std::env::var("MISTRALRS_FORCE_AVXVNNI").as_deref() == Ok("1");
        if !force_avx2
            && !force_vnni
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vnni")
        {
            return Some(Level::Vnni);
        }
        if !force_avx2 && (force_vnni || is_x86_feature_detected!("avxvnni")) {
            return is_x86_feature_detected!("avx2").then_some(Level::Vnni);
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return Some(Level::Avx2);
        }
        None
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Whether the CPU has AMX-INT8, with which candle builds a second tile set
/// for large Q4_K batches (from the blocks, so they must stay).
fn has_amx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 7, EDX bit 25: AMX-INT8.
        let r = std::arch::x86_64::__cpuid_count(7, 0);
        r.edx & (1 << 25) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Bytes of candle's tiles for a `[rows, cols]` matrix of `ty`, when candle
/// multiplies it through tiles at every batch size; `None` otherwise.
pub(crate) fn tiles_for(ty: GgmlDType, rows: usize, cols: usize) -> Option<usize> {
    let lv = level()?;
    if rows == 0 || !rows.is_multiple_of(TILE_ROWS) || !cols.is_multiple_of(SUPERBLOCK) {
        return None;
    }
    let groups = rows / TILE_ROWS;
    match ty {
        // f32 scales and mins for 8 sub-blocks, then 4-bit values.
        GgmlDType::Q4K if !has_amx() => Some(
            groups * (cols / SUPERBLOCK) * (2 * 8 * TILE_ROWS * 4 + SUPERBLOCK / 2 * TILE_ROWS),
        ),
        // f16 scale and 32 bytes per row per 32-value block.
        GgmlDType::Q8_0 if lv == Level::Vnni => Some(groups * (cols / 32) * TILE_ROWS * (2 + 32)),
        _ => None,
    }
}

/// GGUF blocks that only candle's one-time repacking reads.
struct Blocks {
    dtype: GgmlDType,
    block_len: usize,
    /// `u64` words so the blocks are aligned for any block type.
    words: Mutex<Option<Vec<u64>>>,
    bytes: usize,
}

#[derive(Clone)]
struct Handle(Arc<Blocks>);

fn released() -> candle_core::Error {
    candle_core::Error::Msg("the GGUF blocks of this weight were freed after tiling".into())
}

impl QuantizedType for Handle {
    fn dtype(&self) -> GgmlDType {
        self.0.dtype
    }
    fn matmul_t(
        &self,
        _: (usize, usize, usize),
        _: &[f32],
        _: &mut [f32],
    ) -> candle_core::Result<()> {
        Err(released())
    }
    fn matmul_t_f16(
        &self,
        _: (usize, usize, usize),
        _: &[f16],
        _: &mut [f16],
    ) -> candle_core::Result<()> {
        Err(released())
    }
    fn embedding(&self, _: &[u32], _: usize, _: usize) -> candle_core::Result<CpuStorage> {
        Err(released())
    }
    fn dequantize(&self, _: usize) -> candle_core::Result<CpuStorage> {
        Err(released())
    }
    fn storage_size_in_bytes(&self) -> usize {
        match &*self.0.words.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(_) => self.0.bytes,
            None => 0,
        }
    }
    fn as_ptr(&self) -> *const u8 {
        // Read only while the tiles are built, which happens inside `pack`
        // before the words are freed.
        match &*self.0.words.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(w) => w.as_ptr() as *const u8,
            None => std::ptr::NonNull::<u64>::dangling().as_ptr() as *const u8,
        }
    }
    fn block_size(&self) -> usize {
        self.0.block_len
    }
    fn from_float(&mut self, _: &[f32]) {}
    fn from_float_imatrix(&mut self, _: &[f32], _: &[f32], _: usize) {}
    fn size(&self) -> usize {
        self.storage_size_in_bytes()
    }
}

/// A matmul weight held as candle's tiles only, or `None` when candle would
/// not tile this matrix (the caller then keeps ordinary storage).
pub(crate) fn pack(
    ty: GgmlDType,
    rows: usize,
    cols: usize,
    bytes: &[u8],
) -> candle_core::Result<Option<QMatMul>> {
    if tiles_for(ty, rows, cols).is_none() {
        return Ok(None);
    }
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    // SAFETY: a u64 slice viewed as bytes; lengths checked by the copy.
    let dst = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, bytes.len()) };
    dst.copy_from_slice(bytes);
    let blocks = Arc::new(Blocks {
        dtype: ty,
        block_len: ty.block_size(),
        words: Mutex::new(Some(words)),
        bytes: bytes.len(),
    });
    let storage = QStorage::Cpu(Box::new(Handle(blocks.clone())));
    let mm = QMatMul::from_qtensor(QTensor::new(storage, (rows, cols))?)?;
    // One zero row builds the tiles; a Q4_K or Q8_0 matmul that did not go
    // through them would have failed on `matmul_t` above.
    let zero = Tensor::zeros((1, cols), DType::F32, &Device::Cpu)?;
    mm.forward(&zero)?;
    *blocks.words.lock().unwrap_or_else(|e| e.into_inner()) = None;
    Ok(Some(mm))
}

//! Weight matrices: checking GGUF bytes, choosing the form a weight is held
//! in (GGUF blocks under our kernels, candle's tiles, or candle's block
//! storage, with Q5_0 repacked to Q8_0 for candle), and the Q6_K blocks
//! candle's plain block matmul runs on.

use std::borrow::Cow;

use arbor_tensor::{Backend, GgmlType, Result, SharedBytes, WeightData};
use candle_core::Device;
use candle_core::quantized::k_quants::BlockQ6K;
use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};

use crate::float::FloatWeight;
use crate::{CandleBackend, err, packed, qmm, shape_err};

/// A weight matrix: GGUF blocks under our kernels (`qmm`), float values
/// under our batch-invariant matmul (`float`), or candle's
/// quantized form.
pub struct CandleWeight {
    pub(crate) mm: Held,
    pub(crate) ty: GgmlType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) held: u64,
}

impl CandleWeight {
    /// The type the weight is held in (Q8_0 for a Q5_0 repacked for
    /// candle's kernels).
    pub fn held_as(&self) -> GgmlType {
        self.ty
    }

    /// Bytes the weight holds.
    pub fn held_bytes(&self) -> u64 {
        self.held
    }
}

pub(crate) enum Held {
    Own(qmm::QWeight),
    Float(FloatWeight),
    Candle(QMatMul),
}

/// The Q6_K blocks of a weight, borrowed from candle's storage, or `None`
/// for other types.
pub(crate) fn q6k_blocks(mm: &QMatMul) -> Option<&[BlockQ6K]> {
    let QMatMul::QTensor(qt) = mm else {
        return None;
    };
    if qt.dtype() != GgmlDType::Q6K {
        return None;
    }
    // On the CPU the data is borrowed from candle's `Vec<BlockQ6K>`.
    let Ok(Cow::Borrowed(bytes)) = qt.data() else {
        return None;
    };
    let size = std::mem::size_of::<BlockQ6K>();
    let aligned = (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<BlockQ6K>());
    if !aligned || !bytes.len().is_multiple_of(size) {
        return None;
    }
    // SAFETY: aligned and whole blocks (checked); BlockQ6K is a repr(C)
    // struct of byte arrays and an f16 with no padding (candle asserts its
    // size), so the bytes are valid blocks.
    Some(unsafe {
        std::slice::from_raw_parts(bytes.as_ptr() as *const BlockQ6K, bytes.len() / size)
    })
}

impl CandleBackend {
    /// Whether `ty` (as held) multiplies on our kernels.
    pub(crate) fn own_kernel(&self, ty: GgmlType) -> bool {
        !self.candle_kernels && qmm::Kind::of(ty).is_some() && qmm::available()
    }

    /// The type a weight of type `ty` is held in: candle's kernels get Q5_0
    /// repacked to Q8_0 (candle has no fast Q5_0 path).
    pub(crate) fn held_type(&self, ty: GgmlType) -> GgmlType {
        if ty == GgmlType::Q5_0 && !self.own_kernel(ty) {
            GgmlType::Q8_0
        } else {
            ty
        }
    }

    /// The type and bytes a weight is held in.
    pub(crate) fn held_form<'a>(&self, w: &WeightData<'a>) -> Result<(GgmlType, Cow<'a, [u8]>)> {
        Ok(match self.held_type(w.ty) {
            GgmlType::Q8_0 if w.ty == GgmlType::Q5_0 => (
                GgmlType::Q8_0,
                Cow::Owned(arbor_gguf::quant::repack_q5_0_to_q8_0(w.bytes)?),
            ),
            ty => (ty, Cow::Borrowed(w.bytes)),
        })
    }
}

impl CandleBackend {
    /// Whether a streamed weight of type `ty` and shape `rows × cols` is
    /// kept in its read buffer ([`Backend::streams_in_place`]): GGUF rows
    /// under our kernels, and float values under our float matmul.
    pub(crate) fn in_place(&self, ty: GgmlType, rows: usize, cols: usize) -> bool {
        if self.held_type(ty) != ty {
            return false;
        }
        if self.own_kernel(ty) {
            return true;
        }
        packed::tiles_for(candle_dtype(ty), rows, cols).is_none()
            && matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
            && candle_runs(ty)
    }

    /// [`Backend::streamed_weight_in`]: the weight kept in `keep` where
    /// [`Self::in_place`] says so (and the bytes are aligned for the
    /// type), else built as [`Backend::streamed_weight`] builds it.
    pub(crate) fn weight_in(&self, w: WeightData<'_>, keep: &SharedBytes) -> Result<CandleWeight> {
        check_weight(&w)?;
        if keep.as_slice().as_ptr() != w.bytes.as_ptr() || keep.len() != w.bytes.len() {
            return Err(shape_err(
                "streamed_weight_in",
                format!("`{}`: the kept bytes are not the weight's", w.name),
            ));
        }
        if !self.in_place(w.ty, w.rows, w.cols) {
            return self.weight_with(w, false);
        }
        let kept = match self.own_kernel(w.ty) {
            true => qmm::QWeight::in_place(w.ty, w.rows, w.cols, keep).map(|q| CandleWeight {
                held: q.held_bytes(),
                mm: Held::Own(q),
                ty: w.ty,
                rows: w.rows,
                cols: w.cols,
            }),
            false => {
                FloatWeight::in_place(w.ty, w.rows, w.cols, keep).map(|f| float_weight(f, w.ty))
            }
        };
        // A copy here would hold bytes the streamer's plan did not reserve
        // (it counts kept weights as free): refuse instead. GGUF aligns
        // tensor data to 32 bytes, so only an unusual file gets here.
        kept.ok_or_else(|| {
            shape_err(
                "streamed_weight_in",
                format!(
                    "`{}`: {} values at a misaligned offset cannot be read in place",
                    w.name, w.ty
                ),
            )
        })
    }

    /// [`Backend::weight`], K-quant rows interleaved or not (see
    /// [`qmm::QWeight::with_layout`]).
    pub(crate) fn weight_with(&self, w: WeightData<'_>, interleave: bool) -> Result<CandleWeight> {
        check_weight(&w)?;
        let (ty, bytes) = self.held_form(&w)?;
        if self.own_kernel(ty)
            && let Some(q) = qmm::QWeight::with_layout(ty, w.rows, w.cols, &bytes, interleave)
        {
            return Ok(CandleWeight {
                held: q.held_bytes(),
                mm: Held::Own(q),
                ty,
                rows: w.rows,
                cols: w.cols,
            });
        }
        if let Some(mm) = packed::pack(candle_dtype(ty), w.rows, w.cols, &bytes).map_err(err)? {
            return Ok(CandleWeight {
                mm: Held::Candle(mm),
                ty,
                rows: w.rows,
                cols: w.cols,
                held: self.weight_bytes(w.ty, w.rows, w.cols),
            });
        }
        self.plain_weight(ty, &w, bytes)
    }

    /// A float weight under [`crate::float`], or any other in candle's
    /// ordinary block storage.
    pub(crate) fn plain_weight(
        &self,
        ty: GgmlType,
        w: &WeightData<'_>,
        bytes: Cow<[u8]>,
    ) -> Result<CandleWeight> {
        if !candle_runs(ty) {
            return dequantized(ty, w, &bytes);
        }
        if let Some(f) = FloatWeight::from_bytes(ty, w.rows, w.cols, &bytes) {
            return Ok(float_weight(f, ty));
        }
        let held = bytes.len() as u64;
        let storage = QStorage::from_data(bytes, &Device::Cpu, candle_dtype(ty)).map_err(err)?;
        let qt = QTensor::new(storage, (w.rows, w.cols)).map_err(err)?;
        let mm = QMatMul::from_qtensor(qt).map_err(err)?;
        Ok(CandleWeight {
            mm: Held::Candle(mm),
            ty,
            rows: w.rows,
            cols: w.cols,
            held,
        })
    }
}

/// Whether candle-core's own kernels for `ty` run on this CPU. On aarch64,
/// candle-core 0.11's matmuls for Q4_0, Q8_0 and the K-quants issue `sdot`
/// whether or not the core has dotprod, so on a core without it (a
/// Cortex-A72: Raspberry Pi 4) they die of SIGILL. Q4_1, Q5_0, Q5_1 and
/// the float types are plain Rust or NEON there.
pub(crate) fn candle_runs(ty: GgmlType) -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        use GgmlType as T;
        let uses_sdot = matches!(
            ty,
            T::Q4_0 | T::Q8_0 | T::Q2_K | T::Q3_K | T::Q4_K | T::Q5_K | T::Q6_K | T::Q8_K
        );
        !uses_sdot || std::arch::is_aarch64_feature_detected!("dotprod")
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        let _ = ty;
        true
    }
}

/// A weight candle cannot multiply on this CPU and our kernels do not take
/// (see [`candle_runs`]), held as F32 values under our float matmul: exact
/// values, four bytes each.
fn dequantized(ty: GgmlType, w: &WeightData<'_>, bytes: &[u8]) -> Result<CandleWeight> {
    let values = arbor_gguf::dequantize(ty, bytes, w.rows * w.cols).map_err(err)?;
    let f = FloatWeight::from_f32(w.rows, w.cols, values);
    Ok(float_weight(f, GgmlType::F32))
}

/// A float matrix held as type `ty` under our float matmul.
fn float_weight(f: FloatWeight, ty: GgmlType) -> CandleWeight {
    CandleWeight {
        held: f.held_bytes(),
        rows: f.rows,
        cols: f.cols,
        mm: Held::Float(f),
        ty,
    }
}

pub(crate) fn candle_dtype(ty: GgmlType) -> GgmlDType {
    match ty {
        GgmlType::F32 => GgmlDType::F32,
        GgmlType::F16 => GgmlDType::F16,
        GgmlType::BF16 => GgmlDType::BF16,
        GgmlType::Q4_0 => GgmlDType::Q4_0,
        GgmlType::Q4_1 => GgmlDType::Q4_1,
        GgmlType::Q5_0 => GgmlDType::Q5_0,
        GgmlType::Q5_1 => GgmlDType::Q5_1,
        GgmlType::Q8_0 => GgmlDType::Q8_0,
        GgmlType::Q8_1 => GgmlDType::Q8_1,
        GgmlType::Q2_K => GgmlDType::Q2K,
        GgmlType::Q3_K => GgmlDType::Q3K,
        GgmlType::Q4_K => GgmlDType::Q4K,
        GgmlType::Q5_K => GgmlDType::Q5K,
        GgmlType::Q6_K => GgmlDType::Q6K,
        GgmlType::Q8_K => GgmlDType::Q8K,
    }
}

pub(crate) fn check_weight(w: &WeightData<'_>) -> Result<()> {
    let expected =
        w.ty.bytes_for((w.rows * w.cols) as u64)
            .filter(|&b| b == w.bytes.len() as u64);
    if expected.is_none() || !w.cols.is_multiple_of(w.ty.block_len()) {
        return Err(shape_err(
            "weight",
            format!(
                "`{}`: {} bytes of {} do not make a {}x{} matrix",
                w.name,
                w.bytes.len(),
                w.ty,
                w.rows,
                w.cols
            ),
        ));
    }
    Ok(())
}

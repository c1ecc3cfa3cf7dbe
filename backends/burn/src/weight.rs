//! Weights: dequantized to `f32` and stored transposed, or — on a CubeCL
//! device (wgpu, CUDA) — kept in their GGUF blocks (`crate::cube`).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arbor_tensor::{GgmlType, Result, WeightData, check_part};
use burn::tensor::{Int, Tensor, TensorData, s};

use crate::{BurnBackend, BurnTensor, shape_err};

/// A weight matrix `[out, in]` on the device.
#[derive(Debug)]
pub struct BurnWeight {
    repr: Repr,
    rows: usize,
    cols: usize,
    /// Device bytes, counted in the backend's [`Resident`] while alive.
    bytes: u64,
    resident: Resident,
}

#[derive(Debug)]
enum Repr {
    /// `f32`, transposed: `[in, out]` = `[cols, rows]`.
    Dense(Box<Tensor<2>>),
    /// The file's blocks, multiplied in the shader.
    #[cfg(feature = "cube")]
    Blocks(crate::cube::Blocks),
}

impl BurnWeight {
    /// `(out, in)`: the `[rows, cols]` of the original matrix.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Whether the weight stays in its GGUF blocks on the device (rather
    /// than dequantized to `f32`).
    pub fn is_quantized(&self) -> bool {
        !matches!(self.repr, Repr::Dense(_))
    }
}

/// Row-major `[rows, cols]` → `[cols, rows]`, in cache-sized tiles.
fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const TILE: usize = 32;
    let mut out = vec![0.0; data.len()];
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    out[c * rows + r] = data[r * cols + c];
                }
            }
        }
    }
    out
}

impl BurnBackend {
    /// A weight `[rows, cols]` (row-major, `rows` output features) from
    /// host `f32` values, as [`Backend::weight`](arbor_tensor::Backend::weight)
    /// builds it after dequantizing.
    pub fn weight_f32(&self, data: &[f32], rows: usize, cols: usize) -> Result<BurnWeight> {
        if data.len() != rows * cols || rows == 0 || cols == 0 {
            return Err(shape_err(
                "weight",
                format!("{} values for [{rows}, {cols}]", data.len()),
            ));
        }
        let wt = self.upload(transpose(data, rows, cols), [cols, rows]);
        Ok(self.held(
            Repr::Dense(Box::new(wt)),
            rows,
            cols,
            (rows * cols * 4) as u64,
        ))
    }

    /// Device bytes held by the weights this backend (or a clone of it)
    /// has loaded and not yet dropped — what [`weight_bytes`] promised.
    ///
    /// [`weight_bytes`]: arbor_tensor::Backend::weight_bytes
    pub fn resident_weight_bytes(&self) -> u64 {
        self.resident.get()
    }

    /// What CubeCL's memory pools hold on this backend's device: bytes
    /// reserved from the driver and bytes in use (`None` off CubeCL).
    pub fn device_memory(&self) -> Option<(u64, u64)> {
        #[cfg(feature = "cube")]
        if self.blocks {
            return crate::cube::device_memory(&self.device).ok();
        }
        None
    }

    fn held(&self, repr: Repr, rows: usize, cols: usize, bytes: u64) -> BurnWeight {
        self.resident.add(bytes);
        BurnWeight {
            repr,
            rows,
            cols,
            bytes,
            resident: self.resident.clone(),
        }
    }

    /// `w` on the device; `persistent` for a weight held for the run (not
    /// one streamed for a pass).
    pub(crate) fn load_weight(&self, w: WeightData<'_>, persistent: bool) -> Result<BurnWeight> {
        #[cfg(feature = "cube")]
        if self.blocks
            && let Some(b) =
                crate::cube::Blocks::upload(&self.device, &w, self.max_buffer, persistent)?
        {
            let bytes = b.bytes();
            return Ok(self.held(Repr::Blocks(b), w.rows, w.cols, bytes));
        }
        let _ = persistent;
        self.weight_f32(&w.to_f32()?, w.rows, w.cols)
    }

    pub(crate) fn bytes_of_weight(&self, ty: GgmlType, rows: usize, cols: usize) -> u64 {
        #[cfg(feature = "cube")]
        if self.blocks
            && let Some(bytes) = crate::cube::block_bytes(ty, rows, cols)
        {
            return bytes;
        }
        let _ = ty;
        (rows * cols * 4) as u64
    }

    /// `x[:, cols] · W[0..rows, cols]ᵀ`, where `x` is `cols.len()` wide or
    /// as wide as the weight; plus `add` (`[1, rows]` or `[n, rows]`, not
    /// checked here) when given: in the matmul's last step on our kernels,
    /// as a burn add otherwise.
    pub(crate) fn weight_matmul(
        &self,
        x: &BurnTensor,
        w: &BurnWeight,
        rows: usize,
        cols: Range<usize>,
        add: Option<&BurnTensor>,
    ) -> Result<BurnTensor> {
        let [_, k] = x.0.dims();
        check_part("matmul_part", w.shape(), rows, &cols, k)?;
        #[cfg(feature = "cube")]
        if let Repr::Blocks(b) = &w.repr
            && self.own_kernels(&x.0)
            && add.is_none_or(|a| self.own_kernels(&a.0))
            && crate::cube::Blocks::aligned(&cols)
        {
            let x_col = if cols.len() != k { cols.start } else { 0 };
            let add = add.map(|a| &a.0);
            return Ok(BurnTensor(b.matmul(&x.0, x_col, rows, cols, add)?));
        }
        let y = self.unfused_matmul(x, w, rows, cols)?;
        Ok(match add {
            Some(a) => BurnTensor(y.0 + a.0.clone()),
            None => y,
        })
    }

    fn unfused_matmul(
        &self,
        x: &BurnTensor,
        w: &BurnWeight,
        rows: usize,
        cols: Range<usize>,
    ) -> Result<BurnTensor> {
        let [n, k] = x.0.dims();
        let narrow = cols.len() != k;
        match &w.repr {
            Repr::Dense(wt) => {
                let x = match narrow {
                    true => x.0.clone().slice(s![0..n, cols.clone()]),
                    false => x.0.clone(),
                };
                let part = match (rows == w.rows, cols.len() == w.cols) {
                    (true, true) => wt.as_ref().clone(),
                    _ => wt.as_ref().clone().slice(s![cols, 0..rows]),
                };
                Ok(BurnTensor(x.matmul(part)))
            }
            #[cfg(feature = "cube")]
            Repr::Blocks(b) => {
                // Tracked activations (training) and odd column ranges take
                // the weight dequantized, through burn's own matmul.
                let all: Vec<u32> = (0..rows as u32).collect();
                let part = b.rows(&self.device, &all)?.slice(s![0..rows, cols.clone()]);
                let x = match narrow {
                    true => x.0.clone().slice(s![0..n, cols]),
                    false => x.0.clone(),
                };
                Ok(BurnTensor(x.matmul(part.transpose())))
            }
        }
    }

    pub(crate) fn weight_embed(&self, table: &BurnWeight, ids: &[u32]) -> Result<BurnTensor> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= table.rows) {
            return Err(shape_err(
                "embed",
                format!("token {bad} outside a table of {} rows", table.rows),
            ));
        }
        if ids.is_empty() {
            return Err(shape_err("embed", "no tokens".into()));
        }
        match &table.repr {
            Repr::Dense(wt) => {
                // Stored transposed ([dim, vocab]): pick columns.
                let idx: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
                let idx =
                    Tensor::<1, Int>::from_data(TensorData::new(idx, [ids.len()]), &self.device);
                Ok(BurnTensor(wt.as_ref().clone().select(1, idx).transpose()))
            }
            #[cfg(feature = "cube")]
            Repr::Blocks(b) => Ok(BurnTensor(b.rows(&self.device, ids)?)),
        }
    }
}

impl Drop for BurnWeight {
    fn drop(&mut self) {
        self.resident.sub(self.bytes);
    }
}

/// Device bytes held by weights, shared by a backend's clones.
#[derive(Clone, Debug, Default)]
pub(crate) struct Resident(Arc<AtomicU64>);

impl Resident {
    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    fn add(&self, bytes: u64) {
        self.0.fetch_add(bytes, Ordering::Relaxed);
    }
    fn sub(&self, bytes: u64) {
        self.0.fetch_sub(bytes, Ordering::Relaxed);
    }
}

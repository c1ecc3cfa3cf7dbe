//! [`Backend`] for [`CandleBackend`]: the model's ops over host `f32`
//! matrices, matmuls on our kernels or candle's, attention shared out over
//! candle's thread pool.

use arbor_tensor::{
    Backend, GgmlType, Heads, KvFormat, Mask, Result, Rope, SharedBytes, WeightData, check_part,
    matmul_part_padded, matmul_sum_parts, reference, sum_segments,
};
use candle_core::quantized::k_quants;
use candle_core::{Device, Module, Tensor};

use crate::attention::dot;
use crate::weight::{Held, candle_dtype, check_weight, q6k_blocks};
use crate::{CandleBackend, CandleWeight, HostKv, HostTensor, NAME, err, packed, shape_err};

fn to_candle(x: &HostTensor) -> Result<Tensor> {
    Tensor::from_slice(&x.data, (x.rows, x.cols), &Device::Cpu).map_err(err)
}

fn from_candle(t: &Tensor) -> Result<HostTensor> {
    let (rows, cols) = t.dims2().map_err(err)?;
    let data = t
        .flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(err)?;
    Ok(HostTensor { data, rows, cols })
}

impl Backend for CandleBackend {
    type Tensor = HostTensor;
    type Weight = CandleWeight;
    type Kv = HostKv;

    fn name(&self) -> &'static str {
        NAME
    }

    fn weight(&self, w: WeightData<'_>) -> Result<CandleWeight> {
        self.weight_with(w, true)
    }

    /// Layers streamed under a memory budget keep their GGUF rows:
    /// interleaving a whole layer costs more than a one-row pass saves.
    /// Passes of many tokens lay groups of rows out in passing, and Q8_0
    /// rows are transposed in registers (see `qmm`).
    fn streamed_weight(&self, w: WeightData<'_>) -> Result<CandleWeight> {
        self.weight_with(w, false)
    }

    /// GGUF rows under our kernels and float values stay in the streamer's
    /// read buffer: a streamed layer then costs its buffer and no copy.
    fn streams_in_place(&self, ty: GgmlType, rows: usize, cols: usize) -> bool {
        self.in_place(ty, rows, cols)
    }

    fn streamed_weight_in(&self, w: WeightData<'_>, keep: &SharedBytes) -> Result<CandleWeight> {
        self.weight_in(w, keep)
    }

    /// Float values under our float matmul are held as the file stores
    /// them, resident or streamed; our kernels' resident weights are laid
    /// out again.
    fn holds_as_read(&self, ty: GgmlType, rows: usize, cols: usize) -> bool {
        !self.own_kernel(ty) && self.in_place(ty, rows, cols)
    }

    fn embedding_table(&self, w: WeightData<'_>) -> Result<CandleWeight> {
        check_weight(&w)?;
        // Our kernels' weights look rows up from their blocks (a tied table
        // is also the output head); candle's tiles cannot.
        if self.own_kernel(self.held_type(w.ty)) {
            return self.weight(w);
        }
        let (ty, bytes) = self.held_form(&w)?;
        self.plain_weight(ty, &w, bytes)
    }

    fn weight_bytes(&self, ty: GgmlType, rows: usize, cols: usize) -> u64 {
        let held = self.held_type(ty);
        // Our kernels hold the blocks; candle may hold tiles instead.
        let tiles = if self.own_kernel(held) {
            None
        } else {
            packed::tiles_for(candle_dtype(held), rows, cols)
        };
        tiles
            .map(|b| b as u64)
            .or_else(|| held.bytes_for((rows * cols) as u64))
            .unwrap_or(0)
    }

    fn tensor(&self, data: &[f32], rows: usize, cols: usize) -> Result<HostTensor> {
        self.tensor_from_vec(data.to_vec(), rows, cols)
    }

    fn tensor_from_vec(&self, data: Vec<f32>, rows: usize, cols: usize) -> Result<HostTensor> {
        if data.len() != rows * cols {
            return Err(shape_err(
                "tensor",
                format!("{} values for a {rows}x{cols} tensor", data.len()),
            ));
        }
        Ok(HostTensor { data, rows, cols })
    }

    fn shape(&self, x: &HostTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn to_vec(&self, x: &HostTensor) -> Result<Vec<f32>> {
        Ok(x.data.clone())
    }

    fn take_vec(&self, x: HostTensor) -> Result<Vec<f32>> {
        Ok(x.data)
    }

    fn embed(&self, table: &CandleWeight, ids: &[u32]) -> Result<HostTensor> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= table.rows) {
            return Err(shape_err(
                "embed",
                format!("token id {bad} is outside a vocabulary of {}", table.rows),
            ));
        }
        let mm = match &table.mm {
            Held::Candle(mm) => mm,
            Held::Float(f) => {
                return Ok(HostTensor {
                    data: f.gather(ids),
                    rows: ids.len(),
                    cols: table.cols,
                });
            }
            Held::Own(q) => {
                let rows: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
                let data =
                    arbor_gguf::dequantize(table.ty, &q.gguf_rows(&rows), rows.len() * table.cols)
                        .map_err(err)?;
                return Ok(HostTensor {
                    data,
                    rows: ids.len(),
                    cols: table.cols,
                });
            }
        };
        let ids = Tensor::from_slice(ids, ids.len(), &Device::Cpu).map_err(err)?;
        from_candle(&mm.embedding(&ids).map_err(err)?)
    }

    fn matmul(&self, x: &HostTensor, w: &CandleWeight) -> Result<HostTensor> {
        if x.cols != w.cols {
            return Err(shape_err(
                "matmul",
                format!(
                    "x is [{}, {}], weight is [{}, {}]",
                    x.rows, x.cols, w.rows, w.cols
                ),
            ));
        }
        let data = match &w.mm {
            Held::Own(q) => q.matmul(&x.data, x.rows),
            Held::Float(f) => {
                let mut data = vec![0f32; x.rows * w.rows];
                f.matmul(&x.data, x.rows, &mut data);
                data
            }
            Held::Candle(mm) => match q6k_blocks(mm) {
                Some(blocks) => {
                    let mut data = vec![0f32; x.rows * w.rows];
                    k_quants::matmul((x.rows, x.cols, w.rows), &x.data, blocks, &mut data)
                        .map_err(err)?;
                    data
                }
                None => return from_candle(&mm.forward(&to_candle(x)?).map_err(err)?),
            },
        };
        Ok(HostTensor {
            data,
            rows: x.rows,
            cols: w.rows,
        })
    }

    fn weight_shape(&self, w: &CandleWeight) -> (usize, usize) {
        (w.rows, w.cols)
    }

    /// In place for weights under our kernels and float weights; candle's
    /// own forms take the padded path.
    fn matmul_part(
        &self,
        x: &HostTensor,
        w: &CandleWeight,
        rows: usize,
        cols: std::ops::Range<usize>,
    ) -> Result<HostTensor> {
        check_part("matmul_part", (w.rows, w.cols), rows, &cols, x.cols)?;
        let xs = columns(x, cols.clone());
        let data = match &w.mm {
            Held::Own(q) => {
                let part = q.part(rows, &cols).ok_or_else(|| {
                    shape_err(
                        "matmul_part",
                        format!(
                            "rows ..{rows} and columns {cols:?} do not fall on the {} blocks of `{}` \
                             (or, for interleaved K-quant rows, on groups of eight)",
                            w.ty, w.rows
                        ),
                    )
                })?;
                q.matmul_part(&xs, x.rows, &part)
            }
            Held::Float(f) => {
                let mut data = vec![0f32; x.rows * rows];
                f.matmul_part(&xs, x.rows, rows, cols, &mut data);
                data
            }
            Held::Candle(_) => return matmul_part_padded(self, x, w, rows, cols),
        };
        Ok(HostTensor {
            data,
            rows: x.rows,
            cols: rows,
        })
    }

    /// Fused for weights under our kernels (one pass over the rows, each
    /// output's segments summed in turn); other weights take the parts one
    /// at a time.
    fn matmul_sum(
        &self,
        x: &HostTensor,
        w: &CandleWeight,
        rows: usize,
        ends: &[usize],
    ) -> Result<HostTensor> {
        let segs = sum_segments(ends)?;
        let end = segs.last().map_or(0, |s| s.end);
        check_part("matmul_sum", (w.rows, w.cols), rows, &(0..end), x.cols)?;
        let fused = match &w.mm {
            Held::Own(q) => q.sum_part(rows, &segs).map(|p| (q, p)),
            _ => None,
        };
        let Some((q, (part, blocks))) = fused else {
            return matmul_sum_parts(self, x, w, rows, ends);
        };
        let xs = columns(x, 0..end);
        let data = q.matmul_sum(&xs, x.rows, &part, &blocks);
        Ok(HostTensor {
            data,
            rows: x.rows,
            cols: rows,
        })
    }

    fn matmul_tensor(&self, x: &HostTensor, m: &HostTensor) -> Result<HostTensor> {
        if x.cols != m.rows {
            return Err(shape_err(
                "matmul_tensor",
                format!("[{}, {}] · [{}, {}]", x.rows, x.cols, m.rows, m.cols),
            ));
        }
        let mut data = vec![0.0f32; x.rows * m.cols];
        for (out, row) in data
            .chunks_exact_mut(m.cols)
            .zip(x.data.chunks_exact(x.cols))
        {
            for (&v, mrow) in row.iter().zip(m.data.chunks_exact(m.cols)) {
                out.iter_mut().zip(mrow).for_each(|(o, w)| *o += v * w);
            }
        }
        Ok(HostTensor {
            data,
            rows: x.rows,
            cols: m.cols,
        })
    }

    fn add(&self, a: &HostTensor, b: &HostTensor) -> Result<HostTensor> {
        if a.cols != b.cols || (b.rows != a.rows && b.rows != 1) {
            return Err(shape_err(
                "add",
                format!("[{}, {}] + [{}, {}]", a.rows, a.cols, b.rows, b.cols),
            ));
        }
        let mut out = a.clone();
        for (i, row) in out.data.chunks_exact_mut(a.cols).enumerate() {
            let brow = &b.data[(i % b.rows) * b.cols..][..b.cols];
            for (o, v) in row.iter_mut().zip(brow) {
                *o += v;
            }
        }
        Ok(out)
    }

    fn scale_cols(&self, x: &HostTensor, s: &HostTensor) -> Result<HostTensor> {
        if s.rows != 1 || s.cols != x.cols {
            return Err(shape_err(
                "scale_cols",
                format!("[{}, {}] by [{}, {}]", x.rows, x.cols, s.rows, s.cols),
            ));
        }
        let mut out = x.clone();
        for row in out.data.chunks_exact_mut(x.cols) {
            row.iter_mut().zip(&s.data).for_each(|(v, k)| *v *= k);
        }
        Ok(out)
    }

    fn swiglu(&self, gate: &HostTensor, up: &HostTensor) -> Result<HostTensor> {
        if (gate.rows, gate.cols) != (up.rows, up.cols) {
            return Err(shape_err("swiglu", "gate and up differ in shape".into()));
        }
        let data = gate
            .data
            .iter()
            .zip(&up.data)
            .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        Ok(HostTensor { data, ..*gate })
    }

    fn rms_norm(&self, x: &HostTensor, weight: &HostTensor, eps: f32) -> Result<HostTensor> {
        if weight.data.len() != x.cols {
            return Err(shape_err(
                "rms_norm",
                format!(
                    "weight has {} values for {} columns",
                    weight.data.len(),
                    x.cols
                ),
            ));
        }
        let mut out = x.clone();
        for row in out.data.chunks_exact_mut(x.cols) {
            let ms = dot(row, row) / x.cols as f32;
            let scale = 1.0 / (ms + eps).sqrt();
            for (o, w) in row.iter_mut().zip(&weight.data) {
                *o *= scale * w;
            }
        }
        Ok(out)
    }

    fn rope(&self, x: &HostTensor, positions: &[u32], rope: &Rope) -> Result<HostTensor> {
        let d = rope.head_dim;
        if positions.len() != x.rows || d == 0 || !d.is_multiple_of(2) || !x.cols.is_multiple_of(d)
        {
            return Err(shape_err(
                "rope",
                format!(
                    "{} positions for [{}, {}] with head_dim {d}",
                    positions.len(),
                    x.rows,
                    x.cols
                ),
            ));
        }
        let mut out = x.clone();
        reference::rope(&mut out.data, x.cols, positions, rope);
        Ok(out)
    }

    fn select_rows(&self, x: &HostTensor, rows: &[usize]) -> Result<HostTensor> {
        let mut data = Vec::with_capacity(rows.len() * x.cols);
        for &r in rows {
            if r >= x.rows {
                return Err(shape_err("select_rows", format!("row {r} of {}", x.rows)));
            }
            data.extend_from_slice(&x.data[r * x.cols..][..x.cols]);
        }
        Ok(HostTensor {
            data,
            rows: rows.len(),
            cols: x.cols,
        })
    }

    fn kv_format(&self) -> KvFormat {
        self.kv
    }

    fn kv_new(&self, heads: &Heads) -> Result<HostKv> {
        HostKv::new(heads, self.kv)
    }

    fn kv_len(&self, kv: &HostKv) -> usize {
        kv.len
    }

    fn kv_append(&self, kv: &mut HostKv, k: &HostTensor, v: &HostTensor) -> Result<()> {
        if k.cols != kv.kv_dim || v.cols != kv.kv_dim || k.rows != v.rows {
            return Err(shape_err(
                "kv_append",
                format!(
                    "k [{}, {}], v [{}, {}] into a cache of width {}",
                    k.rows, k.cols, v.rows, v.cols, kv.kv_dim
                ),
            ));
        }
        // f16 and Q8_0 storage rounds by itself; f32 storage keeps what
        // attention would read.
        let (k, v) = match self.kv {
            KvFormat::F32 => (self.round(&k.data), self.round(&v.data)),
            _ => (k.data.as_slice().into(), v.data.as_slice().into()),
        };
        kv.append(&k, &v, k.len() / kv.kv_dim.max(1));
        Ok(())
    }

    fn kv_truncate(&self, kv: &mut HostKv, len: usize) -> Result<()> {
        if len > kv.len {
            return Err(shape_err(
                "kv_truncate",
                format!("to {len} of {} positions", kv.len),
            ));
        }
        kv.truncate(len);
        Ok(())
    }

    fn kv_keep(&self, kv: &mut HostKv, positions: &[usize]) -> Result<()> {
        if positions.windows(2).any(|w| w[0] >= w[1])
            || positions.last().is_some_and(|&p| p >= kv.len)
        {
            return Err(shape_err(
                "kv_keep",
                format!("positions must increase and stay below {}", kv.len),
            ));
        }
        // Positions increase, so each row moves down (or stays): copying in
        // order never overwrites a row still to be read.
        for (dst, &src) in positions.iter().enumerate() {
            kv.copy_row(src, dst);
        }
        self.kv_truncate(kv, positions.len())
    }

    fn attention(&self, q: &HostTensor, kv: &HostKv, mask: &Mask, h: &Heads) -> Result<HostTensor> {
        self.attend(q, kv, mask, h)
    }
}

/// Columns `cols` of `x`, row after row, contiguous (borrowed when they are
/// all of `x`'s): what a weight's part multiplies.
fn columns(x: &HostTensor, cols: std::ops::Range<usize>) -> std::borrow::Cow<'_, [f32]> {
    match cols.len() == x.cols {
        true => std::borrow::Cow::Borrowed(&x.data),
        false => (x.data.chunks_exact(x.cols))
            .flat_map(|r| r[cols.clone()].iter().copied())
            .collect(),
    }
}

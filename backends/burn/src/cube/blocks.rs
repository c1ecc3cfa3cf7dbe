//! GGUF blocks on a CubeCL device (wgpu): uploaded as the file holds
//! them, multiplied and gathered by the kernels in [`super::kernels`], so a
//! weight takes about its file bytes of device memory instead of four
//! bytes per value.
//!
//! burn's own quantized tensors cannot hold these formats exactly: they
//! are symmetric (no per-block minimum, so no Q4_1, Q5_1, Q4_K, Q5_K) and
//! have no 5- or 6-bit values (no Q5_0, Q6_K). The kernels here read
//! ggml's layouts directly instead; burn still owns the buffers (a `u32`
//! tensor per weight) and runs everything else.

use std::ops::Range;

use arbor_tensor::{Error, GgmlType, Result, WeightData};
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_cubecl::Cube;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{grid, grid_dim, kernels, output, primitive};

/// How one GGUF type is laid out on the device. Sizes come from the file
/// format (`GgmlType::block_len`, `block_bytes`); F16 and BF16 are taken
/// 32 values at a time.
#[derive(Clone, Copy, Debug)]
struct Format {
    code: u32,
    /// Values per block (a group of 32 for F16 and BF16).
    values: usize,
    /// Bytes per block in the file.
    bytes: usize,
    /// Where two zero bytes go to align the rest of the block to words.
    pad_at: Option<usize>,
}

impl Format {
    fn of(ty: GgmlType) -> Option<Format> {
        use kernels as k;
        let (code, pad_at) = match ty {
            GgmlType::F16 => (k::F16, None),
            GgmlType::BF16 => (k::BF16, None),
            GgmlType::Q4_0 => (k::Q4_0, Some(2)),
            GgmlType::Q4_1 => (k::Q4_1, None),
            GgmlType::Q5_0 => (k::Q5_0, Some(2)),
            GgmlType::Q5_1 => (k::Q5_1, None),
            GgmlType::Q8_0 => (k::Q8_0, Some(2)),
            GgmlType::Q4_K => (k::Q4_K, None),
            GgmlType::Q5_K => (k::Q5_K, None),
            GgmlType::Q6_K => (k::Q6_K, Some(ty.block_bytes())),
            _ => return None,
        };
        let values = ty.block_len().max(kernels::LANES);
        Some(Format {
            code,
            values,
            bytes: values / ty.block_len() * ty.block_bytes(),
            pad_at,
        })
    }

    /// Bytes per block on the device (a multiple of 4).
    fn packed(&self) -> usize {
        self.bytes + if self.pad_at.is_some() { 2 } else { 0 }
    }

    /// Device words of one row of `cols` values.
    fn row_words(&self, cols: usize) -> usize {
        cols / self.values * self.packed() / 4
    }

    /// File bytes of one row of `cols` values.
    fn row_bytes(&self, cols: usize) -> usize {
        cols / self.values * self.bytes
    }

    /// The format of a `[rows, cols]` weight of type `ty`, when the kernels
    /// take it (rows of whole blocks).
    fn for_weight(ty: GgmlType, rows: usize, cols: usize) -> Option<Format> {
        Self::of(ty).filter(|f| rows > 0 && cols > 0 && cols.is_multiple_of(f.values))
    }

    /// Where the two pad bytes go, as the `pack` kernel takes it (past
    /// the block when there are none).
    fn pad_code(&self) -> u32 {
        self.pad_at.map_or(u32::MAX - 2, |at| at as u32)
    }

    /// The file's rows (`bytes`) as device words, packed on the device:
    /// the bytes go up as they are and the `pack` kernel lays them out
    /// (each block padded to whole words, rows in tiles of 32 interleaved
    /// word by word, the last tile filled with zero rows). A layer
    /// streamed to the GPU on every pass is packed on every pass, so the
    /// host only copies. A `persistent` weight (held for the run) gets a
    /// buffer of exactly its size from CubeCL's persistent pool; a
    /// streamed one comes from the pools that recycle buffers pass to pass.
    fn pack_on(
        &self,
        device: &Device,
        bytes: &[u8],
        rows: usize,
        cols: usize,
        persistent: bool,
    ) -> Result<Tensor<1, Int>> {
        let (row_words, row_bytes) = (self.row_words(cols), self.row_bytes(cols));
        let mut raw = vec![0u32; bytes.len().div_ceil(4)];
        copy_bytes(&mut raw, bytes);
        let raw_len = raw.len();
        let raw =
            Tensor::<1, Int>::from_data(TensorData::new(raw, [raw_len]), (device, DType::U32));
        let raw = primitive(raw)?;
        let len = rows.div_ceil(kernels::LANES) * kernels::LANES * row_words;
        let place = (raw.client.clone(), raw.device.clone());
        let empty = move |(client, device)| {
            burn_cubecl::ops::numeric::empty_device_dtype(
                client,
                device,
                burn::tensor::Shape::new([len]),
                DType::U32,
            )
        };
        let client = raw.client.clone();
        let out = match persistent {
            true => client.memory_persistent_allocation(place, empty),
            false => empty(place),
        };
        unsafe {
            kernels::pack::launch_unchecked(
                &client,
                grid(len),
                grid_dim(),
                raw.into_buffer_arg(),
                out.clone().into_buffer_arg(),
                len as u32,
                rows as u32,
                row_bytes as u32,
                row_words as u32,
                self.bytes as u32,
                self.packed() as u32,
                self.pad_code(),
            )
        };
        Ok(Tensor::from_primitive::<Cube>(out))
    }

    /// [`pack_on`](Self::pack_on) on the host: the reference the device
    /// packing is tested against.
    #[cfg(test)]
    fn pack(&self, bytes: &[u8], rows: usize, cols: usize) -> Vec<u32> {
        use rayon::prelude::*;
        let lanes = kernels::LANES;
        let (row_words, row_bytes) = (self.row_words(cols), self.row_bytes(cols));
        let mut words = vec![0u32; rows.div_ceil(lanes) * lanes * row_words];
        words
            .par_chunks_mut(lanes * row_words)
            .zip(bytes.par_chunks(lanes * row_bytes))
            .for_each(|(tile, src)| {
                let mut block = vec![0u8; self.packed()];
                for (l, src_row) in src.chunks_exact(row_bytes).enumerate() {
                    for (b, src) in src_row.chunks_exact(self.bytes).enumerate() {
                        match self.pad_at {
                            Some(at) => {
                                block[..at].copy_from_slice(&src[..at]);
                                block[at..at + 2].fill(0);
                                block[at + 2..].copy_from_slice(&src[at..]);
                            }
                            None => block.copy_from_slice(src),
                        }
                        let k0 = b * self.packed() / 4;
                        for (k, w) in block.chunks_exact(4).enumerate() {
                            tile[(k0 + k) * lanes + l] =
                                u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                        }
                    }
                }
            });
        words
    }
}

/// `bytes` into the words of `dst` (little-endian; `dst` holds at least
/// `bytes.len()` bytes, the rest stays zero), in parallel: a streamed
/// layer is copied on every pass.
fn copy_bytes(dst: &mut [u32], bytes: &[u8]) {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 20;
    let dst: &mut [u8] = bytemuck::cast_slice_mut(dst);
    dst[..bytes.len()]
        .par_chunks_mut(PIECE)
        .zip(bytes.par_chunks(PIECE))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

/// A weight's blocks on the device, in chunks of whole tiles of rows.
#[derive(Debug)]
pub(crate) struct Blocks {
    chunks: Vec<Chunk>,
    format: Format,
    cols: usize,
}

/// Rows `row0..row0 + rows` of a weight in one device buffer.
#[derive(Debug)]
struct Chunk {
    words: Tensor<1, Int>,
    row0: usize,
    rows: usize,
}

/// The largest buffer a weight is kept in by default: wgpu's default
/// storage-binding limit, and the device limit of lavapipe and of many
/// phone GPUs. A larger weight (an output head) is kept in several buffers
/// of whole tiles of rows.
pub(crate) const MAX_BUFFER_BYTES: usize = 1 << 27;

/// Device bytes of a `[rows, cols]` weight of type `ty` kept as blocks, or
/// `None` when the kernels do not take it.
pub(crate) fn block_bytes(ty: GgmlType, rows: usize, cols: usize) -> Option<u64> {
    let f = Format::for_weight(ty, rows, cols)?;
    let rows = rows.div_ceil(kernels::LANES) * kernels::LANES;
    Some((rows * f.row_words(cols) * 4) as u64)
}

/// How many slices a product over `groups` groups of 32 values is cut
/// into: enough units to fill a GPU when one row is multiplied, each slice
/// at least 16 groups (512 values).
fn splits(groups: usize) -> usize {
    (groups / 16).clamp(1, 32)
}

/// Activation rows one unit of the matmul takes for a pass of `n` rows:
/// more rows share each dequantized group, fewer leave more units to run
/// side by side; a row's bits do not depend on it. Four at most: on an
/// H200 it gave the lowest pass times up to 32 rows on the 1.5B shape and
/// up to 16 on the 7B (eight was 4-7% faster there from 32 rows on, and
/// 30-40% slower on the 1.5B; docs/gpu.md).
fn rows_per_unit(n: usize) -> usize {
    kernels::TILE.min(n.next_power_of_two())
}

impl Blocks {
    /// Uploads `w` as blocks in buffers of at most `max_buffer` bytes (a
    /// tile of 32 rows at least), or `None` when the kernels do not take
    /// its type or shape.
    pub(crate) fn upload(
        device: &Device,
        w: &WeightData<'_>,
        max_buffer: usize,
        persistent: bool,
    ) -> Result<Option<Blocks>> {
        let Some(format) = Format::for_weight(w.ty, w.rows, w.cols) else {
            return Ok(None);
        };
        let want = format.row_bytes(w.cols) * w.rows;
        if w.bytes.len() != want {
            return Err(Error::Shape {
                op: "weight",
                detail: format!(
                    "{} bytes for a [{}, {}] {:?} weight (want {want})",
                    w.bytes.len(),
                    w.rows,
                    w.cols,
                    w.ty
                ),
            });
        }
        let lanes = kernels::LANES;
        let (row_words, row_bytes) = (format.row_words(w.cols), format.row_bytes(w.cols));
        let per_chunk = (max_buffer / (4 * row_words) / lanes).max(1) * lanes;
        let chunks = (0..w.rows)
            .step_by(per_chunk)
            .map(|row0| {
                let rows = per_chunk.min(w.rows - row0);
                let src = &w.bytes[row0 * row_bytes..(row0 + rows) * row_bytes];
                Ok(Chunk {
                    words: format.pack_on(device, src, rows, w.cols, persistent)?,
                    row0,
                    rows,
                })
            })
            .collect::<Result<_>>()?;
        let blocks = Blocks {
            chunks,
            format,
            cols: w.cols,
        };
        Ok(Some(blocks))
    }

    pub(crate) fn bytes(&self) -> u64 {
        let lanes = kernels::LANES;
        let rows: usize = self
            .chunks
            .iter()
            .map(|c| c.rows.div_ceil(lanes) * lanes)
            .sum();
        (rows * self.row_words() * 4) as u64
    }

    fn row_words(&self) -> usize {
        self.format.row_words(self.cols)
    }

    /// Whether a column range can be read group by group.
    pub(crate) fn aligned(cols: &Range<usize>) -> bool {
        cols.start.is_multiple_of(kernels::LANES) && cols.len().is_multiple_of(kernels::LANES)
    }

    /// `x[:, x_col..x_col + cols.len()] · W[0..rows, cols]ᵀ` as `[n, rows]`,
    /// plus `add` (`[1, rows]` or `[n, rows]`) when given, added to each
    /// finished sum; `cols` must be [`aligned`](Self::aligned).
    pub(crate) fn matmul(
        &self,
        x: &Tensor<2>,
        x_col: usize,
        rows: usize,
        cols: Range<usize>,
        add: Option<&Tensor<2>>,
    ) -> Result<Tensor<2>> {
        let x = into_contiguous(primitive(x.clone())?);
        let chunks: Vec<&Chunk> = self.chunks.iter().take_while(|c| c.row0 < rows).collect();
        if let [c] = chunks[..] {
            let add = match add {
                Some(a) => Some(into_contiguous(primitive(a.clone())?)),
                None => None,
            };
            return self.chunk_matmul(&x, c, x_col, rows.min(c.rows), cols, add);
        }
        let mut outs = Vec::new();
        for c in chunks {
            let rows = c.rows.min(rows - c.row0);
            outs.push(self.chunk_matmul(&x, c, x_col, rows, cols.clone(), None)?);
        }
        let out = Tensor::cat(outs, 1);
        Ok(match add {
            Some(a) => out + a.clone(),
            None => out,
        })
    }

    /// [`matmul`](Self::matmul) by the first `rows` rows of one chunk.
    fn chunk_matmul(
        &self,
        x: &CubeTensor,
        chunk: &Chunk,
        x_col: usize,
        rows: usize,
        cols: Range<usize>,
        add: Option<CubeTensor>,
    ) -> Result<Tensor<2>> {
        let [n, stride] = [x.meta.shape()[0], x.meta.shape()[1]];
        // A bias row is added to every row (stride 0), a residual row by
        // row; without one the kernels get a one-value stand-in.
        let add_stride = match &add {
            Some(a) if a.meta.shape()[0] > 1 => rows,
            _ => 0,
        };
        let with_add = add.is_some();
        let add = add.unwrap_or_else(|| output(x, [1, 1]));
        let x = x.clone();
        let w = primitive(chunk.words.clone())?;
        // Each unit adds one slice of the groups; how many slices depends
        // on the weight's width alone (never on `n`), so a row's sums are
        // the same in any pass.
        let groups = cols.len() / kernels::LANES;
        let splits = splits(groups);
        let per_split = groups.div_ceil(splits);
        let splits = groups.div_ceil(per_split);
        let tile = rows_per_unit(n);
        let part = output(&x, [splits * n, rows]);
        let client = x.client.clone();
        unsafe {
            kernels::matmul::launch_unchecked(
                &client,
                CubeCount::Static(
                    rows.div_ceil(kernels::LANES) as u32,
                    splits as u32,
                    n.div_ceil(tile) as u32,
                ),
                CubeDim::new_1d(kernels::LANES as u32),
                x.into_buffer_arg(),
                w.into_buffer_arg(),
                part.clone().into_buffer_arg(),
                n as u32,
                rows as u32,
                stride as u32,
                x_col as u32,
                self.row_words() as u32,
                (cols.start / kernels::LANES) as u32,
                groups as u32,
                per_split as u32,
                add.clone().into_buffer_arg(),
                add_stride as u32,
                self.format.code,
                with_add && splits == 1,
                tile,
            )
        };
        if splits == 1 {
            return Ok(Tensor::from_primitive::<Cube>(part));
        }
        let out = output(&part, [n, rows]);
        let len = n * rows;
        unsafe {
            kernels::sum_splits::launch_unchecked(
                &client,
                grid(len),
                grid_dim(),
                part.into_buffer_arg(),
                out.clone().into_buffer_arg(),
                len as u32,
                splits as u32,
                add.into_buffer_arg(),
                rows as u32,
                add_stride as u32,
                with_add,
            )
        };
        Ok(Tensor::from_primitive::<Cube>(out))
    }

    /// Rows `ids` of the weight, dequantized: `[ids.len(), cols]`.
    pub(crate) fn rows(&self, device: &Device, ids: &[u32]) -> Result<Tensor<2>> {
        let n = ids.len();
        let ids =
            Tensor::<1, Int>::from_data(TensorData::new(ids.to_vec(), [n]), (device, DType::U32));
        let ids = primitive(ids)?;
        let out = output(&ids, [n, self.cols]);
        let groups = self.cols / kernels::LANES;
        let client = ids.client.clone();
        // Each chunk writes the rows of the ids it holds.
        for c in &self.chunks {
            let w = primitive(c.words.clone())?;
            unsafe {
                kernels::rows::launch_unchecked(
                    &client,
                    CubeCount::Static(groups.div_ceil(kernels::LANES) as u32, n as u32, 1),
                    CubeDim::new_1d(kernels::LANES as u32),
                    w.into_buffer_arg(),
                    ids.clone().into_buffer_arg(),
                    out.clone().into_buffer_arg(),
                    self.row_words() as u32,
                    groups as u32,
                    c.row0 as u32,
                    c.rows as u32,
                    self.format.code,
                )
            };
        }
        Ok(Tensor::from_primitive::<Cube>(out))
    }
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use super::*;

    /// The device's packing gives the host reference's words, for every
    /// format, with a partial last tile and blocks whose rows end off a
    /// word boundary (Q8_0's 34-byte blocks, three per row).
    #[test]
    fn packing_on_the_device_gives_the_host_layout() {
        let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
        let formats = GgmlType::ALL
            .into_iter()
            .filter_map(|ty| Some((ty, Format::of(ty)?)));
        let mut tested = 0;
        for (ty, f) in formats {
            tested += 1;
            let (rows, cols) = (37, 3 * f.values);
            let bytes: Vec<u8> = (0..rows * f.row_bytes(cols))
                .map(|i| (i * 131 + i / 7) as u8)
                .collect();
            let host = f.pack(&bytes, rows, cols);
            let device = f.pack_on(&device, &bytes, rows, cols, true).unwrap();
            let device: Vec<u32> = device.try_to_vec_as::<u32>().unwrap();
            assert_eq!(device, host, "{ty:?}");
        }
        assert_eq!(tested, 10, "every format the kernels take");
    }
}

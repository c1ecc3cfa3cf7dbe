//! [`DiskHead`]: the output head read from the GGUF file a slice of rows at
//! a time, for budgets that cannot hold it.
//!
//! A tied 150k-row head is the largest tensor of a small model (445 MiB in
//! F16 for the 1.5B, a fifth of the file): held, it can leave no room for a
//! draft at a third of the file. Read per pass it costs what the same bytes
//! of layers would, and holds only one slice and its read buffer. What the
//! budget has left once whole layers are planned (less than a layer) holds
//! the head's first slices, which are then read once instead of every pass.

use std::time::Instant;

use arbor_model::{HeadSlice, HeadSource, Layout, Result, TensorEntry};
use arbor_paging::{AlignedBuf, DirectReader};
use arbor_tensor::{Backend, WeightData};

use crate::{Monitor, SpanKind, paging};

/// Bytes a head slice aims at: large enough that direct reads run at the
/// disk's streaming rate, small beside a layer.
const SLICE_BYTES: usize = 16 << 20;

/// Slices hold a multiple of this many rows, so a kernel's row tiles fall
/// the same way in a slice as in the whole head.
const SLICE_ALIGN: usize = 256;

/// Rows per slice of `entry`: [`SLICE_BYTES`] of them, or an eighth of the
/// head if that is less (a small head still holds a fraction of itself).
pub(crate) fn slice_rows(entry: &TensorEntry) -> usize {
    let rows = (SLICE_BYTES / row_bytes(entry).max(1))
        .min(entry.rows / 8)
        .max(1);
    match rows >= SLICE_ALIGN {
        true => rows / SLICE_ALIGN * SLICE_ALIGN,
        false => rows,
    }
    .min(entry.rows.max(1))
}

/// Bytes of one row of the head in the file.
pub(crate) fn row_bytes(entry: &TensorEntry) -> usize {
    entry.len / entry.rows.max(1)
}

/// Bytes one held slice of `entry` takes on `backend` (every slice but the
/// last, which the plan never holds).
pub(crate) fn slice_bytes<B: Backend>(backend: &B, entry: &TensorEntry) -> u64 {
    backend.weight_bytes(entry.ty, slice_rows(entry), entry.cols)
}

/// Slices of `entry` that `spare` bytes hold, leaving at least one to read:
/// a head with every slice held would be a held head, which the plan gives
/// by other means (and a self draft needs).
pub(crate) fn slices_held<B: Backend>(backend: &B, entry: &TensorEntry, spare: u64) -> usize {
    let slices = entry.rows.div_ceil(slice_rows(entry).max(1));
    let fit = spare / slice_bytes(backend, entry).max(1);
    usize::try_from(fit)
        .unwrap_or(usize::MAX)
        .min(slices.saturating_sub(1))
}

/// Bytes a streamed head holds at once for passes returning up to
/// `logit_rows` rows: one slice built, its read buffer, and the logits
/// assembled on the host before they become a tensor.
pub(crate) fn streamed_head_bytes<B: Backend>(
    backend: &B,
    entry: &TensorEntry,
    logit_rows: usize,
) -> u64 {
    let span = slice_rows(entry) * row_bytes(entry);
    let buffer = DirectReader::span(entry.offset, span).max(arbor_paging::ALIGN);
    slice_bytes(backend, entry) + buffer as u64 + (logit_rows.max(1) * entry.rows * 4) as u64
}

/// Reads rows `first..first + rows` of `entry` into `buf`.
fn read_rows<'b>(
    reader: &DirectReader,
    buf: &'b mut AlignedBuf,
    entry: &TensorEntry,
    first: usize,
    rows: usize,
) -> Result<&'b [u8]> {
    let row_bytes = row_bytes(entry);
    let offset = entry.offset + (first * row_bytes) as u64;
    reader
        .read_into(offset, rows * row_bytes, buf)
        .map_err(paging)
}

/// A [`HeadSource`] reading slices of the head with direct IO into a buffer
/// it reuses (nothing lands in the page cache), but for the first slices
/// when it was told to [`hold`](DiskHead::hold) them. Reads count in the
/// target streamer's [`Monitor`] as IO and as the pass waiting.
pub struct DiskHead<B: Backend> {
    backend: B,
    reader: DirectReader,
    buf: AlignedBuf,
    entry: TensorEntry,
    slice_rows: usize,
    /// The first slices, read once and lent on every pass.
    held: Vec<B::Weight>,
    monitor: Monitor,
    /// The index spans are recorded under (one past the last layer).
    label: usize,
}

impl<B: Backend> DiskHead<B> {
    /// The head of the GGUF file `reader` reads, laid out as `layout`.
    pub fn new(backend: B, reader: DirectReader, layout: &Layout, monitor: Monitor) -> Self {
        let entry = layout.head_tensor().clone();
        Self {
            backend,
            reader,
            buf: AlignedBuf::new(0),
            slice_rows: slice_rows(&entry),
            entry,
            held: Vec::new(),
            monitor,
            label: layout.layers.len(),
        }
    }

    /// Reads the head's first `slices` slices now and holds them: passes
    /// read only the rest. At most every slice but the last.
    pub fn hold(&mut self, slices: usize) -> Result<()> {
        let total = self.entry.rows.div_ceil(self.slice_rows);
        let slices = slices.min(total.saturating_sub(1));
        while self.held.len() < slices {
            let first = self.held.len() * self.slice_rows;
            let e = &self.entry;
            let bytes = read_rows(&self.reader, &mut self.buf, e, first, self.slice_rows)?;
            let w = self.backend.weight(WeightData {
                name: &e.name,
                ty: e.ty,
                rows: self.slice_rows,
                cols: e.cols,
                bytes,
            })?;
            self.held.push(w);
        }
        Ok(())
    }

    /// Rows of the head held for every pass.
    pub fn held_rows(&self) -> usize {
        self.held.len() * self.slice_rows
    }
}

impl<B: Backend> HeadSource<B> for DiskHead<B> {
    fn rows(&self) -> usize {
        self.entry.rows
    }

    fn slice_rows(&self) -> usize {
        self.slice_rows
    }

    fn slice(&mut self, first: usize, rows: usize) -> Result<HeadSlice<'_, B>> {
        let e = &self.entry;
        if first + rows > e.rows || rows == 0 {
            return Err(arbor_model::ModelError::Input(format!(
                "head rows {first}..{} of {}",
                first + rows,
                e.rows
            )));
        }
        if first.is_multiple_of(self.slice_rows)
            && rows == self.slice_rows
            && let Some(w) = self.held.get(first / self.slice_rows)
        {
            return Ok(HeadSlice::Held(w));
        }
        let start = Instant::now();
        let bytes = read_rows(&self.reader, &mut self.buf, e, first, rows)?;
        let read = Instant::now();
        let w = self.backend.streamed_weight(WeightData {
            name: &e.name,
            ty: e.ty,
            rows,
            cols: e.cols,
            bytes,
        })?;
        let built = Instant::now();
        let (io, build) = ((read - start).as_secs_f64(), (built - read).as_secs_f64());
        self.monitor.add(|s| {
            s.bytes += (rows * row_bytes(e)) as u64;
            s.io_secs += io;
            s.build_secs += build;
            s.wait_secs += io + build;
        });
        self.monitor.span(SpanKind::Io, self.label, start, read);
        self.monitor.span(SpanKind::Build, self.label, read, built);
        Ok(HeadSlice::Read(w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(rows: usize, row_bytes: usize) -> TensorEntry {
        TensorEntry {
            name: "output.weight".into(),
            ty: arbor_gguf::GgmlType::F16,
            rows,
            cols: row_bytes / 2,
            offset: 4096,
            len: rows * row_bytes,
        }
    }

    #[test]
    fn slices_are_whole_tiles_near_the_target_size() {
        // The 1.5B's F16 head: 151,936 rows of 3 KiB.
        let e = entry(151_936, 3072);
        let rows = slice_rows(&e);
        assert_eq!(rows % SLICE_ALIGN, 0);
        assert!(rows * 3072 <= SLICE_BYTES && (rows + SLICE_ALIGN) * 3072 > SLICE_BYTES);
        // A small head is cut in eighths, in whole tiles once it has them.
        assert_eq!(slice_rows(&entry(2048, 256)), 256);
        assert_eq!(slice_rows(&entry(4000, 256)), 256);
        assert_eq!(slice_rows(&entry(800, 256)), 100);
        assert_eq!(slice_rows(&entry(3, 256)), 1);
    }
}

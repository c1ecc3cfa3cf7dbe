//! [`DiskHead`]: the output head read from the GGUF file a slice of rows at
//! a time, for budgets that cannot hold it.
//!
//! A tied 150k-row head is the largest tensor of a small model (445 MiB in
//! F16 for the 1.5B, a fifth of the file): held, it can leave no room for a
//! draft at a third of the file. Read per pass it costs what the same bytes
//! of layers would, and holds two read buffers (one slice read ahead) and
//! at most one built slice. What the
//! budget has left once whole layers are planned (less than a layer) holds
//! the head's first slices, which are then read once instead of every pass.

mod ahead;
mod exact;

use std::sync::Arc;
use std::time::Instant;

use arbor_model::{HeadSlice, HeadSource, Layout, Result, TensorEntry};
use arbor_paging::{AlignedBuf, DirectReader};
use arbor_tensor::{Backend, SharedBytes, StableBytes, WeightData};
use crossbeam_channel::{Receiver, Sender};

use ahead::{Fetched, Helper, fetch};
pub use exact::approximable;

use crate::buffers::Loan;
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

/// Bytes a streamed head holds at once: two read buffers (the slice's and
/// the next one's, read ahead) and the slice's built copy where the
/// backend does not multiply it in its buffer. The logits it assembles on
/// the host become the pass's output tensor without a copy
/// ([`Backend::tensor_from_vec`]): the plan's logit scratch counts them.
pub(crate) fn streamed_head_bytes<B: Backend>(backend: &B, entry: &TensorEntry) -> u64 {
    streamed_bytes_in(backend, entry, slice_rows(entry))
}

/// Rows per slice of a head that a held copy stands for (see
/// [`DiskHead::approx`]): only passes that need every logit read it
/// whole, so its slices are one tile of rows and its buffers small.
pub(crate) fn fallback_rows(entry: &TensorEntry) -> usize {
    slice_rows(entry).min(SLICE_ALIGN)
}

/// [`streamed_head_bytes`] with a copy held: slices of [`fallback_rows`].
pub(crate) fn fallback_head_bytes<B: Backend>(backend: &B, entry: &TensorEntry) -> u64 {
    streamed_bytes_in(backend, entry, fallback_rows(entry))
}

/// [`streamed_head_bytes`] for slices of `rows` rows.
fn streamed_bytes_in<B: Backend>(backend: &B, entry: &TensorEntry, rows: usize) -> u64 {
    let span = rows * row_bytes(entry);
    // Any slice's aligned span: its bytes rounded up to whole blocks, and
    // one more block where it starts mid-block.
    let align = arbor_paging::ALIGN;
    let buffer = (span.div_ceil(align) + 1) * align;
    // The last slice may be shorter: nothing is built only where every
    // slice stays in its buffer.
    let last = match entry.rows % rows.max(1) {
        0 => rows,
        short => short,
    };
    let in_place = [rows, last]
        .iter()
        .all(|&r| backend.streams_in_place(entry.ty, r, entry.cols));
    let built = match in_place {
        true => 0,
        false => backend.weight_bytes(entry.ty, rows, entry.cols),
    };
    built + 2 * buffer as u64
}

/// Where rows `first..first + rows` of `entry` lie in the file.
fn rows_range(entry: &TensorEntry, first: usize, rows: usize) -> (u64, usize) {
    let row_bytes = row_bytes(entry);
    (entry.offset + (first * row_bytes) as u64, rows * row_bytes)
}

/// Reads rows `first..first + rows` of `entry` into `buf`.
fn read_rows<'b>(
    reader: &DirectReader,
    buf: &'b mut AlignedBuf,
    entry: &TensorEntry,
    first: usize,
    rows: usize,
) -> Result<&'b [u8]> {
    let (offset, len) = rows_range(entry, first, rows);
    reader.read_into(offset, len, buf).map_err(paging)
}

/// A read of rows `first..first + rows` asked ahead: with the helper, or
/// done already where there is none.
struct Pending {
    first: usize,
    rows: usize,
    ready: Option<Fetched>,
}

/// A [`HeadSource`] reading slices of the head with direct IO (nothing lands
/// in the page cache), but for the first slices when it was told to
/// [`hold`](DiskHead::hold) them.
///
/// Reads run one slice ahead on a helper thread into a second buffer: while
/// the pass multiplies one slice, the next is on its way, and the pass's
/// last slice (the last one the previous pass asked for, so a head run in
/// part is followed too) starts the read of the first one the next pass
/// needs. A pass asking for slices in another order still gets them, read
/// when asked. Where the backend multiplies a slice in place, the slice
/// keeps its read buffer until the pass drops it. Reads count in the
/// target streamer's [`Monitor`] as IO, and the pass's wait for them and
/// their build as waiting.
pub struct DiskHead<B: Backend> {
    backend: B,
    reader: Arc<DirectReader>,
    /// `None` where the system gave no thread: reads happen when asked.
    helper: Option<Helper>,
    /// Read buffers not in use: two in all, one of them with `pending`
    /// while a read runs ahead.
    free: Vec<AlignedBuf>,
    /// Buffers coming back from slices kept in place (see [`Loan`]).
    back: (Sender<AlignedBuf>, Receiver<AlignedBuf>),
    pending: Option<Pending>,
    /// The slice asked last, and the end of the last pass (the rows a pass
    /// runs: all of them unless the decoder runs part of the head).
    last: Option<(usize, usize)>,
    pass_end: usize,
    /// Slices read for passes, and how many of them had been read ahead.
    asked: (usize, usize),
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
        let reader = Arc::new(reader);
        Self {
            backend,
            helper: Helper::spawn(Arc::clone(&reader)),
            reader,
            free: vec![AlignedBuf::new(0), AlignedBuf::new(0)],
            back: crossbeam_channel::unbounded(),
            pending: None,
            last: None,
            pass_end: entry.rows,
            asked: (0, 0),
            slice_rows: slice_rows(&entry),
            entry,
            held: Vec::new(),
            monitor,
            label: layout.layers.len(),
        }
    }

    /// Reads the head in slices of `fallback_rows` from now on: a held
    /// copy gives greedy passes their argmax, and the rest, which read the
    /// whole head, are rare enough to take small reads. Only before any
    /// slice is held or read.
    pub fn small_slices(&mut self) -> Result<()> {
        if !self.held.is_empty() || self.asked.0 > 0 {
            return Err(arbor_model::ModelError::Invalid(
                "a head's slices are sized before any is read".into(),
            ));
        }
        self.slice_rows = fallback_rows(&self.entry);
        Ok(())
    }

    /// Reads the head's first `slices` slices now and holds them: passes
    /// read only the rest. At most every slice but the last.
    pub fn hold(&mut self, slices: usize) -> Result<()> {
        let total = self.entry.rows.div_ceil(self.slice_rows);
        let slices = slices.min(total.saturating_sub(1));
        self.settle()?;
        let mut buf = self.free.pop().unwrap_or_else(|| AlignedBuf::new(0));
        let built = self.hold_into(&mut buf, slices);
        self.free.push(buf);
        built
    }

    /// Reads and builds held slices into `buf` until `slices` are held.
    fn hold_into(&mut self, buf: &mut AlignedBuf, slices: usize) -> Result<()> {
        while self.held.len() < slices {
            let first = self.held.len() * self.slice_rows;
            let e = &self.entry;
            let bytes = read_rows(&self.reader, buf, e, first, self.slice_rows)?;
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

    /// Read buffers this head has, but for those lent to slices still
    /// alive: two once the pass has dropped its slices, whichever reads
    /// run ahead.
    pub fn buffers_home(&self) -> usize {
        self.free.len() + usize::from(self.pending.is_some()) + self.back.1.len()
    }

    /// Slices read for passes so far, and how many of them had been read
    /// ahead (the pass did not wait for the whole read).
    pub fn reads_ahead(&self) -> (usize, usize) {
        self.asked
    }

    /// Waits for the read asked ahead, if any.
    fn take_pending(&mut self) -> Result<Option<(usize, Fetched)>> {
        let Some(p) = self.pending.take() else {
            return Ok(None);
        };
        let f = match p.ready {
            Some(f) => f,
            None => self.helper.as_ref().and_then(Helper::wait).ok_or_else(|| {
                arbor_model::ModelError::Invalid("the head's read-ahead thread stopped".into())
            })?,
        };
        Ok(Some((p.rows, f)))
    }

    /// Waits for a read under way and takes its buffer back, counting the
    /// bytes it read: they crossed the disk, wanted or not.
    fn settle(&mut self) -> Result<()> {
        if let Some((rows, f)) = self.take_pending()? {
            self.count_read((rows * row_bytes(&self.entry)) as u64, &f);
            self.free.push(f.buf);
        }
        Ok(())
    }

    /// Records a finished read of `bytes` in the monitor's IO (nothing
    /// for a read that failed).
    fn count_read(&self, bytes: u64, f: &Fetched) {
        if f.start.is_err() {
            return;
        }
        let io = (f.ended - f.began).as_secs_f64();
        self.monitor.add(|s| {
            s.bytes += bytes;
            s.io_secs += io;
        });
        self.monitor
            .span(SpanKind::Io, self.label, f.began, f.ended);
    }

    /// Takes back the buffers of slices the pass has dropped, keeping two
    /// in all (more only while a caller keeps slices alive).
    fn reclaim(&mut self) {
        self.free.extend(self.back.1.try_iter());
        let keep = 2 - usize::from(self.pending.is_some());
        self.free.truncate(keep);
    }

    /// Starts reading rows `first..first + rows` into a free buffer: on the
    /// helper thread, or now where there is none.
    fn start_read(&mut self, first: usize, rows: usize) {
        self.reclaim();
        // Two buffers serve: the previous slice has been dropped (its
        // borrow ends before the next ask) and its buffer is back. A caller
        // keeping a slice's weight alive gets a buffer of its own.
        let buf = self.free.pop().unwrap_or_else(|| AlignedBuf::new(0));
        let (offset, len) = rows_range(&self.entry, first, rows);
        let ready = match &self.helper {
            Some(h) => match h.submit(offset, len, buf) {
                Ok(()) => None,
                Err(buf) => Some(fetch(&self.reader, offset, len, buf)),
            },
            None => Some(fetch(&self.reader, offset, len, buf)),
        };
        self.pending = Some(Pending { first, rows, ready });
    }

    /// The slice a pass asks for after rows `first..first + rows`: the next
    /// one, or after the last pass's end the first one not held (the next
    /// pass's).
    fn next_after(&self, first: usize, rows: usize) -> Option<(usize, usize)> {
        let total = self.entry.rows;
        let next = match first + rows {
            n if n < self.pass_end.min(total) => n,
            _ => self.held_rows(),
        };
        (next < total).then(|| (next, self.slice_rows.min(total - next)))
    }

    /// Notes an ask: one that goes back to or before the previous one
    /// starts a pass, and the previous one ended the last.
    fn note_ask(&mut self, first: usize, rows: usize) {
        if let Some((f, r)) = self.last
            && first <= f
        {
            self.pass_end = f + r;
        }
        self.last = Some((first, rows));
    }

    /// The weight of `rows` rows read into `range` of `buf`: kept in the
    /// buffer where the backend multiplies it in place (the buffer comes
    /// back when the pass drops the weight), else copied and the buffer
    /// freed at once.
    fn build(
        &mut self,
        buf: AlignedBuf,
        range: std::ops::Range<usize>,
        rows: usize,
    ) -> Result<B::Weight> {
        let e = &self.entry;
        let data = |bytes| WeightData {
            name: &e.name,
            ty: e.ty,
            rows,
            cols: e.cols,
            bytes,
        };
        if !self.backend.streams_in_place(e.ty, rows, e.cols) {
            let w = self.backend.streamed_weight(data(&buf.as_slice()[range]));
            self.free.push(buf);
            return Ok(w?);
        }
        let lent: Arc<dyn StableBytes> = Arc::new(Loan::new(buf, self.back.0.clone()));
        let keep = SharedBytes::new(lent, range).ok_or_else(|| {
            arbor_model::ModelError::Invalid("a head slice outside its buffer".into())
        })?;
        Ok(self
            .backend
            .streamed_weight_in(data(keep.as_slice()), &keep)?)
    }
}

impl<B: Backend> Drop for DiskHead<B> {
    fn drop(&mut self) {
        // The read under way writes into a buffer the helper owns: wait for
        // it, so the buffer's memory is gone when the head is.
        let _ = self.take_pending();
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
        self.reclaim();
        let e = &self.entry;
        if first + rows > e.rows || rows == 0 {
            return Err(arbor_model::ModelError::Input(format!(
                "head rows {first}..{} of {}",
                first + rows,
                e.rows
            )));
        }
        self.note_ask(first, rows);
        if first.is_multiple_of(self.slice_rows)
            && rows == self.slice_rows
            && first / self.slice_rows < self.held.len()
        {
            return Ok(HeadSlice::Held(&self.held[first / self.slice_rows]));
        }
        let asked = Instant::now();
        // The read ahead is this slice, or else it is waited out and this
        // one is read now.
        let ahead = self
            .pending
            .as_ref()
            .is_some_and(|p| p.first == first && p.rows == rows);
        if !ahead {
            self.settle()?;
            self.start_read(first, rows);
        }
        self.asked.0 += 1;
        self.asked.1 += usize::from(ahead);
        let Some((_, fetched)) = self.take_pending()? else {
            return Err(arbor_model::ModelError::Invalid(
                "the head slice's read was not started".into(),
            ));
        };
        let got = Instant::now();
        let len = rows * row_bytes(&self.entry);
        self.count_read(len as u64, &fetched);
        let Fetched { buf, start, .. } = fetched;
        // The buffer goes back to the pool even if the read failed.
        let start = match start {
            Ok(start) => start,
            Err(err) => {
                self.free.push(buf);
                return Err(paging(err));
            }
        };
        // The next slice starts on its way while this one is built and
        // multiplied.
        if let Some((next, next_rows)) = self.next_after(first, rows) {
            self.start_read(next, next_rows);
        }
        let w = self.build(buf, start..start + len, rows)?;
        let built = Instant::now();
        let (wait, build) = ((got - asked).as_secs_f64(), (built - got).as_secs_f64());
        self.monitor.add(|s| {
            s.build_secs += build;
            s.wait_secs += wait + build;
        });
        self.monitor.span(SpanKind::Wait, self.label, asked, got);
        self.monitor.span(SpanKind::Build, self.label, got, built);
        Ok(HeadSlice::Read(w))
    }

    fn gather(&mut self, rows: &[usize]) -> Result<Option<B::Weight>> {
        exact::gather(self, rows).map(Some)
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

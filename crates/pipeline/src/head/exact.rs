//! What a streamed float head gives a certified argmax (see
//! [`arbor_model::certified`]): its held low-bit copy, built from one read
//! of the head at load, and the exact rows a pass asks for, read by
//! themselves.

use std::time::Instant;

use arbor_gguf::GgmlType;
use arbor_model::certified::{APPROX_SLICE_ROWS, ApproxHead};
use arbor_model::{ModelError, Result};
use arbor_paging::AlignedBuf;
use arbor_tensor::{Backend, WeightData};

use super::{DiskHead, read_rows, row_bytes};
use crate::SpanKind;

/// Rows between two wanted ones that are read with them rather than
/// starting a second read (a row of the 1.5B's F16 head is 3 KiB; a direct
/// read moves whole 4 KiB blocks).
const GAP_ROWS: usize = 4;

/// Runs `(first, rows)` covering `wanted` (increasing), joined across gaps
/// of at most [`GAP_ROWS`].
pub(crate) fn runs(wanted: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &r in wanted {
        match out.last_mut() {
            Some((first, rows)) if r <= *first + *rows + GAP_ROWS => {
                *rows = (*rows).max(r + 1 - *first);
            }
            _ => out.push((r, 1)),
        }
    }
    out
}

/// Whether a head of type `ty` has an approximate copy: float heads,
/// whose Q8_0 copy is about half their bytes.
pub fn approximable(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F16 | GgmlType::BF16 | GgmlType::F32)
}

impl<B: Backend> DiskHead<B> {
    /// Reads the whole head once, a slice at a time into a buffer of its
    /// own (dropped at the end: the head's buffers stay the size its
    /// slices need), and builds its `ty` copy (Q8_0 or Q5_0).
    pub fn approx(&mut self, ty: GgmlType) -> Result<ApproxHead<B>> {
        let e = self.entry.clone();
        let mut approx = ApproxHead::new(ty, e.cols)?;
        let mut buf = AlignedBuf::new(0);
        let step = self.slice_rows.min(APPROX_SLICE_ROWS);
        for first in (0..e.rows).step_by(step) {
            let rows = step.min(e.rows - first);
            let bytes = read_rows(&self.reader, &mut buf, &e, first, rows)?;
            approx.push(&self.backend, e.ty, bytes)?;
        }
        approx.finish(&self.backend)
    }
}

/// The exact rows of a certified pass: read run by run, built as one
/// weight of the head's type.
pub(super) fn gather<B: Backend>(head: &mut DiskHead<B>, wanted: &[usize]) -> Result<B::Weight> {
    let e = head.entry.clone();
    if wanted.windows(2).any(|w| w[0] >= w[1]) || wanted.last().is_some_and(|&r| r >= e.rows) {
        return Err(ModelError::Input(format!(
            "head rows to gather must increase and be below {}",
            e.rows
        )));
    }
    let row = row_bytes(&e);
    let mut bytes = Vec::with_capacity(wanted.len() * row);
    let mut buf = AlignedBuf::new(0);
    let began = Instant::now();
    let mut read = 0u64;
    let mut at = 0;
    for (first, rows) in runs(wanted) {
        let got = read_rows(&head.reader, &mut buf, &e, first, rows)?;
        read += got.len() as u64;
        while at < wanted.len() && wanted[at] < first + rows {
            let r = wanted[at] - first;
            bytes.extend_from_slice(&got[r * row..(r + 1) * row]);
            at += 1;
        }
    }
    let ended = Instant::now();
    head.monitor.add(|s| {
        s.bytes += read;
        s.io_secs += (ended - began).as_secs_f64();
        s.wait_secs += (ended - began).as_secs_f64();
    });
    head.monitor.span(SpanKind::Io, head.label, began, ended);
    Ok(head.backend.weight(WeightData {
        name: &e.name,
        ty: e.ty,
        rows: wanted.len(),
        cols: e.cols,
        bytes: &bytes,
    })?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cover_every_row_and_join_short_gaps() {
        assert_eq!(runs(&[]), vec![]);
        assert_eq!(runs(&[7]), vec![(7, 1)]);
        assert_eq!(runs(&[1, 2, 3]), vec![(1, 3)]);
        // A gap of four rows is read through; five start a new read.
        assert_eq!(runs(&[10, 15]), vec![(10, 6)]);
        assert_eq!(runs(&[10, 16]), vec![(10, 1), (16, 1)]);
        assert_eq!(runs(&[0, 100, 101, 500]), vec![(0, 1), (100, 2), (500, 1)]);
    }
}

//! [`DiskRows`]: token-embedding rows read from the GGUF file as tokens
//! need them.

use std::path::{Path, PathBuf};

use arbor_model::{Layout, Result, RowSource};
use arbor_paging::{AlignedBuf, DirectReader};

use crate::paging;

/// A [`RowSource`] reading an untied token embedding's rows from the file
/// with direct IO, one row per read, into a buffer it reuses (nothing lands
/// in the page cache).
pub struct DiskRows {
    path: PathBuf,
    reader: DirectReader,
    buf: AlignedBuf,
    /// Absolute offset of row 0.
    offset: u64,
    row_bytes: usize,
}

impl DiskRows {
    /// The embedding rows of the GGUF file at `path`, whose layout is
    /// `layout`.
    pub fn open(path: &Path, layout: &Layout) -> Result<Self> {
        let e = &layout.embedding;
        Ok(Self {
            path: path.to_path_buf(),
            reader: DirectReader::open(path).map_err(paging)?,
            buf: AlignedBuf::new(0),
            offset: e.offset,
            row_bytes: e.len / e.rows,
        })
    }
}

impl RowSource for DiskRows {
    fn row(&mut self, row: usize) -> Result<&[u8]> {
        let offset = self.offset + row as u64 * self.row_bytes as u64;
        self.reader
            .read_into(offset, self.row_bytes, &mut self.buf)
            .map_err(paging)
    }

    /// Opens the file again: the two sources read independently.
    fn try_clone(&self) -> Result<Box<dyn RowSource>> {
        Ok(Box::new(Self {
            path: self.path.clone(),
            reader: DirectReader::open(&self.path).map_err(paging)?,
            buf: AlignedBuf::new(0),
            offset: self.offset,
            row_bytes: self.row_bytes,
        }))
    }
}

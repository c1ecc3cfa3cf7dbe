//! [`Packed`]: many strings or byte strings in one allocation.

/// Strings or byte strings stored back to back: entry `i` is
/// `data[ends[i - 1]..ends[i]]`. One allocation instead of one per token.
#[derive(PartialEq, Eq)]
pub(crate) struct Packed<T> {
    pub(crate) data: T,
    ends: Vec<u32>,
}

impl<T: AsRef<[u8]>> Packed<T> {
    /// An empty store writing into `data`, with room for `n` entries.
    pub(crate) fn new(data: T, n: usize) -> Self {
        Self {
            data,
            ends: Vec::with_capacity(n),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(crate) fn span(&self, i: usize) -> Option<std::ops::Range<usize>> {
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        Some(start..end)
    }

    /// Ends the entry being written at the current end of `data`.
    pub(crate) fn close(&mut self) {
        // The total size is checked against u32 by the caller.
        self.ends.push(self.data.as_ref().len() as u32);
    }
}

impl Packed<String> {
    pub(crate) fn push(&mut self, s: &str) {
        self.data.push_str(s);
        self.close();
    }

    pub(crate) fn get(&self, id: u32) -> Option<&str> {
        self.span(id as usize).map(|r| &self.data[r])
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        (0..self.len()).map(|i| &self.data[self.span(i).expect("in range")])
    }
}

impl Packed<Vec<u8>> {
    pub(crate) fn get(&self, id: u32) -> Option<&[u8]> {
        self.span(id as usize).map(|r| &self.data[r])
    }
}

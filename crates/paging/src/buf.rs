//! Page-aligned heap buffers, as `O_DIRECT` reads require.

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;

/// The alignment of [`AlignedBuf`]s, in bytes, for both the start address
/// and the capacity. 4096 covers the logical block size of practically
/// every disk and file system, which is what `O_DIRECT` insists on.
pub const ALIGN: usize = 4096;

/// A zero-initialised heap buffer whose start address and capacity are both
/// multiples of [`ALIGN`].
///
/// `O_DIRECT` reads must land in memory aligned like this, which a `Vec<u8>`
/// does not promise. The buffer is plain owned memory, so it is `Send` and
/// `Sync` like a `Box<[u8]>`.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    capacity: usize,
}

// SAFETY: `AlignedBuf` uniquely owns its allocation (like `Box<[u8]>`);
// shared access only hands out `&[u8]` and mutation needs `&mut self`.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above; `&AlignedBuf` allows only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates a zeroed buffer of at least `capacity` bytes: the size is
    /// rounded up to a multiple of [`ALIGN`], and is never less than
    /// [`ALIGN`].
    ///
    /// Like `Vec::with_capacity`, panics if the rounded size overflows
    /// `isize`, and aborts through [`alloc::handle_alloc_error`] if the
    /// allocator has no memory.
    pub fn new(capacity: usize) -> AlignedBuf {
        let capacity = capacity
            .max(1)
            .checked_next_multiple_of(ALIGN)
            .expect("AlignedBuf capacity overflow");
        let layout = Self::layout(capacity);
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout);
        };
        AlignedBuf { ptr, capacity }
    }

    fn layout(capacity: usize) -> Layout {
        Layout::from_size_align(capacity, ALIGN).expect("AlignedBuf capacity overflow")
    }

    /// The size of the buffer in bytes (a multiple of [`ALIGN`]).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `capacity` initialised bytes that we own.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.capacity) }
    }

    /// The whole buffer, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) }
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_rounded_and_aligned() {
        for (asked, want) in [
            (0, ALIGN),
            (1, ALIGN),
            (ALIGN, ALIGN),
            (ALIGN + 1, 2 * ALIGN),
            (10 * ALIGN - 7, 10 * ALIGN),
        ] {
            let mut buf = AlignedBuf::new(asked);
            assert_eq!(buf.capacity(), want, "asked for {asked}");
            assert_eq!(buf.as_slice().len(), want);
            assert_eq!(buf.as_slice().as_ptr() as usize % ALIGN, 0);
            assert!(buf.as_slice().iter().all(|&b| b == 0));
            buf.as_mut_slice().fill(0xab);
            assert!(buf.as_slice().iter().all(|&b| b == 0xab));
        }
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<AlignedBuf>();
    }
}

//! [`SharedBytes`]: a weight's bytes lent by whoever read them (a streamer's
//! read buffer), which a backend may keep as the weight's storage instead of
//! copying them. The owner gets its buffer back when the last holder drops.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

/// Memory that stays put: whatever [`StableBytes::bytes`] returns is the
/// same slice (same address, same length) on every call, for as long as the
/// value lives, and nobody writes to it meanwhile.
///
/// # Safety
/// Implementors promise the above; [`SharedBytes`] keeps a pointer into the
/// slice on that promise.
pub unsafe trait StableBytes: Send + Sync {
    fn bytes(&self) -> &[u8];
}

/// A range of a [`StableBytes`] owner, held alive by an [`Arc`].
#[derive(Clone)]
pub struct SharedBytes {
    /// Held for as long as the pointer is used: the bytes go back to their
    /// owner only when the last holder drops.
    _owner: Arc<dyn StableBytes>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the pointer points into the owner's bytes, which are Send + Sync,
// never written while shared (the StableBytes contract) and kept alive by
// the Arc this value holds.
unsafe impl Send for SharedBytes {}
unsafe impl Sync for SharedBytes {}

impl SharedBytes {
    /// `range` of `owner`'s bytes; `None` when the range is not inside them.
    pub fn new(owner: Arc<dyn StableBytes>, range: Range<usize>) -> Option<Self> {
        let bytes = owner.bytes().get(range)?;
        let (ptr, len) = (bytes.as_ptr(), bytes.len());
        Some(Self {
            _owner: owner,
            ptr,
            len,
        })
    }

    /// The bytes, copied into an owner of their own (tests, and callers
    /// that have only a slice).
    pub fn copy_of(bytes: &[u8]) -> Self {
        let len = bytes.len();
        Self::new(Arc::new(Owned(bytes.to_vec())), 0..len).expect("the whole vector")
    }

    /// `len` bytes that `fill` writes, in an owner of their own aligned
    /// for any [`Plain`] type (a weight read from a file straight into the
    /// storage a backend keeps).
    pub fn filled<E>(len: usize, fill: impl FnOnce(&mut [u8]) -> Result<(), E>) -> Result<Self, E> {
        let mut words = vec![0u64; len.div_ceil(8)];
        // SAFETY: the u64 buffer viewed as its first `len` bytes.
        fill(unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) })?;
        Ok(Self::new(Arc::new(Words { words, len }), 0..len).expect("the whole buffer"))
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` was a slice of the owner's bytes, which
        // stay where they are and unchanged while `owner` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Deref for SharedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedBytes({} bytes at {:p})", self.len, self.ptr)
    }
}

/// A vector as an owner: its heap buffer does not move while it is not
/// touched, and nothing here touches it.
struct Owned(Vec<u8>);

// SAFETY: the vector is never changed after construction, so its slice is
// the same on every call.
unsafe impl StableBytes for Owned {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Bytes in a buffer of words (aligned for every [`Plain`] type), the
/// first `len` of them.
struct Words {
    words: Vec<u64>,
    len: usize,
}

// SAFETY: the buffer is never changed after construction, so its slice is
// the same on every call.
unsafe impl StableBytes for Words {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` is at most the buffer's size in bytes (`filled`).
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}

/// A number type whose every bit pattern is a value, with no padding: bytes
/// may be read as values of it.
///
/// # Safety
/// Implementors promise the above (`u8`, `f32`, `half::f16`, …: not
/// `bool`, `char`, references or types with niches).
pub unsafe trait Plain: Copy + Send + Sync + 'static {}

// SAFETY: plain numbers; every bit pattern is a value.
unsafe impl Plain for u8 {}
unsafe impl Plain for u16 {}
unsafe impl Plain for u32 {}
unsafe impl Plain for f32 {}
unsafe impl Plain for half::f16 {}
unsafe impl Plain for half::bf16 {}

/// Storage for a weight's values: owned, or read in place from bytes
/// someone lent (checked for byte order, alignment and length).
pub struct Store<T: Plain>(Values<T>);

enum Values<T> {
    Owned(Vec<T>),
    Shared(SharedBytes),
}

impl<T: Plain> Store<T> {
    pub fn owned(values: Vec<T>) -> Self {
        Self(Values::Owned(values))
    }

    /// `bytes` viewed as values of `T` where the target is little-endian
    /// and the bytes are aligned for `T` and a whole number of values;
    /// `None` otherwise (the caller copies).
    pub fn shared(bytes: &SharedBytes) -> Option<Self> {
        let size = std::mem::size_of::<T>();
        let fits = cfg!(target_endian = "little")
            && size > 0
            && (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
            && bytes.len().is_multiple_of(size);
        fits.then(|| Self(Values::Shared(bytes.clone())))
    }

    /// Whether the values are kept in lent bytes.
    pub fn is_shared(&self) -> bool {
        matches!(self.0, Values::Shared(_))
    }
}

impl<T: Plain> Deref for Store<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.0 {
            Values::Owned(v) => v,
            // SAFETY: `shared` is the only way in and checked alignment,
            // length and byte order; `T: Plain` makes every bit pattern a
            // value; the bytes live and stay unchanged while `b` does.
            Values::Shared(b) => unsafe {
                std::slice::from_raw_parts(
                    b.as_ptr() as *const T,
                    b.len() / std::mem::size_of::<T>(),
                )
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_outside_the_owner_is_refused() {
        let owner: Arc<dyn StableBytes> = Arc::new(Owned(vec![1, 2, 3, 4]));
        assert!(SharedBytes::new(owner.clone(), 1..5).is_none());
        let s = SharedBytes::new(owner, 1..3).unwrap();
        assert_eq!(&*s, &[2, 3]);
    }

    #[test]
    fn filled_bytes_are_aligned_for_every_plain_type_and_errors_pass_through() {
        for len in [0, 1, 7, 8, 1001] {
            let s = SharedBytes::filled(len, |b| {
                b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
                Ok::<(), ()>(())
            })
            .unwrap();
            assert_eq!(s.len(), len);
            assert!(s.iter().enumerate().all(|(i, &x)| x == i as u8));
            assert!((s.as_ptr() as usize).is_multiple_of(8));
        }
        let values: Vec<f32> = (0..9).map(|i| i as f32 * 0.5).collect();
        let s = SharedBytes::filled(36, |b| {
            b.copy_from_slice(
                &values
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<_>>(),
            );
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(&*Store::<f32>::shared(&s).expect("aligned"), &values[..]);
        assert_eq!(SharedBytes::filled(4, |_| Err("no")).unwrap_err(), "no");
    }

    #[test]
    fn values_read_in_place_equal_the_decoded_ones() {
        let values: Vec<u16> = (0..64).map(|i| i * 1021).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        // A vector of u8 is not promised u16 alignment: offset 0 or 1 of
        // an even address decides which of the two views is aligned.
        let shared = SharedBytes::copy_of(&bytes);
        let aligned = (shared.as_ptr() as usize).is_multiple_of(2);
        let store = Store::<u16>::shared(&shared);
        assert_eq!(store.is_some(), aligned);
        if let Some(s) = store {
            assert!(s.is_shared());
            assert_eq!(&*s, &values[..]);
        }
        let odd = SharedBytes::copy_of(&bytes[..bytes.len() - 1]);
        assert!(Store::<u16>::shared(&odd).is_none(), "not whole values");
    }
}

//! An allocator that remembers the largest single allocation the current
//! thread made, so a fuzz target can fail on an input that makes the code
//! under test ask for memory out of proportion to the input (before it
//! asks for so much that the process dies).
//!
//! A test binary installs it with
//! `#[global_allocator] static A: arbor_fuzz::alloc::Tracking = arbor_fuzz::alloc::Tracking;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Passes everything to the system allocator, counting what the current
/// thread asks for (tests run on many threads).
pub struct Tracking;

/// What one thread allocated: the largest single request, the number of
/// requests and their total size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allocs {
    pub largest: usize,
    pub count: usize,
    pub bytes: usize,
}

thread_local! {
    static ALLOCS: Cell<Allocs> = const {
        Cell::new(Allocs {
            largest: 0,
            count: 0,
            bytes: 0,
        })
    };
}

fn note(size: usize) {
    // `try_with`: allocations during thread teardown are not tracked.
    let _ = ALLOCS.try_with(|a| {
        let mut v = a.get();
        v.largest = v.largest.max(size);
        v.count += 1;
        v.bytes = v.bytes.saturating_add(size);
        a.set(v);
    });
}

// SAFETY: every call is forwarded unchanged to `System`.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Runs `f`, returning its result and what this thread allocated
/// meanwhile (all zero unless [`Tracking`] is the global allocator).
pub fn allocs_during<T>(f: impl FnOnce() -> T) -> (T, Allocs) {
    let before = ALLOCS.with(|a| a.replace(Allocs::default()));
    let out = f();
    let during = ALLOCS.with(|a| a.replace(before));
    (out, during)
}

/// Runs `f`, returning its result and the largest single allocation this
/// thread made meanwhile (0 unless [`Tracking`] is the global allocator).
pub fn largest_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let (out, a) = allocs_during(f);
    (out, a.largest)
}

//! An allocator that remembers the largest single allocation the current
//! thread made, so a fuzz target can fail on an input that makes the code
//! under test ask for memory out of proportion to the input (before it
//! asks for so much that the process dies).
//!
//! A test binary installs it with
//! `#[global_allocator] static A: arbor_fuzz::alloc::Tracking = arbor_fuzz::alloc::Tracking;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Passes everything to the system allocator, noting sizes per thread.
pub struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: allocations during thread teardown are not tracked.
    let _ = LARGEST.try_with(|m| m.set(m.get().max(size)));
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

/// Runs `f`, returning its result and the largest single allocation this
/// thread made meanwhile (0 unless [`Tracking`] is the global allocator).
pub fn largest_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LARGEST.with(|m| m.replace(0));
    let out = f();
    let largest = LARGEST.with(|m| m.replace(before.max(m.get())));
    (out, largest)
}

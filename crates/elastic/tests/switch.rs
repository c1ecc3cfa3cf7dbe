//! Switching levels moves a number: no allocation, also with LoRA
//! adapters held for some levels (counted by a global allocator that this
//! test binary alone installs; the test runs single-threaded by itself).

mod common;
use common::*;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use arbor_elastic::LoraFile;
use arbor_gguf::GgmlType;
use arbor_model::{LanguageModel, Proj};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn switching_levels_allocates_nothing() {
    let m = tiny(GgmlType::Q8_0, 43);
    let (_source, out) = elastic(&m, "switch");
    let mut model = load(&out.0);
    let f = LoraFile::new(model.config(), model.elastic(), 0.5, 4, &Proj::ALL, 1).unwrap();
    LanguageModel::attach_lora(&mut model, &f.to_host()).unwrap();
    let levels = [0.25, 0.5, 0.75, 1.0, 0.6, 0.3];
    let mut seen = 0.0;
    COUNTING.store(true, Ordering::SeqCst);
    for i in 0..1000 {
        seen += model.set_level(levels[i % levels.len()]).unwrap();
    }
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(ALLOCATIONS.load(Ordering::SeqCst), 0);
    assert!(seen > 0.0);
    // The model still runs after all that.
    assert!(!run(&mut model).is_empty());
}

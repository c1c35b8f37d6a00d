//! Decoding performs zero heap allocations: a counting global allocator watches every
//! step after the session is created.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use kvm_core::quant::DType;
use kvm_core::{Model, Session};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn prefill_and_decode_allocate_nothing() {
    for (case, dtype) in [("fixed_basic", DType::F32), ("growable_power_law", DType::F32), ("fixed_basic", DType::F16)]
    {
        let blob = convert_to_bytes(&golden_dir(case), dtype);
        let model = Model::from_bytes(&blob).unwrap();
        let mut arena = Arena::new(model.arena_len());
        let mut session = Session::new(model, arena.bytes()).unwrap();
        let prompt: Vec<u32> = (0..37).map(|i| (i * 7 % 96) as u32).collect();
        let before = ALLOCATIONS.load(Ordering::SeqCst);
        session.prefill(&prompt).unwrap();
        // Long enough to fold many chunks and, for the growable case, grow the state.
        let mut tok = 1u32;
        for _ in 0..400 {
            let logits = session.decode(tok).unwrap();
            tok = (logits.iter().enumerate().fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
                as u32
                + 1)
                % 96;
        }
        let after = ALLOCATIONS.load(Ordering::SeqCst);
        assert_eq!(after - before, 0, "{case}/{}: decode allocated", dtype.name());
    }
}

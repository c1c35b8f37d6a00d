//! Decoding and tokenizing perform zero heap allocations: a counting global allocator
//! watches every step after the session (or tokenizer) is created. Counts are per
//! thread, so tests running side by side do not see each other's allocations.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::*;
use kvm_core::quant::DType;
use kvm_core::tokenizer::{StreamDecoder, Tokenizer};
use kvm_core::{Model, Session};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the thread's counter may already be gone while it exits.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
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
        let before = allocations();
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
        let after = allocations();
        assert_eq!(after - before, 0, "{case}/{}: decode allocated", dtype.name());
    }
}

#[test]
fn encode_and_decode_allocate_nothing() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tokenizers/gpt2/tokenizer.json");
    let section = kvm_export::tokenizer::build_section(&std::fs::read_to_string(path).unwrap()).unwrap();
    let long = "日本語のテキスト ".repeat(100) + &" ".repeat(1000);
    let texts = ["Hello world! it's 12 <|endoftext|> 🚀", long.as_str()];
    let mut ids = vec![0u32; long.len()];
    let mut text = vec![0u8; 4 * long.len()];

    let before = allocations();
    let t = Tokenizer::from_bytes(&section).unwrap();
    let mut decoded = 0;
    for s in texts {
        let n = t.encode(s, &mut ids).unwrap();
        assert!(t.encode(s, &mut ids[..1]).is_err());
        decoded += t.decode_into(&ids[..n], &mut text).unwrap();
        let mut d = StreamDecoder::new();
        for &id in &ids[..n] {
            d.push(&t, id, &mut text).unwrap();
        }
        d.finish();
    }
    let after = allocations();
    assert_eq!(after - before, 0, "the tokenizer allocated");
    assert_eq!(decoded, texts.iter().map(|s| s.len()).sum::<usize>());
}

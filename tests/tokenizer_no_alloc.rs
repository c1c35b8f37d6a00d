//! Tokenizing performs zero heap allocations: a counting global allocator watches encode,
//! decode and the streaming decoder (this binary holds nothing else, so no other test's
//! allocations land in the window).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use kvm_core::tokenizer::{StreamDecoder, Tokenizer};

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
fn encode_and_decode_allocate_nothing() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tokenizers/gpt2/tokenizer.json");
    let section = kvm_export::tokenizer::build_section(&std::fs::read_to_string(path).unwrap()).unwrap();
    let long = "日本語のテキスト ".repeat(100) + &" ".repeat(1000);
    let texts = ["Hello world! it's 12 <|endoftext|> 🚀", long.as_str()];
    let mut ids = vec![0u32; long.len()];
    let mut text = vec![0u8; 4 * long.len()];

    let before = ALLOCATIONS.load(Ordering::SeqCst);
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
    let after = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(after - before, 0, "the tokenizer allocated");
    assert_eq!(decoded, texts.iter().map(|s| s.len()).sum::<usize>());
}

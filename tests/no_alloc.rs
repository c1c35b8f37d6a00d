//! Decoding and tokenizing perform zero heap allocations: a counting global allocator
//! watches every step after the session (or tokenizer) is created. Counts are per
//! thread, so tests running side by side do not see each other's allocations; the pool
//! test also counts, in one shared total, the threads it marks as its own (its caller and
//! the pool's workers).

use kvm_test_support as common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use kvm_core::cache::CacheDtype;
use kvm_core::exec::Exec;
use kvm_core::quant::DType;
use kvm_core::state::Phase;
use kvm_core::tokenizer::{StreamDecoder, Tokenizer};
use kvm_core::{Model, Session};
use kvm_export::synth::{synth, Preset};
use kvm_runtime::pool::Pool;
use kvm_runtime::prefill::prefill;
use kvm_write::policy::Policy;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
    /// Whether this thread's allocations also go to [`MARKED_ALLOCATIONS`].
    static MARKED: Cell<bool> = const { Cell::new(false) };
}

/// Allocations by every thread marked with [`MARKED`].
static MARKED_ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

fn count() {
    // `try_with`: the thread's counter may already be gone while it exits.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    if MARKED.try_with(Cell::get).unwrap_or(false) {
        MARKED_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every call goes unchanged to the system allocator, which keeps the contract;
// counting touches only thread-locals and an atomic, never the heap.
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
    for (case, dtype, cache) in [
        ("fixed_basic", DType::F32, CacheDtype::F32),
        ("growable_power_law", DType::F32, CacheDtype::F32),
        ("fixed_basic", DType::F16, CacheDtype::F32),
        ("growable_power_law", DType::F32, CacheDtype::F16),
        ("growable_power_law", DType::Q8_0, CacheDtype::Q8),
        ("hybrid_swa_saturation", DType::F32, CacheDtype::F32),
        ("hybrid_swa_saturation", DType::Q8_0, CacheDtype::F16),
        // The integer numerics (its own i16 rows).
        ("growable_power_law", DType::I8, CacheDtype::F32),
        ("hybrid_swa_saturation", DType::I8, CacheDtype::F32),
    ] {
        let blob = match dtype {
            DType::I8 => convert_with(&golden_dir(case), &Policy::int()),
            _ => convert_to_bytes(&golden_dir(case), dtype),
        };
        let model = Model::from_bytes(&blob).unwrap().with_cache(cache).unwrap();
        let mut arena = Arena::new(model.arena_len());
        let mut session = Session::new(model, arena.bytes_mut()).unwrap();
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
        assert_eq!(after - before, 0, "{case}/{}/{} cache: decode allocated", dtype.name(), cache.name());
    }
}

#[test]
fn encode_and_decode_allocate_nothing() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tokenizers/gpt2/tokenizer.json");
    let section = kvm_write::tokenizer::build_section(&std::fs::read_to_string(path).unwrap()).unwrap();
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

/// Marks both threads of a 2-thread `pool`: each of two heads waits until the other has
/// started, so the caller and the worker must run one each.
fn mark_pool_threads(pool: &Pool) {
    assert_eq!(pool.threads(), 2);
    let started = AtomicUsize::new(0);
    let (out_len, scratch_len) = (128, 1024); // a head this big is worth a hand-off
    let (mut outs, mut scratch) = (vec![0f32; 2 * out_len], vec![0f32; 2 * scratch_len]);
    pool.heads(&mut outs, out_len, &mut scratch, scratch_len, &|_, _, _| {
        MARKED.with(|m| m.set(true));
        started.fetch_add(1, Ordering::SeqCst);
        let t = Instant::now();
        while started.load(Ordering::SeqCst) < 2 {
            assert!(t.elapsed() < Duration::from_secs(10), "the pool's worker never joined");
            std::hint::spin_loop();
        }
    });
}

#[test]
fn decode_on_a_pool_allocates_nothing_on_any_thread() {
    // Wide enough that the pool splits the MLP and output products ([1024, 256] and
    // [4096, 256]) and the attention heads (128 values by 128 window and state slots).
    let cfg = kvm_core::config::Config {
        vocab_len: 4096,
        d_model: 256,
        n_heads: 2,
        d_qk: 128,
        d_v: 128,
        d_ff: 1024,
        chunk_len: 64,
        state_min_len: 64,
        ..Preset::Tiny.config()
    };
    let path = std::env::temp_dir().join(format!("kvm-no-alloc-pool-{}.kvm", std::process::id()));
    synth(&path, &cfg, &Policy::uniform(DType::Q8_0), 1, &mut |_| {}).unwrap();
    let blob = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).ok();
    let model = Model::from_bytes(&blob).unwrap();
    let mut arena = Arena::new(model.arena_len());
    let mut session = Session::new(model, arena.bytes_mut()).unwrap();
    let pool = Pool::new(2).unwrap();
    mark_pool_threads(&pool);
    let prompt: Vec<u32> = (0..100).map(|i| (i * 7 % 256) as u32).collect();
    prefill(&mut session, &prompt, Phase::Prefill, &pool).unwrap();
    let decode = |session: &mut Session<'_, '_>, steps: usize, exec: &dyn Exec| {
        let mut tok = 1u32;
        for _ in 0..steps {
            let logits = session.decode_with(tok, exec).unwrap();
            tok = (logits.iter().enumerate().fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
                as u32
                + 1)
                % 256;
        }
    };
    // Warm-up: every thread's kernel scratch reaches its size.
    decode(&mut session, 8, &pool);
    let before = MARKED_ALLOCATIONS.load(Ordering::SeqCst);
    // Long enough to fold several chunks.
    decode(&mut session, 300, &pool);
    let after = MARKED_ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(after - before, 0, "decode on the pool allocated");
}

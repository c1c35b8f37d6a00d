//! The C API driven by bytes: each byte picks a call (load with any flags and length,
//! init in an arena of any size with any session config, prefill, chunked prefill that
//! cancels anywhere, decode, generate, logits into any buffer, sampler settings and seeds,
//! save into any buffer, restore a damaged snapshot, reset, tokenize and detokenize with
//! any buffer sizes), the following bytes its arguments. No sequence may panic (a panic
//! would come back as `KVM_ERR_PANIC`) or touch memory it was not given.
//!
//! Every `unsafe` block in the target's body is one C API call whose pointers are live
//! locals and whose lengths are those of the buffers passed (however short the input made
//! them), or the session `s`, null when its init failed, which every function must
//! refuse: the API's own argument checks are what is under test, so the blocks carry no
//! comment each.
#![no_main]
#![allow(clippy::undocumented_unsafe_blocks)]

use kvm_runtime::capi::kvm_status::*;
use kvm_runtime::capi::*;
use libfuzzer_sys::fuzz_target;

static BLOB: &[u8] = include_bytes!("../../models/tiny-kjv-q8_0.kvm");

/// The input, read as arguments.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn f32(&mut self) -> f32 {
        f32::from_bits(self.u32())
    }
    fn small(&mut self, max: usize) -> usize {
        (self.u32() as usize) % (max + 1)
    }
}

/// A 64-byte aligned buffer of `len` bytes.
struct Aligned {
    words: Vec<u128>,
    off: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let words = vec![0u128; len / 16 + 5];
        let off = (words.as_ptr() as *const u8).align_offset(64);
        Aligned { words, off, len }
    }
    fn ptr(&mut self) -> *mut u8 {
        // SAFETY: `off + len` lies inside the allocation by construction.
        unsafe { (self.words.as_mut_ptr() as *mut u8).add(self.off) }
    }
}

/// Stops a chunked prefill once `done` reaches the `usize` behind `user`.
unsafe extern "C" fn stop_at(user: *mut std::ffi::c_void, done: usize, _total: usize) -> i32 {
    // SAFETY: the target passes a live `usize`.
    i32::from(done >= unsafe { *user.cast::<usize>() })
}

fn ok(code: kvm_status) {
    assert_ne!(code, KVM_ERR_PANIC, "a call panicked");
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let mut model = Box::new(kvm_model::new());
    let flags = u32::from(b.u8() % 4);
    let cut = if b.u8() % 8 == 0 { b.small(BLOB.len()) } else { BLOB.len() };
    ok(unsafe { kvm_model_load(BLOB.as_ptr(), cut, flags, &mut *model) });
    // One byte picks the arena (short or not, its low bits) and the config (any, a
    // quarter of the time, its top bits; threads kept to two so an input stays quick).
    let pick = b.u8();
    let config = match pick >> 6 {
        3 => kvm_session_config { state_slots: b.u32() % 80, threads: b.u32() % 3, batch_tokens: b.u32() % 80 },
        _ => kvm_session_config_default(),
    };
    let mut need = 0;
    ok(unsafe { kvm_arena_size_for(&*model, config.state_slots, &mut need) });
    let arena_len = match pick % 8 {
        0 => need.saturating_sub(b.small(4096)),
        _ => need,
    };
    let mut arena = Aligned::new(arena_len.max(1));
    let mut s = std::ptr::null_mut();
    ok(unsafe { kvm_session_init_ex(&*model, &config, arena.ptr().cast(), arena.len, &mut s) });
    let mut snap: Vec<u8> = Vec::new();
    let mut steps = 0;
    while !b.0.is_empty() && steps < 64 {
        steps += 1;
        match b.u8() % 16 {
            0 => {
                let n = b.small(40);
                let ids: Vec<u32> = (0..n).map(|_| if b.u8() < 250 { u32::from(b.u8()) } else { b.u32() }).collect();
                ok(unsafe { kvm_prefill(s, ids.as_ptr(), ids.len()) });
            }
            1 | 2 => {
                let mut t = 0;
                ok(unsafe { kvm_decode_step(s, &mut t) });
            }
            3 => {
                let mut n = 0;
                ok(unsafe { kvm_generate(s, b.small(8), None, std::ptr::null_mut(), &mut n) });
            }
            4 => {
                let cfg = kvm_sampler_config {
                    temperature: b.f32(),
                    top_k: b.u32(),
                    top_p: b.f32(),
                    min_p: b.f32(),
                    repeat_penalty: b.f32(),
                    repeat_window: b.u32() % 512,
                };
                ok(unsafe { kvm_sampler_set(s, &cfg) });
            }
            5 => {
                let cfg = if b.u8() % 2 == 0 { kvm_sampler_greedy() } else { kvm_sampler_default() };
                ok(unsafe { kvm_sampler_set(s, &cfg) });
                ok(unsafe { kvm_sampler_seed(s, u64::from(b.u32())) });
            }
            6 => {
                let size = unsafe { kvm_state_size(s) };
                let cap = if b.u8() % 4 == 0 { b.small(size) } else { size };
                snap = vec![0u8; cap];
                let mut written = 0;
                ok(unsafe { kvm_state_save(s, snap.as_mut_ptr().cast(), snap.len(), &mut written) });
            }
            7 => {
                for _ in 0..b.small(3) {
                    if !snap.is_empty() {
                        let at = b.u32() as usize % snap.len();
                        snap[at] ^= b.u8();
                    }
                }
                ok(unsafe { kvm_state_restore(s, snap.as_ptr().cast(), snap.len()) });
            }
            8 => ok(unsafe { kvm_session_reset(s) }),
            9 => {
                let text: Vec<u8> = (0..b.small(24)).map(|_| b.u8()).collect();
                let mut ids = vec![0u32; b.small(32)];
                let mut n = 0;
                ok(unsafe {
                    kvm_tokenize(&*model, text.as_ptr().cast(), text.len(), ids.as_mut_ptr(), ids.len(), &mut n)
                });
            }
            10 => {
                let ids: Vec<u32> = (0..b.small(16)).map(|_| u32::from(b.u8()) | u32::from(b.u8() % 2) << 8).collect();
                let mut text = vec![0u8; b.small(64)];
                let mut n = 0;
                ok(unsafe {
                    kvm_detokenize(&*model, ids.as_ptr(), ids.len(), text.as_mut_ptr().cast(), text.len(), &mut n)
                });
            }
            11 => {
                let mut info = kvm_model_desc::default();
                ok(unsafe { kvm_model_info(&*model, &mut info) });
                let _ = unsafe { kvm_session_pos(s) };
            }
            12 => ok(unsafe { kvm_model_set_cache(&mut *model, b.u32() % 4) }),
            13 => {
                let (mut p, mut n) = (std::ptr::null(), 0);
                ok(unsafe { kvm_logits(s, &mut p, &mut n) });
            }
            14 => {
                let mut out = vec![0f32; b.small(300)];
                let mut n = 0;
                ok(unsafe { kvm_logits_copy(s, out.as_mut_ptr(), out.len(), &mut n) });
            }
            _ => {
                let ids: Vec<u32> = (0..b.small(80)).map(|_| u32::from(b.u8())).collect();
                let (chunk, mut stop) = (b.small(20), b.small(80));
                let mut fed = 0;
                let user = (&mut stop as *mut usize).cast();
                ok(unsafe { kvm_prefill_chunked(s, ids.as_ptr(), ids.len(), chunk, Some(stop_at), user, &mut fed) });
            }
        }
    }
    ok(unsafe { kvm_session_release(s) });
});

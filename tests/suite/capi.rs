//! The C API, called through its `extern "C"` functions exactly as C calls them: handle
//! and argument checks, tokenizing, generation against the Rust path and the reference,
//! state snapshots that resume bit-exactly, and the C example program itself.
//!
//! Every `unsafe` block here is one C API call, made as C makes it: with pointers to
//! live locals of the sizes the call asks for, or with the null, misaligned or short
//! arguments whose rejection is under test; so the blocks carry no comment each.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::process::Command;
use std::ptr::{null, null_mut};
use std::sync::OnceLock;

use crate::common::*;
use kvm_core::cache::CacheDtype;
use kvm_core::error::{ConfigField, Origin, Section, Unsupported};
use kvm_core::format::Role;
use kvm_core::quant::DType;
use kvm_core::sampler::{ranges, Candidate, Sampler, SamplerConfig};
use kvm_core::{Error, Model, Session};
use kvm_runtime::capi::kvm_status::*;
use kvm_runtime::capi::*;

/// tiny-kjv as f32, converted once.
fn tiny_kjv() -> &'static [u8] {
    static BLOB: OnceLock<Vec<u8>> = OnceLock::new();
    BLOB.get_or_init(|| convert_to_bytes(&repo().join("models/tiny-kjv"), DType::F32))
}

/// A loaded model and arenas for its sessions.
struct Fixture {
    model: Box<kvm_model>,
    arena_len: usize,
}

impl Fixture {
    fn new(blob: &'static [u8]) -> Fixture {
        let mut model = Box::new(kvm_model::new());
        assert_eq!(unsafe { kvm_model_load(blob.as_ptr(), blob.len(), 0, &mut *model) }, KVM_OK);
        let arena_len = unsafe { kvm_arena_size(&*model) };
        assert!(arena_len > 0);
        Fixture { model, arena_len }
    }

    fn kjv() -> Fixture {
        Fixture::new(tiny_kjv())
    }

    /// A session in a fresh arena (kept alive by the returned value).
    fn session(&self) -> TestSession {
        let mut arena = Arena::new(self.arena_len);
        let mut s = null_mut();
        let bytes = arena.bytes_mut();
        let code = unsafe { kvm_session_init(&*self.model, bytes.as_mut_ptr().cast(), bytes.len(), &mut s) };
        assert_eq!(code, KVM_OK);
        assert_eq!(s.cast::<u8>(), bytes.as_mut_ptr(), "the handle is the arena's address");
        TestSession { s, _arena: arena }
    }

    fn tokenize(&self, text: &str) -> Vec<u32> {
        let mut ids = vec![0u32; text.len()];
        let mut n = 0;
        let code = unsafe {
            kvm_tokenize(&*self.model, text.as_ptr().cast(), text.len(), ids.as_mut_ptr(), ids.len(), &mut n)
        };
        assert_eq!(code, KVM_OK);
        ids.truncate(n);
        ids
    }

    fn detokenize(&self, ids: &[u32]) -> Vec<u8> {
        let mut text = vec![0u8; ids.len() * 8];
        let mut n = 0;
        let code = unsafe {
            kvm_detokenize(&*self.model, ids.as_ptr(), ids.len(), text.as_mut_ptr().cast(), text.len(), &mut n)
        };
        assert_eq!(code, KVM_OK);
        text.truncate(n);
        text
    }
}

struct TestSession {
    s: *mut kvm_session,
    _arena: Arena,
}

impl TestSession {
    fn prefill(&self, ids: &[u32]) {
        assert_eq!(unsafe { kvm_prefill(self.s, ids.as_ptr(), ids.len()) }, KVM_OK);
    }

    fn step(&self) -> u32 {
        let mut t = u32::MAX;
        assert_eq!(unsafe { kvm_decode_step(self.s, &mut t) }, KVM_OK);
        t
    }

    fn steps(&self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.step()).collect()
    }

    fn set_sampler(&self, cfg: kvm_sampler_config, seed: u64) {
        assert_eq!(unsafe { kvm_sampler_set(self.s, &cfg) }, KVM_OK);
        assert_eq!(unsafe { kvm_sampler_seed(self.s, seed) }, KVM_OK);
    }

    fn pos(&self) -> usize {
        unsafe { kvm_session_pos(self.s) }
    }

    fn save(&self) -> Vec<u8> {
        let n = unsafe { kvm_state_size(self.s) };
        let mut buf = vec![0u8; n];
        let mut written = 0;
        assert_eq!(unsafe { kvm_state_save(self.s, buf.as_mut_ptr().cast(), buf.len(), &mut written) }, KVM_OK);
        assert_eq!(written, n);
        buf
    }

    fn restore(&self, snap: &[u8]) -> kvm_status {
        unsafe { kvm_state_restore(self.s, snap.as_ptr().cast(), snap.len()) }
    }
}

fn greedy() -> kvm_sampler_config {
    kvm_sampler_greedy()
}

/// Sampling with every filter and the repetition penalty on, so snapshots must carry the
/// RNG position and the token history.
fn sampling() -> kvm_sampler_config {
    kvm_sampler_config { repeat_penalty: 1.3, repeat_window: 64, ..kvm_sampler_default() }
}

fn c_str(p: *const std::ffi::c_char) -> &'static str {
    assert!(!p.is_null());
    unsafe { CStr::from_ptr(p) }.to_str().unwrap()
}

/// Tokens the core's own Session produces greedily: the Rust path.
fn rust_greedy(blob: &[u8], prompt: &[u32], n: usize) -> Vec<u32> {
    rust_greedy_cached(blob, CacheDtype::F32, prompt, n)
}

/// [`rust_greedy`] with the attention rows stored as `cache`.
fn rust_greedy_cached(blob: &[u8], cache: CacheDtype, prompt: &[u32], n: usize) -> Vec<u32> {
    let model = Model::from_bytes(blob).unwrap().with_cache(cache).unwrap();
    let mut arena = Arena::new(model.arena_len());
    let mut session = Session::new(model, arena.bytes_mut()).unwrap();
    let mut sampler = Sampler::new(SamplerConfig::greedy(), 0);
    let mut scratch = vec![Candidate::EMPTY; model.config().vocab_len as usize];
    let mut logits = session.prefill(prompt).unwrap().to_vec();
    let mut out = vec![];
    while out.len() < n {
        let t = sampler.sample(&logits, &[], &mut scratch).unwrap();
        out.push(t);
        if out.len() < n {
            logits = session.decode(t).unwrap().to_vec();
        }
    }
    out
}

#[test]
fn version_and_status_strings() {
    assert_eq!(c_str(kvm_version()), env!("CARGO_PKG_VERSION"));
    let mut seen = std::collections::HashSet::new();
    for s in kvm_status::all() {
        let msg = c_str(kvm_status_string(s as i32));
        assert!(!msg.is_empty() && msg != "unknown status", "{s:?}");
        assert!(seen.insert(msg), "{s:?} shares its message");
    }
    assert_eq!(kvm_status::all()[0], KVM_OK);
    assert_eq!(KVM_OK as i32, 0);
    for code in [-1, 20, 99, 109, i32::MIN, i32::MAX] {
        assert_eq!(c_str(kvm_status_string(code)), "unknown status");
    }
}

#[test]
fn every_core_error_kind_has_its_own_code() {
    let kinds = [
        Error::Truncated,
        Error::BadMagic,
        Error::UnsupportedVersion { major: 9, minor: 0 },
        Error::BadEndianness,
        Error::Checksum { section: Section::Header },
        Error::OutOfBounds,
        Error::Misaligned,
        Error::BadTensor { role: 0, layer: 0 },
        Error::BadConfig(ConfigField::VocabLen),
        Error::Unsupported(Unsupported::DType),
        Error::ArenaSize { expected: 1, got: 0 },
        Error::ArenaMisaligned,
        Error::TokenOutOfRange { token: 1, vocab_len: 1 },
        Error::BufferTooSmall { needed: 1 },
        Error::BadTokenizer,
        Error::BadSnapshot,
        Error::InvalidArgument,
        Error::NonFiniteLogits { pos: 0, origin: Origin::Head },
        Error::ExtraBytes { file_len: 1, blob_len: 2 },
        Error::OutOfMemory { bytes: 1 },
    ];
    let codes: std::collections::HashSet<i32> = kinds.iter().map(|&e| kvm_status::from(e) as i32).collect();
    assert_eq!(codes.len(), kinds.len());
    assert!(!codes.contains(&0));
    // Payloads do not matter.
    assert_eq!(kvm_status::from(Error::Checksum { section: Section::Tensor { index: 3 } }), KVM_ERR_CHECKSUM);
}

#[test]
fn load_reports_every_bad_blob_as_the_core_does() {
    let blob = tiny_kjv();
    let mut m = kvm_model::new();
    let load =
        |bytes: &[u8], flags: u32, m: &mut kvm_model| unsafe { kvm_model_load(bytes.as_ptr(), bytes.len(), flags, m) };
    assert_eq!(load(blob, 0, &mut m), KVM_OK);
    assert_eq!(load(blob, KVM_LOAD_TRUSTED, &mut m), KVM_OK);
    assert_eq!(load(blob, 2, &mut m), KVM_ERR_INVALID_ARGUMENT);
    assert_eq!(unsafe { kvm_model_load(null(), 0, 0, &mut m) }, KVM_ERR_TRUNCATED);
    assert_eq!(unsafe { kvm_model_load(null(), 10, 0, &mut m) }, KVM_ERR_NULL_POINTER);
    assert_eq!(unsafe { kvm_model_load(blob.as_ptr(), blob.len(), 0, null_mut()) }, KVM_ERR_NULL_POINTER);
    assert_eq!(unsafe { kvm_model_load(blob.as_ptr(), usize::MAX, 0, &mut m) }, KVM_ERR_INVALID_ARGUMENT);
    // A kvm_model at an odd address.
    let mut words = vec![0u64; KVM_MODEL_WORDS + 1];
    let odd = unsafe { words.as_mut_ptr().cast::<u8>().add(4) }.cast::<kvm_model>();
    assert_eq!(unsafe { kvm_model_load(blob.as_ptr(), blob.len(), 0, odd) }, KVM_ERR_MISALIGNED_POINTER);

    let expect = |bytes: &[u8]| match Model::from_bytes(bytes) {
        Ok(_) => KVM_OK,
        Err(e) => kvm_status::from(e),
    };
    let mut bad = blob.to_vec();
    bad[0] ^= 0xFF;
    assert_eq!(load(&bad, 0, &mut m), KVM_ERR_BAD_MAGIC);
    // Truncations, from nothing to one byte short.
    for len in [0, 1, 3, 4, 8, 100, 255, 256, 300, 4096, blob.len() / 2, blob.len() - 1] {
        let got = load(&blob[..len], 0, &mut m);
        assert_ne!(got, KVM_OK, "length {len}");
        assert_eq!(got, expect(&blob[..len]), "length {len}");
    }
    // Corrupted bytes: the same verdict as the core, and never a panic.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..300 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut bad = blob.to_vec();
        let at = (x % 1024.min(blob.len() as u64)) as usize;
        bad[at] = bad[at].wrapping_add((x >> 32) as u8 | 1);
        let got = load(&bad, 0, &mut m);
        assert_ne!(got, KVM_ERR_PANIC);
        assert_eq!(got, expect(&bad), "byte {at}");
    }
    // A flipped weight fails its checksum, unless the image is trusted.
    let mut bad = blob.to_vec();
    let last = bad.len() - 100;
    bad[last] ^= 1;
    assert_eq!(load(&bad, 0, &mut m), KVM_ERR_CHECKSUM);
    assert_eq!(load(&bad, KVM_LOAD_TRUSTED, &mut m), KVM_OK);
}

#[test]
fn model_info_and_unloaded_handles() {
    let f = Fixture::kjv();
    let mut info = kvm_model_desc::default();
    assert_eq!(unsafe { kvm_model_info(&*f.model, &mut info) }, KVM_OK);
    assert_eq!((info.vocab_len, info.n_layers, info.n_heads, info.d_model), (256, 4, 4, 128));
    assert_eq!((info.d_qk, info.d_v, info.chunk_len, info.window_len, info.state_len), (32, 32, 32, 64, 32));
    assert_eq!((info.format_major, info.tokenizer), (1, 0));
    assert_eq!(info.n_params, 892_704);
    assert_eq!(info.file_len, tiny_kjv().len() as u64);
    assert_eq!(info.arena_size, f.arena_len);
    let core = Model::from_bytes(tiny_kjv()).unwrap();
    assert!(info.arena_size > core.arena_len(), "the arena also holds the handle and the sampler's scratch");
    let s = f.session();
    assert_eq!(info.state_size, unsafe { kvm_state_size(s.s) });
    assert_eq!(unsafe { kvm_model_info(&*f.model, null_mut()) }, KVM_ERR_NULL_POINTER);

    let blank = kvm_model::new();
    assert_eq!(unsafe { kvm_model_info(&blank, &mut info) }, KVM_ERR_BAD_HANDLE);
    assert_eq!(unsafe { kvm_model_info(null(), &mut info) }, KVM_ERR_NULL_POINTER);
    assert_eq!(unsafe { kvm_arena_size(&blank) }, 0);
    assert_eq!(unsafe { kvm_arena_size(null()) }, 0);
    let mut arena = Arena::new(f.arena_len);
    let mut h = null_mut();
    let a = arena.bytes_mut();
    assert_eq!(unsafe { kvm_session_init(&blank, a.as_mut_ptr().cast(), a.len(), &mut h) }, KVM_ERR_BAD_HANDLE);
    let mut n = 0;
    assert_eq!(unsafe { kvm_tokenize(&blank, c"a".as_ptr(), 1, null_mut(), 0, &mut n) }, KVM_ERR_BAD_HANDLE);
    // A copy of a loaded kvm_model is as good as the original.
    let copy = *f.model;
    assert_eq!(unsafe { kvm_arena_size(&copy) }, f.arena_len);
}

#[test]
fn compact_caches_shrink_the_arena_and_decode_as_the_rust_path() {
    let mut arena_len = usize::MAX;
    for (c, cache) in [(KVM_CACHE_F16, CacheDtype::F16), (KVM_CACHE_Q8, CacheDtype::Q8)] {
        let mut f = Fixture::kjv();
        let mut info = kvm_model_desc::default();
        assert_eq!(unsafe { kvm_model_info(&*f.model, &mut info) }, KVM_OK);
        assert_eq!(info.cache, KVM_CACHE_F32);
        let (arena32, state32) = (info.arena_size, info.state_size);
        assert_eq!(unsafe { kvm_model_set_cache(&mut *f.model, 7) }, KVM_ERR_INVALID_ARGUMENT);
        assert_eq!(unsafe { kvm_model_set_cache(null_mut(), c) }, KVM_ERR_NULL_POINTER);
        assert_eq!(unsafe { kvm_model_set_cache(&mut *f.model, c) }, KVM_OK);
        assert_eq!(unsafe { kvm_model_info(&*f.model, &mut info) }, KVM_OK);
        assert_eq!(info.cache, c);
        assert!(info.arena_size < arena32 && info.state_size < state32, "{cache:?} shrinks arena and snapshots");
        assert!(info.arena_size < arena_len, "q8 is smaller than f16");
        arena_len = info.arena_size;
        f.arena_len = unsafe { kvm_arena_size(&*f.model) };
        assert_eq!(f.arena_len, info.arena_size);
        let r = &references()[0];
        let ids = f.tokenize(&r.prompt);
        let s = f.session();
        s.set_sampler(greedy(), 0);
        s.prefill(&ids);
        let n = r.greedy_ids.len();
        assert_eq!(s.steps(n), rust_greedy_cached(tiny_kjv(), cache, &ids, n), "{cache:?}");
    }
}

#[test]
fn arenas_are_checked() {
    let f = Fixture::kjv();
    let m = &*f.model;
    let mut arena = Arena::new(f.arena_len + 128);
    let a = arena.bytes_mut();
    let p = a.as_mut_ptr();
    let mut s = null_mut();
    assert_eq!(unsafe { kvm_session_init(m, null_mut(), f.arena_len, &mut s) }, KVM_ERR_NULL_POINTER);
    assert_eq!(unsafe { kvm_session_init(m, p.cast(), f.arena_len, null_mut()) }, KVM_ERR_NULL_POINTER);
    assert_eq!(unsafe { kvm_session_init(m, p.add(8).cast(), f.arena_len, &mut s) }, KVM_ERR_ARENA_MISALIGNED);
    assert_eq!(unsafe { kvm_session_init(m, p.cast(), f.arena_len - 1, &mut s) }, KVM_ERR_ARENA_SIZE);
    assert_eq!(unsafe { kvm_session_init(m, p.cast(), 0, &mut s) }, KVM_ERR_ARENA_SIZE);
    assert!(s.is_null(), "no handle on failure");
    // Garbage in the arena does not matter; a larger arena is fine.
    a.fill(0xA5);
    assert_eq!(unsafe { kvm_session_init(m, p.cast(), a.len(), &mut s) }, KVM_OK);
    assert_eq!(unsafe { kvm_session_pos(s) }, 0);
    assert_eq!(unsafe { kvm_session_init(m, p.add(64).cast(), f.arena_len, &mut s) }, KVM_OK);
}

#[test]
fn session_handles_are_checked() {
    let f = Fixture::kjv();
    let mut t = 0u32;
    let mut n = 0usize;
    let cfg = greedy();
    let id = [65u32];
    let mut buf = [0u8; 64];
    for s in [null_mut(), Arena::new(4096).bytes_mut().as_mut_ptr().cast::<kvm_session>()] {
        let want = if s.is_null() { KVM_ERR_NULL_POINTER } else { KVM_ERR_BAD_HANDLE };
        unsafe {
            assert_eq!(kvm_session_reset(s), want);
            assert_eq!(kvm_sampler_set(s, &cfg), want);
            assert_eq!(kvm_sampler_seed(s, 1), want);
            assert_eq!(kvm_prefill(s, id.as_ptr(), 1), want);
            assert_eq!(kvm_decode_step(s, &mut t), want);
            assert_eq!(kvm_generate(s, 4, None, null_mut(), &mut n), want);
            assert_eq!(kvm_state_save(s, buf.as_mut_ptr().cast(), buf.len(), &mut n), want);
            assert_eq!(kvm_state_restore(s, buf.as_ptr().cast(), buf.len()), want);
            assert_eq!(kvm_session_pos(s), 0);
            assert_eq!(kvm_state_size(s), 0);
        }
    }
    // A misaligned handle.
    let s = f.session();
    let off = unsafe { s.s.cast::<u8>().add(8) }.cast::<kvm_session>();
    assert_eq!(unsafe { kvm_session_reset(off) }, KVM_ERR_BAD_HANDLE);
    // A session copied to another address is refused: it points into its old arena.
    s.prefill(&[65, 66]);
    let mut moved = Arena::new(f.arena_len);
    let m = moved.bytes_mut();
    unsafe { std::ptr::copy_nonoverlapping(s.s.cast::<u8>(), m.as_mut_ptr(), f.arena_len) };
    assert_eq!(unsafe { kvm_decode_step(m.as_mut_ptr().cast(), &mut t) }, KVM_ERR_BAD_HANDLE);
    // The original is fine.
    s.step();
}

#[test]
fn token_ids_and_buffers_are_checked() {
    let f = Fixture::kjv();
    let s = f.session();
    let mut t = 0;
    assert_eq!(unsafe { kvm_decode_step(s.s, &mut t) }, KVM_ERR_NO_CONTEXT);
    assert_eq!(unsafe { kvm_generate(s.s, 3, None, null_mut(), null_mut()) }, KVM_ERR_NO_CONTEXT);
    // A bad id anywhere leaves the session untouched.
    let bad = [65u32, 66, 256, 67];
    assert_eq!(unsafe { kvm_prefill(s.s, bad.as_ptr(), bad.len()) }, KVM_ERR_TOKEN_OUT_OF_RANGE);
    assert_eq!(unsafe { kvm_prefill(s.s, [u32::MAX].as_ptr(), 1) }, KVM_ERR_TOKEN_OUT_OF_RANGE);
    assert_eq!(s.pos(), 0);
    assert_eq!(unsafe { kvm_prefill(s.s, bad.as_ptr(), 0) }, KVM_ERR_INVALID_ARGUMENT);
    assert_eq!(unsafe { kvm_prefill(s.s, null(), 3) }, KVM_ERR_NULL_POINTER);
    assert_eq!(unsafe { kvm_prefill(s.s, bad.as_ptr(), usize::MAX) }, KVM_ERR_INVALID_ARGUMENT);
    assert_eq!(unsafe { kvm_prefill(s.s, bad.as_ptr(), usize::MAX / 4 + 1) }, KVM_ERR_INVALID_ARGUMENT);
    let odd = unsafe { bad.as_ptr().cast::<u8>().add(1) }.cast::<u32>();
    assert_eq!(unsafe { kvm_prefill(s.s, odd, 2) }, KVM_ERR_MISALIGNED_POINTER);
    assert_eq!(s.pos(), 0);
    s.prefill(&bad[..2]);
    assert_eq!(s.pos(), 2);
    assert_eq!(unsafe { kvm_decode_step(s.s, null_mut()) }, KVM_ERR_NULL_POINTER);
    assert_eq!(s.pos(), 2, "a refused step changes nothing");
    s.step();
    assert_eq!(s.pos(), 3);

    // Detokenizing.
    let mut text = [0u8; 8];
    let mut n = 0;
    let m = &*f.model;
    let tp = text.as_mut_ptr().cast();
    assert_eq!(unsafe { kvm_detokenize(m, [300u32].as_ptr(), 1, tp, 8, &mut n) }, KVM_ERR_TOKEN_OUT_OF_RANGE);
    assert_eq!(unsafe { kvm_detokenize(m, [65u32].as_ptr(), 1, tp, 8, null_mut()) }, KVM_ERR_NULL_POINTER);
    assert_eq!(unsafe { kvm_detokenize(m, null(), 0, tp, 8, &mut n) }, KVM_OK);
    assert_eq!(n, 0);
}

#[test]
fn tokenize_reports_sizes_and_round_trips() {
    let f = Fixture::kjv();
    let m = &*f.model;
    let text = "In the beginning God created the heaven and the earth. \u{2014} \u{00e9}";
    let mut n = 0;
    let code = unsafe { kvm_tokenize(m, text.as_ptr().cast(), text.len(), null_mut(), 0, &mut n) };
    assert_eq!(code, KVM_ERR_BUFFER_TOO_SMALL);
    assert_eq!(n, text.len(), "byte-level: one id per byte");
    let mut ids = vec![0u32; n];
    let code = unsafe { kvm_tokenize(m, text.as_ptr().cast(), text.len(), ids.as_mut_ptr(), n - 1, &mut n) };
    assert_eq!((code, n), (KVM_ERR_BUFFER_TOO_SMALL, text.len()));
    let code = unsafe { kvm_tokenize(m, text.as_ptr().cast(), text.len(), null_mut(), 5, &mut n) };
    assert_eq!(code, KVM_ERR_NULL_POINTER);
    let code = unsafe { kvm_tokenize(m, text.as_ptr().cast(), text.len(), ids.as_mut_ptr(), 0, null_mut()) };
    assert_eq!(code, KVM_ERR_NULL_POINTER);
    assert_eq!(unsafe { kvm_tokenize(m, null(), 0, null_mut(), 0, &mut n) }, KVM_OK);
    assert_eq!(n, 0);
    assert_eq!(unsafe { kvm_tokenize(m, null(), 4, null_mut(), 0, &mut n) }, KVM_ERR_NULL_POINTER);

    let ids = f.tokenize(text);
    assert_eq!(ids, text.bytes().map(u32::from).collect::<Vec<_>>());
    let mut len = 0;
    let code = unsafe { kvm_detokenize(m, ids.as_ptr(), ids.len(), null_mut(), 0, &mut len) };
    assert_eq!((code, len), (KVM_ERR_BUFFER_TOO_SMALL, text.len()));
    assert_eq!(f.detokenize(&ids), text.as_bytes());
}

#[test]
fn sampler_settings_are_validated() {
    let f = Fixture::kjv();
    let s = f.session();
    let mut got = greedy();
    assert_eq!(unsafe { kvm_sampler_get(s.s, &mut got) }, KVM_OK);
    assert_eq!(got, kvm_sampler_default(), "sessions start at the defaults");
    assert_eq!(SamplerConfig::from(kvm_sampler_default()), SamplerConfig::DEFAULT);
    assert_eq!(SamplerConfig::from(kvm_sampler_greedy()), SamplerConfig::greedy());
    let d = kvm_sampler_default();
    let max = KVM_MAX_REPEAT_WINDOW;
    for bad in [
        kvm_sampler_config { temperature: f32::NAN, ..d },
        kvm_sampler_config { temperature: -1.0, ..d },
        kvm_sampler_config { top_p: 0.0, ..d },
        kvm_sampler_config { min_p: 2.0, ..d },
        kvm_sampler_config { repeat_penalty: 0.0, ..d },
        kvm_sampler_config { repeat_window: max + 1, ..d },
    ] {
        assert_eq!(unsafe { kvm_sampler_set(s.s, &bad) }, KVM_ERR_INVALID_ARGUMENT, "{bad:?}");
        assert_eq!(unsafe { kvm_sampler_get(s.s, &mut got) }, KVM_OK);
        assert_eq!(got, d, "a refused setting changes nothing");
    }
    let ok = kvm_sampler_config { repeat_window: max, ..greedy() };
    assert_eq!(unsafe { kvm_sampler_set(s.s, &ok) }, KVM_OK);
    assert_eq!(unsafe { kvm_sampler_get(s.s, &mut got) }, KVM_OK);
    assert_eq!(got, ok);
    assert_eq!(unsafe { kvm_sampler_set(s.s, null()) }, KVM_ERR_NULL_POINTER);
    assert_eq!(unsafe { kvm_sampler_get(s.s, null_mut()) }, KVM_ERR_NULL_POINTER);
}

struct Reference {
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
}

fn references() -> Vec<Reference> {
    let path = repo().join("models/tiny-kjv/reference/greedy.json");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    json.as_array()
        .unwrap()
        .iter()
        .map(|r| Reference {
            prompt: r["prompt"].as_str().unwrap().to_string(),
            prompt_ids: ids(&r["prompt_ids"]),
            greedy_ids: ids(&r["greedy_ids"]),
        })
        .collect()
}

#[test]
fn greedy_equals_the_rust_path_and_the_reference() {
    let f = Fixture::kjv();
    let refs = references();
    assert!(!refs.is_empty());
    for r in &refs {
        let ids = f.tokenize(&r.prompt);
        assert_eq!(ids, r.prompt_ids);
        let n = r.greedy_ids.len();

        // Pull.
        let s = f.session();
        s.set_sampler(greedy(), 0);
        s.prefill(&ids);
        let pulled = s.steps(n);
        assert_eq!(s.pos(), ids.len() + n);

        // Push.
        let s = f.session();
        s.set_sampler(greedy(), 0);
        s.prefill(&ids);
        let mut pushed: (Vec<u32>, Vec<u8>) = (vec![], vec![]);
        unsafe extern "C" fn collect(user: *mut c_void, token: u32, piece: *const u8, len: usize) -> i32 {
            let out = unsafe { &mut *user.cast::<(Vec<u32>, Vec<u8>)>() };
            out.0.push(token);
            out.1.extend_from_slice(unsafe { std::slice::from_raw_parts(piece, len) });
            0
        }
        let mut count = 0;
        let user = (&mut pushed as *mut (Vec<u32>, Vec<u8>)).cast();
        assert_eq!(unsafe { kvm_generate(s.s, n, Some(collect), user, &mut count) }, KVM_OK);
        assert_eq!(count, n);

        let rust = rust_greedy(tiny_kjv(), &ids, n);
        assert_eq!(pulled, rust, "{:?}: pull API vs Rust", r.prompt);
        assert_eq!(pushed.0, rust, "{:?}: push API vs Rust", r.prompt);
        assert_eq!(pulled, r.greedy_ids, "{:?}: C API vs the reference", r.prompt);
        assert_eq!(pushed.1, f.detokenize(&pushed.0), "callback pieces are the tokens' text");
    }
}

#[test]
fn generate_callback_stops_and_generation_resumes() {
    let f = Fixture::kjv();
    let prompt = f.tokenize("And the LORD spake unto Moses");
    let whole = {
        let s = f.session();
        s.set_sampler(sampling(), 3);
        s.prefill(&prompt);
        s.steps(12)
    };
    struct Stop {
        seen: Vec<u32>,
        after: usize,
    }
    unsafe extern "C" fn stop_after(user: *mut c_void, token: u32, _: *const u8, _: usize) -> i32 {
        let st = unsafe { &mut *user.cast::<Stop>() };
        st.seen.push(token);
        i32::from(st.seen.len() == st.after)
    }
    let s = f.session();
    s.set_sampler(sampling(), 3);
    s.prefill(&prompt);
    let mut st = Stop { seen: vec![], after: 5 };
    let mut count = 0;
    let user = (&mut st as *mut Stop).cast();
    assert_eq!(unsafe { kvm_generate(s.s, 100, Some(stop_after), user, &mut count) }, KVM_OK);
    assert_eq!((count, st.seen.len()), (5, 5));
    assert_eq!(s.pos(), prompt.len() + 5, "the token the callback stopped on is in the context");
    // Carrying on, without a callback, gives the uninterrupted sequence.
    assert_eq!(unsafe { kvm_generate(s.s, 4, None, null_mut(), &mut count) }, KVM_OK);
    assert_eq!(count, 4);
    let rest = s.steps(3);
    assert_eq!(st.seen, whole[..5]);
    assert_eq!(rest, whole[9..]);
    // max_tokens 0 does nothing.
    assert_eq!(unsafe { kvm_generate(s.s, 0, Some(stop_after), user, &mut count) }, KVM_OK);
    assert_eq!((count, s.pos()), (0, prompt.len() + 12));
}

#[test]
fn reset_starts_over() {
    let f = Fixture::kjv();
    let prompt = f.tokenize("Blessed are");
    let s = f.session();
    s.set_sampler(sampling(), 11);
    s.prefill(&prompt);
    let first = s.steps(16);
    assert_eq!(unsafe { kvm_session_reset(s.s) }, KVM_OK);
    assert_eq!(s.pos(), 0);
    let mut t = 0;
    assert_eq!(unsafe { kvm_decode_step(s.s, &mut t) }, KVM_ERR_NO_CONTEXT);
    s.prefill(&prompt);
    assert_eq!(s.steps(16), first, "reset rewinds the RNG to its seed");
}

/// Saves mid-generation, carries on, restores (in place and into another session) and
/// checks the continuation is the uninterrupted one, down to the state's bytes.
fn check_bit_exact_resume(f: &Fixture, prompt: &[u32], cfg: kvm_sampler_config, before: usize, after: usize) {
    let run = f.session();
    run.set_sampler(cfg, 99);
    run.prefill(prompt);
    let whole = run.steps(before + after);
    let end_state = run.save();

    let s = f.session();
    s.set_sampler(cfg, 99);
    s.prefill(prompt);
    assert_eq!(s.steps(before), whole[..before]);
    let snap = s.save();
    assert_eq!(s.steps(after), whole[before..], "uninterrupted");
    assert_eq!(s.restore(&snap), KVM_OK);
    assert_eq!(s.pos(), prompt.len() + before);
    assert_eq!(s.steps(after), whole[before..], "after restoring in place");
    assert_eq!(s.save(), end_state, "the state after resuming is bit-identical");

    // Another session, sampler settings copied (they are not part of the state).
    let other = f.session();
    other.set_sampler(cfg, 12345);
    assert_eq!(other.restore(&snap), KVM_OK);
    assert_eq!(other.steps(after), whole[before..], "after restoring into another session");
    assert_eq!(other.save(), end_state);
}

#[test]
fn state_restore_resumes_bit_exactly() {
    let f = Fixture::kjv();
    let prompt = f.tokenize("And God said, Let there be light");
    // Past the 64-token window, so the means state folds chunks in between.
    check_bit_exact_resume(&f, &prompt, sampling(), 40, 60);
    check_bit_exact_resume(&f, &prompt, greedy(), 3, 10);
    // Saved right after the prefill: the prompt's last token is still pending.
    check_bit_exact_resume(&f, &prompt, sampling(), 0, 20);
}

#[test]
fn state_restore_resumes_bit_exactly_on_every_golden_config() {
    for case in golden_cases() {
        let blob: &'static [u8] = Box::leak(convert_to_bytes(&golden_dir(&case), DType::F32).into_boxed_slice());
        let f = Fixture::new(blob);
        let vocab = Model::from_bytes(blob).unwrap().config().vocab_len;
        let prompt: Vec<u32> = (0..37u32).map(|i| (i * 7 + 3) % vocab).collect();
        eprintln!("{case}");
        check_bit_exact_resume(&f, &prompt, sampling(), 30, 50);
        check_bit_exact_resume(&f, &prompt[..3], sampling(), 0, 40);
    }
}

#[test]
fn bad_snapshots_are_refused_and_change_nothing() {
    let f = Fixture::kjv();
    let prompt = f.tokenize("The LORD is my shepherd");
    let s = f.session();
    s.set_sampler(sampling(), 5);
    s.prefill(&prompt);
    s.steps(4);
    let snap = s.save();
    let pos = s.pos();

    // Saving into a small buffer reports the size and writes nothing.
    let mut small = vec![0xEEu8; snap.len() - 1];
    let mut written = 0;
    let code = unsafe { kvm_state_save(s.s, small.as_mut_ptr().cast(), small.len(), &mut written) };
    assert_eq!((code, written), (KVM_ERR_BUFFER_TOO_SMALL, snap.len()));
    assert!(small.iter().all(|&b| b == 0xEE));
    let code = unsafe { kvm_state_save(s.s, null_mut(), 0, &mut written) };
    assert_eq!((code, written), (KVM_ERR_BUFFER_TOO_SMALL, snap.len()));
    let mut buf = vec![0u8; snap.len()];
    assert_eq!(unsafe { kvm_state_save(s.s, buf.as_mut_ptr().cast(), buf.len(), null_mut()) }, KVM_ERR_NULL_POINTER);
    assert_eq!(unsafe { kvm_state_save(s.s, null_mut(), snap.len(), &mut written) }, KVM_ERR_NULL_POINTER);

    // Wrong lengths, flipped bits anywhere, another model's snapshot.
    assert_eq!(s.restore(&snap[..snap.len() - 1]), KVM_ERR_BAD_SNAPSHOT);
    assert_eq!(s.restore(&[]), KVM_ERR_BAD_SNAPSHOT);
    assert_eq!(unsafe { kvm_state_restore(s.s, null(), snap.len()) }, KVM_ERR_NULL_POINTER);
    let mut longer = snap.clone();
    longer.push(0);
    assert_eq!(s.restore(&longer), KVM_ERR_BAD_SNAPSHOT);
    for at in [0, 4, 8, 16, 20, 24, 28, 32, 40, 48, 63, 64, 100, 1087, 1088, 1100, snap.len() / 2, snap.len() - 1] {
        let mut bad = snap.clone();
        bad[at] ^= 0x10;
        assert_eq!(s.restore(&bad), KVM_ERR_BAD_SNAPSHOT, "byte {at}");
    }
    let golden: &'static [u8] = Box::leak(convert_to_bytes(&golden_dir("fixed_basic"), DType::F32).into_boxed_slice());
    let g = Fixture::new(golden);
    let gs = g.session();
    gs.prefill(&[1, 2, 3]);
    let foreign = gs.save();
    assert_eq!(s.restore(&foreign), KVM_ERR_BAD_SNAPSHOT);

    // None of that touched the session.
    assert_eq!(s.pos(), pos);
    assert_eq!(s.save(), snap);
}

#[test]
fn moving_a_session_through_a_snapshot() {
    // The documented way to move a session: save, init a new arena, restore.
    let f = Fixture::kjv();
    let prompt = f.tokenize("Thou shalt");
    let a = f.session();
    a.set_sampler(greedy(), 0);
    a.prefill(&prompt);
    let snap = a.save();
    let expected = a.steps(20);
    drop(a);
    let b = f.session();
    b.set_sampler(greedy(), 0);
    assert_eq!(b.restore(&snap), KVM_OK);
    assert_eq!(b.steps(20), expected);
}

/// Builds and runs examples/c (through its run.sh) and checks its greedy tokens against
/// the Rust path. The C side goes through the generated header and the staticlib, so this
/// also catches a header that disagrees with the Rust structs.
#[test]
fn c_example_matches_rust_greedy() {
    let model = std::env::temp_dir().join(format!("kvm-capi-{}-tiny-kjv-f32.kvm", std::process::id()));
    std::fs::write(&model, tiny_kjv()).unwrap();
    let prompt = "In the beginning";
    let n = 48;
    // Its own target directory: the outer cargo may still hold the main one's lock.
    let target: PathBuf = repo().join("target/c-example");
    let run = |threads: &str| {
        let out = Command::new("sh")
            .arg(repo().join("examples/c/run.sh"))
            .arg(&model)
            .arg(prompt)
            .arg(n.to_string())
            .arg(threads)
            .env("CARGO_TARGET_DIR", &target)
            .output()
            .expect("run examples/c/run.sh");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "run.sh failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        stdout
    };
    let stdout = run("1");
    let threaded = run("2");
    std::fs::remove_file(&model).ok();
    assert_eq!(threaded, stdout, "two threads print the same, perplexity included");
    let ids: Vec<u32> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ids:"))
        .expect("an ids: line")
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    let prompt_ids: Vec<u32> = prompt.bytes().map(u32::from).collect();
    assert_eq!(ids, rust_greedy(tiny_kjv(), &prompt_ids, n));
    assert!(stdout.contains("state save/restore: ok"), "{stdout}");
    // The perplexity it computed from kvm_logits is the Rust session's.
    let (ppl, scored) = stdout
        .lines()
        .find_map(|l| l.strip_prefix("prompt perplexity: "))
        .and_then(|l| l.strip_suffix(" tokens"))
        .and_then(|l| l.split_once(" over "))
        .expect("a perplexity line");
    let (ppl, scored): (f64, usize) = (ppl.parse().unwrap(), scored.parse().unwrap());
    assert_eq!(scored, prompt_ids.len() - 1);
    let want = rust_perplexity(tiny_kjv(), &prompt_ids);
    assert!((ppl - want).abs() < 2e-6, "C example {ppl}, Rust {want}");
}

/// The perplexity of `ids[1..]`, each given what precedes it, by the core's Session.
fn rust_perplexity(blob: &[u8], ids: &[u32]) -> f64 {
    let model = Model::from_bytes(blob).unwrap();
    let mut arena = Arena::new(model.arena_len());
    let mut session = Session::new(model, arena.bytes_mut()).unwrap();
    let mut nll = 0.0;
    for (i, &t) in ids.iter().enumerate().skip(1) {
        let logits = session.prefill(&ids[i - 1..i]).unwrap();
        let max = logits.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
        let sum: f64 = logits.iter().map(|&x| (f64::from(x) - max).exp()).sum();
        nll -= f64::from(logits[t as usize]) - max - sum.ln();
    }
    let ppl = (nll / (ids.len() - 1) as f64).exp();
    assert!(ppl.is_finite() && ppl > 1.0, "{ppl}");
    ppl
}

/// `blob`, leaked so a `kvm_model` may borrow it for the rest of the test binary.
fn leak(blob: Vec<u8>) -> &'static [u8] {
    Box::leak(blob.into_boxed_slice())
}

#[test]
fn a_bad_out_pointer_fails_the_call_before_it_changes_anything() {
    let f = Fixture::kjv();
    let prompt = f.tokenize("In the beginning");
    let s = f.session();
    s.set_sampler(sampling(), 9);
    s.prefill(&prompt);
    let (pos, snap) = (s.pos(), s.save());
    let mut words = [0u32; 4];
    let odd = unsafe { words.as_mut_ptr().cast::<u8>().add(1) }.cast::<u32>();
    assert_eq!(unsafe { kvm_decode_step(s.s, odd) }, KVM_ERR_MISALIGNED_POINTER);
    assert_eq!(unsafe { kvm_decode_step(s.s, null_mut()) }, KVM_ERR_NULL_POINTER);
    let mut counts = [0usize; 2];
    let odd_count = unsafe { counts.as_mut_ptr().cast::<u8>().add(3) }.cast::<usize>();
    assert_eq!(unsafe { kvm_generate(s.s, 5, None, null_mut(), odd_count) }, KVM_ERR_MISALIGNED_POINTER);
    // No position advanced, no draw of the RNG, no token in the history.
    assert_eq!(s.pos(), pos);
    assert_eq!(s.save(), snap);
    let fresh = f.session();
    fresh.set_sampler(sampling(), 9);
    fresh.prefill(&prompt);
    assert_eq!(s.steps(6), fresh.steps(6));

    // Tokenizing into a misaligned count writes no ids.
    let mut ids = vec![u32::MAX; 32];
    let code = unsafe { kvm_tokenize(&*f.model, c"In".as_ptr(), 2, ids.as_mut_ptr(), ids.len(), odd_count) };
    assert_eq!(code, KVM_ERR_MISALIGNED_POINTER);
    assert!(ids.iter().all(|&t| t == u32::MAX));
    // A misaligned handle out-pointer: the arena is left alone.
    let mut arena = Arena::new(f.arena_len);
    let bytes = arena.bytes_mut();
    bytes.fill(0xAB);
    let mut handles = [null_mut::<kvm_session>(); 2];
    let odd_handle = unsafe { handles.as_mut_ptr().cast::<u8>().add(1) }.cast::<*mut kvm_session>();
    let code = unsafe { kvm_session_init(&*f.model, bytes.as_mut_ptr().cast(), bytes.len(), odd_handle) };
    assert_eq!(code, KVM_ERR_MISALIGNED_POINTER);
    assert!(bytes.iter().all(|&b| b == 0xAB));
}

#[test]
fn snapshots_are_bound_to_the_whole_model() {
    // The same weights and tensor table, another rope_theta: another model.
    let dir = checkpoint_copy(&repo().join("models/tiny-kjv"), "theta", |c| c["rope_theta"] = 500000.into());
    let other = leak(convert_to_bytes(&dir, DType::F32));
    std::fs::remove_dir_all(&dir).ok();
    let (a, b) = (Model::from_bytes(tiny_kjv()).unwrap(), Model::from_bytes(other).unwrap());
    assert_eq!(a.header().table_crc, b.header().table_crc, "the tensor tables match");
    assert_ne!(a.identity(), b.identity());

    let (fa, fb) = (Fixture::kjv(), Fixture::new(other));
    let (sa, sb) = (fa.session(), fb.session());
    let prompt = fa.tokenize("And God said");
    sa.prefill(&prompt);
    sa.steps(3);
    sb.prefill(&prompt);
    let before = sb.save();
    assert_eq!(sb.restore(&sa.save()), KVM_ERR_BAD_SNAPSHOT);
    assert_eq!(sb.save(), before);

    // The core's own snapshots, too.
    let mut arena_a = Arena::new(a.arena_len());
    let mut arena_b = Arena::new(b.arena_len());
    let mut core_a = Session::new(a, arena_a.bytes_mut()).unwrap();
    let mut core_b = Session::new(b, arena_b.bytes_mut()).unwrap();
    core_a.prefill(&prompt).unwrap();
    let mut snap = vec![0u8; core_a.snapshot_len()];
    core_a.snapshot(&mut snap).unwrap();
    assert_eq!(core_b.restore(&snap), Err(Error::BadSnapshot));
    assert_eq!(core_a.restore(&snap), Ok(()));
}

#[test]
fn non_finite_logits_have_their_own_status() {
    let blob = leak(model_with(256, f32::MAX));
    let f = Fixture::new(blob);
    let s = f.session();
    s.set_sampler(greedy(), 0);
    s.prefill(&[1, 2, 3]);
    // Nothing computed yet: a snapshot to go back to.
    let before = s.save();
    let mut t = u32::MAX;
    assert_eq!(unsafe { kvm_decode_step(s.s, &mut t) }, KVM_ERR_NON_FINITE);
    assert_eq!(t, u32::MAX);
    assert_eq!(
        c_str(kvm_status_string(KVM_ERR_NON_FINITE as i32)),
        "the model's logits are not finite (NaN or infinity)"
    );
    // The step was taken; until a reset or a restore every call says so again (not "no
    // context"), and changes nothing.
    assert_eq!(s.pos(), 3);
    let (mut p, mut n) = (null::<f32>(), 0usize);
    let mut buf = vec![0u8; before.len()];
    let mut written = 0usize;
    for _ in 0..2 {
        assert_eq!(unsafe { kvm_decode_step(s.s, &mut t) }, KVM_ERR_NON_FINITE);
        assert_eq!(unsafe { kvm_logits(s.s, &mut p, &mut n) }, KVM_ERR_NON_FINITE);
        assert_eq!((t, p, n), (u32::MAX, null(), 0));
        assert_eq!(unsafe { kvm_prefill(s.s, [4u32].as_ptr(), 1) }, KVM_ERR_NON_FINITE);
        assert_eq!(unsafe { kvm_generate(s.s, 3, None, null_mut(), null_mut()) }, KVM_ERR_NON_FINITE);
        let code = unsafe { kvm_state_save(s.s, buf.as_mut_ptr().cast(), buf.len(), &mut written) };
        assert_eq!(code, KVM_ERR_NON_FINITE);
        assert_eq!(s.pos(), 3);
    }
    // A restore goes back to before the overflow; the same step overflows again.
    assert_eq!(s.restore(&before), KVM_OK);
    assert_eq!(unsafe { kvm_logits(s.s, &mut p, &mut n) }, KVM_ERR_NON_FINITE);
    assert_eq!(s.pos(), 3);
    // A reset starts afresh.
    assert_eq!(unsafe { kvm_session_reset(s.s) }, KVM_OK);
    assert_eq!(s.pos(), 0);
    s.prefill(&[4]);
    assert_eq!(unsafe { kvm_logits(s.s, &mut p, &mut n) }, KVM_ERR_NON_FINITE);
    assert_eq!(unsafe { kvm_session_reset(s.s) }, KVM_OK);

    // The core says where: the position of the token whose logits overflowed, and the
    // stage of the forward pass that overflowed first.
    let model = Model::from_bytes(blob).unwrap();
    let mut arena = Arena::new(model.arena_len());
    let mut core = Session::new(model, arena.bytes_mut()).unwrap();
    for t in [5, 6] {
        core.step(t, kvm_core::state::Phase::Prefill, false).unwrap();
    }
    let head = Err(Error::NonFiniteLogits { pos: 2, origin: Origin::Head });
    assert_eq!(core.decode(7).map(|_| ()), head);
    assert_eq!(core.pos(), 3);
    let text = Error::NonFiniteLogits { pos: 2, origin: Origin::Block(1) }.to_string();
    assert!(text.contains("position 2") && text.contains("layer 1"), "{text}");
    // Values that overflow in layer 1 (of the tiny preset's 2): found there.
    let up = leak(model_with_matrix(256, (Role::Wv, 1), f32::MAX));
    let model = Model::from_bytes(up).unwrap();
    let mut arena = Arena::new(model.arena_len());
    let mut core = Session::new(model, arena.bytes_mut()).unwrap();
    assert_eq!(core.decode(7).map(|_| ()), Err(Error::NonFiniteLogits { pos: 0, origin: Origin::Block(1) }));
    // The same model with ordinary weights decodes.
    let fine = leak(model_with(256, 0.01));
    let model = Model::from_bytes(fine).unwrap();
    let mut arena = Arena::new(model.arena_len());
    let mut core = Session::new(model, arena.bytes_mut()).unwrap();
    assert!(core.decode(7).unwrap().iter().all(|x| x.is_finite()));
}

#[test]
fn a_failed_load_leaves_the_model_unloaded() {
    let blob = tiny_kjv();
    let mut m = kvm_model::new();
    assert_eq!(unsafe { kvm_model_load(blob.as_ptr(), blob.len(), 0, &mut m) }, KVM_OK);
    assert!(unsafe { kvm_arena_size(&m) } > 0);
    let mut bad = blob.to_vec();
    bad[0] ^= 1;
    assert_eq!(unsafe { kvm_model_load(bad.as_ptr(), bad.len(), 0, &mut m) }, KVM_ERR_BAD_MAGIC);
    assert_eq!(unsafe { kvm_arena_size(&m) }, 0);
    let mut info = kvm_model_desc::default();
    assert_eq!(unsafe { kvm_model_info(&m, &mut info) }, KVM_ERR_BAD_HANDLE);
    // A bad flag is a failed load too.
    assert_eq!(unsafe { kvm_model_load(blob.as_ptr(), blob.len(), 0, &mut m) }, KVM_OK);
    assert_eq!(unsafe { kvm_model_load(blob.as_ptr(), blob.len(), 2, &mut m) }, KVM_ERR_INVALID_ARGUMENT);
    assert_eq!(unsafe { kvm_arena_size(&m) }, 0);

    // Bytes past the header's file length are named as such.
    let mut longer = blob.to_vec();
    longer.push(0);
    assert_eq!(unsafe { kvm_model_load(longer.as_ptr(), longer.len(), 0, &mut m) }, KVM_ERR_EXTRA_BYTES);
    let file_len = blob.len() as u64;
    assert_eq!(Model::from_bytes(&longer).map(|_| ()), Err(Error::ExtraBytes { file_len, blob_len: file_len + 1 }));
}

/// The logits `kvm_logits()` points at, copied.
fn c_logits(s: &TestSession) -> Vec<f32> {
    let (mut p, mut n) = (null(), 0usize);
    assert_eq!(unsafe { kvm_logits(s.s, &mut p, &mut n) }, KVM_OK);
    unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

/// A session of `f` made with `config`, in an arena of `kvm_arena_size_for()` its slots.
fn session_ex(f: &Fixture, config: kvm_session_config) -> TestSession {
    let mut len = 0;
    assert_eq!(unsafe { kvm_arena_size_for(&*f.model, config.state_slots, &mut len) }, KVM_OK);
    let mut arena = Arena::new(len);
    let mut s = null_mut();
    let a = arena.bytes_mut();
    assert_eq!(unsafe { kvm_session_init_ex(&*f.model, &config, a.as_mut_ptr().cast(), a.len(), &mut s) }, KVM_OK);
    TestSession { s, _arena: arena }
}

fn config(threads: u32, batch_tokens: u32) -> kvm_session_config {
    kvm_session_config { threads, batch_tokens, ..kvm_session_config_default() }
}

#[test]
fn logits_are_the_rust_sessions() {
    let f = Fixture::kjv();
    let prompt = f.tokenize("And God said, Let there be light: and there was light.");
    let s = f.session();
    let (mut p, mut n) = (null::<f32>(), 7usize);
    assert_eq!(unsafe { kvm_logits(s.s, &mut p, &mut n) }, KVM_ERR_NO_CONTEXT, "a fresh session has none");
    assert_eq!((p, n), (null(), 7), "untouched on error");
    s.set_sampler(greedy(), 0);
    s.prefill(&prompt);

    let model = Model::from_bytes(tiny_kjv()).unwrap();
    let mut arena = Arena::new(model.arena_len());
    let mut rust = Session::new(model, arena.bytes_mut()).unwrap();
    let want = rust.prefill(&prompt).unwrap().to_vec();
    let got = c_logits(&s);
    assert_eq!(got.len(), 256);
    assert_eq!(bits(&got), bits(&want), "after the prompt");
    assert_eq!(s.pos(), prompt.len());
    assert_eq!(bits(&c_logits(&s)), bits(&want), "asking again runs nothing");

    // Copies: too small a buffer runs nothing and says how many.
    let before = s.save();
    let mut small = vec![0f32; 255];
    let mut len = 0;
    assert_eq!(unsafe { kvm_logits_copy(s.s, small.as_mut_ptr(), small.len(), &mut len) }, KVM_ERR_BUFFER_TOO_SMALL);
    assert_eq!(len, 256);
    assert_eq!(unsafe { kvm_logits_copy(s.s, null_mut(), 0, &mut len) }, KVM_ERR_BUFFER_TOO_SMALL);
    assert!(small.iter().all(|&x| x == 0.0));
    let mut copy = vec![0f32; 300];
    assert_eq!(unsafe { kvm_logits_copy(s.s, copy.as_mut_ptr(), copy.len(), null_mut()) }, KVM_ERR_NULL_POINTER);
    assert_eq!(unsafe { kvm_logits(s.s, null_mut(), &mut n) }, KVM_ERR_NULL_POINTER);
    assert_eq!(unsafe { kvm_logits(s.s, &mut p, null_mut()) }, KVM_ERR_NULL_POINTER);
    assert_eq!(unsafe { kvm_logits(null_mut(), &mut p, &mut n) }, KVM_ERR_NULL_POINTER);
    assert_eq!(s.save(), before, "failed calls change nothing");
    assert_eq!(unsafe { kvm_logits_copy(s.s, copy.as_mut_ptr(), copy.len(), &mut len) }, KVM_OK);
    assert_eq!((len, bits(&copy[..256])), (256, bits(&want)));

    // Decoding samples from those logits, and the next ones are the Rust path's too.
    let mut sampler = Sampler::new(SamplerConfig::greedy(), 0);
    let mut scratch = vec![Candidate::EMPTY; 256];
    let mut want = want;
    for _ in 0..70 {
        let t = s.step();
        assert_eq!(t, sampler.sample(&want, &[], &mut scratch).unwrap());
        want = rust.decode(t).unwrap().to_vec();
        assert_eq!(bits(&c_logits(&s)), bits(&want), "at {}", s.pos());
    }
    assert_eq!(unsafe { kvm_session_reset(s.s) }, KVM_OK);
    assert_eq!(unsafe { kvm_logits(s.s, &mut p, &mut n) }, KVM_ERR_NO_CONTEXT, "a reset session has none");
}

#[test]
fn logits_and_generation_without_them_agree() {
    // Reading the logits between steps changes no token and no state.
    let f = Fixture::kjv();
    let prompt = f.tokenize("Blessed are the meek");
    let (a, b) = (f.session(), f.session());
    for s in [&a, &b] {
        s.set_sampler(sampling(), 17);
        s.prefill(&prompt);
    }
    let plain = a.steps(30);
    let read: Vec<u32> = (0..30)
        .map(|_| {
            c_logits(&b);
            b.step()
        })
        .collect();
    assert_eq!(plain, read);
    assert_eq!(a.save(), b.save());
}

#[test]
fn snapshots_carry_the_logits() {
    let f = Fixture::kjv();
    let prompt = f.tokenize("In the beginning God");
    let s = f.session();
    s.set_sampler(sampling(), 4);
    s.prefill(&prompt);
    s.steps(5);
    let logits = c_logits(&s);
    let snap = s.save();
    let next = s.steps(20);

    let other = f.session();
    other.set_sampler(sampling(), 999);
    assert_eq!(other.restore(&snap), KVM_OK);
    assert_eq!(bits(&c_logits(&other)), bits(&logits), "restored, not recomputed");
    assert_eq!(other.steps(20), next);
    // A snapshot without logits restores none: the pending token is run for them.
    let fresh = f.session();
    fresh.prefill(&prompt);
    let pending = fresh.save();
    assert_eq!(other.restore(&pending), KVM_OK);
    assert_eq!(bits(&c_logits(&other)), bits(&c_logits(&fresh)));
}

unsafe extern "C" fn record_progress(user: *mut c_void, done: usize, total: usize) -> i32 {
    let (seen, stop_at) = unsafe { &mut *user.cast::<(Vec<(usize, usize)>, usize)>() };
    seen.push((done, total));
    i32::from(done >= *stop_at)
}

/// `kvm_prefill_chunked()` of `ids`, stopping once `stop_at` ids are in: the status,
/// the ids fed and the callback's calls.
fn chunked(s: &TestSession, ids: &[u32], chunk: usize, stop_at: usize) -> (kvm_status, usize, Vec<(usize, usize)>) {
    let mut user = (Vec::new(), stop_at);
    let mut fed = usize::MAX;
    let p = (&mut user as *mut (Vec<(usize, usize)>, usize)).cast();
    let code = unsafe { kvm_prefill_chunked(s.s, ids.as_ptr(), ids.len(), chunk, Some(record_progress), p, &mut fed) };
    (code, fed, user.0)
}

#[test]
fn chunked_prefill_cancels_and_resumes_exactly() {
    let f = Fixture::kjv();
    let text = "And the earth was without form, and void; and darkness was upon the face of the deep. ";
    let ids = f.tokenize(&text.repeat(3));
    let n = ids.len();
    for cfg in [kvm_session_config_default(), config(2, 16), config(1, 64)] {
        let whole = session_ex(&f, cfg);
        let (code, fed, seen) = chunked(&whole, &ids, 40, usize::MAX);
        assert_eq!((code, fed), (KVM_OK, n), "{cfg:?}");
        let steps: Vec<(usize, usize)> = (1..=n.div_ceil(40)).map(|i| ((i * 40).min(n), n)).collect();
        assert_eq!(seen, steps, "one call per chunk");
        let want = c_logits(&whole);

        let s = session_ex(&f, cfg);
        let (code, fed, seen) = chunked(&s, &ids, 40, 100);
        assert_eq!((code, fed, seen.len()), (KVM_ERR_CANCELLED, 120, 3), "{cfg:?}");
        assert_eq!(s.pos(), 120, "the session ends at the cancelled chunk's last token");
        let (code, fed, _) = chunked(&s, &ids[120..], 40, usize::MAX);
        assert_eq!((code, fed), (KVM_OK, n - 120));
        assert_eq!(bits(&c_logits(&s)), bits(&want), "{cfg:?}: resumed = uninterrupted");
        assert_eq!(s.save(), whole.save());
        if cfg == kvm_session_config_default() {
            // One token at a time, the chunking is invisible.
            let plain = f.session();
            plain.prefill(&ids);
            assert_eq!(bits(&c_logits(&plain)), bits(&want));
        }
    }

    // A cancelled session decodes from where it stopped.
    let s = f.session();
    s.set_sampler(greedy(), 0);
    assert_eq!(chunked(&s, &ids, 10, 10).0, KVM_ERR_CANCELLED);
    assert_eq!(s.steps(8), rust_greedy(tiny_kjv(), &ids[..10], 8));

    // Bad arguments feed nothing and call nobody.
    let s = f.session();
    let mut bad = ids.clone();
    bad[50] = 256;
    assert_eq!(chunked(&s, &bad, 10, usize::MAX), (KVM_ERR_TOKEN_OUT_OF_RANGE, 0, vec![]));
    assert_eq!(chunked(&s, &ids, 0, usize::MAX), (KVM_ERR_INVALID_ARGUMENT, 0, vec![]));
    assert_eq!(chunked(&s, &[], 10, usize::MAX), (KVM_ERR_INVALID_ARGUMENT, 0, vec![]));
    let mut counts = [0usize; 2];
    let odd = unsafe { counts.as_mut_ptr().cast::<u8>().add(1) }.cast::<usize>();
    let code = unsafe { kvm_prefill_chunked(s.s, ids.as_ptr(), n, 10, None, null_mut(), odd) };
    assert_eq!(code, KVM_ERR_MISALIGNED_POINTER);
    assert_eq!(s.pos(), 0);
    // A stop asked for after the last chunk is no cancel; no callback is fine too.
    assert_eq!(chunked(&s, &ids[..30], 10, 30), (KVM_OK, 30, vec![(10, 30), (20, 30), (30, 30)]));
    assert_eq!(unsafe { kvm_prefill_chunked(s.s, ids.as_ptr(), n, 7, None, null_mut(), null_mut()) }, KVM_OK);
    assert_eq!(s.pos(), 30 + n);
}

#[test]
fn thread_counts_change_no_bit() {
    let f = Fixture::kjv();
    let prompt = f.tokenize(&"And God saw the light, that it was good: ".repeat(4));
    let run = |cfg: kvm_session_config| {
        let s = session_ex(&f, cfg);
        s.set_sampler(sampling(), 8);
        s.prefill(&prompt);
        let first = c_logits(&s);
        let tokens = s.steps(40);
        let state = s.save();
        assert_eq!(unsafe { kvm_session_release(s.s) }, KVM_OK);
        (bits(&first), tokens, state)
    };
    for batch in [1, 16, 64] {
        let one = run(config(1, batch));
        for threads in [2, 3] {
            assert!(run(config(threads, batch)) == one, "{threads} threads, batches of {batch}");
        }
    }
    // Without batches a threaded session is the plain one.
    let plain = f.session();
    plain.set_sampler(sampling(), 8);
    plain.prefill(&prompt);
    let logits = c_logits(&plain);
    assert_eq!(run(config(2, 1)).0, bits(&logits));
    // Batches round differently, within what the core promises.
    let s = session_ex(&f, config(2, 64));
    s.prefill(&prompt);
    let d = max_abs_diff(&c_logits(&s), &logits);
    assert!(d < 1e-4, "batched prefill differs by {d}");
    assert_eq!(unsafe { kvm_session_release(s.s) }, KVM_OK);
}

#[test]
fn session_configs_are_checked() {
    let f = Fixture::kjv();
    let m = &*f.model;
    let mut arena = Arena::new(f.arena_len);
    let a = arena.bytes_mut();
    a.fill(0xAB);
    let mut s = null_mut();
    let init = |cfg: &kvm_session_config, a: &mut [u8], s: &mut *mut kvm_session| unsafe {
        kvm_session_init_ex(m, cfg, a.as_mut_ptr().cast(), a.len(), s)
    };
    for bad in [config(0, 1), config(1, 0), config(KVM_MAX_THREADS + 1, 1), config(1, KVM_MAX_BATCH_TOKENS + 1)] {
        assert_eq!(init(&bad, a, &mut s), KVM_ERR_INVALID_ARGUMENT, "{bad:?}");
    }
    let bad_slots = kvm_session_config { state_slots: 31, ..kvm_session_config_default() };
    assert_eq!(init(&bad_slots, a, &mut s), KVM_ERR_STATE_SLOTS);
    assert_eq!(unsafe { kvm_session_init_ex(m, null(), a.as_mut_ptr().cast(), a.len(), &mut s) }, KVM_ERR_NULL_POINTER);
    assert!(s.is_null() && a.iter().all(|&b| b == 0xAB), "nothing written");
    // The default config is kvm_session_init's session, which needs no release but may
    // have one; a released handle is dead.
    assert_eq!(init(&kvm_session_config_default(), a, &mut s), KVM_OK);
    assert_eq!(unsafe { kvm_prefill(s, [65u32, 66].as_ptr(), 2) }, KVM_OK);
    assert_eq!(unsafe { kvm_session_release(s) }, KVM_OK);
    let mut tok = 0;
    assert_eq!(unsafe { kvm_decode_step(s, &mut tok) }, KVM_ERR_BAD_HANDLE);
    assert_eq!(unsafe { kvm_session_release(s) }, KVM_ERR_BAD_HANDLE);
    assert_eq!(unsafe { kvm_session_release(null_mut()) }, KVM_ERR_NULL_POINTER);
}

#[test]
fn state_capacities_size_arenas_and_sessions() {
    let blob = leak(convert_to_bytes(&golden_dir("growable_power_law"), DType::F32));
    let f = Fixture::new(blob);
    let m = &*f.model;
    let mut info = kvm_model_desc::default();
    assert_eq!(unsafe { kvm_model_info(m, &mut info) }, KVM_OK);
    let core = Model::from_bytes(blob).unwrap();
    let (min, max) = (info.state_len_min, info.state_len_max);
    assert_eq!((min, max), (core.config().chunk_len, core.config().natural_state_len() as u32));
    assert!(min < max, "a growable model");
    let size = |slots: u32| {
        let mut n = usize::MAX;
        let code = unsafe { kvm_arena_size_for(m, slots, &mut n) };
        (code, n)
    };
    assert_eq!(size(0), (KVM_OK, f.arena_len), "0 is the model's own capacity");
    assert_eq!(size(info.state_len), (KVM_OK, f.arena_len));
    assert_eq!(size(min - 1), (KVM_ERR_STATE_SLOTS, usize::MAX));
    assert_eq!(size(max + 1), (KVM_ERR_STATE_SLOTS, usize::MAX));
    assert_eq!(unsafe { kvm_arena_size_for(m, min, null_mut()) }, KVM_ERR_NULL_POINTER);
    let sizes: Vec<usize> = (min..=max).map(|n| size(n).1).collect();
    assert!(sizes.windows(2).all(|w| w[0] < w[1]), "more slots, more arena: {sizes:?}");
    for (n, &len) in (min..=max).zip(&sizes) {
        // Exactly the core's arena for that capacity plus the C layer's fixed regions.
        assert_eq!(len - core.arena_len_for(n as usize).unwrap(), sizes[0] - core.arena_len_for(min as usize).unwrap());
    }

    // A small capacity decodes as the core's session of that capacity, past the point
    // where the default one would still grow.
    let prompt: Vec<u32> = (0..150u32).map(|i| (i * 7 + 3) % info.vocab_len).collect();
    let slots = min + 8;
    let cfg = kvm_session_config { state_slots: slots, ..kvm_session_config_default() };
    let s = session_ex(&f, cfg);
    s.prefill(&prompt);
    let mut arena = Arena::new(core.arena_len_for(slots as usize).unwrap());
    let mut rust = Session::with_state_len(core, arena.bytes_mut(), slots as usize).unwrap();
    let want = rust.prefill(&prompt).unwrap().to_vec();
    assert_eq!(bits(&c_logits(&s)), bits(&want));
    assert_eq!(rust.state_slots(), slots as usize, "the state filled its capacity");
    let full = f.session();
    full.prefill(&prompt);
    assert_ne!(bits(&c_logits(&full)), bits(&want), "the default capacity held more");
    // Its snapshots are its own size, and other capacities refuse them.
    assert!(unsafe { kvm_state_size(s.s) } < unsafe { kvm_state_size(full.s) });
    assert_eq!(full.restore(&s.save()), KVM_ERR_BAD_SNAPSHOT);

    // An arena one byte short of the capacity is refused and left alone.
    let mut short = Arena::new(size(slots).1 - 1);
    let a = short.bytes_mut();
    a.fill(0x5A);
    let mut h = null_mut();
    assert_eq!(unsafe { kvm_session_init_ex(m, &cfg, a.as_mut_ptr().cast(), a.len(), &mut h) }, KVM_ERR_ARENA_SIZE);
    assert!(h.is_null() && a.iter().all(|&b| b == 0x5A));
}

/// A callback that releases its own session: the call stops at the next step with
/// `KVM_ERR_BAD_HANDLE`, instead of going on with a dead handle and answering OK.
#[test]
fn a_callback_that_releases_its_session_stops_the_call() {
    let f = Fixture::kjv();
    let prompt = f.tokenize("In the beginning");
    unsafe extern "C" fn release_on_token(user: *mut c_void, _: u32, _: *const u8, _: usize) -> i32 {
        assert_eq!(unsafe { kvm_session_release(user.cast()) }, KVM_OK);
        0
    }
    unsafe extern "C" fn release_on_progress(user: *mut c_void, _: usize, _: usize) -> i32 {
        assert_eq!(unsafe { kvm_session_release(user.cast()) }, KVM_OK);
        0
    }
    for cfg in [kvm_session_config_default(), config(2, 16)] {
        let s = session_ex(&f, cfg);
        s.prefill(&prompt);
        let mut count = usize::MAX;
        let code = unsafe { kvm_generate(s.s, 10, Some(release_on_token), s.s.cast(), &mut count) };
        assert_eq!((code, count), (KVM_ERR_BAD_HANDLE, 1), "{cfg:?}");
        assert_eq!(unsafe { kvm_session_pos(s.s) }, 0, "the handle is dead");

        let s = session_ex(&f, cfg);
        let mut fed = usize::MAX;
        let p = s.s.cast();
        let code = unsafe {
            kvm_prefill_chunked(s.s, prompt.as_ptr(), prompt.len(), 1, Some(release_on_progress), p, &mut fed)
        };
        assert_eq!((code, fed), (KVM_ERR_BAD_HANDLE, 1), "{cfg:?}");
    }
}

/// The C API's sampler ranges are the command line's (one table, `sampler::ranges`): every
/// bound is accepted when it is in its range and refused when not, and so is the nearest
/// value beyond it. (`kvm`'s flags, through the same table: `limits.rs`.)
#[test]
fn the_sampler_ranges_are_the_command_lines() {
    use std::ops::Bound::{Excluded, Included};
    let f = Fixture::kjv();
    let s = f.session();
    let set = |edit: &dyn Fn(&mut kvm_sampler_config)| {
        let mut cfg = kvm_sampler_default();
        edit(&mut cfg);
        unsafe { kvm_sampler_set(s.s, &cfg) }
    };
    let want = |ok: bool| if ok { KVM_OK } else { KVM_ERR_INVALID_ARGUMENT };
    type Field = fn(&mut kvm_sampler_config, f32);
    let fields: [(ranges::Range<f32>, Field); 4] = [
        (ranges::TEMPERATURE, |c, v| c.temperature = v),
        (ranges::TOP_P, |c, v| c.top_p = v),
        (ranges::MIN_P, |c, v| c.min_p = v),
        (ranges::REPEAT_PENALTY, |c, v| c.repeat_penalty = v),
    ];
    for (range, field) in fields {
        for (bound, outward) in [(range.0, -1.0f32), (range.1, 1.0)] {
            let (v, inside) = match bound {
                Included(v) => (v, true),
                Excluded(v) => (v, false),
                std::ops::Bound::Unbounded => unreachable!("every range is bounded"),
            };
            assert_eq!(set(&|c| field(c, v)), want(inside), "{range:?} at {v}");
            let beyond = next_f32(v, outward);
            assert_eq!(set(&|c| field(c, beyond)), KVM_ERR_INVALID_ARGUMENT, "{range:?} at {beyond}");
            let within = next_f32(v, -outward);
            assert_eq!(set(&|c| field(c, within)), KVM_OK, "{range:?} at {within}");
        }
        assert_eq!(set(&|c| field(c, f32::NAN)), KVM_ERR_INVALID_ARGUMENT, "{range:?} at NaN");
    }
    assert_eq!(ranges::REPEAT_WINDOW, (Included(0), Included(KVM_MAX_REPEAT_WINDOW)));
    assert_eq!(set(&|c| c.repeat_window = KVM_MAX_REPEAT_WINDOW), KVM_OK);
    assert_eq!(set(&|c| c.repeat_window = KVM_MAX_REPEAT_WINDOW + 1), KVM_ERR_INVALID_ARGUMENT);
    assert_eq!(set(&|c| c.repeat_penalty = 1e30), KVM_ERR_INVALID_ARGUMENT);
}

/// The f32 next to `v` towards `dir`'s sign.
fn next_f32(v: f32, dir: f32) -> f32 {
    if v == 0.0 {
        return f32::from_bits(1).copysign(dir);
    }
    let step = if (v > 0.0) == (dir > 0.0) { 1 } else { -1i32 as u32 };
    f32::from_bits(v.to_bits().wrapping_add(step))
}

/// The snapshot's layout (docs/c-api.md, FORMAT.md "Session snapshots"): a 64-byte head
/// with the version at 4, the flags at 20 and the head's CRC at 48, the history, then at
/// `CORE` the core's snapshot, whose own CRC is its word 7 and flags its word 8.
const CORE: usize = 64 + 4 * KVM_MAX_REPEAT_WINDOW as usize;

/// Makes `snap`'s head CRC right: every byte before [`CORE`] but its own, and `tail`.
fn sign_head(snap: &mut [u8], tail: std::ops::Range<usize>) {
    let crc = kvm_core::format::crc32_update(0, &snap[..48]);
    let crc = kvm_core::format::crc32_update(crc, &snap[52..CORE]);
    let crc = kvm_core::format::crc32_update(crc, &snap[tail]);
    snap[48..52].copy_from_slice(&crc.to_le_bytes());
}

/// Makes the core snapshot `core`'s CRC (word 7) right.
fn sign_core(core: &mut [u8]) {
    let crc = kvm_core::format::crc32_update(kvm_core::format::crc32(&core[..28]), &core[32..]);
    core[28..32].copy_from_slice(&crc.to_le_bytes());
}

/// A snapshot's logits are the core's, under the core's CRC: one made to hold a NaN
/// (`kvm_state_save()` never writes one), every CRC made right, is refused and changes
/// nothing; so is one whose unused tail is not zero.
#[test]
fn a_snapshot_whose_logits_are_not_finite_is_refused() {
    let f = Fixture::kjv();
    let s = f.session();
    s.prefill(&f.tokenize("In the beginning"));
    let vocab = c_logits(&s).len();
    let snap = s.save();
    assert_eq!(u32::from_le_bytes(snap[4..8].try_into().unwrap()), 4, "version 4");
    assert_eq!(snap[20] & 4, 4, "with logits");
    let logits_at = snap.len() - 4 * vocab;
    let mut nan = snap.clone();
    nan[logits_at + 8..logits_at + 12].copy_from_slice(&f32::NAN.to_le_bytes());
    sign_core(&mut nan[CORE..]);
    let other = f.session();
    other.prefill(&f.tokenize("And"));
    let before = other.save();
    assert_eq!(other.restore(&nan), KVM_ERR_BAD_SNAPSHOT);
    assert_eq!(other.save(), before);
    // Saved with a token pending: the core's state alone, then zeros.
    assert_eq!(before[20] & 4, 0);
    assert!(before[logits_at..].iter().all(|&b| b == 0));
    let mut tail = before.clone();
    tail[logits_at + 1] = 1;
    assert_eq!(other.restore(&tail), KVM_ERR_BAD_SNAPSHOT);
    assert_eq!(other.save(), before);
    assert_eq!(other.restore(&snap), KVM_OK);
    assert_eq!(bits(&c_logits(&other)), bits(&c_logits(&s)));
}

/// Snapshots of version 3 (the core's state alone, then the logits, both under the head's
/// CRC), built here from the documented layout, still restore: with logits, and with a
/// token pending; a v3 one with a NaN logit is refused.
#[test]
fn a_version_3_snapshot_still_restores() {
    let f = Fixture::kjv();
    let s = f.session();
    s.set_sampler(sampling(), 8);
    s.prefill(&f.tokenize("In the beginning God"));
    s.steps(3);
    let logits = c_logits(&s);
    let vocab = logits.len();
    let v4 = s.save();
    let next = s.steps(12);
    let state_len = v4.len() - CORE - 4 * vocab;
    // v4 -> v3: version 3, the core's flags word cleared and its CRC made right, the
    // logits where they were, the head's CRC over them too.
    let to_v3 = |v4: &[u8]| {
        let mut v3 = v4.to_vec();
        v3[4..8].copy_from_slice(&3u32.to_le_bytes());
        v3[CORE + 32..CORE + 36].fill(0);
        sign_core(&mut v3[CORE..CORE + state_len]);
        sign_head(&mut v3, CORE + state_len..v4.len());
        v3
    };
    let v3 = to_v3(&v4);
    let other = f.session();
    other.set_sampler(sampling(), 1);
    assert_eq!(other.restore(&v3), KVM_OK);
    assert_eq!(bits(&c_logits(&other)), bits(&logits), "the logits put back");
    assert_eq!(other.save(), v4, "saved again: the same session, as version 4");
    assert_eq!(other.steps(12), next);

    let mut bad = v3.clone();
    bad[CORE + state_len + 4..CORE + state_len + 8].copy_from_slice(&f32::INFINITY.to_le_bytes());
    sign_head(&mut bad, CORE + state_len..v4.len());
    let before = other.save();
    assert_eq!(other.restore(&bad), KVM_ERR_BAD_SNAPSHOT);
    assert_eq!(other.save(), before);
    let mut unsigned = v3.clone();
    unsigned[v3.len() - 1] ^= 1;
    assert_eq!(other.restore(&unsigned), KVM_ERR_BAD_SNAPSHOT, "the head's CRC covers v3's logits");

    // A token pending: no logits, a zero tail.
    let fresh = f.session();
    fresh.prefill(&f.tokenize("In"));
    let pending = fresh.save();
    assert_eq!(other.restore(&to_v3(&pending)), KVM_OK);
    assert_eq!(other.save(), pending);
}

//! The C API: `extern "C"` functions over kvm-core, declared in `include/kvm.h`.
//!
//! Nothing here allocates, but for the threads and batch activations of a std session
//! that asks for them (`kvm_session_init_ex()`). The caller provides every other byte:
//! - a `kvm_model` (a sized, 8-byte aligned struct declared in the header) that
//!   `kvm_model_load()` fills with a validated view of the model blob;
//! - one arena per session, `kvm_arena_size()` bytes aligned to `KVM_ARENA_ALIGN`;
//!   `kvm_session_init()` places the session handle at its front and returns a pointer
//!   to it, so a `kvm_session *` *is* the arena's address (layout in `session.rs`);
//! - buffers for token ids, text and state snapshots, whose needed sizes the functions
//!   report.
//!
//! Every function returns a `kvm_status` (or a size, `0` meaning a bad handle) and
//! checks its arguments first: null, misaligned or too-small buffers, out-of-range
//! tokens and overflowing lengths are statuses, never undefined behaviour or a panic.
//! With the `std` feature each call also runs under `catch_unwind`: a panic (a bug)
//! becomes [`KVM_ERR_PANIC`] and poisons the session it happened in. Without
//! `std` there is no unwinding; a panic goes to the firmware's `#[panic_handler]`, which
//! is why the paths above are written not to panic on any input.
//!
//! Threads: a session is used by one thread at a time; a loaded `kvm_model` is only read
//! and can be shared. Sessions copy the model view, so the `kvm_model` itself may be
//! discarded after `kvm_session_init()`; the blob may not.

// The C names are the API.
#![allow(non_camel_case_types)]

mod session;
mod text;

use core::ffi::{c_char, c_void};
use core::mem::{align_of, size_of, MaybeUninit};

use kvm_core::sampler::SamplerConfig;
use kvm_core::{Error, Model};

use session::{ArenaPlan, SessionCell};

/// Required alignment, in bytes, of a session arena.
pub const KVM_ARENA_ALIGN: usize = 64;
const _: () = assert!(KVM_ARENA_ALIGN == kvm_core::state::ARENA_ALIGN);

/// Size of `kvm_model` in 8-byte words.
pub const KVM_MODEL_WORDS: usize = 64;

/// The largest `repeat_window` a session's sampler accepts.
pub const KVM_MAX_REPEAT_WINDOW: u32 = 256;

/// `kvm_model_load()` flag: skip the checksums of the tensor data (everything else is
/// still validated), for trusted images in flash where a CRC over every weight at boot
/// costs time.
pub const KVM_LOAD_TRUSTED: u32 = 1;

/// `kvm_model_set_cache()`: store attention's keys and values as f32 (exact, the
/// reference's numerics).
pub const KVM_CACHE_F32: u32 = 0;
/// `kvm_model_set_cache()`: store attention's keys and values as f16: half the state bytes
/// each decode step reads and a smaller arena, at f16 precision.
pub const KVM_CACHE_F16: u32 = 1;
/// `kvm_model_set_cache()`: store attention's keys and values as i8 with one f32 scale per
/// row: a quarter of the state bytes, at 8-bit precision.
pub const KVM_CACHE_Q8: u32 = 2;

/// The outcome of a call. `KVM_OK` is 0; each kind of core error has its own code, then
/// come the errors of the C layer itself.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvm_status {
    KVM_OK = 0,
    /// The model blob is shorter than a structure it must contain.
    KVM_ERR_TRUNCATED = 1,
    /// The blob does not start with the `KVMF` magic.
    KVM_ERR_BAD_MAGIC = 2,
    /// The file's format version is not one this build reads.
    KVM_ERR_UNSUPPORTED_VERSION = 3,
    /// The file was written with another byte order.
    KVM_ERR_BAD_ENDIANNESS = 4,
    /// A checksum of the file did not match.
    KVM_ERR_CHECKSUM = 5,
    /// A section or tensor lies outside the blob or overlaps another.
    KVM_ERR_OUT_OF_BOUNDS = 6,
    /// A tensor's data is not 64-byte aligned within the blob.
    KVM_ERR_MISALIGNED = 7,
    /// A tensor is missing, duplicated, or has the wrong dtype or shape.
    KVM_ERR_BAD_TENSOR = 8,
    /// A config field holds a value the math cannot use.
    KVM_ERR_BAD_CONFIG = 9,
    /// The model (or its tokenizer) needs code this build does not have.
    KVM_ERR_UNSUPPORTED = 10,
    /// The arena is smaller than `kvm_arena_size`.
    KVM_ERR_ARENA_SIZE = 11,
    /// The arena is not `KVM_ARENA_ALIGN`-byte aligned.
    KVM_ERR_ARENA_MISALIGNED = 12,
    /// A token id is not below the vocabulary size.
    KVM_ERR_TOKEN_OUT_OF_RANGE = 13,
    /// A caller buffer is too small; the call reports the size needed.
    KVM_ERR_BUFFER_TOO_SMALL = 14,
    /// The model's tokenizer section is malformed.
    KVM_ERR_BAD_TOKENIZER = 15,
    /// A state snapshot is corrupt or belongs to another model.
    KVM_ERR_BAD_SNAPSHOT = 16,
    /// An argument is outside its documented range.
    KVM_ERR_INVALID_ARGUMENT = 17,
    /// The model's logits came out NaN or infinite (its weights or state overflowed). The
    /// step was taken, and the session must be reset (`kvm_session_reset()`) or restored
    /// (`kvm_state_restore()`): until then every prefill, logits, decode, generate and
    /// state-save call on it returns this status again and changes nothing.
    KVM_ERR_NON_FINITE = 18,
    /// The blob is longer than the file length its header states.
    KVM_ERR_EXTRA_BYTES = 19,
    /// A required pointer is null.
    KVM_ERR_NULL_POINTER = 100,
    /// A pointer is not aligned for its element type.
    KVM_ERR_MISALIGNED_POINTER = 101,
    /// The handle is not an initialised model or session (or its arena moved, or a call
    /// on it panicked).
    KVM_ERR_BAD_HANDLE = 102,
    /// The session has no token to continue from: prefill first.
    KVM_ERR_NO_CONTEXT = 103,
    /// A bug: kvm panicked. The session it happened in is unusable until re-initialised.
    KVM_ERR_PANIC = 104,
    /// The caller's progress callback asked to stop; the session holds what was fed.
    KVM_ERR_CANCELLED = 105,
    /// A state capacity is below one chunk or above the most the model's config fills
    /// (`kvm_model_desc.state_len_min` and `state_len_max`).
    KVM_ERR_STATE_SLOTS = 106,
    /// The system refused to start a session's threads.
    KVM_ERR_THREADS = 107,
}

use kvm_status::*;

impl From<Error> for kvm_status {
    fn from(e: Error) -> Self {
        match e {
            Error::Truncated => KVM_ERR_TRUNCATED,
            Error::BadMagic => KVM_ERR_BAD_MAGIC,
            Error::UnsupportedVersion { .. } => KVM_ERR_UNSUPPORTED_VERSION,
            Error::BadEndianness => KVM_ERR_BAD_ENDIANNESS,
            Error::Checksum { .. } => KVM_ERR_CHECKSUM,
            Error::OutOfBounds => KVM_ERR_OUT_OF_BOUNDS,
            Error::Misaligned => KVM_ERR_MISALIGNED,
            Error::BadTensor { .. } => KVM_ERR_BAD_TENSOR,
            Error::BadConfig(_) => KVM_ERR_BAD_CONFIG,
            Error::Unsupported(_) => KVM_ERR_UNSUPPORTED,
            Error::ArenaSize { .. } => KVM_ERR_ARENA_SIZE,
            Error::ArenaMisaligned => KVM_ERR_ARENA_MISALIGNED,
            Error::TokenOutOfRange { .. } => KVM_ERR_TOKEN_OUT_OF_RANGE,
            Error::BufferTooSmall { .. } => KVM_ERR_BUFFER_TOO_SMALL,
            Error::BadTokenizer => KVM_ERR_BAD_TOKENIZER,
            Error::BadSnapshot => KVM_ERR_BAD_SNAPSHOT,
            Error::InvalidArgument => KVM_ERR_INVALID_ARGUMENT,
            Error::NonFiniteLogits { .. } => KVM_ERR_NON_FINITE,
            Error::ExtraBytes { .. } => KVM_ERR_EXTRA_BYTES,
            // The core's enum is non-exhaustive; a kind added there without a code here
            // must not pass for success.
            _ => KVM_ERR_UNSUPPORTED,
        }
    }
}

impl kvm_status {
    /// Every status, in code order.
    pub const fn all() -> [kvm_status; 28] {
        ALL
    }
}

const ALL: [kvm_status; 28] = [
    KVM_OK,
    KVM_ERR_TRUNCATED,
    KVM_ERR_BAD_MAGIC,
    KVM_ERR_UNSUPPORTED_VERSION,
    KVM_ERR_BAD_ENDIANNESS,
    KVM_ERR_CHECKSUM,
    KVM_ERR_OUT_OF_BOUNDS,
    KVM_ERR_MISALIGNED,
    KVM_ERR_BAD_TENSOR,
    KVM_ERR_BAD_CONFIG,
    KVM_ERR_UNSUPPORTED,
    KVM_ERR_ARENA_SIZE,
    KVM_ERR_ARENA_MISALIGNED,
    KVM_ERR_TOKEN_OUT_OF_RANGE,
    KVM_ERR_BUFFER_TOO_SMALL,
    KVM_ERR_BAD_TOKENIZER,
    KVM_ERR_BAD_SNAPSHOT,
    KVM_ERR_INVALID_ARGUMENT,
    KVM_ERR_NON_FINITE,
    KVM_ERR_EXTRA_BYTES,
    KVM_ERR_NULL_POINTER,
    KVM_ERR_MISALIGNED_POINTER,
    KVM_ERR_BAD_HANDLE,
    KVM_ERR_NO_CONTEXT,
    KVM_ERR_PANIC,
    KVM_ERR_CANCELLED,
    KVM_ERR_STATE_SLOTS,
    KVM_ERR_THREADS,
];

impl kvm_status {
    /// A NUL-terminated description.
    const fn message(self) -> &'static str {
        match self {
            KVM_OK => "ok\0",
            KVM_ERR_TRUNCATED => "model blob is truncated\0",
            KVM_ERR_BAD_MAGIC => "not a kvm model (bad magic)\0",
            KVM_ERR_UNSUPPORTED_VERSION => "unsupported model format version\0",
            KVM_ERR_BAD_ENDIANNESS => "model was written with another byte order\0",
            KVM_ERR_CHECKSUM => "model checksum mismatch\0",
            KVM_ERR_OUT_OF_BOUNDS => "a section or tensor lies outside the blob\0",
            KVM_ERR_MISALIGNED => "tensor data is not 64-byte aligned\0",
            KVM_ERR_BAD_TENSOR => "bad tensor entry\0",
            KVM_ERR_BAD_CONFIG => "invalid model config\0",
            KVM_ERR_UNSUPPORTED => "model needs a feature this build lacks\0",
            KVM_ERR_ARENA_SIZE => "arena is smaller than kvm_arena_size()\0",
            KVM_ERR_ARENA_MISALIGNED => "arena is not KVM_ARENA_ALIGN-byte aligned\0",
            KVM_ERR_TOKEN_OUT_OF_RANGE => "token id out of range\0",
            KVM_ERR_BUFFER_TOO_SMALL => "buffer too small\0",
            KVM_ERR_BAD_TOKENIZER => "malformed tokenizer section\0",
            KVM_ERR_BAD_SNAPSHOT => "state snapshot is corrupt or belongs to another model\0",
            KVM_ERR_INVALID_ARGUMENT => "argument out of range\0",
            KVM_ERR_NON_FINITE => "the model's logits are not finite (NaN or infinity)\0",
            KVM_ERR_EXTRA_BYTES => "model blob is longer than its header's file length\0",
            KVM_ERR_NULL_POINTER => "null pointer\0",
            KVM_ERR_MISALIGNED_POINTER => "pointer is not aligned for its type\0",
            KVM_ERR_BAD_HANDLE => "not an initialised kvm handle\0",
            KVM_ERR_NO_CONTEXT => "session has no context: prefill first\0",
            KVM_ERR_PANIC => "internal error (kvm panicked)\0",
            KVM_ERR_CANCELLED => "cancelled by the progress callback\0",
            KVM_ERR_STATE_SLOTS => "state slots outside the model's range\0",
            KVM_ERR_THREADS => "the system could not start the threads\0",
        }
    }
}

/// Storage for a loaded model: declare one (static, global or on the stack) and pass it
/// to `kvm_model_load()`. Its contents are private.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvm_model {
    _opaque: [u64; KVM_MODEL_WORDS],
}

impl kvm_model {
    /// Unloaded storage.
    pub const fn new() -> Self {
        kvm_model { _opaque: [0; KVM_MODEL_WORDS] }
    }
}

impl Default for kvm_model {
    fn default() -> Self {
        Self::new()
    }
}

/// A session: lives at the front of the arena given to `kvm_session_init()`.
#[derive(Debug)]
pub struct kvm_session {
    _private: [u8; 0],
}

/// A model's sizes, as `kvm_model_info()` reports them.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvm_model_desc {
    /// Format version of the file.
    pub format_major: u32,
    pub format_minor: u32,
    /// Token ids are `[0, vocab_len)`, the logits `vocab_len` floats.
    pub vocab_len: u32,
    pub n_layers: u32,
    pub n_heads: u32,
    pub d_model: u32,
    /// Per-head query/key width.
    pub d_qk: u32,
    /// Per-head value width.
    pub d_v: u32,
    /// MLP hidden width.
    pub d_ff: u32,
    pub chunk_len: u32,
    /// Tokens in the sliding window.
    pub window_len: u32,
    /// State slots a session holds unless `kvm_session_config.state_slots` says otherwise.
    pub state_len: u32,
    /// 0: byte-level (token id = byte value); 1: GPT-2 byte-level BPE.
    pub tokenizer: u32,
    /// Weights, all tensors.
    pub n_params: u64,
    /// Bytes of the model file.
    pub file_len: u64,
    /// `kvm_arena_size()`: bytes of one session's arena.
    pub arena_size: usize,
    /// `kvm_state_size()`: bytes of one state snapshot.
    pub state_size: usize,
    /// How sessions store attention's rows: `KVM_CACHE_F32`, `KVM_CACHE_F16` or
    /// `KVM_CACHE_Q8`.
    pub cache: u32,
    /// The fewest state slots a session may hold (`kvm_session_config.state_slots`): one
    /// chunk.
    pub state_len_min: u32,
    /// The most state slots a session may hold: all the config ever fills. Growable
    /// models follow the reference exactly until their state reaches a session's
    /// capacity, then keep merging without growing.
    pub state_len_max: u32,
    /// Ids `[0, text_len)` have text; ids `[text_len, vocab_len)` are padding (the
    /// paper's models pad GPT-2's 50,257 tokens to 50,304): they detokenize to nothing,
    /// no text tokenizes to them and `kvm_decode_step()` never samples them. C code that
    /// samples from `kvm_logits()` itself should read its first `text_len` only.
    pub text_len: u32,
}

/// Sampling settings: each filter has a neutral value that switches it off.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct kvm_sampler_config {
    /// Softmax temperature, `>= 0` and finite. `0` is greedy and skips every filter.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens. `0` keeps all.
    pub top_k: u32,
    /// Nucleus: keep the most likely tokens holding this much probability, in `(0, 1]`.
    pub top_p: f32,
    /// Keep tokens at least this likely relative to the most likely, in `[0, 1]`.
    pub min_p: f32,
    /// Repetition penalty, `> 0`; `1` is off.
    pub repeat_penalty: f32,
    /// Recent tokens the penalty looks at, at most `KVM_MAX_REPEAT_WINDOW`.
    pub repeat_window: u32,
}

impl From<SamplerConfig> for kvm_sampler_config {
    fn from(c: SamplerConfig) -> Self {
        kvm_sampler_config {
            temperature: c.temperature,
            top_k: c.top_k,
            top_p: c.top_p,
            min_p: c.min_p,
            repeat_penalty: c.repeat_penalty,
            repeat_window: c.repeat_window,
        }
    }
}

impl From<kvm_sampler_config> for SamplerConfig {
    fn from(c: kvm_sampler_config) -> Self {
        SamplerConfig {
            temperature: c.temperature,
            top_k: c.top_k,
            top_p: c.top_p,
            min_p: c.min_p,
            repeat_penalty: c.repeat_penalty,
            repeat_window: c.repeat_window,
        }
    }
}

/// How a session is made: its state capacity and how it runs. `kvm_session_config_default()`
/// gives what `kvm_session_init()` makes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct kvm_session_config {
    /// State slots the session holds: 0 for the model's own capacity
    /// (`kvm_model_desc.state_len`), else in `[state_len_min, state_len_max]` of
    /// `kvm_model_desc`. The arena must be `kvm_arena_size_for()` this many slots.
    pub state_slots: u32,
    /// Threads running the matrix products, the caller's included, in
    /// `[1, KVM_MAX_THREADS]`. More than 1 only in builds with the `std` feature
    /// (`KVM_ERR_UNSUPPORTED` otherwise); the thread count never changes a result.
    pub threads: u32,
    /// Most prompt tokens fed through the model as one batch (each weight read once per
    /// batch), in `[1, KVM_MAX_BATCH_TOKENS]`. More than 1 only with `std`. 1 computes
    /// every token alone, as the reference does; a longer batch rounds differently, by
    /// less than 1e-4 of a logit.
    pub batch_tokens: u32,
}

/// The most threads a session may run on: more than any machine kvm runs on has cores,
/// so a larger count is a mistake rather than a request for that many threads.
pub const KVM_MAX_THREADS: u32 = 256;

/// The longest batch of prompt tokens: activations stay a few KB per token, in cache.
pub const KVM_MAX_BATCH_TOKENS: u32 = 256;
#[cfg(feature = "std")]
const _: () = assert!(KVM_MAX_BATCH_TOKENS as usize == crate::prefill::BATCH_TOKENS);

/// Called by `kvm_prefill_chunked()` after each chunk with the ids of the call fed so far
/// (`done`) and in all (`total`). Return 0 to go on, non-zero to stop there.
pub type kvm_progress_callback = Option<unsafe extern "C" fn(user_data: *mut c_void, done: usize, total: usize) -> i32>;

/// Called by `kvm_generate()` with each new token and its text (`piece_len` bytes, not
/// NUL-terminated, valid during the call). Return 0 to go on, non-zero to stop.
pub type kvm_token_callback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, token: u32, piece: *const u8, piece_len: usize) -> i32>;

/// What a `kvm_model` holds. `repr(C)` pins `magic` to offset 0.
#[repr(C)]
struct ModelCell {
    magic: u64,
    model: Model<'static>,
}

/// `"KVMMODL1"`.
const MODEL_LIVE: u64 = u64::from_le_bytes(*b"KVMMODL1");

const _: () = assert!(size_of::<ModelCell>() <= size_of::<kvm_model>());
const _: () = assert!(align_of::<ModelCell>() <= align_of::<kvm_model>());

type Outcome = Result<(), kvm_status>;

/// Runs `f`, turning a panic into `KVM_ERR_PANIC` where unwinding exists.
#[cfg(feature = "std")]
fn catch<T>(f: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok()
}

/// Without `std` a panic never returns here (see the module docs).
#[cfg(not(feature = "std"))]
fn catch<T>(f: impl FnOnce() -> T) -> Option<T> {
    Some(f())
}

fn status(outcome: Option<Outcome>) -> kvm_status {
    match outcome {
        Some(Ok(())) => KVM_OK,
        Some(Err(e)) => e,
        None => KVM_ERR_PANIC,
    }
}

/// Runs `f` on the session behind `s`, poisoning it if `f` panics.
///
/// # Safety
/// `s` is null, or readable for 8 bytes and, if they hold a live session's magic, a
/// session not in use elsewhere.
unsafe fn with_session(s: *mut kvm_session, f: impl FnOnce(&mut SessionCell) -> Outcome) -> kvm_status {
    let cell = s.cast::<SessionCell>();
    // SAFETY: per the contract.
    if let Err(e) = unsafe { SessionCell::check(cell) } {
        return e;
    }
    // SAFETY: `check` found a live cell at home; the caller gives us exclusive use.
    let outcome = catch(|| f(unsafe { &mut *cell }));
    if outcome.is_none() {
        // SAFETY: the borrow ended with the unwinding closure.
        unsafe { SessionCell::poison(cell) };
    }
    status(outcome)
}

/// As [`with_session`], read-only.
///
/// # Safety
/// As [`with_session`], shared access.
unsafe fn with_session_ref<T>(
    s: *const kvm_session,
    f: impl FnOnce(&SessionCell) -> Result<T, kvm_status>,
) -> Result<T, kvm_status> {
    let cell = s.cast::<SessionCell>();
    // SAFETY: per the contract.
    unsafe { SessionCell::check(cell)? };
    // SAFETY: `check` found a live cell at home.
    catch(|| f(unsafe { &*cell })).unwrap_or(Err(KVM_ERR_PANIC))
}

/// The model behind `m`.
///
/// # Safety
/// `m` is null or readable for `size_of::<kvm_model>()` bytes.
unsafe fn model_of(m: *const kvm_model) -> Result<Model<'static>, kvm_status> {
    if m.is_null() {
        return Err(KVM_ERR_NULL_POINTER);
    }
    if m as usize % align_of::<kvm_model>() != 0 {
        return Err(KVM_ERR_MISALIGNED_POINTER);
    }
    let cell = m.cast::<ModelCell>();
    // SAFETY: readable per the contract; `magic` is at offset 0.
    if unsafe { cell.cast::<u64>().read() } != MODEL_LIVE {
        return Err(KVM_ERR_BAD_HANDLE);
    }
    // SAFETY: the magic says `kvm_model_load` wrote a `ModelCell` here.
    Ok(unsafe { (*cell).model })
}

/// Checks a C array argument: null only when empty, aligned, and not overflowing.
fn check_array<T>(p: *const T, len: usize) -> Outcome {
    if len == 0 {
        return Ok(());
    }
    if p.is_null() {
        return Err(KVM_ERR_NULL_POINTER);
    }
    if p as usize % align_of::<T>() != 0 {
        return Err(KVM_ERR_MISALIGNED_POINTER);
    }
    let bytes = len.checked_mul(size_of::<T>()).filter(|&b| b <= isize::MAX as usize);
    match bytes.and_then(|b| (p as usize).checked_add(b)) {
        Some(_) => Ok(()),
        None => Err(KVM_ERR_INVALID_ARGUMENT),
    }
}

/// A C input array as a slice.
///
/// # Safety
/// If `len > 0`, `p` is valid for reads of `len` elements for `'a`.
unsafe fn input<'a, T>(p: *const T, len: usize) -> Result<&'a [T], kvm_status> {
    check_array(p, len)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: checked non-null, aligned and in range; readable per the contract.
    Ok(unsafe { core::slice::from_raw_parts(p, len) })
}

/// A C output array as a slice of possibly uninitialised elements.
///
/// # Safety
/// If `len > 0`, `p` is valid for writes of `len` elements for `'a`.
unsafe fn output<'a, T>(p: *mut T, len: usize) -> Result<&'a mut [MaybeUninit<T>], kvm_status> {
    check_array(p, len)?;
    if len == 0 {
        return Ok(&mut []);
    }
    // SAFETY: checked non-null, aligned and in range; writable per the contract.
    Ok(unsafe { core::slice::from_raw_parts_mut(p.cast::<MaybeUninit<T>>(), len) })
}

/// Checks an out-parameter: non-null and aligned. Calls check theirs before they change
/// anything, so a bad one fails the call with no effect.
fn check_out<T>(p: *mut T) -> Outcome {
    if p.is_null() {
        return Err(KVM_ERR_NULL_POINTER);
    }
    if p as usize % align_of::<T>() != 0 {
        return Err(KVM_ERR_MISALIGNED_POINTER);
    }
    Ok(())
}

/// Writes `v` to an out-parameter.
///
/// # Safety
/// `p` is null or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> Outcome {
    check_out(p)?;
    // SAFETY: non-null, aligned, writable per the contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Runs `fill`, which writes into a caller buffer and returns the count written, or an
/// error with the count needed (`KVM_ERR_BUFFER_TOO_SMALL`) or 0; stores that count in
/// `*count` either way. A null or misaligned `count` is refused before `fill` runs.
///
/// # Safety
/// `count` is null or valid for writes.
unsafe fn counted(count: *mut usize, fill: impl FnOnce() -> Result<usize, (kvm_status, usize)>) -> Outcome {
    check_out(count)?;
    let (outcome, n) = match fill() {
        Ok(n) => (Ok(()), n),
        Err((e, needed)) => (Err(e), needed),
    };
    // SAFETY: per the contract.
    unsafe { put(count, n)? };
    outcome
}

/// The library version, e.g. `"0.1.0"` (static, NUL-terminated).
#[no_mangle]
pub extern "C" fn kvm_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// A static, NUL-terminated description of `status`; never null, also for codes this
/// version does not know.
#[no_mangle]
pub extern "C" fn kvm_status_string(status: i32) -> *const c_char {
    let known = ALL.iter().find(|s| **s as i32 == status);
    known.map_or("unknown status\0", |s| s.message()).as_ptr().cast()
}

/// Validates the model file in `blob` (`blob_len` bytes) and fills `model` with a view
/// of it. Nothing is copied: `blob` must stay valid and unchanged for as long as the model
/// or any session made from it is used. A 64-byte aligned blob lets the kernels read it
/// fastest. `flags` is 0 or `KVM_LOAD_TRUSTED`.
///
/// Returns the first problem found in the file as a status; no input makes it read out
/// of bounds. A failed load leaves `model` unloaded (every call on it then returns
/// `KVM_ERR_BAD_HANDLE`), also when it held a model before; sessions already made from
/// that model go on unaffected.
///
/// # Safety
/// `blob` is valid for reads of `blob_len` bytes; `model` is null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_model_load(
    blob: *const u8,
    blob_len: usize,
    flags: u32,
    model: *mut kvm_model,
) -> kvm_status {
    if let Err(e) = check_out(model) {
        return e;
    }
    let code = status(catch(|| {
        if flags & !KVM_LOAD_TRUSTED != 0 {
            return Err(KVM_ERR_INVALID_ARGUMENT);
        }
        // SAFETY: per the contract; the caller keeps the blob alive (documented).
        let bytes: &'static [u8] = unsafe { input(blob, blob_len)? };
        let loaded =
            if flags & KVM_LOAD_TRUSTED != 0 { Model::from_bytes_trusted(bytes) } else { Model::from_bytes(bytes) };
        let cell = ModelCell { magic: MODEL_LIVE, model: loaded? };
        // SAFETY: checked non-null and aligned; `ModelCell` fits (asserted above).
        unsafe { model.cast::<ModelCell>().write(cell) };
        Ok(())
    }));
    if code != KVM_OK {
        // SAFETY: checked non-null and aligned; writable per the contract.
        unsafe { model.write(kvm_model::new()) };
    }
    code
}

/// Fills `info` with the model's sizes.
///
/// # Safety
/// `model` is null or a `kvm_model` (loaded or not); `info` is null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_model_info(model: *const kvm_model, info: *mut kvm_model_desc) -> kvm_status {
    status(catch(|| {
        // SAFETY: per the contract.
        let m = unsafe { model_of(model)? };
        let c = m.config();
        let plan = ArenaPlan::new(&m)?;
        let n_params = m.tensors().map(|t| u64::from(t.rows) * u64::from(t.cols)).fold(0u64, u64::saturating_add);
        let out = kvm_model_desc {
            format_major: u32::from(kvm_core::format::VERSION_MAJOR),
            format_minor: u32::from(m.header().minor),
            vocab_len: c.vocab_len,
            n_layers: c.n_layers,
            n_heads: c.n_heads,
            d_model: c.d_model,
            d_qk: c.d_qk,
            d_v: c.d_v,
            d_ff: c.d_ff,
            chunk_len: c.chunk_len,
            window_len: c.window_chunks.saturating_mul(c.chunk_len),
            state_len: m.header().state_capacity,
            tokenizer: m.header().tokenizer_kind as u32,
            n_params,
            file_len: m.header().file_len,
            arena_size: plan.total,
            state_size: session::state_size(&m)?,
            cache: m.cache() as u32,
            state_len_min: *session::state_len_range(&m).start() as u32,
            state_len_max: *session::state_len_range(&m).end() as u32,
            text_len: m.tokenizer().text_len(),
        };
        // SAFETY: per the contract.
        unsafe { put(info, out) }
    }))
}

/// Makes sessions created from `model` from now on store attention's rows as `cache`
/// (`KVM_CACHE_F32`, `KVM_CACHE_F16` or `KVM_CACHE_Q8`) instead of what the file says; `kvm_arena_size()`
/// and `kvm_state_size()` follow. Sessions already created keep theirs.
///
/// # Safety
/// `model` is null or a `kvm_model`.
#[no_mangle]
pub unsafe extern "C" fn kvm_model_set_cache(model: *mut kvm_model, cache: u32) -> kvm_status {
    status(catch(|| {
        // SAFETY: per the contract.
        let m = unsafe { model_of(model)? };
        let cache = kvm_core::cache::CacheDtype::from_u32(cache).ok_or(KVM_ERR_INVALID_ARGUMENT)?;
        let cell = ModelCell { magic: MODEL_LIVE, model: m.with_cache(cache)? };
        // SAFETY: `model_of` checked it non-null, aligned and live.
        unsafe { model.cast::<ModelCell>().write(cell) };
        Ok(())
    }))
}

/// What [`kvm_arena_size`] returns for `model`: the core's [`Model::arena_len`] plus the
/// session handle, the sampler's scratch and room for restored logits. `None` if the
/// sizes overflow.
pub fn arena_size(model: &Model<'_>) -> Option<usize> {
    ArenaPlan::new(model).ok().map(|p| p.total)
}

/// Bytes of arena one session of `model` needs: the session handle, the core's state and
/// scratch, the sampler's scratch and room for logits restored from a snapshot. The arena must be aligned to `KVM_ARENA_ALIGN`
/// bytes. Returns 0 if `model` is not a loaded model.
///
/// # Safety
/// `model` is null or a `kvm_model`.
#[no_mangle]
pub unsafe extern "C" fn kvm_arena_size(model: *const kvm_model) -> usize {
    // SAFETY: per the contract.
    let plan = catch(|| ArenaPlan::new(&unsafe { model_of(model)? }));
    plan.and_then(Result::ok).map_or(0, |p| p.total)
}

/// Creates a session of `model` in the caller's `arena` (`arena_len >=
/// kvm_arena_size(model)` bytes, aligned to `KVM_ARENA_ALIGN`) and stores its handle,
/// which points at the arena's first byte, in `*session`. The arena is zeroed first, so
/// it may hold anything.
///
/// The session starts empty, sampling with `kvm_sampler_default()` and seed 0. The
/// arena holds pointers into itself: it must not be moved or copied while in use (use
/// the state functions to move a session). There is nothing to free: to end a session,
/// stop using its arena.
///
/// # Safety
/// `model` is null or a `kvm_model`; `arena` is null or valid for writes of `arena_len`
/// bytes and used by nothing else while the session lives; `session` is null or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_session_init(
    model: *const kvm_model,
    arena: *mut c_void,
    arena_len: usize,
    session: *mut *mut kvm_session,
) -> kvm_status {
    status(catch(|| {
        // SAFETY: per the contract.
        let m = unsafe { model_of(model)? };
        check_out(session)?;
        let plan = ArenaPlan::new(&m)?;
        // SAFETY: per the contract.
        let cell = unsafe { SessionCell::init(m, plan, session::Exec::serial(), arena.cast(), arena_len)? };
        // SAFETY: per the contract.
        unsafe { put(session, cell.cast::<kvm_session>()) }
    }))
}

/// What `kvm_session_init()` makes: the model's state capacity, one thread, one token at
/// a time.
#[no_mangle]
pub extern "C" fn kvm_session_config_default() -> kvm_session_config {
    kvm_session_config { state_slots: 0, threads: 1, batch_tokens: 1 }
}

/// The arena plan of `config`'s state capacity, and how the session runs.
fn plan_of(m: &Model<'_>, config: &kvm_session_config) -> Result<(ArenaPlan, session::Exec), kvm_status> {
    let plan = match config.state_slots {
        0 => ArenaPlan::new(m)?,
        n => ArenaPlan::with_state_len(m, n as usize)?,
    };
    let in_range = |n: u32, max: u32| (1..=max).contains(&n);
    if !in_range(config.threads, KVM_MAX_THREADS) || !in_range(config.batch_tokens, KVM_MAX_BATCH_TOKENS) {
        return Err(KVM_ERR_INVALID_ARGUMENT);
    }
    Ok((plan, session::Exec { threads: config.threads as usize, batch: config.batch_tokens as usize }))
}

/// Writes to `*size` the bytes of arena a session of `model` holding `state_slots` state
/// slots needs (0: the model's own capacity, which is `kvm_arena_size()`). It grows with
/// `state_slots`. `KVM_ERR_STATE_SLOTS` (and `*size` untouched) if `state_slots` is
/// outside `[state_len_min, state_len_max]` of `kvm_model_info()`.
///
/// # Safety
/// `model` is null or a `kvm_model`; `size` is null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_arena_size_for(model: *const kvm_model, state_slots: u32, size: *mut usize) -> kvm_status {
    status(catch(|| {
        // SAFETY: per the contract.
        let m = unsafe { model_of(model)? };
        check_out(size)?;
        let config = kvm_session_config { state_slots, ..kvm_session_config_default() };
        let (plan, _) = plan_of(&m, &config)?;
        // SAFETY: per the contract.
        unsafe { put(size, plan.total) }
    }))
}

/// As `kvm_session_init()`, made as `config` says: `arena_len` must be at least
/// `kvm_arena_size_for(model, config->state_slots)`. Every argument is checked before
/// the arena is touched: `KVM_ERR_STATE_SLOTS` for a capacity out of range,
/// `KVM_ERR_ARENA_SIZE` for an arena too small for it, `KVM_ERR_INVALID_ARGUMENT` for a
/// thread count or batch length out of range, `KVM_ERR_UNSUPPORTED` for more than one
/// of either in a build without `std`, `KVM_ERR_THREADS` if the system refuses the
/// threads.
///
/// A session with more than one thread or token per batch holds threads and heap memory
/// (std builds): end it with `kvm_session_release()` before its arena is reused or freed.
/// Its threads spin briefly after each job, then sleep. It is used by one thread at a
/// time, as any session.
///
/// # Safety
/// As `kvm_session_init()`; `config` is null or valid for reads.
#[no_mangle]
pub unsafe extern "C" fn kvm_session_init_ex(
    model: *const kvm_model,
    config: *const kvm_session_config,
    arena: *mut c_void,
    arena_len: usize,
    session: *mut *mut kvm_session,
) -> kvm_status {
    status(catch(|| {
        // SAFETY: per the contract.
        let (m, config) = unsafe { (model_of(model)?, input(config, 1)?) };
        let config = config.first().ok_or(KVM_ERR_NULL_POINTER)?;
        check_out(session)?;
        let (plan, exec) = plan_of(&m, config)?;
        // SAFETY: per the contract.
        let cell = unsafe { SessionCell::init(m, plan, exec, arena.cast(), arena_len)? };
        // SAFETY: per the contract.
        unsafe { put(session, cell.cast::<kvm_session>()) }
    }))
}

/// Ends a session: stops its threads and frees its heap memory (a session of
/// `kvm_session_init()`, or of `kvm_session_config_default()`, has none), also after a
/// `KVM_ERR_PANIC`. The handle is dead afterwards (`KVM_ERR_BAD_HANDLE`) and its arena
/// free for any use.
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()` or `kvm_session_init_ex()`,
/// not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn kvm_session_release(session: *mut kvm_session) -> kvm_status {
    // SAFETY: per the contract.
    status(catch(|| unsafe { SessionCell::release(session.cast()) }))
}

/// Forgets every token of the session and rewinds its random generator to the last seed;
/// the sampler settings stay.
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()`.
#[no_mangle]
pub unsafe extern "C" fn kvm_session_reset(session: *mut kvm_session) -> kvm_status {
    let f = |s: &mut SessionCell| {
        s.reset();
        Ok(())
    };
    // SAFETY: per the contract.
    unsafe { with_session(session, f) }
}

/// Tokens in the session's context (prompt and generated). 0 for a bad handle.
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()`.
#[no_mangle]
pub unsafe extern "C" fn kvm_session_pos(session: *const kvm_session) -> usize {
    // SAFETY: per the contract.
    unsafe { with_session_ref(session, |s| Ok(s.pos())) }.unwrap_or(0)
}

/// The default settings: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repetition
/// penalty off (1.0) with a window of 64.
#[no_mangle]
pub extern "C" fn kvm_sampler_default() -> kvm_sampler_config {
    SamplerConfig::DEFAULT.into()
}

/// Greedy decoding: always the most likely token (lowest id on ties).
#[no_mangle]
pub extern "C" fn kvm_sampler_greedy() -> kvm_sampler_config {
    SamplerConfig::greedy().into()
}

/// Sets the session's sampler. `KVM_ERR_INVALID_ARGUMENT` (and no change) if a field is
/// out of range or `repeat_window > KVM_MAX_REPEAT_WINDOW`.
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()`; `config` is null or valid for
/// reads.
#[no_mangle]
pub unsafe extern "C" fn kvm_sampler_set(session: *mut kvm_session, config: *const kvm_sampler_config) -> kvm_status {
    let f = |s: &mut SessionCell| {
        // SAFETY: per the contract.
        let cfg = unsafe { input(config, 1)? };
        s.set_sampler(cfg.first().copied().ok_or(KVM_ERR_NULL_POINTER)?.into())
    };
    // SAFETY: per the contract.
    unsafe { with_session(session, f) }
}

/// Writes the session's sampler settings to `config`.
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()`; `config` is null or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_sampler_get(session: *const kvm_session, config: *mut kvm_sampler_config) -> kvm_status {
    // SAFETY: per the contract.
    let cfg = unsafe { with_session_ref(session, |s| Ok(s.sampler_config())) };
    // SAFETY: per the contract.
    status(Some(cfg.and_then(|c| unsafe { put(config, c.into()) })))
}

/// Restarts the sampler's random generator (PCG32) from `seed`. The same seed, settings
/// and context give the same tokens on every platform.
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()`.
#[no_mangle]
pub unsafe extern "C" fn kvm_sampler_seed(session: *mut kvm_session, seed: u64) -> kvm_status {
    let f = |s: &mut SessionCell| {
        s.reseed(seed);
        Ok(())
    };
    // SAFETY: per the contract.
    unsafe { with_session(session, f) }
}

/// Encodes `text_len` bytes of UTF-8 `text` into token ids. On success `*n_ids` is the
/// count written to `ids` (capacity `ids_cap`). If `ids_cap` is too small, returns
/// `KVM_ERR_BUFFER_TOO_SMALL` with the count needed in `*n_ids` (`ids` may be null when
/// `ids_cap` is 0, to ask for the size).
///
/// # Safety
/// `model` is null or a `kvm_model`; `text` is valid for reads of `text_len` bytes (null
/// if 0); `ids` for writes of `ids_cap` ids; `n_ids` null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_tokenize(
    model: *const kvm_model,
    text: *const c_char,
    text_len: usize,
    ids: *mut u32,
    ids_cap: usize,
    n_ids: *mut usize,
) -> kvm_status {
    status(catch(|| {
        // SAFETY: per the contract.
        let (m, text, out) = unsafe { (model_of(model)?, input(text.cast::<u8>(), text_len)?, output(ids, ids_cap)?) };
        // SAFETY: per the contract.
        unsafe { counted(n_ids, || text::encode(&m, text, out)) }
    }))
}

/// Decodes `n_ids` token ids into text (raw bytes, not NUL-terminated). On success
/// `*text_len` is the byte count written to `text` (capacity `text_cap`). If `text_cap`
/// is too small, returns `KVM_ERR_BUFFER_TOO_SMALL` with the bytes needed in `*text_len`
/// (`text` may be null when `text_cap` is 0).
///
/// # Safety
/// `model` is null or a `kvm_model`; `ids` is valid for reads of `n_ids` ids (null if
/// 0); `text` for writes of `text_cap` bytes; `text_len` null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_detokenize(
    model: *const kvm_model,
    ids: *const u32,
    n_ids: usize,
    text: *mut c_char,
    text_cap: usize,
    text_len: *mut usize,
) -> kvm_status {
    status(catch(|| {
        // SAFETY: per the contract.
        let (m, ids, out) = unsafe { (model_of(model)?, input(ids, n_ids)?, output(text.cast::<u8>(), text_cap)?) };
        // SAFETY: per the contract.
        unsafe { counted(text_len, || text::decode(&m, ids, out)) }
    }))
}

/// Appends `n_ids` prompt tokens (`n_ids >= 1`) to the session's context. Every id is
/// checked before any is fed: `KVM_ERR_TOKEN_OUT_OF_RANGE` leaves the session unchanged.
/// The last id is fed lazily, by the next `kvm_decode_step()` (see `kvm_generate()`).
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()`; `ids` is valid for reads of
/// `n_ids` ids.
#[no_mangle]
pub unsafe extern "C" fn kvm_prefill(session: *mut kvm_session, ids: *const u32, n_ids: usize) -> kvm_status {
    // SAFETY: per the contract.
    let f = |s: &mut SessionCell| s.prefill(unsafe { input(ids, n_ids)? });
    // SAFETY: per the contract.
    unsafe { with_session(session, f) }
}

/// `kvm_prefill()` in chunks of `chunk` ids (the last one may be shorter), calling
/// `callback` (may be null) after each with the ids fed so far and `n_ids`; a non-zero
/// return stops there with `KVM_ERR_CANCELLED` (after the last chunk, it changes nothing). Every id and pointer is checked before
/// any is fed. `*n_fed` (may be null) receives how many of `ids` are in the context, also
/// on error: after a cancel the session ends at that token boundary, ready to decode or
/// to go on with `kvm_prefill_chunked(session, ids + n_fed, n_ids - n_fed, ...)`, which
/// with the same `chunk` gives exactly what an uninterrupted call does. With one token per
/// batch (the default) the chunking never changes a result.
///
/// # Safety
/// As `kvm_prefill()`; `callback` is null or safe to call with `user_data`; `n_fed` is
/// null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_prefill_chunked(
    session: *mut kvm_session,
    ids: *const u32,
    n_ids: usize,
    chunk: usize,
    callback: kvm_progress_callback,
    user_data: *mut c_void,
    n_fed: *mut usize,
) -> kvm_status {
    let mut done = 0usize;
    let f = |s: &mut SessionCell| {
        if !n_fed.is_null() {
            check_out(n_fed)?;
        }
        // SAFETY: per the contract.
        let ids = unsafe { input(ids, n_ids)? };
        s.check_ids(ids)?;
        if chunk == 0 {
            return Err(KVM_ERR_INVALID_ARGUMENT);
        }
        for part in ids.chunks(chunk) {
            s.prefill(part)?;
            done += part.len();
            if let Some(cb) = callback {
                // SAFETY: the caller vouches for the callback and its user data.
                if unsafe { cb(user_data, done, n_ids) } != 0 && done < n_ids {
                    return Err(KVM_ERR_CANCELLED);
                }
            }
        }
        Ok(())
    };
    // SAFETY: per the contract.
    let code = unsafe { with_session(session, f) };
    if !n_fed.is_null() {
        // SAFETY: per the contract.
        let _ = unsafe { put(n_fed, done) };
    }
    code
}

/// Points `*logits` at the logits of the token after the whole context (`*len ==
/// vocab_len` floats, unnormalised; softmax them for probabilities), so C code can
/// sample, score or compute perplexity itself. If the context's last token has not been
/// run yet (after a prefill or a decode step), this runs it: the forward pass the next
/// `kvm_decode_step()` would run, which then samples from these very logits. Asking
/// twice costs nothing.
///
/// The logits lie in the session's arena and stay valid until the next call that
/// changes the session (prefill, decode, generate, reset, restore, release). A fresh or
/// reset session has none: `KVM_ERR_NO_CONTEXT`, and `*logits`, `*len` untouched, as on
/// every error. After logits that were not finite, `KVM_ERR_NON_FINITE` until the session
/// is reset or restored.
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()`; `logits` and `len` are null
/// or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_logits(session: *mut kvm_session, logits: *mut *const f32, len: *mut usize) -> kvm_status {
    let f = |s: &mut SessionCell| {
        check_out(logits)?;
        check_out(len)?;
        let l = s.logits()?;
        // SAFETY: per the contract.
        unsafe {
            put(logits, l.as_ptr())?;
            put(len, l.len())
        }
    };
    // SAFETY: per the contract.
    unsafe { with_session(session, f) }
}

/// As `kvm_logits()`, copying the logits into `out` (capacity `cap` floats); `*len`
/// receives `vocab_len` (0 on other errors). If `cap` is smaller:
/// `KVM_ERR_BUFFER_TOO_SMALL` with the count needed in `*len`, and nothing run or written
/// (`out` may be null when `cap` is 0).
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()`; `out` is valid for writes of
/// `cap` floats; `len` null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_logits_copy(
    session: *mut kvm_session,
    out: *mut f32,
    cap: usize,
    len: *mut usize,
) -> kvm_status {
    let f = |s: &mut SessionCell| {
        // SAFETY: per the contract.
        let out = unsafe { output(out, cap)? };
        // SAFETY: per the contract.
        unsafe {
            counted(len, || {
                let vocab_len = s.model().config().vocab_len as usize;
                let out = out.get_mut(..vocab_len).ok_or((KVM_ERR_BUFFER_TOO_SMALL, vocab_len))?;
                let l = s.logits().map_err(|e| (e, 0))?;
                for (o, &x) in out.iter_mut().zip(l) {
                    o.write(x);
                }
                Ok(vocab_len)
            })
        }
    };
    // SAFETY: per the contract.
    unsafe { with_session(session, f) }
}

/// Pull-style generation: runs the model on the context's last token, samples the next
/// token with the session's sampler, appends it to the context and writes it to `*token`.
/// Each call costs one forward pass. `KVM_ERR_NO_CONTEXT` before any prefill;
/// `KVM_ERR_NON_FINITE` once logits were not finite, until the session is reset or
/// restored.
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()`; `token` is null or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_decode_step(session: *mut kvm_session, token: *mut u32) -> kvm_status {
    let f = |s: &mut SessionCell| {
        check_out(token)?;
        let next = s.decode_step()?;
        // SAFETY: per the contract.
        unsafe { put(token, next) }
    };
    // SAFETY: per the contract.
    unsafe { with_session(session, f) }
}

/// Push-style generation: up to `max_tokens` calls of `kvm_decode_step()`, handing each
/// token and its text to `callback` (may be null), which stops generation by returning
/// non-zero; the token it was given stays in the context. `*n_generated` (may be null)
/// receives the number of tokens produced, also on error.
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()`; `callback` is null or safe to
/// call with `user_data`; `n_generated` is null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_generate(
    session: *mut kvm_session,
    max_tokens: usize,
    callback: kvm_token_callback,
    user_data: *mut c_void,
    n_generated: *mut usize,
) -> kvm_status {
    let mut count = 0usize;
    let f = |s: &mut SessionCell| {
        if !n_generated.is_null() {
            check_out(n_generated)?;
        }
        while count < max_tokens {
            let token = s.decode_step()?;
            count += 1;
            if let Some(cb) = callback {
                let piece = text::piece(s.model(), token).unwrap_or(&[]);
                // SAFETY: the caller vouches for the callback and its user data.
                if unsafe { cb(user_data, token, piece.as_ptr(), piece.len()) } != 0 {
                    break;
                }
            }
        }
        Ok(())
    };
    // SAFETY: per the contract.
    let code = unsafe { with_session(session, f) };
    if !n_generated.is_null() {
        // SAFETY: per the contract.
        let _ = unsafe { put(n_generated, count) };
    }
    code
}

/// Bytes of a state snapshot of `session` (the same for every session of a model and
/// state capacity; `kvm_model_info().state_size` at the model's own). 0 for a bad handle.
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()`.
#[no_mangle]
pub unsafe extern "C" fn kvm_state_size(session: *const kvm_session) -> usize {
    // SAFETY: per the contract.
    unsafe { with_session_ref(session, |s| Ok(s.state_size())) }.unwrap_or(0)
}

/// Saves the session's whole state (context, pending token or the logits `kvm_logits()`
/// computed, sampler position and history; not the sampler settings) into `buf`. `*written` receives
/// `kvm_state_size()`; if `buf_cap` is smaller, `KVM_ERR_BUFFER_TOO_SMALL` and nothing is
/// written to `buf`. Restoring it continues generation bit-exactly.
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()`; `buf` is valid for writes of
/// `buf_cap` bytes; `written` null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_state_save(
    session: *const kvm_session,
    buf: *mut c_void,
    buf_cap: usize,
    written: *mut usize,
) -> kvm_status {
    let f = |s: &SessionCell| {
        s.check_finite()?;
        let n = s.state_size();
        // SAFETY: per the contract.
        unsafe { put(written, n)? };
        if buf_cap < n {
            return Err(KVM_ERR_BUFFER_TOO_SMALL);
        }
        // SAFETY: per the contract.
        let out = unsafe { output(buf.cast::<u8>(), n)? };
        out.fill(MaybeUninit::new(0));
        // SAFETY: every byte was just initialised, and `[MaybeUninit<u8>]` has the layout
        // of `[u8]`.
        s.save(unsafe { &mut *(out as *mut [MaybeUninit<u8>] as *mut [u8]) })
    };
    // SAFETY: per the contract.
    status(Some(unsafe { with_session_ref(session, f) }))
}

/// Restores a `kvm_state_save()` snapshot (`len` bytes) of a session of the same model;
/// generation then continues exactly as it would have from the save. The sampler
/// settings are not part of the state. A corrupt snapshot or one of another model gives
/// `KVM_ERR_BAD_SNAPSHOT` and leaves the session unchanged. Snapshots carry a CRC, which
/// catches corruption, not forgery: restore only snapshots you made.
///
/// # Safety
/// `session` is null or a handle from `kvm_session_init()`; `buf` is valid for reads of
/// `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn kvm_state_restore(session: *mut kvm_session, buf: *const c_void, len: usize) -> kvm_status {
    // SAFETY: per the contract.
    let f = |s: &mut SessionCell| s.restore(unsafe { input(buf.cast::<u8>(), len)? });
    // SAFETY: per the contract.
    unsafe { with_session(session, f) }
}

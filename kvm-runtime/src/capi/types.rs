//! The C API's types, as `include/kvm.h` declares them: constants, `kvm_status` and its
//! messages, the handle structs, the model description, the sampler and session configs,
//! the callbacks; and `ModelCell`, what a `kvm_model` holds.

use core::ffi::c_void;
use core::mem::{align_of, size_of};

use kvm_core::sampler::SamplerConfig;
use kvm_core::{Error, Model};

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
    /// The system refused the memory of a session's threads (their batch buffer).
    KVM_ERR_OUT_OF_MEMORY = 108,
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
            Error::OutOfMemory { .. } => KVM_ERR_OUT_OF_MEMORY,
            // The core's enum is non-exhaustive; a kind added there without a code here
            // must not pass for success.
            _ => KVM_ERR_UNSUPPORTED,
        }
    }
}

impl kvm_status {
    /// Every status, in code order.
    pub const fn all() -> [kvm_status; 29] {
        ALL
    }
}

pub(crate) const ALL: [kvm_status; 29] = [
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
    KVM_ERR_OUT_OF_MEMORY,
];

impl kvm_status {
    /// A NUL-terminated description.
    pub(crate) const fn message(self) -> &'static str {
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
            KVM_ERR_OUT_OF_MEMORY => "out of memory\0",
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
pub(crate) struct ModelCell {
    pub(crate) magic: u64,
    pub(crate) model: Model<'static>,
}

/// `"KVMMODL1"`.
pub(crate) const MODEL_LIVE: u64 = u64::from_le_bytes(*b"KVMMODL1");

const _: () = assert!(size_of::<ModelCell>() <= size_of::<kvm_model>());
const _: () = assert!(align_of::<ModelCell>() <= align_of::<kvm_model>());

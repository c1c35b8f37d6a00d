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
//! becomes [`KVM_ERR_PANIC`](kvm_status::KVM_ERR_PANIC) and poisons the session it
//! happened in. Without `std` there is no unwinding; a panic goes to the firmware's
//! `#[panic_handler]`, which is why the paths above are written not to panic on any input.
//!
//! Threads: a session is used by one thread at a time; a loaded `kvm_model` is only read
//! and can be shared. Sessions copy the model view, so the `kvm_model` itself may be
//! discarded after `kvm_session_init()`; the blob may not.

// The C names are the API.
#![allow(non_camel_case_types)]

// Below the exports: the C types, the session a handle points at, the checks every call
// makes.
mod check;
mod session;
mod types;

// The exported functions by area. cbindgen declares them in the header in the order it
// parses these modules; the blank lines keep rustfmt from sorting them.

mod model;

mod lifecycle;

mod sampler;

mod text;

mod run;

mod snapshot;

pub use lifecycle::*;
pub use model::*;
pub use run::*;
pub use sampler::*;
pub use snapshot::*;
pub use text::*;
pub use types::*;

//! The exported functions of a model: the library version, status strings, loading a
//! model, its description, its attention cache and the arena size of its sessions.

use core::ffi::c_char;

use kvm_core::Model;

use super::check::{catch, check_out, input, model_of, put, status};
use super::session::{self, ArenaPlan};
use super::types::kvm_status::{self, *};
use super::types::{kvm_model, kvm_model_desc, ModelCell, ALL, KVM_LOAD_TRUSTED, MODEL_LIVE};

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
/// session handle and the sampler's scratch. `None` if the sizes overflow.
pub fn arena_size(model: &Model<'_>) -> Option<usize> {
    ArenaPlan::new(model).ok().map(|p| p.total)
}

/// Bytes of arena one session of `model` needs: the session handle, the core's state and
/// scratch and the sampler's scratch. The arena must be aligned to `KVM_ARENA_ALIGN`
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

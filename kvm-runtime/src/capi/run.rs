//! The exported functions that run the model: prefill (whole or in chunks), the logits of
//! the next token, and generation one token per call or with a callback.

use core::ffi::c_void;

use super::check::{check_out, counted, input, output, put, with_session};
use super::session::SessionCell;
use super::text;
use super::types::kvm_status::{self, *};
use super::types::{kvm_progress_callback, kvm_session, kvm_token_callback};

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
/// batch (the default) the chunking never changes a result. The callback may call kvm on
/// this session too; if it releases it, the call stops with `KVM_ERR_BAD_HANDLE`.
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
    let mut parts: &[u32] = &[];
    let check = |s: &mut SessionCell| {
        if !n_fed.is_null() {
            check_out(n_fed)?;
        }
        // SAFETY: per the contract.
        parts = unsafe { input(ids, n_ids)? };
        s.check_ids(parts)?;
        if chunk == 0 {
            return Err(KVM_ERR_INVALID_ARGUMENT);
        }
        Ok(())
    };
    // SAFETY: per the contract.
    let mut code = unsafe { with_session(session, check) };
    // Each chunk borrows the session only while it is fed, so the callback may call kvm
    // on this session (even release it: the next chunk's handle check sees that).
    for part in parts.chunks(chunk.max(1)) {
        if code != KVM_OK {
            break;
        }
        // SAFETY: per the contract.
        code = unsafe { with_session(session, |s| s.prefill(part)) };
        if code != KVM_OK {
            break;
        }
        done += part.len();
        // SAFETY: the caller vouches for the callback and its user data.
        if callback.is_some_and(|cb| unsafe { cb(user_data, done, n_ids) } != 0) && done < n_ids {
            code = KVM_ERR_CANCELLED;
        }
    }
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
/// receives the number of tokens produced, also on error. The callback may call kvm on
/// this session too; if it releases it, generation stops with `KVM_ERR_BAD_HANDLE`.
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
    let check = |_: &mut SessionCell| if n_generated.is_null() { Ok(()) } else { check_out(n_generated) };
    // SAFETY: per the contract.
    let mut code = unsafe { with_session(session, check) };
    // Each step borrows the session only while it decodes, so the callback may call kvm
    // on this session (even release it: the next step's handle check sees that).
    while code == KVM_OK && count < max_tokens {
        let mut step = (0, &[][..]);
        let f = |s: &mut SessionCell| {
            let token = s.decode_step()?;
            step = (token, text::piece(s.model(), token).unwrap_or(&[]));
            Ok(())
        };
        // SAFETY: per the contract.
        code = unsafe { with_session(session, f) };
        if code != KVM_OK {
            break;
        }
        count += 1;
        let (token, piece) = step;
        // SAFETY: the caller vouches for the callback and its user data.
        if callback.is_some_and(|cb| unsafe { cb(user_data, token, piece.as_ptr(), piece.len()) } != 0) {
            break;
        }
    }
    if !n_generated.is_null() {
        // SAFETY: per the contract.
        let _ = unsafe { put(n_generated, count) };
    }
    code
}

//! The exported functions of state snapshots: their size, saving a session's state and
//! restoring it.

use core::ffi::c_void;
use core::mem::MaybeUninit;

use super::check::{input, output, put, status, with_session, with_session_ref};
use super::session::SessionCell;
use super::types::kvm_session;
use super::types::kvm_status::{self, *};

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
/// catches corruption, not forgery: restore only snapshots you made. One whose logits are
/// not finite (`kvm_state_save()` never writes one) is refused likewise. Snapshots of
/// the previous layout (version 3, docs/c-api.md) still restore.
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

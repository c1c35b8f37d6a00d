//! What every exported function runs through: the panic guard, the session and model
//! behind a handle, and the checks of C arrays and out-parameters.

use core::mem::{align_of, size_of, MaybeUninit};

use kvm_core::Model;

use super::session::SessionCell;
use super::types::kvm_status::{self, *};
use super::types::{kvm_model, kvm_session, ModelCell, MODEL_LIVE};

pub(crate) type Outcome = Result<(), kvm_status>;

/// Runs `f`, turning a panic into `KVM_ERR_PANIC` where unwinding exists.
#[cfg(feature = "std")]
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok()
}

/// Without `std` a panic never returns here (see the module docs).
#[cfg(not(feature = "std"))]
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> Option<T> {
    Some(f())
}

pub(crate) fn status(outcome: Option<Outcome>) -> kvm_status {
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
pub(crate) unsafe fn with_session(s: *mut kvm_session, f: impl FnOnce(&mut SessionCell) -> Outcome) -> kvm_status {
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
pub(crate) unsafe fn with_session_ref<T>(
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
pub(crate) unsafe fn model_of(m: *const kvm_model) -> Result<Model<'static>, kvm_status> {
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
pub(crate) fn check_array<T>(p: *const T, len: usize) -> Outcome {
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
pub(crate) unsafe fn input<'a, T>(p: *const T, len: usize) -> Result<&'a [T], kvm_status> {
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
pub(crate) unsafe fn output<'a, T>(p: *mut T, len: usize) -> Result<&'a mut [MaybeUninit<T>], kvm_status> {
    check_array(p, len)?;
    if len == 0 {
        return Ok(&mut []);
    }
    // SAFETY: checked non-null, aligned and in range; writable per the contract.
    Ok(unsafe { core::slice::from_raw_parts_mut(p.cast::<MaybeUninit<T>>(), len) })
}

/// Checks an out-parameter: non-null and aligned. Calls check theirs before they change
/// anything, so a bad one fails the call with no effect.
pub(crate) fn check_out<T>(p: *mut T) -> Outcome {
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
pub(crate) unsafe fn put<T>(p: *mut T, v: T) -> Outcome {
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
pub(crate) unsafe fn counted(count: *mut usize, fill: impl FnOnce() -> Result<usize, (kvm_status, usize)>) -> Outcome {
    check_out(count)?;
    let (outcome, n) = match fill() {
        Ok(n) => (Ok(()), n),
        Err((e, needed)) => (Err(e), needed),
    };
    // SAFETY: per the contract.
    unsafe { put(count, n)? };
    outcome
}

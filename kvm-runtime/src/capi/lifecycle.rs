//! The exported functions of a session's life: making one in an arena (with the default
//! config or a given one), sizing its arena, ending, resetting it and its position.

use core::ffi::c_void;

use kvm_core::Model;

use super::check::{catch, check_out, input, model_of, put, status, with_session, with_session_ref};
use super::session::{self, ArenaPlan, SessionCell};
use super::types::kvm_status::{self, *};
use super::types::{kvm_model, kvm_session, kvm_session_config, KVM_MAX_BATCH_TOKENS, KVM_MAX_THREADS};

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
/// threads, `KVM_ERR_OUT_OF_MEMORY` if it refuses their memory.
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

//! The exported functions of a session's sampler: the preset settings, setting and
//! reading them, seeding its random generator.

use kvm_core::sampler::SamplerConfig;

use super::check::{input, put, status, with_session, with_session_ref};
use super::session::SessionCell;
use super::types::kvm_status::{self, *};
use super::types::{kvm_sampler_config, kvm_session};

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
/// out of its range: `temperature` in [0, 100], `top_p` in (0, 1], `min_p` in [0, 1],
/// `repeat_penalty` in (0, 100], `repeat_window` in [0, KVM_MAX_REPEAT_WINDOW] (the
/// ranges of the `kvm` command line's flags).
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

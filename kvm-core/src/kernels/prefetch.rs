//! Cache hints: bring lines in before loads or stores need them (a hint never faults and
//! changes nothing; on architectures without one it is nothing).

/// What [`prefetch_lines`] brings cache lines in for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Loads soon, on this core: into L1.
    Read,
    /// Stores soon, on this core: into L1, owned.
    Write,
    /// Loads a little later, perhaps on another core: into L2, leaving L1 to the work at hand.
    Later,
}

/// Asks the CPU to bring the cache lines of `bytes` in, so that loads or stores to them
/// soon after do not wait on memory or on another core (a hint: never faults, changes
/// nothing, and is nothing where the architecture has no such hint).
#[inline]
pub(crate) fn prefetch_lines<T>(bytes: &[T], access: Access) {
    prefetch_range(bytes.as_ptr() as usize, core::mem::size_of_val(bytes), access);
}

/// Asks the CPU to bring the `len` bytes at address `addr` into its L2 cache, for loads a
/// little later, perhaps by another core: the weights of the next matrix products, loaded
/// by a thread that would otherwise wait for them. A hint that reads nothing: it never
/// faults, not even where nothing is mapped, so `addr` may outlive what it pointed to.
#[inline]
pub fn prefetch_later(addr: usize, len: usize) {
    prefetch_range(addr, len, Access::Later);
}

/// [`prefetch_lines`] of the `len` bytes at address `addr`, which need not be mapped.
#[inline]
fn prefetch_range(addr: usize, len: usize, access: Access) {
    // `wrapping_add`: the address is never dereferenced, so it needs no provenance.
    let p = addr as *const u8;
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(64) {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0, _MM_HINT_T1};
        let p = p.wrapping_add(off).cast();
        // SAFETY: a prefetch reads and writes nothing architecturally and never faults
        // (`prefetchw` is a NOP on CPUs without it).
        unsafe {
            match access {
                Access::Read => _mm_prefetch::<_MM_HINT_T0>(p),
                Access::Write => _mm_prefetch::<_MM_HINT_ET0>(p),
                Access::Later => _mm_prefetch::<_MM_HINT_T1>(p),
            }
        };
    }
    #[cfg(target_arch = "aarch64")]
    for off in (0..len).step_by(64) {
        use core::arch::asm;
        let p = p.wrapping_add(off);
        // SAFETY: as above (`prfm`, a hint).
        unsafe {
            match access {
                Access::Read => asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags)),
                Access::Write => asm!("prfm pstl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags)),
                Access::Later => asm!("prfm pldl2keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags)),
            }
        };
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (p, len, access);
}

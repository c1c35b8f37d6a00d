//! x86_64 tiers: [`avx2`] for every x86_64 CPU of the last decade, [`avx512`] on top of it
//! where wider vectors and VNNI pay off.

pub(crate) mod avx2;
pub(crate) mod avx512;

/// Bytes ahead of the current row that attention's kernels prefetch: the state's rows
/// stream from memory once per token, faster than the hardware prefetcher ramps up.
pub(crate) const PREFETCH_AHEAD: usize = 4096;

/// Asks for the cache lines of `[p + PREFETCH_AHEAD, p + PREFETCH_AHEAD + len)`: a hint
/// (it never faults, even past the end of the rows).
#[inline(always)]
pub(crate) fn prefetch_ahead(p: *const u8, len: usize) {
    use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let mut off = 0;
    while off < len {
        // SAFETY: a prefetch reads nothing architecturally; `wrapping_add` keeps the
        // address arithmetic defined whatever it points at.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + off).cast()) };
        off += 64;
    }
}

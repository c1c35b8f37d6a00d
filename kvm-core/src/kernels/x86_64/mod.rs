//! x86_64 tiers: [`avx2`] for every x86_64 CPU of the last decade, [`avx512`] on top of it
//! where wider vectors and VNNI pay off.

pub(crate) mod avx2;
pub(crate) mod avx512;

use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};

/// Prefetches the cache line `ahead` bytes past `p` (a hint: never faults).
///
/// A tile reads several short rows side by side, which the hardware stream prefetcher
/// does not follow (it tracks about one stream per 4 KiB page); without this, weights
/// coming from DRAM arrive at half the bandwidth. Tiles ask for the same position `R` rows
/// further along each row's run (`ahead = R * row bytes`; see `kernels::tiles`).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, ahead: usize) {
    // SAFETY: a prefetch reads nothing architecturally (SSE, baseline on x86_64);
    // `wrapping_add` keeps the address arithmetic defined past the end of the rows.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead).cast()) }
}

/// Bytes ahead of the current row that attention's kernels prefetch: the state's rows
/// stream from memory once per token, faster than the hardware prefetcher ramps up.
pub(crate) const PREFETCH_AHEAD: usize = 4096;

/// [`prefetch`]es every cache line of `[p + PREFETCH_AHEAD, p + PREFETCH_AHEAD + len)`.
#[inline(always)]
pub(crate) fn prefetch_ahead(p: *const u8, len: usize) {
    for off in (0..len).step_by(64) {
        prefetch(p, PREFETCH_AHEAD + off);
    }
}

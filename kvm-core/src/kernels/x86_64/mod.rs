//! x86_64 tiers: [`avx2`] for every x86_64 CPU of the last decade, [`avx512`] on top of it
//! where wider vectors and VNNI pay off.

pub(crate) mod avx2;
pub(crate) mod avx512;

use super::tier::{streaming, Streaming};
use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};

/// Prefetches the cache line `ahead` bytes past `p` (a hint: never faults).
///
/// The kernels read several runs of memory side by side (a tile's rows each come from
/// their own run of the matrix; attention reads the state's rows once per token), which
/// the hardware stream prefetcher does not follow well enough: it tracks about one stream
/// per 4 KiB page and ramps up slowly. Without this, weights coming from DRAM arrive at
/// half the bandwidth.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, ahead: usize) {
    // SAFETY: a prefetch reads nothing architecturally (SSE, baseline on x86_64);
    // `wrapping_add` keeps the address arithmetic defined past the end of the rows.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead).cast()) }
}

/// Whether the float decode tiles prefetch their rows in software ([`Streaming::Software`]).
#[inline]
pub(crate) fn software_streams() -> bool {
    streaming() == Streaming::Software
}

/// Bytes a tile of `R` rows prefetches ahead in each of its runs: 32 KiB in flight in
/// all, as much as L1 holds, however many runs and however long the rows.
pub(crate) const fn tile_ahead<const R: usize>() -> usize {
    32 * 1024 / R
}

/// Prefetches, for a tile of `R` rows of packed f32 ([`crate::quant::DType::F32P`]), the
/// block at `p` plus [`packed_ahead`] into L1 and the one at `p` plus [`tile_ahead`] into
/// L2: a block spans at most 3 lines and starts at most 112 bytes after the last one's
/// start, so 2 prefetches 64 bytes apart reach every line of each.
///
/// f32p's decode does more work per byte than f32's, so it keeps less in flight in L1 and
/// has L2 hold the float kernels' distance ahead.
#[inline(always)]
pub(crate) fn prefetch_packed<const R: usize>(p: *const u8) {
    for line in [0, 64] {
        prefetch(p, packed_ahead::<R>() + line);
        // SAFETY: as in `prefetch`.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(tile_ahead::<R>() + line).cast()) }
    }
}

/// Bytes a tile of `R` rows of packed f32 prefetches ahead into L1 in each of its runs:
/// 8 KiB in flight in all, a quarter of [`tile_ahead`].
const fn packed_ahead<const R: usize>() -> usize {
    8 * 1024 / R
}

/// Bytes ahead of the current row that attention's kernels and the interleaved groups
/// prefetch.
pub(crate) const PREFETCH_AHEAD: usize = 4096;

/// [`prefetch`]es every cache line of `[p + PREFETCH_AHEAD, p + PREFETCH_AHEAD + len)`.
#[inline(always)]
pub(crate) fn prefetch_ahead(p: *const u8, len: usize) {
    for off in (0..len).step_by(64) {
        prefetch(p, PREFETCH_AHEAD + off);
    }
}

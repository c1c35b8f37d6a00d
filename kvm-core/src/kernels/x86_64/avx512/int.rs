//! The AVX-512 tier's integer numerics' product ([`crate::kernels::matvec_i8`]): 32 i8
//! weights widen to i16 and meet 32 input values in VNNI's `vpdpwssd`, which adds each
//! pair of products (at most 2 * 128 * 2^15) into an i32 lane without saturating, so the
//! lanes wrap as the scalar oracle's partial sums do.

use super::Avx512;
use crate::kernels::traits::IntKernel;
use crate::kernels::x86_64::{prefetch, software_streams, tile_ahead};
use core::arch::x86_64::*;

impl IntKernel for Avx512 {
    const LANES: usize = 32;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn sums<const R: usize>(q: [&[i8]; R], x: &[i16]) -> [i32; R] {
        debug_assert!(x.len().is_multiple_of(Self::LANES) && q.iter().all(|q| q.len() >= x.len()));
        let hints = software_streams();
        let mut acc = [_mm512_setzero_si512(); R];
        for c in (0..x.len()).step_by(Self::LANES) {
            // SAFETY: `x` holds `c + 32` values, unaligned.
            let xv = unsafe { _mm512_loadu_si512(x.as_ptr().add(c).cast()) };
            for r in 0..R {
                if hints && c % 64 == 0 {
                    prefetch(q[r].as_ptr().wrapping_add(c).cast(), tile_ahead::<R>());
                }
                // SAFETY: `q[r]` holds at least `x.len()` weights; rows start 4 bytes past
                // a row's start, so the load is unaligned.
                let wv = _mm512_cvtepi8_epi16(unsafe { _mm256_loadu_si256(q[r].as_ptr().add(c).cast()) });
                acc[r] = _mm512_dpwssd_epi32(acc[r], wv, xv);
            }
        }
        // (A modular sum of the lanes, as the scalar's wrapping adds.)
        core::array::from_fn(|r| _mm512_reduce_add_epi32(acc[r]))
    }
}

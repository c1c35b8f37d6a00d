//! The AVX2 tier's integer numerics' product ([`crate::kernels::matvec_i8`]): 16 i8
//! weights widen to i16 and meet 16 input values in `madd`, whose pairs of products (at
//! most 2 * 128 * 2^15, no overflow) land in 8 i32 lanes per row, added wrapping as the
//! scalar oracle's partial sums are.

use super::Avx2;
use crate::kernels::traits::IntKernel;
use crate::kernels::x86_64::{prefetch, software_streams, tile_ahead};
use core::arch::x86_64::*;

impl IntKernel for Avx2 {
    const LANES: usize = 16;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sums<const R: usize>(q: [&[i8]; R], x: &[i16]) -> [i32; R] {
        debug_assert!(x.len().is_multiple_of(Self::LANES) && q.iter().all(|q| q.len() >= x.len()));
        let hints = software_streams();
        let mut acc = [_mm256_setzero_si256(); R];
        for c in (0..x.len()).step_by(Self::LANES) {
            // SAFETY: `x` holds `c + 16` values, unaligned.
            let xv = unsafe { _mm256_loadu_si256(x.as_ptr().add(c).cast()) };
            for r in 0..R {
                if hints && c % 64 == 0 {
                    prefetch(q[r].as_ptr().wrapping_add(c).cast(), tile_ahead::<R>());
                }
                // SAFETY: `q[r]` holds at least `x.len()` weights; rows start 4 bytes past
                // a row's start, so the load is unaligned.
                let wv = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(q[r].as_ptr().add(c).cast()) });
                acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(wv, xv));
            }
        }
        core::array::from_fn(|r| hsum_i32(acc[r]))
    }
}

/// The wrapping sum of the 8 i32 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_i32(v: __m256i) -> i32 {
    let v = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01>(v));
    _mm_cvtsi128_si32(v)
}

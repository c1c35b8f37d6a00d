//! The AVX-512 tier's softmax pieces: exponentials 16 lanes at a time, maximum and its position.

use super::tier::Avx512;
use crate::kernels::attend::{self, Exp};
use crate::kernels::scalar;
use crate::kernels::x86_64::avx2::{self};
use core::arch::x86_64::*;

/// [`scalar::exp_sub`] 16 lanes at a time, operation for operation (bit-identical), the
/// values left over 8 at a time as the AVX2 tier takes them.
impl Exp for Avx512 {
    const LANES: usize = 16;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn exp_sub_lanes(x: &mut [f32], max: f32) {
        let m = _mm512_set1_ps(max);
        // SAFETY: `x` holds 16 floats.
        unsafe { _mm512_storeu_ps(x.as_mut_ptr(), exp16(_mm512_sub_ps(_mm512_loadu_ps(x.as_ptr()), m))) };
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn exp_sub_tail(x: &mut [f32], max: f32) {
        // SAFETY: this tier includes the AVX2 one.
        unsafe { attend::exp_sub_in::<avx2::Avx2>(x, max) }
    }
}

/// [`scalar::max`] in four registers of 16 running maxima (`vmaxps` keeps its second
/// operand when the first is NaN, so NaNs never enter them).
///
/// # Safety
/// The tier's features are present.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn max(x: &[f32]) -> f32 {
    let mut acc = [_mm512_set1_ps(f32::NEG_INFINITY); 4];
    let mut chunks = x.chunks_exact(64);
    for c in &mut chunks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `c` holds 64 floats.
            *a = _mm512_max_ps(unsafe { _mm512_loadu_ps(c.as_ptr().add(16 * k)) }, *a);
        }
    }
    let a = _mm512_max_ps(_mm512_max_ps(acc[0], acc[1]), _mm512_max_ps(acc[2], acc[3]));
    // SAFETY: this tier includes the AVX2 one.
    _mm512_reduce_max_ps(a).max(unsafe { avx2::max(chunks.remainder()) })
}

/// [`scalar::find`] 16 lanes at a time.
///
/// # Safety
/// The tier's features are present.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn find(x: &[f32], v: f32) -> Option<usize> {
    let m = _mm512_set1_ps(v);
    let mut chunks = x.chunks_exact(16);
    for (i, c) in (&mut chunks).enumerate() {
        // SAFETY: `c` holds 16 floats.
        let mask = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(unsafe { _mm512_loadu_ps(c.as_ptr()) }, m);
        if mask != 0 {
            return Some(16 * i + mask.trailing_zeros() as usize);
        }
    }
    // SAFETY: as above.
    unsafe { avx2::find(chunks.remainder(), v) }.map(|j| x.len() / 16 * 16 + j)
}

/// [`scalar::exp_approx`] of 16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn exp16(x: __m512) -> __m512 {
    use scalar::exp;
    // `max(a, b)` is `a > b ? a : b` and `min(a, b)` is `a < b ? a : b`: the scalar clamps,
    // NaN included.
    let x = _mm512_max_ps(_mm512_set1_ps(exp::LO), x);
    let x = _mm512_min_ps(_mm512_set1_ps(exp::HI), x);
    let t = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(exp::LOG2E)), _mm512_set1_ps(0.5));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(t);
    let r = _mm512_sub_ps(
        _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(exp::LN2_HI))),
        _mm512_mul_ps(n, _mm512_set1_ps(exp::LN2_LO)),
    );
    let mut p = _mm512_set1_ps(exp::P[0]);
    for &c in &exp::P[1..] {
        p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
    }
    let y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0));
    let two_n = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)));
    _mm512_mul_ps(y, _mm512_castsi512_ps(two_n))
}

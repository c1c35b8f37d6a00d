//! The AVX2 tier's softmax pieces: exponentials 8 lanes at a time, maximum and its position.

use super::tier::Avx2;
use crate::kernels::attend::Exp;
use crate::kernels::scalar;
use core::arch::x86_64::*;

/// [`scalar::exp_sub`] 8 lanes at a time, operation for operation (bit-identical).
impl Exp for Avx2 {
    const LANES: usize = 8;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn exp_sub_lanes(x: &mut [f32], max: f32) {
        let m = _mm256_set1_ps(max);
        // SAFETY: `x` holds 8 floats.
        unsafe { _mm256_storeu_ps(x.as_mut_ptr(), exp8(_mm256_sub_ps(_mm256_loadu_ps(x.as_ptr()), m))) };
    }
}

/// [`scalar::max`] in four registers of 8 running maxima (`maxps` keeps its second
/// operand when the first is NaN, so NaNs never enter them).
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn max(x: &[f32]) -> f32 {
    let mut acc = [_mm256_set1_ps(f32::NEG_INFINITY); 4];
    let mut chunks = x.chunks_exact(32);
    for c in &mut chunks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `c` holds 32 floats.
            *a = _mm256_max_ps(unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * k)) }, *a);
        }
    }
    let a = _mm256_max_ps(_mm256_max_ps(acc[0], acc[1]), _mm256_max_ps(acc[2], acc[3]));
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), a) };
    lanes.into_iter().fold(scalar::max(chunks.remainder()), f32::max)
}

/// [`scalar::find`] 8 lanes at a time.
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn find(x: &[f32], v: f32) -> Option<usize> {
    let m = _mm256_set1_ps(v);
    let mut chunks = x.chunks_exact(8);
    for (i, c) in (&mut chunks).enumerate() {
        // SAFETY: `c` holds 8 floats.
        let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(unsafe { _mm256_loadu_ps(c.as_ptr()) }, m);
        let mask = _mm256_movemask_ps(eq);
        if mask != 0 {
            return Some(8 * i + mask.trailing_zeros() as usize);
        }
    }
    scalar::find(chunks.remainder(), v).map(|j| x.len() / 8 * 8 + j)
}

/// [`scalar::exp_approx`] of 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn exp8(x: __m256) -> __m256 {
    use scalar::exp;
    // `max(a, b)` is `a > b ? a : b` and `min(a, b)` is `a < b ? a : b`: the scalar clamps,
    // NaN included.
    let x = _mm256_max_ps(_mm256_set1_ps(exp::LO), x);
    let x = _mm256_min_ps(_mm256_set1_ps(exp::HI), x);
    let n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(exp::LOG2E)), _mm256_set1_ps(0.5)));
    let r = _mm256_sub_ps(
        _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(exp::LN2_HI))),
        _mm256_mul_ps(n, _mm256_set1_ps(exp::LN2_LO)),
    );
    let mut p = _mm256_set1_ps(exp::P[0]);
    for &c in &exp::P[1..] {
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0));
    let two_n = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(y, _mm256_castsi256_ps(two_n))
}

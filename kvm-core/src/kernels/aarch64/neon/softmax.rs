//! The NEON tiers' softmax pieces: exponentials 4 lanes at a time, maximum and its position.

use super::tier::Neon;
use crate::kernels::attend::Exp;
use crate::kernels::scalar;
use core::arch::aarch64::*;

/// [`scalar::exp_sub`] 4 lanes at a time, operation for operation (bit-identical).
impl Exp for Neon {
    const LANES: usize = 4;

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn exp_sub_lanes(x: &mut [f32], max: f32) {
        let m = vdupq_n_f32(max);
        // SAFETY: `x` holds 4 floats.
        unsafe { vst1q_f32(x.as_mut_ptr(), exp4(vsubq_f32(vld1q_f32(x.as_ptr()), m))) };
    }
}

/// [`scalar::max`] in four registers of 4 running maxima (`fmaxnm` returns the number
/// when one operand is NaN, so NaNs never enter them).
///
/// # Safety
/// NEON is present.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn max(x: &[f32]) -> f32 {
    let mut acc = [vdupq_n_f32(f32::NEG_INFINITY); 4];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `c` holds 16 floats.
            *a = vmaxnmq_f32(*a, unsafe { vld1q_f32(c.as_ptr().add(4 * k)) });
        }
    }
    let a = vmaxnmq_f32(vmaxnmq_f32(acc[0], acc[1]), vmaxnmq_f32(acc[2], acc[3]));
    vmaxnmvq_f32(a).max(scalar::max(chunks.remainder()))
}

/// [`scalar::find`] 4 lanes at a time.
///
/// # Safety
/// NEON is present.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn find(x: &[f32], v: f32) -> Option<usize> {
    let m = vdupq_n_f32(v);
    let mut chunks = x.chunks_exact(4);
    for (i, c) in (&mut chunks).enumerate() {
        // SAFETY: `c` holds 4 floats.
        if vmaxvq_u32(vceqq_f32(unsafe { vld1q_f32(c.as_ptr()) }, m)) != 0 {
            return scalar::find(c, v).map(|j| 4 * i + j);
        }
    }
    scalar::find(chunks.remainder(), v).map(|j| x.len() / 4 * 4 + j)
}

/// [`scalar::exp_approx`] of 4 lanes.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn exp4(x: float32x4_t) -> float32x4_t {
    use scalar::exp;
    // The clamps: equal to the scalar ones for numbers; NaN stays NaN.
    let x = vmaxq_f32(vdupq_n_f32(exp::LO), x);
    let x = vminq_f32(vdupq_n_f32(exp::HI), x);
    let n = vrndmq_f32(vaddq_f32(vmulq_f32(x, vdupq_n_f32(exp::LOG2E)), vdupq_n_f32(0.5)));
    let r = vsubq_f32(vsubq_f32(x, vmulq_f32(n, vdupq_n_f32(exp::LN2_HI))), vmulq_f32(n, vdupq_n_f32(exp::LN2_LO)));
    let mut p = vdupq_n_f32(exp::P[0]);
    for &c in &exp::P[1..] {
        p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(c));
    }
    let y = vaddq_f32(vaddq_f32(vmulq_f32(vmulq_f32(p, r), r), r), vdupq_n_f32(1.0));
    let two_n = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
    vmulq_f32(y, vreinterpretq_f32_s32(two_n))
}

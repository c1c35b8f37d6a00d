//! The NEON tiers' integer numerics' product ([`crate::kernels::matvec_i8`]), the same for
//! NEON and NEON + dotprod (`sdot` takes bytes only): 16 i8 weights widen to i16
//! (`sxtl`) and meet 16 input values in `smlal` / `smlal2`, each product (at most 2^22)
//! added into an i32 lane, two accumulators a row; lanes and their sum (`addv`) wrap as
//! the scalar oracle's partial sums do.

use super::tier::NeonTier;
use crate::kernels::traits::IntKernel;
use core::arch::aarch64::*;

impl<D> IntKernel for NeonTier<D> {
    const LANES: usize = 16;

    #[target_feature(enable = "neon")]
    unsafe fn sums<const R: usize>(q: [&[i8]; R], x: &[i16]) -> [i32; R] {
        debug_assert!(x.len().is_multiple_of(Self::LANES) && q.iter().all(|q| q.len() >= x.len()));
        let mut acc = [[vdupq_n_s32(0); 2]; R];
        for c in (0..x.len()).step_by(Self::LANES) {
            // SAFETY: `x` holds `c + 16` values.
            let (x0, x1) = unsafe { (vld1q_s16(x.as_ptr().add(c)), vld1q_s16(x.as_ptr().add(c + 8))) };
            for r in 0..R {
                // SAFETY: `q[r]` holds at least `x.len()` weights (`ld1` takes any alignment).
                let w = unsafe { vld1q_s8(q[r].as_ptr().add(c)) };
                let (w0, w1) = (vmovl_s8(vget_low_s8(w)), vmovl_high_s8(w));
                let [a0, a1] = acc[r];
                let a0 = vmlal_high_s16(vmlal_s16(a0, vget_low_s16(w0), vget_low_s16(x0)), w0, x0);
                let a1 = vmlal_high_s16(vmlal_s16(a1, vget_low_s16(w1), vget_low_s16(x1)), w1, x1);
                acc[r] = [a0, a1];
            }
        }
        core::array::from_fn(|r| vaddvq_s32(vaddq_s32(acc[r][0], acc[r][1])))
    }
}

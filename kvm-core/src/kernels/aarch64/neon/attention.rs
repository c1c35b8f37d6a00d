//! The NEON tiers' attention tiles ([`crate::kernels::attend`]'s inner steps), one for both.

use super::float::Widen8;
use super::tier::Neon;
use crate::kernels::attend::Attend;
use crate::kernels::scalar;
use crate::kernels::traits::StoredType;
use core::arch::aarch64::*;

/// Attention's tiles (both NEON tiers): a dot's 16 canonical lanes as four vectors;
/// weighted sums of 4 columns per vector, loaded 8 at a time (f16 rows widen exactly with
/// `fcvtl`), up to 8 vectors held across all the rows; multiplies and adds stay separate
/// (no `fmla`), so the bits are the scalar ones.
impl<T: StoredType<Float: Widen8>> Attend<T> for Neon {
    const SUM_COLUMNS: usize = 8;

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn dot_rows<const R: usize>(rows: &[T], x: &[f32]) -> [f32; R] {
        let d = x.len();
        let body = d - d % scalar::DOT_LANES;
        let mut acc = [[vdupq_n_f32(0.0); 4]; R];
        let mut c = 0;
        while c < body {
            // SAFETY: columns `c..c + 16` exist in `x` and in every row.
            let v: [float32x4_t; 4] = core::array::from_fn(|k| unsafe { vld1q_f32(x.as_ptr().add(c + 4 * k)) });
            for (r, a) in acc.iter_mut().enumerate() {
                let p = rows[r * d + c..r * d + c + 16].as_ptr();
                // SAFETY: `p` holds 16 elements.
                let [lo, hi] = unsafe { [T::Float::load8(p.cast()), T::Float::load8(p.add(8).cast())] };
                for (k, w) in [lo[0], lo[1], hi[0], hi[1]].into_iter().enumerate() {
                    a[k] = vaddq_f32(a[k], vmulq_f32(w, v[k]));
                }
            }
            c += 16;
        }
        let mut out = [0f32; R];
        for (r, (o, a)) in out.iter_mut().zip(acc).enumerate() {
            // Lanes l + 8, then l + 4, l + 2, l + 1, as scalar::fold_lanes.
            let q = vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]));
            let h = vadd_f32(vget_low_f32(q), vget_high_f32(q));
            let s = vget_lane_f32::<0>(h) + vget_lane_f32::<1>(h);
            *o = scalar::dot_tail(s, &rows[r * d + body..(r + 1) * d], &x[body..]);
        }
        out
    }

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn sum_columns<const V: usize>(p: &[f32], rows: &[T], d: usize, c: usize, out: &mut [f32]) {
        let o = out[c..c + 8 * V].as_mut_ptr();
        let mut acc = [[vdupq_n_f32(0.0); 2]; V];
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `o` holds 8 V floats.
            *a = unsafe { [vld1q_f32(o.add(8 * k)), vld1q_f32(o.add(8 * k + 4))] };
        }
        for (j, &pj) in p.iter().enumerate() {
            let pj = vdupq_n_f32(pj);
            let r = rows[j * d + c..j * d + c + 8 * V].as_ptr();
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: `r` holds 8 V elements.
                let w = unsafe { T::Float::load8(r.add(8 * k).cast()) };
                a[0] = vaddq_f32(a[0], vmulq_f32(pj, w[0]));
                a[1] = vaddq_f32(a[1], vmulq_f32(pj, w[1]));
            }
        }
        for (k, a) in acc.iter().enumerate() {
            // SAFETY: as the loads.
            unsafe {
                vst1q_f32(o.add(8 * k), a[0]);
                vst1q_f32(o.add(8 * k + 4), a[1]);
            }
        }
    }
}

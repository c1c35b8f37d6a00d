//! The simd128 tier's attention tiles ([`crate::kernels::attend`]'s inner steps) and
//! softmax's pieces: exponentials, maximum and its position.

use super::float::Widen8;
use super::Simd128;
use crate::kernels::attend::{Attend, Exp};
use crate::kernels::scalar;
use crate::kernels::traits::StoredType;
use core::arch::wasm32::*;

/// Attention's tiles: a dot's 16 canonical lanes as four vectors; weighted sums of 8
/// columns per `V`, held across all the rows; multiplies and adds separate, so the bits
/// are the scalar ones.
impl<T: StoredType<Float: Widen8>> Attend<T> for Simd128 {
    const SUM_COLUMNS: usize = 8;

    #[inline(always)]
    unsafe fn dot_rows<const R: usize>(rows: &[T], x: &[f32]) -> [f32; R] {
        let d = x.len();
        let body = d - d % scalar::DOT_LANES;
        let mut acc = [[f32x4_splat(0.0); 4]; R];
        let mut c = 0;
        while c < body {
            // SAFETY: columns `c..c + 16` exist in `x` and in every row.
            let v: [v128; 4] = core::array::from_fn(|k| unsafe { v128_load(x.as_ptr().add(c + 4 * k).cast()) });
            for (r, a) in acc.iter_mut().enumerate() {
                let p = rows[r * d + c..r * d + c + 16].as_ptr();
                // SAFETY: `p` holds 16 elements.
                let [lo, hi] = unsafe { [T::Float::load8(p.cast()), T::Float::load8(p.add(8).cast())] };
                for (k, w) in [lo[0], lo[1], hi[0], hi[1]].into_iter().enumerate() {
                    a[k] = f32x4_add(a[k], f32x4_mul(w, v[k]));
                }
            }
            c += 16;
        }
        let mut out = [0f32; R];
        for (r, (o, a)) in out.iter_mut().zip(acc).enumerate() {
            // Lanes l + 8, then l + 4, l + 2, l + 1, as scalar::fold_lanes.
            let q = f32x4_add(f32x4_add(a[0], a[2]), f32x4_add(a[1], a[3]));
            let h = f32x4_add(q, i32x4_shuffle::<2, 3, 0, 1>(q, q));
            let s = f32x4_extract_lane::<0>(h) + f32x4_extract_lane::<1>(h);
            *o = scalar::dot_tail(s, &rows[r * d + body..(r + 1) * d], &x[body..]);
        }
        out
    }

    #[inline(always)]
    unsafe fn sum_columns<const V: usize>(p: &[f32], rows: &[T], d: usize, c: usize, out: &mut [f32]) {
        let o = out[c..c + 8 * V].as_mut_ptr();
        let mut acc = [[f32x4_splat(0.0); 2]; V];
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `o` holds 8 V floats.
            *a = unsafe { [v128_load(o.add(8 * k).cast()), v128_load(o.add(8 * k + 4).cast())] };
        }
        for (j, &pj) in p.iter().enumerate() {
            let pj = f32x4_splat(pj);
            let r = rows[j * d + c..j * d + c + 8 * V].as_ptr();
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: `r` holds 8 V elements.
                let w = unsafe { T::Float::load8(r.add(8 * k).cast()) };
                a[0] = f32x4_add(a[0], f32x4_mul(pj, w[0]));
                a[1] = f32x4_add(a[1], f32x4_mul(pj, w[1]));
            }
        }
        for (k, a) in acc.iter().enumerate() {
            // SAFETY: as the loads.
            unsafe {
                v128_store(o.add(8 * k).cast(), a[0]);
                v128_store(o.add(8 * k + 4).cast(), a[1]);
            }
        }
    }
}

/// [`scalar::exp_sub`] 4 lanes at a time, operation for operation (bit-identical).
impl Exp for Simd128 {
    const LANES: usize = 4;

    #[inline(always)]
    unsafe fn exp_sub_lanes(x: &mut [f32], max: f32) {
        // SAFETY: `x` holds 4 floats.
        unsafe {
            let v = f32x4_sub(v128_load(x.as_ptr().cast()), f32x4_splat(max));
            v128_store(x.as_mut_ptr().cast(), exp4(v));
        }
    }
}

/// [`scalar::exp_approx`] of 4 lanes.
#[inline(always)]
fn exp4(x: v128) -> v128 {
    use scalar::exp;
    // `pmax(a, b)` is `a < b ? b : a` and `pmin(a, b)` is `b < a ? b : a`: the scalar
    // clamps, NaN included.
    let x = f32x4_pmax(x, f32x4_splat(exp::LO));
    let x = f32x4_pmin(x, f32x4_splat(exp::HI));
    let n = f32x4_floor(f32x4_add(f32x4_mul(x, f32x4_splat(exp::LOG2E)), f32x4_splat(0.5)));
    let r = f32x4_sub(f32x4_sub(x, f32x4_mul(n, f32x4_splat(exp::LN2_HI))), f32x4_mul(n, f32x4_splat(exp::LN2_LO)));
    let mut p = f32x4_splat(exp::P[0]);
    for &c in &exp::P[1..] {
        p = f32x4_add(f32x4_mul(p, r), f32x4_splat(c));
    }
    let y = f32x4_add(f32x4_add(f32x4_mul(f32x4_mul(p, r), r), r), f32x4_splat(1.0));
    let two_n = i32x4_shl(i32x4_add(i32x4_trunc_sat_f32x4(n), i32x4_splat(127)), 23);
    f32x4_mul(y, two_n)
}

/// [`scalar::max`] in four registers of 4 running maxima: `pmax(acc, x)` is
/// `acc < x ? x : acc`, so a NaN in `x` leaves `acc` as it was and never enters it.
pub(crate) fn max(x: &[f32]) -> f32 {
    let mut acc = [f32x4_splat(f32::NEG_INFINITY); 4];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `c` holds 16 floats.
            *a = f32x4_pmax(*a, unsafe { v128_load(c.as_ptr().add(4 * k).cast()) });
        }
    }
    let a = f32x4_pmax(f32x4_pmax(acc[0], acc[1]), f32x4_pmax(acc[2], acc[3]));
    [f32x4_extract_lane::<0>(a), f32x4_extract_lane::<1>(a), f32x4_extract_lane::<2>(a), f32x4_extract_lane::<3>(a)]
        .into_iter()
        .fold(scalar::max(chunks.remainder()), f32::max)
}

/// [`scalar::find`] 4 lanes at a time.
pub(crate) fn find(x: &[f32], v: f32) -> Option<usize> {
    let m = f32x4_splat(v);
    let mut chunks = x.chunks_exact(4);
    for (i, c) in (&mut chunks).enumerate() {
        // SAFETY: `c` holds 4 floats.
        let mask = i32x4_bitmask(f32x4_eq(unsafe { v128_load(c.as_ptr().cast()) }, m));
        if mask != 0 {
            return Some(4 * i + mask.trailing_zeros() as usize);
        }
    }
    scalar::find(chunks.remainder(), v).map(|j| x.len() / 4 * 4 + j)
}

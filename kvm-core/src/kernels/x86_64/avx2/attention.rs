//! The AVX2 tier's attention tiles ([`crate::kernels::attend`]'s inner steps).

use super::float::Widen8;
use super::tier::Avx2;
use crate::kernels::attend::{Attend, AttendMany};
use crate::kernels::scalar;
use crate::kernels::traits::StoredType;
use crate::kernels::x86_64::prefetch_ahead;
use core::arch::x86_64::*;

/// Attention's tiles: a dot's 16 canonical lanes as two vectors; weighted sums of 8
/// columns per vector, up to 8 vectors held across all the rows; f16 rows widen exactly
/// (`vcvtph2ps`) and multiplies and adds stay separate, so the bits are the scalar ones.
impl<T: StoredType<Float: Widen8>> Attend<T> for Avx2 {
    const SUM_COLUMNS: usize = 8;

    #[inline(always)]
    fn prefetch_rows(rows: &[T]) {
        prefetch_ahead(rows.as_ptr().cast(), size_of_val(rows));
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_rows<const R: usize>(rows: &[T], x: &[f32]) -> [f32; R] {
        let d = x.len();
        let body = d - d % scalar::DOT_LANES;
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut c = 0;
        while c < body {
            // SAFETY: columns `c..c + 16` exist in `x` and in every row.
            let v = unsafe { [_mm256_loadu_ps(x.as_ptr().add(c)), _mm256_loadu_ps(x.as_ptr().add(c + 8))] };
            for (r, a) in acc.iter_mut().enumerate() {
                let p = rows[r * d + c..r * d + c + 16].as_ptr();
                // SAFETY: `p` holds 16 elements.
                let w = unsafe { [T::Float::load8(p.cast()), T::Float::load8(p.add(8).cast())] };
                a[0] = _mm256_add_ps(a[0], _mm256_mul_ps(w[0], v[0]));
                a[1] = _mm256_add_ps(a[1], _mm256_mul_ps(w[1], v[1]));
            }
            c += 16;
        }
        let mut out = [0f32; R];
        for (r, (o, a)) in out.iter_mut().zip(acc).enumerate() {
            *o = scalar::dot_tail(fold8(_mm256_add_ps(a[0], a[1])), &rows[r * d + body..(r + 1) * d], &x[body..]);
        }
        out
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum_columns<const V: usize>(p: &[f32], rows: &[T], d: usize, c: usize, out: &mut [f32]) {
        let o = out[c..c + 8 * V].as_mut_ptr();
        let mut acc = [_mm256_setzero_ps(); V];
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `o` holds 8 V floats.
            *a = unsafe { _mm256_loadu_ps(o.add(8 * k)) };
        }
        for (j, &pj) in p.iter().enumerate() {
            let pj = _mm256_set1_ps(pj);
            let r = rows[j * d + c..j * d + c + 8 * V].as_ptr();
            crate::kernels::x86_64::prefetch_ahead(r.cast(), 8 * V * size_of::<T>());
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: `r` holds 8 V elements.
                *a = _mm256_add_ps(*a, _mm256_mul_ps(pj, unsafe { T::Float::load8(r.add(8 * k).cast()) }));
            }
        }
        for (k, a) in acc.iter().enumerate() {
            // SAFETY: as the loads.
            unsafe { _mm256_storeu_ps(o.add(8 * k), *a) };
        }
    }
}

/// Multi-query tiles of 2 rows x 2 queries (a dot's 16 lanes take two registers, so that
/// is what 16 registers hold), and sums of four queries over 16 columns (8 accumulators).
impl<T: StoredType<Float: Widen8>> AttendMany<T> for Avx2 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dots_tile<const R: usize, const Q: usize>(
        rows: &[T],
        xs: &[f32],
        d: usize,
        n: usize,
        (i0, j0): (usize, usize),
        out: &mut [f32],
    ) {
        let body = d - d % scalar::DOT_LANES;
        let (rows, xs) = (&rows[j0 * d..(j0 + R) * d], &xs[i0 * d..(i0 + Q) * d]);
        // Raw pointers in the loop, as in the AVX-512 tile (slices checked per load spill).
        let (rp, xp) = (rows.as_ptr(), xs.as_ptr());
        let mut acc = [[[_mm256_setzero_ps(); 2]; Q]; R];
        let mut c = 0;
        while c < body {
            // SAFETY: columns `c..c + 16` exist in every query and row (`c + 16 <= body <= d`).
            let x: [[__m256; 2]; Q] = core::array::from_fn(|q| unsafe {
                let p = xp.add(q * d + c);
                [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))]
            });
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                let p = unsafe { rp.add(r * d + c) };
                // SAFETY: `p` holds 16 elements.
                let w = unsafe { [T::Float::load8(p.cast()), T::Float::load8(p.add(8).cast())] };
                for (a, x) in acc.iter_mut().zip(&x) {
                    a[0] = _mm256_add_ps(a[0], _mm256_mul_ps(w[0], x[0]));
                    a[1] = _mm256_add_ps(a[1], _mm256_mul_ps(w[1], x[1]));
                }
            }
            c += 16;
        }
        for (r, acc) in acc.iter().enumerate() {
            for (q, a) in acc.iter().enumerate() {
                let (row, x) = (&rows[r * d + body..(r + 1) * d], &xs[q * d + body..(q + 1) * d]);
                out[(i0 + q) * n + j0 + r] = scalar::dot_tail(fold8(_mm256_add_ps(a[0], a[1])), row, x);
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum_many<const Q: usize, const V: usize>(
        p: [&[f32]; Q],
        rows: &[T],
        d: usize,
        c: usize,
        outs: &mut [f32],
    ) {
        let n = p.first().map_or(0, |p| p.len());
        assert!(c + 8 * V <= d && outs.len() >= Q * d && rows.len() >= n * d && p.iter().all(|p| p.len() == n));
        let (o, r, p) = (outs.as_mut_ptr(), rows.as_ptr(), p.map(<[f32]>::as_ptr));
        // Every access: columns `[c, c + 8 V)` exist in each query's output and in
        // each of the `n` rows, and each query has `n` scores (asserted above).
        // SAFETY: see above.
        let mut acc: [[__m256; V]; Q] =
            core::array::from_fn(|q| core::array::from_fn(|k| unsafe { _mm256_loadu_ps(o.add(q * d + c + 8 * k)) }));
        for j in 0..n {
            // SAFETY: see above.
            let v: [__m256; V] = core::array::from_fn(|k| unsafe { T::Float::load8(r.add(j * d + c + 8 * k).cast()) });
            for (acc, p) in acc.iter_mut().zip(&p) {
                // SAFETY: see above.
                let pj = _mm256_set1_ps(unsafe { *p.add(j) });
                for (a, &v) in acc.iter_mut().zip(&v) {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(pj, v));
                }
            }
        }
        for (q, acc) in acc.iter().enumerate() {
            for (k, &a) in acc.iter().enumerate() {
                // SAFETY: see above.
                unsafe { _mm256_storeu_ps(o.add(q * d + c + 8 * k), a) };
            }
        }
    }
}

/// Lanes `l + 4`, `+ 2`, `+ 1` of an 8-lane vector folded as [`scalar::fold_lanes`] does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fold8(v: __m256) -> f32 {
    let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps::<0b01>(h, h)))
}

//! The AVX-512 tier's attention tiles ([`crate::kernels::attend`]'s inner steps).

use super::float::Widen16;
use super::tier::Avx512;
use crate::kernels::attend::{Attend, AttendMany};
use crate::kernels::scalar;
use crate::kernels::traits::StoredType;
use crate::kernels::x86_64::avx2::{self};
use crate::kernels::x86_64::prefetch_ahead;
use core::arch::x86_64::*;

/// Attention's tiles: a dot's 16 canonical lanes as one vector; weighted sums of 16
/// columns per vector, up to 8 vectors held across all the rows (one pass for a 128-wide
/// head); f16 rows widen exactly (`vcvtph2ps`, 16 from 32 bytes) and multiplies and adds
/// stay separate, so the bits are the scalar ones.
impl<T: StoredType<Float: Widen16>> Attend<T> for Avx512 {
    const SUM_COLUMNS: usize = 16;

    #[inline(always)]
    fn prefetch_rows(rows: &[T]) {
        prefetch_ahead(rows.as_ptr().cast(), size_of_val(rows));
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dot_rows<const R: usize>(rows: &[T], x: &[f32]) -> [f32; R] {
        let d = x.len();
        let body = d - d % scalar::DOT_LANES;
        let mut acc = [_mm512_setzero_ps(); R];
        let mut c = 0;
        while c < body {
            // SAFETY: columns `c..c + 16` exist in `x` and in every row.
            let v = unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) };
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                let w = unsafe { T::Float::load16(rows[r * d + c..r * d + c + 16].as_ptr().cast()) };
                *a = _mm512_add_ps(*a, _mm512_mul_ps(w, v));
            }
            c += 16;
        }
        let mut out = [0f32; R];
        for (r, (o, a)) in out.iter_mut().zip(acc).enumerate() {
            *o = scalar::dot_tail(fold_lanes(a), &rows[r * d + body..(r + 1) * d], &x[body..]);
        }
        out
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn sum_columns<const V: usize>(p: &[f32], rows: &[T], d: usize, c: usize, out: &mut [f32]) {
        let o = out[c..c + 16 * V].as_mut_ptr();
        let mut acc = [_mm512_setzero_ps(); V];
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `o` holds 16 V floats.
            *a = unsafe { _mm512_loadu_ps(o.add(16 * k)) };
        }
        for (j, &pj) in p.iter().enumerate() {
            let pj = _mm512_set1_ps(pj);
            let r = rows[j * d + c..j * d + c + 16 * V].as_ptr();
            crate::kernels::x86_64::prefetch_ahead(r.cast(), 16 * V * size_of::<T>());
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: `r` holds 16 V elements.
                *a = _mm512_add_ps(*a, _mm512_mul_ps(pj, unsafe { T::Float::load16(r.add(16 * k).cast()) }));
            }
        }
        for (k, a) in acc.iter().enumerate() {
            // SAFETY: as the loads.
            unsafe { _mm512_storeu_ps(o.add(16 * k), *a) };
        }
    }
}

/// Multi-query tiles of 4 rows x 4 queries (each row read once per 4 queries, each query
/// once per 4 rows), and sums of four queries over 64 columns.
impl<T: StoredType<Float: Widen16>> AttendMany<T> for Avx512 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
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
        // Raw pointers in the loop: slices checked per load cost LLVM the registers (it spilled
        // accumulators and copied the rest every round).
        let (rp, xp) = (rows.as_ptr(), xs.as_ptr());
        let mut acc = [[_mm512_setzero_ps(); Q]; R];
        let mut c = 0;
        while c < body {
            // SAFETY: columns `c..c + 16` exist in every query and row (`c + 16 <= body <= d`).
            let x: [__m512; Q] = core::array::from_fn(|q| unsafe { _mm512_loadu_ps(xp.add(q * d + c)) });
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                let w = unsafe { T::Float::load16(rp.add(r * d + c).cast()) };
                for (a, &x) in acc.iter_mut().zip(&x) {
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(w, x));
                }
            }
            c += 16;
        }
        if R == 4 && Q == 4 && body == d {
            // The sixteen folds at once: lane 4 q + r holds row r's dot with query q.
            let sums = fold16(core::array::from_fn(|k| acc[k / 4][k % 4]));
            for q in 0..4 {
                let o = &mut out[(i0 + q) * n + j0..(i0 + q) * n + j0 + 4];
                let lanes = match q {
                    0 => _mm512_extractf32x4_ps::<0>(sums),
                    1 => _mm512_extractf32x4_ps::<1>(sums),
                    2 => _mm512_extractf32x4_ps::<2>(sums),
                    _ => _mm512_extractf32x4_ps::<3>(sums),
                };
                // SAFETY: `o` holds 4 floats.
                unsafe { _mm_storeu_ps(o.as_mut_ptr(), lanes) };
            }
            return;
        }
        for (r, acc) in acc.iter().enumerate() {
            for (q, &a) in acc.iter().enumerate() {
                let (row, x) = (&rows[r * d + body..(r + 1) * d], &xs[q * d + body..(q + 1) * d]);
                out[(i0 + q) * n + j0 + r] = scalar::dot_tail(fold_lanes(a), row, x);
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn sum_many<const Q: usize, const V: usize>(
        p: [&[f32]; Q],
        rows: &[T],
        d: usize,
        c: usize,
        outs: &mut [f32],
    ) {
        let n = p.first().map_or(0, |p| p.len());
        assert!(c + 16 * V <= d && outs.len() >= Q * d && rows.len() >= n * d && p.iter().all(|p| p.len() == n));
        let (o, r, p) = (outs.as_mut_ptr(), rows.as_ptr(), p.map(<[f32]>::as_ptr));
        // Every access: columns `[c, c + 16 V)` exist in each query's output and in
        // each of the `n` rows, and each query has `n` scores (asserted above).
        // SAFETY: see above.
        let mut acc: [[__m512; V]; Q] =
            core::array::from_fn(|q| core::array::from_fn(|k| unsafe { _mm512_loadu_ps(o.add(q * d + c + 16 * k)) }));
        for j in 0..n {
            // SAFETY: see above.
            let v: [__m512; V] =
                core::array::from_fn(|k| unsafe { T::Float::load16(r.add(j * d + c + 16 * k).cast()) });
            for (acc, p) in acc.iter_mut().zip(&p) {
                // SAFETY: see above.
                let pj = _mm512_set1_ps(unsafe { *p.add(j) });
                for (a, &v) in acc.iter_mut().zip(&v) {
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(pj, v));
                }
            }
        }
        for (q, acc) in acc.iter().enumerate() {
            for (k, &a) in acc.iter().enumerate() {
                // SAFETY: see above.
                unsafe { _mm512_storeu_ps(o.add(q * d + c + 16 * k), a) };
            }
        }
    }
}

/// [`scalar::fold_lanes`] of sixteen vectors at once, transposed: each level adds the
/// halves of two vectors' groups in one instruction (45 in all, against 7 a vector
/// folded alone). Lane `4 b + j` of the result is the fold of `a[4 j + b]`; every add
/// takes the lower lanes first, as the scalar fold does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn fold16(a: [__m512; 16]) -> __m512 {
    // a[l] + a[l + 8]: vectors 2j and 2j + 1 in the low and high eight lanes.
    let b: [__m512; 8] = core::array::from_fn(|j| {
        let (x, y) = (a[2 * j], a[2 * j + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(x, y), _mm512_shuffle_f32x4::<0xEE>(x, y))
    });
    // a[l] + a[l + 4]: vector 4i + k in 128-bit block k.
    let c: [__m512; 4] = core::array::from_fn(|i| {
        let (x, y) = (b[2 * i], b[2 * i + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(x, y), _mm512_shuffle_f32x4::<0xDD>(x, y))
    });
    // a[l] + a[l + 2], then a[0] + a[1], within each block.
    let d: [__m512; 2] = core::array::from_fn(|i| {
        let (x, y) = (c[2 * i], c[2 * i + 1]);
        _mm512_add_ps(_mm512_shuffle_ps::<0x44>(x, y), _mm512_shuffle_ps::<0xEE>(x, y))
    });
    _mm512_add_ps(_mm512_shuffle_ps::<0x88>(d[0], d[1]), _mm512_shuffle_ps::<0xDD>(d[0], d[1]))
}

/// [`scalar::fold_lanes`] of one vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn fold_lanes(a: __m512) -> f32 {
    let half =
        _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a))));
    avx2::fold8(half)
}

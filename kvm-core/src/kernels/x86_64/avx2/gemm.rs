//! The AVX2 tier's batch product ([`crate::kernels::gemm`]'s tile): 6 weight rows by 2 vectors of tokens.

use super::tier::Avx2;
use crate::kernels::gemm::{self, Gemm, BLOCK};
use core::arch::x86_64::*;

impl Gemm for Avx2 {
    const LANES: usize = 8;

    /// 6 rows by 2 vectors of tokens: 12 accumulators, 2 token vectors and a broadcast
    /// weight in the 16 registers.
    fn rows(_vecs: usize) -> usize {
        6
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile(w: &[*const f32], xt: *const f32, cols: usize, vecs: usize, out: &mut [f32], carry: bool) {
        let w: [*const f32; 6] = core::array::from_fn(|r| w[r]);
        let width = vecs * 8;
        for v0 in (0..vecs).step_by(2) {
            // SAFETY: (both arms) `xt` holds `BLOCK >= width` tokens per column; the
            // rest forwarded.
            unsafe {
                if v0 + 2 <= vecs {
                    gemm_tile::<2>(w, xt.add(8 * v0), cols, &mut out[8 * v0..], width, carry);
                } else {
                    gemm_tile::<1>(w, xt.add(8 * v0), cols, &mut out[8 * v0..], width, carry);
                }
            }
        }
    }

    /// 8 tokens by up to 8 rows at a time: an 8 x 8 transpose (rows past `rows` zero),
    /// then each token's values in plain stores ([`store_lanes`]).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store(out: &[f32], width: usize, rows: usize, n: usize, ys: &mut [f32], ld: usize) {
        for r0 in (0..rows).step_by(8) {
            let real = (rows - r0).min(8);
            for t0 in (0..n).step_by(8) {
                // (Whole loops with a test inside, not `take`: unrolled, the 8 vectors stay
                // in registers.)
                let mut r8 = [_mm256_setzero_ps(); 8];
                for (r, v) in r8.iter_mut().enumerate() {
                    if r < real {
                        // SAFETY: row `r0 + r < rows` holds `width >= t0 + 8` values
                        // (`width` is whole vectors of 8).
                        *v = unsafe { _mm256_loadu_ps(out.as_ptr().add((r0 + r) * width + t0)) };
                    }
                }
                for (j, v) in transpose8(r8).into_iter().enumerate() {
                    if t0 + j < n {
                        // SAFETY: token `t0 + j < n` has `rows >= r0 + real` values at
                        // `(t0 + j) * ld`.
                        unsafe { store_lanes(ys.as_mut_ptr().add((t0 + j) * ld + r0), v, real) };
                    }
                }
            }
        }
    }

    /// 8 x 8 blocks in 24 shuffles each; the columns past the last whole 8 as the default
    /// does.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn transpose(xs: &[f32], cols: usize, xt: &mut [f32]) {
        let n = xs.len() / cols;
        let body = cols - cols % 8;
        for t0 in (0..BLOCK).step_by(8) {
            for c0 in (0..body).step_by(8) {
                // Token `t0 + i`'s 8 values from column `c0`, zero past the last token.
                let mut rows = [_mm256_setzero_ps(); 8];
                for (i, row) in rows.iter_mut().enumerate() {
                    if t0 + i < n {
                        // SAFETY: token `t0 + i < n` holds `cols >= c0 + 8` values.
                        *row = unsafe { _mm256_loadu_ps(xs.as_ptr().add((t0 + i) * cols + c0)) };
                    }
                }
                for (j, col) in transpose8(rows).into_iter().enumerate() {
                    // SAFETY: `xt` holds `cols * BLOCK` values, 64-byte aligned, and
                    // `t0 + 8 <= BLOCK`.
                    unsafe { _mm256_store_ps(xt.as_mut_ptr().add((c0 + j) * BLOCK + t0), col) };
                }
            }
        }
        gemm::transpose_columns(xs, cols, body, xt);
    }
}

/// Stores the first `real` (`1..=8`) lanes of `v` at `p` in up to three plain stores of 4,
/// 2 and 1 lanes: AMD's cores take a masked store (`vmaskmovps`) as a microcoded sequence,
/// which cost the 768 x 768 product of 256 tokens about a tenth of its time.
///
/// # Safety
/// `p` is valid for `real` f32 writes; AVX is enabled in the (inlining) caller.
#[inline(always)]
unsafe fn store_lanes(p: *mut f32, v: __m256, real: usize) {
    // SAFETY: every store writes lanes below `real` (the caller's promise).
    unsafe {
        if real == 8 {
            return _mm256_storeu_ps(p, v);
        }
        let (mut p, mut k, mut rest) = (p, real, _mm256_castps256_ps128(v));
        if k >= 4 {
            _mm_storeu_ps(p, rest);
            (p, k, rest) = (p.add(4), k - 4, _mm256_extractf128_ps::<1>(v));
        }
        if k >= 2 {
            _mm_store_sd(p.cast(), _mm_castps_pd(rest));
            (p, k, rest) = (p.add(2), k - 2, _mm_movehl_ps(rest, rest));
        }
        if k == 1 {
            _mm_store_ss(p, rest);
        }
    }
}

/// [`Gemm::tile`] of 6 rows by `V` vectors of tokens, into `out` at a row stride of
/// `width` values.
///
/// # Safety
/// As [`Gemm::tile`] for `V` vectors, with AVX2 and FMA enabled in the (inlining) caller.
#[inline(always)]
pub(super) unsafe fn gemm_tile<const V: usize>(
    w: [*const f32; 6],
    xt: *const f32,
    cols: usize,
    out: &mut [f32],
    width: usize,
    carry: bool,
) {
    // SAFETY: the caller enables the features; `xt` holds `cols` columns of `BLOCK >= 8 *
    // V` tokens (32-byte aligned: columns are 64-byte aligned and `8 * v0` floats in),
    // each row `cols` f32 and `out` `5 * width + 8 * V` values.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); V]; 6];
        if carry {
            for (r, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm256_loadu_ps(out.as_ptr().add(r * width + 8 * v));
                }
            }
        }
        for c in 0..cols {
            let mut x = [_mm256_setzero_ps(); V];
            for (v, x) in x.iter_mut().enumerate() {
                *x = _mm256_load_ps(xt.add(c * BLOCK + 8 * v));
            }
            for r in 0..6 {
                let b = _mm256_set1_ps(w[r].add(c).read_unaligned());
                for v in 0..V {
                    acc[r][v] = _mm256_fmadd_ps(b, x[v], acc[r][v]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (v, &acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(r * width + 8 * v), acc);
            }
        }
    }
}

/// The transpose of an 8 x 8 block: `out[j]` lane `i` is `rows[i]` lane `j`. Pairs of
/// rows interleave, then quads within 128-bit lanes, then the lanes of two quads meet.
#[inline(always)]
pub(super) fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let mut a = r;
    let mut b = r;
    // SAFETY: register-only AVX shuffles, enabled in the (inlining) caller.
    unsafe {
        // a[2i], a[2i + 1]: rows 2i and 2i + 1 interleaved, columns 4L, 4L + 1 (low) and
        // 4L + 2, 4L + 3 (high) of each 128-bit lane L.
        for i in 0..4 {
            a[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            a[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // b[4g + k], lane L: rows 4g..4g + 4 at column 4L + k.
        for g in 0..2 {
            let (lo, hi) = ([a[4 * g], a[4 * g + 2]], [a[4 * g + 1], a[4 * g + 3]]);
            b[4 * g] = _mm256_shuffle_ps::<0x44>(lo[0], lo[1]);
            b[4 * g + 1] = _mm256_shuffle_ps::<0xEE>(lo[0], lo[1]);
            b[4 * g + 2] = _mm256_shuffle_ps::<0x44>(hi[0], hi[1]);
            b[4 * g + 3] = _mm256_shuffle_ps::<0xEE>(hi[0], hi[1]);
        }
        // Column 4L + k: lane L of both quads.
        for k in 0..4 {
            a[k] = _mm256_permute2f128_ps::<0x20>(b[k], b[4 + k]);
            a[4 + k] = _mm256_permute2f128_ps::<0x31>(b[k], b[4 + k]);
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tier::{supported, Tier};

    /// Every count of lanes, 1 to 8: those lanes stored in order, nothing after them.
    #[test]
    fn store_lanes_writes_the_first_lanes_only() {
        if !supported(Tier::Avx2) {
            return;
        }
        let lanes = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        for real in 1..=8 {
            let mut out = [-1.0f32; 9];
            // SAFETY: the CPU has AVX2 (checked above); `out` holds 9 values.
            unsafe { store_lanes(out.as_mut_ptr(), _mm256_loadu_ps(lanes.as_ptr()), real) };
            assert_eq!(&out[..real], &lanes[..real], "{real} lanes");
            assert!(out[real..].iter().all(|&v| v == -1.0), "{real} lanes: {out:?}");
        }
    }
}

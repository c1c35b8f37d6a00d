//! The AVX-512 tier's batch product ([`crate::kernels::gemm`]'s tile), in 24 of the 32 registers.

use super::tier::Avx512;
use crate::kernels::gemm::{self, Gemm, BLOCK};
use core::arch::x86_64::*;

impl Gemm for Avx512 {
    const LANES: usize = 16;

    /// 24 of the 32 registers accumulate (12 for a single vector of tokens, which leaves
    /// FMA latency hidden by 12 independent sums).
    fn rows(vecs: usize) -> usize {
        match vecs {
            1 | 2 => 12,
            3 => 8,
            _ => 6,
        }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tile(w: &[*const f32], xt: *const f32, cols: usize, vecs: usize, out: &mut [f32], carry: bool) {
        // SAFETY: (every arm) forwarded; `rows(vecs)` pointers.
        unsafe {
            match vecs {
                1 => gemm_tile::<12, 1>(w, xt, cols, out, carry),
                2 => gemm_tile::<12, 2>(w, xt, cols, out, carry),
                3 => gemm_tile::<8, 3>(w, xt, cols, out, carry),
                _ => gemm_tile::<6, 4>(w, xt, cols, out, carry),
            }
        }
    }

    /// 16 tokens at a time: a 16 x 16 transpose of the rows (those past `rows` zero),
    /// then each token's `rows` values in one masked store.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn store(out: &[f32], width: usize, rows: usize, n: usize, ys: &mut [f32], ld: usize) {
        let mask: __mmask16 = (1 << rows.min(16)) - 1;
        for t0 in (0..n).step_by(16) {
            // (Whole loops with a test inside, not `take`: unrolled, the 16 vectors stay in
            // registers.)
            let mut r16 = [_mm512_setzero_ps(); 16];
            for (r, v) in r16.iter_mut().enumerate() {
                if r < rows {
                    // SAFETY: row `r < rows` holds `width >= t0 + 16` values (`width` is
                    // whole vectors of 16).
                    *v = unsafe { _mm512_loadu_ps(out.as_ptr().add(r * width + t0)) };
                }
            }
            for (j, v) in transpose16(r16).into_iter().enumerate() {
                if t0 + j < n {
                    // SAFETY: token `t0 + j < n` has `rows` values at `(t0 + j) * ld`.
                    unsafe { _mm512_mask_storeu_ps(ys.as_mut_ptr().add((t0 + j) * ld), mask, v) };
                }
            }
        }
    }

    /// 16 x 16 blocks in 64 shuffles each; the columns past the last whole 16 as the
    /// default does.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn transpose(xs: &[f32], cols: usize, xt: &mut [f32]) {
        let n = xs.len() / cols;
        let body = cols - cols % 16;
        for t0 in (0..BLOCK).step_by(16) {
            for c0 in (0..body).step_by(16) {
                // Token `t0 + i`'s 16 values from column `c0`, zero past the last token.
                let mut rows = [_mm512_setzero_ps(); 16];
                for (i, row) in rows.iter_mut().enumerate() {
                    if t0 + i < n {
                        // SAFETY: token `t0 + i < n` holds `cols >= c0 + 16` values.
                        *row = unsafe { _mm512_loadu_ps(xs.as_ptr().add((t0 + i) * cols + c0)) };
                    }
                }
                for (j, col) in transpose16(rows).into_iter().enumerate() {
                    // SAFETY: `xt` holds `cols * BLOCK` values, 64-byte aligned, and
                    // `t0 + 16 <= BLOCK`.
                    unsafe { _mm512_store_ps(xt.as_mut_ptr().add((c0 + j) * BLOCK + t0), col) };
                }
            }
        }
        gemm::transpose_columns(xs, cols, body, xt);
    }
}

/// The transpose of a 16 x 16 block: `out[j]` lane `i` is `rows[i]` lane `j`. Pairs of
/// rows interleave, then quads within 128-bit lanes, then lanes across vectors twice.
#[inline(always)]
pub(super) fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    let (mut a, mut b) = (r, r);
    // SAFETY: register-only AVX-512 F shuffles, enabled in the (inlining) caller.
    unsafe {
        // a[2i], a[2i + 1]: rows 2i and 2i + 1 interleaved, columns 4L, 4L + 1 (low) and
        // 4L + 2, 4L + 3 (high) of each 128-bit lane L.
        for i in 0..8 {
            a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // b[4g + k], lane L: rows 4g..4g + 4 at column 4L + k.
        for g in 0..4 {
            let (lo, hi) = ([a[4 * g], a[4 * g + 2]], [a[4 * g + 1], a[4 * g + 3]]);
            b[4 * g] = _mm512_shuffle_ps::<0x44>(lo[0], lo[1]);
            b[4 * g + 1] = _mm512_shuffle_ps::<0xEE>(lo[0], lo[1]);
            b[4 * g + 2] = _mm512_shuffle_ps::<0x44>(hi[0], hi[1]);
            b[4 * g + 3] = _mm512_shuffle_ps::<0xEE>(hi[0], hi[1]);
        }
        // c[4k..4k + 4], for column offset k: groups 0 and 1, then 2 and 3, side by side,
        // lanes 0-1 of each, then lanes 2-3.
        for k in 0..4 {
            let (g01, g23) = ([b[k], b[4 + k]], [b[8 + k], b[12 + k]]);
            a[4 * k] = _mm512_shuffle_f32x4::<0x44>(g01[0], g01[1]);
            a[4 * k + 1] = _mm512_shuffle_f32x4::<0xEE>(g01[0], g01[1]);
            a[4 * k + 2] = _mm512_shuffle_f32x4::<0x44>(g23[0], g23[1]);
            a[4 * k + 3] = _mm512_shuffle_f32x4::<0xEE>(g23[0], g23[1]);
        }
        // Column 4L + k: lane L of groups 0..4.
        for k in 0..4 {
            let (lo, hi) = ([a[4 * k], a[4 * k + 2]], [a[4 * k + 1], a[4 * k + 3]]);
            b[k] = _mm512_shuffle_f32x4::<0x88>(lo[0], lo[1]);
            b[4 + k] = _mm512_shuffle_f32x4::<0xDD>(lo[0], lo[1]);
            b[8 + k] = _mm512_shuffle_f32x4::<0x88>(hi[0], hi[1]);
            b[12 + k] = _mm512_shuffle_f32x4::<0xDD>(hi[0], hi[1]);
        }
    }
    b
}

/// [`Gemm::tile`] of `R` rows by `V` vectors of tokens.
///
/// # Safety
/// As [`Gemm::tile`], with the tier's features enabled in the (inlining) caller.
#[inline(always)]
pub(super) unsafe fn gemm_tile<const R: usize, const V: usize>(
    w: &[*const f32],
    xt: *const f32,
    cols: usize,
    out: &mut [f32],
    carry: bool,
) {
    let w: [*const f32; R] = core::array::from_fn(|r| w[r]);
    // SAFETY: the caller enables the features; `xt` holds `cols` aligned columns of
    // `BLOCK >= 16 * V` tokens, each row `cols` f32 and `out` `R * V * 16` values.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        if carry {
            for (r, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_loadu_ps(out.as_ptr().add((r * V + v) * 16));
                }
            }
        }
        for c in 0..cols {
            let mut x = [_mm512_setzero_ps(); V];
            for (v, x) in x.iter_mut().enumerate() {
                *x = _mm512_load_ps(xt.add(c * BLOCK + 16 * v));
            }
            for r in 0..R {
                let b = _mm512_set1_ps(w[r].add(c).read_unaligned());
                for v in 0..V {
                    acc[r][v] = _mm512_fmadd_ps(b, x[v], acc[r][v]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (v, &acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add((r * V + v) * 16), acc);
            }
        }
    }
}

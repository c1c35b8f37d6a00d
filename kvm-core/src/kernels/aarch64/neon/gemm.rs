//! The NEON tiers' batch product ([`crate::kernels::gemm`]'s tile), one for both tiers.

use super::tier::{Neon, NeonDot};
use crate::kernels::gemm::{self, Gemm, BLOCK};
use crate::kernels::traits::Kernels;
use core::arch::aarch64::*;

/// The two tiers, whose float kernels are the same: one batch product ([`Gemm`]) for both.
pub(crate) trait FloatTier: Kernels {}

impl FloatTier for Neon {}
impl FloatTier for NeonDot {}

impl<K: FloatTier> Gemm for K {
    const LANES: usize = 4;

    /// 6 rows by 4 vectors of tokens: 24 accumulators, 6 weight quads and 2 token vectors
    /// in the 32 registers. One or two vectors take 12 or 8 rows, whose quads take a
    /// register for each accumulator or two.
    fn rows(vecs: usize) -> usize {
        match vecs {
            1 => 12,
            2 => 8,
            _ => 6,
        }
    }

    #[target_feature(enable = "neon")]
    unsafe fn tile(w: &[*const f32], xt: *const f32, cols: usize, vecs: usize, out: &mut [f32], carry: bool) {
        let width = vecs * 4;
        // SAFETY: (every arm) `rows(vecs)` pointers; `xt` holds `BLOCK >= width` tokens per
        // column and `out` `rows(vecs)` rows of `width`, so each strip of vectors from
        // `v0` fits; the rest forwarded.
        unsafe {
            match vecs {
                1 => gemm_tile::<12, 1>(w, xt, cols, out, width, carry),
                2 => gemm_tile::<8, 2>(w, xt, cols, out, width, carry),
                _ => {
                    for v0 in (0..vecs).step_by(4) {
                        let (xt, out) = (xt.add(4 * v0), &mut out[4 * v0..]);
                        match vecs - v0 {
                            1 => gemm_tile::<6, 1>(w, xt, cols, out, width, carry),
                            2 => gemm_tile::<6, 2>(w, xt, cols, out, width, carry),
                            3 => gemm_tile::<6, 3>(w, xt, cols, out, width, carry),
                            _ => gemm_tile::<6, 4>(w, xt, cols, out, width, carry),
                        }
                    }
                }
            }
        }
    }

    /// 4 tokens by up to 4 rows at a time: a 4 x 4 transpose (rows past `rows` zero), then
    /// each token's values in one store (two for 3 rows).
    #[target_feature(enable = "neon")]
    unsafe fn store(out: &[f32], width: usize, rows: usize, n: usize, ys: &mut [f32], ld: usize) {
        for r0 in (0..rows).step_by(4) {
            let real = (rows - r0).min(4);
            for t0 in (0..n).step_by(4) {
                // (Whole loops with a test inside, not `take`: unrolled, the 4 vectors stay in
                // registers.)
                let mut r4 = [vdupq_n_f32(0.0); 4];
                for (r, v) in r4.iter_mut().enumerate() {
                    if r < real {
                        // SAFETY: row `r0 + r < rows` holds `width >= t0 + 4` values
                        // (`width` is whole vectors of 4).
                        *v = unsafe { vld1q_f32(out.as_ptr().add((r0 + r) * width + t0)) };
                    }
                }
                for (j, v) in transpose4(r4).into_iter().enumerate() {
                    if t0 + j < n {
                        // SAFETY: token `t0 + j < n` has `rows >= r0 + real` values at
                        // `(t0 + j) * ld`.
                        unsafe { store_lanes(ys.as_mut_ptr().add((t0 + j) * ld + r0), v, real) };
                    }
                }
            }
        }
    }

    /// 4 x 4 blocks in 8 shuffles each; the columns past the last whole 4 as the default
    /// does.
    #[target_feature(enable = "neon")]
    unsafe fn transpose(xs: &[f32], cols: usize, xt: &mut [f32]) {
        let n = xs.len() / cols;
        let body = cols - cols % 4;
        for t0 in (0..BLOCK).step_by(4) {
            for c0 in (0..body).step_by(4) {
                // Token `t0 + i`'s 4 values from column `c0`, zero past the last token.
                let mut rows = [vdupq_n_f32(0.0); 4];
                for (i, row) in rows.iter_mut().enumerate() {
                    if t0 + i < n {
                        // SAFETY: token `t0 + i < n` holds `cols >= c0 + 4` values.
                        *row = unsafe { vld1q_f32(xs.as_ptr().add((t0 + i) * cols + c0)) };
                    }
                }
                for (j, col) in transpose4(rows).into_iter().enumerate() {
                    // SAFETY: `xt` holds `cols * BLOCK` values and `t0 + 4 <= BLOCK`.
                    unsafe { vst1q_f32(xt.as_mut_ptr().add((c0 + j) * BLOCK + t0), col) };
                }
            }
        }
        gemm::transpose_columns(xs, cols, body, xt);
    }
}

/// [`Gemm::tile`] of `R` rows by the `V` vectors of tokens at `xt`, into `out` at a row
/// stride of `width` values. The weights come 4 columns at a time, a quad per row in one
/// register, and lane `k` of each meets column `k`'s token vectors in FMAs by element
/// (`fmla .s[k]`); the `cols % 4` tail broadcasts each weight. At 6 x 4, 3.5 loads and 24
/// FMAs per column (6 weight quads, 8 `ldp` of token vectors, 96 FMAs and 4 loop
/// instructions per 4 columns): a broadcast per weight would load 6 times a column.
///
/// # Safety
/// As [`Gemm::tile`] for `R` rows and `V` vectors, with NEON enabled in the caller; `out`
/// holds `(R - 1) * width + 4 * V` values.
#[inline(always)]
pub(super) unsafe fn gemm_tile<const R: usize, const V: usize>(
    w: &[*const f32],
    xt: *const f32,
    cols: usize,
    out: &mut [f32],
    width: usize,
    carry: bool,
) {
    let rows: [*const f32; R] = core::array::from_fn(|r| w[r]);
    let body = cols - cols % 4;
    // SAFETY: the caller enables NEON; `xt` holds `cols` columns of `BLOCK >= 4 * V` tokens,
    // each row `cols` f32 (read as bytes: unaligned) and `out` as documented.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); V]; R];
        if carry {
            for (r, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = vld1q_f32(out.as_ptr().add(r * width + 4 * v));
                }
            }
        }
        let mut c = 0;
        while c < body {
            let mut quads = [vdupq_n_f32(0.0); R];
            for (q, p) in quads.iter_mut().zip(rows) {
                *q = vreinterpretq_f32_u8(vld1q_u8(p.add(c).cast()));
            }
            gemm_column::<R, V, 0>(&mut acc, &quads, xt.add(c * BLOCK));
            gemm_column::<R, V, 1>(&mut acc, &quads, xt.add((c + 1) * BLOCK));
            gemm_column::<R, V, 2>(&mut acc, &quads, xt.add((c + 2) * BLOCK));
            gemm_column::<R, V, 3>(&mut acc, &quads, xt.add((c + 3) * BLOCK));
            c += 4;
        }
        for c in body..cols {
            for v in 0..V {
                let x = vld1q_f32(xt.add(c * BLOCK + 4 * v));
                for (acc, p) in acc.iter_mut().zip(rows) {
                    acc[v] = vfmaq_n_f32(acc[v], x, p.add(c).read_unaligned());
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (v, &acc) in acc.iter().enumerate() {
                vst1q_f32(out.as_mut_ptr().add(r * width + 4 * v), acc);
            }
        }
    }
}

/// One column of [`gemm_tile`]: `acc[r][v] += quads[r][K] * x[v]` for the `V` token
/// vectors at `x`, a vector at a time (the tile's registers hold one or two of them
/// beside the accumulators and the quads).
///
/// # Safety
/// NEON is enabled in the caller; `x` points at `4 * V` readable, 16-byte aligned f32.
#[inline(always)]
pub(super) unsafe fn gemm_column<const R: usize, const V: usize, const K: i32>(
    acc: &mut [[float32x4_t; V]; R],
    quads: &[float32x4_t; R],
    x: *const f32,
) {
    // SAFETY: NEON is enabled in the caller; the loads as documented.
    unsafe {
        for v in 0..V {
            let x = vld1q_f32(x.add(4 * v));
            for (acc, &q) in acc.iter_mut().zip(quads) {
                acc[v] = vfmaq_laneq_f32::<K>(acc[v], x, q);
            }
        }
    }
}

/// The transpose of a 4 x 4 block: `out[j]` lane `i` is `r[i]` lane `j`. Pairs of rows
/// interleave their even and odd lanes (`trn1`, `trn2`), then the pairs' 64-bit halves
/// meet.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn transpose4(r: [float32x4_t; 4]) -> [float32x4_t; 4] {
    // Rows 0, 1 (`e0`, `o0`) and 2, 3 (`e1`, `o1`) at columns 0 and 2 (even), 1 and 3 (odd),
    // as 64-bit halves.
    let e0 = vreinterpretq_f64_f32(vtrn1q_f32(r[0], r[1]));
    let e1 = vreinterpretq_f64_f32(vtrn1q_f32(r[2], r[3]));
    let o0 = vreinterpretq_f64_f32(vtrn2q_f32(r[0], r[1]));
    let o1 = vreinterpretq_f64_f32(vtrn2q_f32(r[2], r[3]));
    [
        vreinterpretq_f32_f64(vtrn1q_f64(e0, e1)),
        vreinterpretq_f32_f64(vtrn1q_f64(o0, o1)),
        vreinterpretq_f32_f64(vtrn2q_f64(e0, e1)),
        vreinterpretq_f32_f64(vtrn2q_f64(o0, o1)),
    ]
}

/// Stores the first `k` (1 to 4) lanes of `v` at `p`.
///
/// # Safety
/// NEON is enabled in the caller; `p` points at `k` writable f32.
#[inline(always)]
pub(super) unsafe fn store_lanes(p: *mut f32, v: float32x4_t, k: usize) {
    // SAFETY: (every arm) `k` values at `p`.
    unsafe {
        match k {
            1 => vst1q_lane_f32::<0>(p, v),
            2 => vst1_f32(p, vget_low_f32(v)),
            3 => {
                vst1_f32(p, vget_low_f32(v));
                vst1q_lane_f32::<2>(p.add(2), v);
            }
            _ => vst1q_f32(p, v),
        }
    }
}

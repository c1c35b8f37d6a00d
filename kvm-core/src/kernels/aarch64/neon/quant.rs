//! The NEON tiers' integer weights: whole-block `i8 x i8` products (`smull` pairs, or `sdot`
//! with dotprod), and the row-interleaved q4_0x16 / q8_0x16 groups.

use super::float::f16_to_f32;
use crate::kernels::scalar;
use crate::kernels::traits::{GroupKernel, Kernel};
use crate::quant::{DType, GroupQ4_0x16, GroupQ8_0x16, QK, X16};
use core::arch::aarch64::*;
use core::arch::asm;
use core::marker::PhantomData;

/// An integer format whose blocks widen to 32 signed bytes, with an f16 scale first.
pub(crate) trait Blocks32 {
    const DTYPE: DType;

    /// The 32 weights of the block at `p`, as i8.
    ///
    /// # Safety
    /// `p` points at one whole block.
    unsafe fn load32(p: *const u8) -> [int8x16_t; 2];
}

/// q8_0 blocks.
pub(crate) struct Q8;

/// q4_0 blocks.
pub(crate) struct Q4;

impl Blocks32 for Q8 {
    const DTYPE: DType = DType::Q8_0;

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load32(p: *const u8) -> [int8x16_t; 2] {
        // SAFETY: a block is the 2 scale bytes then 32 weights.
        unsafe { [vld1q_s8(p.add(2).cast()), vld1q_s8(p.add(18).cast())] }
    }
}

impl Blocks32 for Q4 {
    const DTYPE: DType = DType::Q4_0;

    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load32(p: *const u8) -> [int8x16_t; 2] {
        // SAFETY: a block is the 2 scale bytes then 16 bytes of nibbles.
        let [lo, hi] = nibbles(unsafe { vld1q_u8(p.add(2)) });
        let eight = vdupq_n_s8(8);
        [vsubq_s8(lo, eight), vsubq_s8(hi, eight)]
    }
}

/// The low and the high nibbles of `q`'s bytes, as bytes in `0..16`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn nibbles(q: uint8x16_t) -> [int8x16_t; 2] {
    [vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vreinterpretq_s8_u8(vshrq_n_u8::<4>(q))]
}

/// The f16 scale at the start of the block at `p`.
///
/// # Safety
/// `p` points at 2 readable bytes.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn scale(p: *const u8) -> f32 {
    // SAFETY: 2 readable bytes.
    let bits = u16::from_le_bytes(unsafe { p.cast::<[u8; 2]>().read() });
    vgetq_lane_f32::<0>(f16_to_f32::<false>(vdupq_n_u16(bits)))
}

/// The exact i32 dot product of a weight block and an activation block, as 4 lanes.
pub(crate) trait Dot32 {
    /// # Safety
    /// The tier's features are present; callers inline it into a function that enables
    /// them.
    unsafe fn dot32(w: [int8x16_t; 2], a: [int8x16_t; 2]) -> int32x4_t;
}

/// Widening multiplies (plain NEON).
pub(crate) struct Mull;

/// `sdot` (the `dotprod` extension).
pub(crate) struct SDot;

impl Dot32 for Mull {
    #[inline(always)]
    unsafe fn dot32(w: [int8x16_t; 2], a: [int8x16_t; 2]) -> int32x4_t {
        // SAFETY: NEON is present.
        unsafe {
            let p0 = vmlal_high_s8(vmull_s8(vget_low_s8(w[0]), vget_low_s8(a[0])), w[0], a[0]);
            let p1 = vmlal_high_s8(vmull_s8(vget_low_s8(w[1]), vget_low_s8(a[1])), w[1], a[1]);
            vpadalq_s16(vpaddlq_s16(p0), p1)
        }
    }
}

impl Dot32 for SDot {
    #[inline(always)]
    unsafe fn dot32(w: [int8x16_t; 2], a: [int8x16_t; 2]) -> int32x4_t {
        let mut acc: int32x4_t;
        // SAFETY: register-only; the caller enables `dotprod` (without it this does not
        // assemble, so it cannot be miscompiled into a plain-NEON function).
        unsafe {
            asm!(
                "movi {acc:v}.4s, #0",
                "sdot {acc:v}.4s, {w0:v}.16b, {a0:v}.16b",
                "sdot {acc:v}.4s, {w1:v}.16b, {a1:v}.16b",
                acc = out(vreg) acc,
                w0 = in(vreg) w[0],
                a0 = in(vreg) a[0],
                w1 = in(vreg) w[1],
                a1 = in(vreg) a[1],
                options(pure, nomem, nostack),
            );
        }
        acc
    }
}

/// Integer kernel: the canonical sum of [`scalar::sum_blocks`], its 8 f32 accumulators as
/// two f32x4 (blocks `8g..8g + 4` feed the first, `8g + 4..8g + 8` the second).
pub(crate) struct Quant<B, D>(PhantomData<(B, D)>);

impl<B: Blocks32> Kernel for Quant<B, Mull> {
    type Act = u8;

    #[target_feature(enable = "neon")]
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[u8]; T], cols: usize) -> [[f32; T]; R] {
        // SAFETY: forwarded; NEON is enabled here.
        unsafe { quant_tile::<B, Mull, R, T>(w, a, cols) }
    }
}

impl<B: Blocks32> Kernel for Quant<B, SDot> {
    type Act = u8;

    #[target_feature(enable = "neon,dotprod")]
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[u8]; T], cols: usize) -> [[f32; T]; R] {
        // SAFETY: forwarded; NEON and dotprod are enabled here.
        unsafe { quant_tile::<B, SDot, R, T>(w, a, cols) }
    }
}

/// The body of both integer tiles, inlined into each so that `D::dot32` compiles with its
/// tier's features.
///
/// # Safety
/// As [`Kernel::tile`], with `D`'s features enabled in the caller.
#[inline(always)]
pub(super) unsafe fn quant_tile<B: Blocks32, D: Dot32, const R: usize, const T: usize>(
    w: [&[u8]; R],
    a: [&[u8]; T],
    cols: usize,
) -> [[f32; T]; R] {
    let nb = cols / QK;
    // SAFETY: NEON is present; every quad stays inside the `nb` blocks.
    unsafe {
        let mut lo = [[vdupq_n_f32(0.0); T]; R];
        let mut hi = [[vdupq_n_f32(0.0); T]; R];
        let mut b0 = 0;
        while b0 + 8 <= nb {
            quad::<B, D, R, T>(w, a, cols, b0, 4, &mut lo);
            quad::<B, D, R, T>(w, a, cols, b0 + 4, 4, &mut hi);
            b0 += 8;
        }
        let n = nb - b0;
        if n > 0 {
            quad::<B, D, R, T>(w, a, cols, b0, n.min(4), &mut lo);
        }
        if n > 4 {
            quad::<B, D, R, T>(w, a, cols, b0 + 4, n - 4, &mut hi);
        }
        let mut out = [[0.0; T]; R];
        for r in 0..R {
            for t in 0..T {
                // `[a0 + a1, a2 + a3, a4 + a5, a6 + a7]`, then `scalar::reduce_lanes`' tree
                // (`vaddvq` would not promise an order).
                let p = vpaddq_f32(lo[r][t], hi[r][t]);
                let q = vpaddq_f32(p, p);
                out[r][t] = vgetq_lane_f32::<0>(q) + vgetq_lane_f32::<1>(q);
            }
        }
        out
    }
}

/// Adds the terms of blocks `b0..b0 + n` (`n <= 4`, lane `k` for block `b0 + k`) into
/// `acc`: exact block sums side by side, scaled by `d_w * d_a` with two multiplies and an
/// add (no FMA).
///
/// # Safety
/// NEON and `D`'s features are enabled in the caller; the rows and activations hold
/// blocks `b0..b0 + n`.
#[inline(always)]
pub(super) unsafe fn quad<B: Blocks32, D: Dot32, const R: usize, const T: usize>(
    w: [&[u8]; R],
    a: [&[u8]; T],
    cols: usize,
    b0: usize,
    n: usize,
    acc: &mut [[float32x4_t; T]; R],
) {
    let bb = B::DTYPE.block_bytes();
    // SAFETY: forwarded; reads stay inside blocks `b0..b0 + n`.
    unsafe {
        let x = pair::<B, D, R, T>(w, a, b0, 0, n);
        let y = pair::<B, D, R, T>(w, a, b0, 2, n);
        let mut da = [vdupq_n_f32(0.0); T];
        for t in 0..T {
            let p = a[t].as_ptr().add(cols + 4 * b0);
            da[t] = if n == 4 {
                vld1q_f32(p.cast())
            } else {
                let mut d = [0.0f32; 4];
                for (k, d) in d.iter_mut().enumerate().take(n) {
                    *d = f32::from_le_bytes(p.add(4 * k).cast::<[u8; 4]>().read());
                }
                vld1q_f32(d.as_ptr())
            };
        }
        for r in 0..R {
            let mut bits = [0u16; 8];
            for (k, bits) in bits.iter_mut().enumerate().take(n) {
                *bits = u16::from_le_bytes(w[r].as_ptr().add((b0 + k) * bb).cast::<[u8; 2]>().read());
            }
            let dw = f16_to_f32::<false>(vld1q_u16(bits.as_ptr()));
            for t in 0..T {
                let isum = vpaddq_s32(x[r][t], y[r][t]);
                let term = vmulq_f32(vmulq_f32(dw, da[t]), vcvtq_f32_s32(isum));
                acc[r][t] = vaddq_f32(acc[r][t], term);
            }
        }
    }
}

/// The lanes of blocks `b0 + j` and `b0 + j + 1`, for each of `R x T` pairs, pairwise
/// added (`[s_j 0+1, s_j 2+3, s_j+1 0+1, s_j+1 2+3]`). Blocks at or past `b0 + n` are zero.
///
/// # Safety
/// As [`quad`].
#[inline(always)]
pub(super) unsafe fn pair<B: Blocks32, D: Dot32, const R: usize, const T: usize>(
    w: [&[u8]; R],
    a: [&[u8]; T],
    b0: usize,
    j: usize,
    n: usize,
) -> [[int32x4_t; T]; R] {
    let bb = B::DTYPE.block_bytes();
    // SAFETY: forwarded; reads stay inside blocks `b0..b0 + n`.
    unsafe {
        let mut s = [[[vdupq_n_s32(0); T]; R]; 2];
        for (k, sk) in s.iter_mut().enumerate() {
            if j + k >= n {
                break;
            }
            let b = b0 + j + k;
            let mut av = [[vdupq_n_s8(0); 2]; T];
            for t in 0..T {
                let p = a[t].as_ptr().add(b * QK).cast::<i8>();
                av[t] = [vld1q_s8(p), vld1q_s8(p.add(16))];
            }
            for r in 0..R {
                let wv = B::load32(w[r].as_ptr().add(b * bb));
                for t in 0..T {
                    sk[r][t] = D::dot32(wv, av[t]);
                }
            }
        }
        let mut h = [[vdupq_n_s32(0); T]; R];
        for r in 0..R {
            for t in 0..T {
                h[r][t] = vpaddq_s32(s[0][r][t], s[1][r][t]);
            }
        }
        h
    }
}

/// The blocks of an interleaved dtype as [`Interleaved`] reads them: after a group block's
/// 16 scales, pieces of 64 bytes, each the same 4 bytes of all 16 rows, so 16 bytes of a
/// piece are 4 bytes of each of 4 rows.
pub(crate) trait X16Blocks {
    /// Bytes of one group block (16 scales, then the quant bytes).
    const GROUP_BYTES: usize;
    /// What [`X16Blocks::load4rows`] adds to every weight (q4_0's nibbles are the weights
    /// plus 8).
    const BIAS: i32;
    /// How many products of a loaded weight and an activation byte (in `-127..=127`) one
    /// i16 lane sums exactly, at least 2: how far the widening multiplies sum in i16.
    const I16_PRODUCTS: usize;

    /// Row quad `j` of a group block (`q`: `16 j` bytes past its scales), as signed bytes
    /// plus [`X16Blocks::BIAS`]: bytes `4r..4r + 4` of vector `v` are row `4j + r`'s weights
    /// `4v..4v + 4`, so vector `v` meets quad `v % 4` of the activation block's vector
    /// `v / 4`.
    ///
    /// # Safety
    /// NEON is enabled in the caller; `q` points into a whole group block as above.
    unsafe fn load4rows(q: *const u8) -> [int8x16_t; 8];
}

impl X16Blocks for Q4 {
    const GROUP_BYTES: usize = core::mem::size_of::<GroupQ4_0x16>();
    const BIAS: i32 = 8;
    // Products of at most 15 * 127: 16 make 30480.
    const I16_PRODUCTS: usize = 16;

    #[inline(always)]
    unsafe fn load4rows(q: *const u8) -> [int8x16_t; 8] {
        // SAFETY: 4 pieces of 64 bytes from the block's quant bytes; NEON is enabled in the
        // caller.
        unsafe {
            let mut w = [vdupq_n_s8(0); 8];
            for v in 0..4 {
                // Piece `v` holds weights `4v..4v + 4` (low nibbles) and `16 + 4v..` (high).
                [w[v], w[4 + v]] = nibbles(vld1q_u8(q.add(64 * v)));
            }
            w
        }
    }
}

impl X16Blocks for Q8 {
    const GROUP_BYTES: usize = core::mem::size_of::<GroupQ8_0x16>();
    const BIAS: i32 = 0;
    // Products of at most 128 * 127: 2 make 32512, 3 could overflow.
    const I16_PRODUCTS: usize = 2;

    #[inline(always)]
    unsafe fn load4rows(q: *const u8) -> [int8x16_t; 8] {
        // SAFETY: 8 pieces of 64 bytes from the block's quant bytes; NEON is enabled in the
        // caller. Piece `v` holds weights `4v..4v + 4`.
        core::array::from_fn(|v| unsafe { vld1q_s8(q.add(64 * v).cast()) })
    }
}

/// The exact i32 dot products of 4 rows of an interleaved block with an activation block:
/// the step [`Interleaved`] takes per vector of rows.
pub(crate) trait Dot4Rows {
    /// `acc + [w of row r . a]` for `r` in `0..4`, `w` as [`X16Blocks::load4rows`] gives
    /// it for `B` (with its bias).
    ///
    /// # Safety
    /// As [`Dot32::dot32`].
    unsafe fn dot4rows<B: X16Blocks>(acc: int32x4_t, w: [int8x16_t; 8], a: [int8x16_t; 2]) -> int32x4_t;
}

/// The activation quad each of [`X16Blocks::load4rows`]' vectors meets (`v`: quad `v % 4`
/// of `a[v / 4]`), repeated across a vector.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn quads(a: [int8x16_t; 2]) -> [int8x16_t; 8] {
    let (a0, a1) = (vreinterpretq_s32_s8(a[0]), vreinterpretq_s32_s8(a[1]));
    [
        vreinterpretq_s8_s32(vdupq_laneq_s32::<0>(a0)),
        vreinterpretq_s8_s32(vdupq_laneq_s32::<1>(a0)),
        vreinterpretq_s8_s32(vdupq_laneq_s32::<2>(a0)),
        vreinterpretq_s8_s32(vdupq_laneq_s32::<3>(a0)),
        vreinterpretq_s8_s32(vdupq_laneq_s32::<0>(a1)),
        vreinterpretq_s8_s32(vdupq_laneq_s32::<1>(a1)),
        vreinterpretq_s8_s32(vdupq_laneq_s32::<2>(a1)),
        vreinterpretq_s8_s32(vdupq_laneq_s32::<3>(a1)),
    ]
}

/// The products of vectors `vs` of `w` (as [`X16Blocks::load4rows`] gives them) with the
/// quads of `x` (as [`quads`]) that they meet, summed lane by lane in i16 (the caller keeps
/// `vs` short enough to be exact): rows 0 and 1 (the low halves), then rows 2 and 3, 4 lanes
/// a row.
///
/// # Safety
/// NEON is enabled in the caller; `vs` is a non-empty range in `0..8`.
#[inline(always)]
pub(super) unsafe fn mull_chain(w: &[int8x16_t; 8], x: &[int8x16_t; 8], vs: core::ops::Range<usize>) -> [int16x8_t; 2] {
    // SAFETY: NEON is present.
    unsafe {
        let v0 = vs.start;
        let mut l = vmull_s8(vget_low_s8(w[v0]), vget_low_s8(x[v0]));
        let mut h = vmull_high_s8(w[v0], x[v0]);
        for v in v0 + 1..vs.end {
            l = vmlal_s8(l, vget_low_s8(w[v]), vget_low_s8(x[v]));
            h = vmlal_high_s8(h, w[v], x[v]);
        }
        [l, h]
    }
}

impl Dot4Rows for Mull {
    #[inline(always)]
    unsafe fn dot4rows<B: X16Blocks>(acc: int32x4_t, w: [int8x16_t; 8], a: [int8x16_t; 2]) -> int32x4_t {
        // SAFETY: NEON is present.
        unsafe {
            let x = quads(a);
            if B::I16_PRODUCTS >= 16 {
                // A lane's 8 products in one chain, then a row's lanes pairwise (16
                // products, still i16), then one i32 lane.
                let [l, h] = mull_chain(&w, &x, 0..8);
                vpadalq_s16(acc, vpaddq_s16(l, h))
            } else {
                // Chains of 2, each widened pairwise into i32: rows 0 and 1 in `lo`, 2 and 3
                // in `hi`, 2 lanes a row.
                let (mut lo, mut hi) = (vdupq_n_s32(0), vdupq_n_s32(0));
                for c in 0..4 {
                    let [l, h] = mull_chain(&w, &x, 2 * c..2 * c + 2);
                    lo = vpadalq_s16(lo, l);
                    hi = vpadalq_s16(hi, h);
                }
                // `[row 0, row 1, row 2, row 3]`.
                vaddq_s32(acc, vpaddq_s32(lo, hi))
            }
        }
    }
}

impl Dot4Rows for SDot {
    #[inline(always)]
    unsafe fn dot4rows<B: X16Blocks>(acc: int32x4_t, w: [int8x16_t; 8], a: [int8x16_t; 2]) -> int32x4_t {
        let mut acc = acc;
        // SAFETY: register-only; the caller enables `dotprod` (as in `dot32`). `sdot` by
        // element takes one quad of `a` for every lane, and sums in i32 (any `B`).
        unsafe {
            asm!(
                "sdot {acc:v}.4s, {w0:v}.16b, {a0:v}.4b[0]",
                "sdot {acc:v}.4s, {w1:v}.16b, {a0:v}.4b[1]",
                "sdot {acc:v}.4s, {w2:v}.16b, {a0:v}.4b[2]",
                "sdot {acc:v}.4s, {w3:v}.16b, {a0:v}.4b[3]",
                "sdot {acc:v}.4s, {w4:v}.16b, {a1:v}.4b[0]",
                "sdot {acc:v}.4s, {w5:v}.16b, {a1:v}.4b[1]",
                "sdot {acc:v}.4s, {w6:v}.16b, {a1:v}.4b[2]",
                "sdot {acc:v}.4s, {w7:v}.16b, {a1:v}.4b[3]",
                acc = inout(vreg) acc,
                w0 = in(vreg) w[0],
                w1 = in(vreg) w[1],
                w2 = in(vreg) w[2],
                w3 = in(vreg) w[3],
                w4 = in(vreg) w[4],
                w5 = in(vreg) w[5],
                w6 = in(vreg) w[6],
                w7 = in(vreg) w[7],
                a0 = in(vreg) a[0],
                a1 = in(vreg) a[1],
                options(pure, nomem, nostack),
            );
        }
        acc
    }
}

/// q4_0x16 and q8_0x16 groups: 4 rows a vector, so a block's exact sums for the 16 rows
/// come out as 4 vectors with no folding, and accumulator `b % 8` of the canonical sum
/// ([`scalar::sum_blocks`]) of 4 rows is one f32x4. A token's 8 x 4 accumulators would fill
/// the register file, so they stay in memory: each block's terms are made in registers,
/// 4 rows at a time with the weights loaded (for q4, decoded) once for every token in
/// flight (all `T` with `sdot`, one with the widening multiplies), and added in with one
/// load and one store each.
pub(crate) struct Interleaved<B, D>(PhantomData<(B, D)>);

impl<B: X16Blocks> GroupKernel for Interleaved<B, Mull> {
    #[target_feature(enable = "neon")]
    unsafe fn group<const T: usize>(g: &[u8], a: [&[u8]; T], cols: usize) -> [[f32; X16]; T] {
        // One token at a time: loading (and decoding) the weights costs little next to the
        // 64 multiplies a token makes of them, and with several tokens the compiler hoists
        // the activations' widening out of the multiplies (and spills it), which costs more.
        let mut out = [[0.0; X16]; T];
        for (o, a) in out.iter_mut().zip(a) {
            // SAFETY: forwarded; NEON is enabled here.
            [*o] = unsafe { x16_group::<B, Mull, 1>(g, [a], cols) };
        }
        out
    }
}

impl<B: X16Blocks> GroupKernel for Interleaved<B, SDot> {
    #[target_feature(enable = "neon,dotprod")]
    unsafe fn group<const T: usize>(g: &[u8], a: [&[u8]; T], cols: usize) -> [[f32; X16]; T] {
        // SAFETY: forwarded; NEON and dotprod are enabled here.
        unsafe { x16_group::<B, SDot, T>(g, a, cols) }
    }
}

/// The body of the [`Interleaved`] kernels, inlined into each so that `D::dot4rows`
/// compiles with its tier's features.
///
/// # Safety
/// As [`GroupKernel::group`], with `D`'s features enabled in the caller.
#[inline(always)]
pub(super) unsafe fn x16_group<B: X16Blocks, D: Dot4Rows, const T: usize>(
    g: &[u8],
    a: [&[u8]; T],
    cols: usize,
) -> [[f32; X16]; T] {
    let nb = cols / QK;
    let gb = B::GROUP_BYTES;
    debug_assert_eq!(g.len(), nb * gb);
    // SAFETY: NEON is present; `g` holds the group's `nb` blocks and each `a[t]` a whole
    // activation (`cols` values, then `nb` f32 scales).
    unsafe {
        // `acc[t][k][j]`: accumulator `k` of rows `4j..4j + 4` for token `t`.
        let mut acc = [[[vdupq_n_f32(0.0); 4]; scalar::LANES]; T];
        for b in 0..nb {
            let wb = g.as_ptr().add(b * gb);
            // The 16 scales, rows `4j..4j + 4` in `dw[j]` (exact).
            let h = [vreinterpretq_u16_u8(vld1q_u8(wb)), vreinterpretq_u16_u8(vld1q_u8(wb.add(16)))];
            let dw = [
                f16_to_f32::<false>(h[0]),
                f16_to_f32::<true>(h[0]),
                f16_to_f32::<false>(h[1]),
                f16_to_f32::<true>(h[1]),
            ];
            let mut x = [[vdupq_n_s8(0); 2]; T];
            let mut base = [vdupq_n_s32(0); T];
            let mut da = [0.0f32; T];
            for t in 0..T {
                let p = a[t].as_ptr().add(b * QK);
                x[t] = [vld1q_s8(p.cast()), vld1q_s8(p.add(16).cast())];
                if B::BIAS != 0 {
                    // The loaded weights are the true ones plus the bias: every row's sum
                    // starts at -bias * sum(a) (each half's sum at most 16 * 128 in
                    // magnitude, as i16).
                    let s = i32::from(vaddlvq_s8(x[t][0])) + i32::from(vaddlvq_s8(x[t][1]));
                    base[t] = vdupq_n_s32(-B::BIAS * s);
                }
                da[t] = f32::from_le_bytes(a[t].as_ptr().add(cols + 4 * b).cast::<[u8; 4]>().read());
            }
            let k = b % scalar::LANES;
            // Row quad `j` of piece `v` is the 16 bytes at `64 v + 16 j` after the scales.
            let q = wb.add(2 * X16);
            for j in 0..4 {
                let w = B::load4rows(q.add(16 * j));
                for t in 0..T {
                    let isum = D::dot4rows::<B>(base[t], w, x[t]);
                    // `(d_w * d_a) * isum`, two multiplies (no FMA), as `scalar::block_term`.
                    let term = vmulq_f32(vmulq_n_f32(dw[j], da[t]), vcvtq_f32_s32(isum));
                    acc[t][k][j] = vaddq_f32(acc[t][k][j], term);
                }
            }
        }
        let mut out = [[0.0; X16]; T];
        for t in 0..T {
            for j in 0..4 {
                // `scalar::reduce_lanes`' tree, 4 rows a vector.
                let c = &acc[t];
                let s = vaddq_f32(
                    vaddq_f32(vaddq_f32(c[0][j], c[1][j]), vaddq_f32(c[2][j], c[3][j])),
                    vaddq_f32(vaddq_f32(c[4][j], c[5][j]), vaddq_f32(c[6][j], c[7][j])),
                );
                vst1q_f32(out[t].as_mut_ptr().add(4 * j), s);
            }
        }
        out
    }
}

//! The NEON tiers: Advanced SIMD (every aarch64 CPU) and, with the `dotprod` extension
//! (Cortex-A55/A76 and later, Apple M1, Neoverse N1), `sdot` for the integer formats.
//!
//! Float weights widen 8 at a time to two f32x4 and meet the activation in FMAs; f16
//! widens with `fcvtl`, written as inline assembly because the f16 vector intrinsics need a
//! newer compiler than the crate's MSRV; f32p weights rebuild 4 at a time from their bytes
//! (a table lookup) and exponent nibbles ([`Packed`]). A batch of tokens (prefill) meets
//! float weights in [`gemm`]'s product, one tile for both tiers: a quad of a row's weights
//! in a register, each lane against a column's vectors of tokens in FMAs by element
//! ([`gemm_tile`]).
//!
//! Integer formats take `i8 x i8` products of a whole block: `smull` + `smlal2` pairs (at
//! most 2 * 128 * 127, which fits i16) widened into i32 lanes, or four `sdot`-accumulated
//! byte quads per lane. q4_0x16 and q8_0x16 groups hold 4 rows of 4 bytes in a vector, so
//! the activation quad they meet is one lane: `sdot` by element, or that quad broadcast for
//! the widening multiplies ([`Interleaved`]). The two tiers share everything but that one
//! step, and give the scalar tier's bits (see [`Quant`]).

use core::arch::aarch64::*;
use core::arch::asm;
use core::marker::PhantomData;

use half::f16;

use crate::kernels::attend::{Attend, Exp, Isa};
use crate::kernels::gemm::{self, Gemm, BLOCK};
use crate::kernels::{scalar, FloatType, GroupKernel, Kernel, Kernels, StoredType, BF16, F16, F32, I8};
use crate::quant::{f32p_row, BlockF32P, DType, GroupQ4_0x16, GroupQ8_0x16, QK, X16};

/// The NEON tier.
pub(crate) struct Neon;
/// The NEON + dotprod tier.
pub(crate) struct NeonDot;

impl Kernels for Neon {
    type F32 = Float<F32>;
    type F16 = Float<F16>;
    type BF16 = Float<BF16>;
    type Q8_0 = Quant<Q8, Mull>;
    type Q4_0 = Quant<Q4, Mull>;
    type Q4_0x16 = Interleaved<Q4, Mull>;
    type Q8_0x16 = Interleaved<Q8, Mull>;
    type F32P = Packed;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        // SAFETY: the caller guarantees NEON.
        unsafe { quantize_act(x, out) }
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        // SAFETY: the caller guarantees NEON.
        unsafe { dequant_row(dtype, row, out) }
    }

    const GEMM: Option<gemm::RunFn> = Some(gemm::run::<Self>);
}

impl Kernels for NeonDot {
    type F32 = Float<F32>;
    type F16 = Float<F16>;
    type BF16 = Float<BF16>;
    type Q8_0 = Quant<Q8, SDot>;
    type Q4_0 = Quant<Q4, SDot>;
    type Q4_0x16 = Interleaved<Q4, SDot>;
    type Q8_0x16 = Interleaved<Q8, SDot>;
    type F32P = Packed;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        // SAFETY: the caller guarantees NEON.
        unsafe { quantize_act(x, out) }
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        // SAFETY: the caller guarantees NEON.
        unsafe { dequant_row(dtype, row, out) }
    }

    const GEMM: Option<gemm::RunFn> = Some(gemm::run::<Self>);
}

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
    unsafe fn tile(w: &[*const f32], xt: *const f32, cols: usize, vecs: usize, out: &mut [f32]) {
        let width = vecs * 4;
        // SAFETY: (every arm) `rows(vecs)` pointers; `xt` holds `BLOCK >= width` tokens per
        // column and `out` `rows(vecs)` rows of `width`, so each strip of vectors from
        // `v0` fits; the rest forwarded.
        unsafe {
            match vecs {
                1 => gemm_tile::<12, 1>(w, xt, cols, out, width),
                2 => gemm_tile::<8, 2>(w, xt, cols, out, width),
                _ => {
                    for v0 in (0..vecs).step_by(4) {
                        let (xt, out) = (xt.add(4 * v0), &mut out[4 * v0..]);
                        match vecs - v0 {
                            1 => gemm_tile::<6, 1>(w, xt, cols, out, width),
                            2 => gemm_tile::<6, 2>(w, xt, cols, out, width),
                            3 => gemm_tile::<6, 3>(w, xt, cols, out, width),
                            _ => gemm_tile::<6, 4>(w, xt, cols, out, width),
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
unsafe fn gemm_tile<const R: usize, const V: usize>(
    w: &[*const f32],
    xt: *const f32,
    cols: usize,
    out: &mut [f32],
    width: usize,
) {
    let rows: [*const f32; R] = core::array::from_fn(|r| w[r]);
    let body = cols - cols % 4;
    // SAFETY: the caller enables NEON; `xt` holds `cols` columns of `BLOCK >= 4 * V` tokens,
    // each row `cols` f32 (read as bytes: unaligned) and `out` as documented.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); V]; R];
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
unsafe fn gemm_column<const R: usize, const V: usize, const K: i32>(
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
fn transpose4(r: [float32x4_t; 4]) -> [float32x4_t; 4] {
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
unsafe fn store_lanes(p: *mut f32, v: float32x4_t, k: usize) {
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

/// Widens 4 f16 (the low half of `h`, or the high half with `HIGH`) to f32 (`fcvtl`,
/// `fcvtl2`; exact).
#[inline]
#[target_feature(enable = "neon")]
fn f16_to_f32<const HIGH: bool>(h: uint16x8_t) -> float32x4_t {
    let f: float32x4_t;
    // SAFETY: a register-only conversion present in every AArch64 Advanced SIMD unit.
    unsafe {
        if HIGH {
            asm!("fcvtl2 {f:v}.4s, {h:v}.8h", h = in(vreg) h, f = lateout(vreg) f, options(pure, nomem, nostack));
        } else {
            asm!("fcvtl {f:v}.4s, {h:v}.4h", h = in(vreg) h, f = lateout(vreg) f, options(pure, nomem, nostack));
        }
    }
    f
}

/// An element type whose 8 consecutive values widen exactly to two f32x4: the float
/// dtypes of weight rows, and the attention state's rows ([`StoredType`], the q8 cache's
/// [`I8`] included).
pub(crate) trait Widen8 {
    /// # Safety
    /// `p` points at 8 readable values.
    unsafe fn load8(p: *const u8) -> [float32x4_t; 2];
}

impl Widen8 for F32 {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load8(p: *const u8) -> [float32x4_t; 2] {
        // SAFETY: 32 readable bytes; byte loads need no alignment.
        unsafe { [vreinterpretq_f32_u8(vld1q_u8(p)), vreinterpretq_f32_u8(vld1q_u8(p.add(16)))] }
    }
}

impl Widen8 for F16 {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load8(p: *const u8) -> [float32x4_t; 2] {
        // SAFETY: 16 readable bytes.
        let h = vreinterpretq_u16_u8(unsafe { vld1q_u8(p) });
        [f16_to_f32::<false>(h), f16_to_f32::<true>(h)]
    }
}

impl Widen8 for I8 {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load8(p: *const u8) -> [float32x4_t; 2] {
        // SAFETY: 8 readable bytes; i8 widens exactly.
        let h = vmovl_s8(unsafe { vld1_s8(p.cast()) });
        [vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))), vcvtq_f32_s32(vmovl_high_s16(h))]
    }
}

impl Widen8 for BF16 {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load8(p: *const u8) -> [float32x4_t; 2] {
        // SAFETY: 16 readable bytes. bf16 is the top half of an f32.
        let h = vreinterpretq_u16_u8(unsafe { vld1q_u8(p) });
        [vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))), vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h))]
    }
}

/// Float kernel: `R x T` accumulators of 4 lanes fed 8 columns a step, the `cols % 8`
/// tail in scalar.
pub(crate) struct Float<W>(PhantomData<W>);

impl<W: Widen8 + FloatType> Kernel for Float<W> {
    type Act = f32;

    #[target_feature(enable = "neon")]
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[f32]; T], cols: usize) -> [[f32; T]; R] {
        let es = W::DTYPE.block_bytes();
        let body = cols - cols % 8;
        let mut acc = [[vdupq_n_f32(0.0); T]; R];
        let mut c = 0;
        while c < body {
            let mut x = [[vdupq_n_f32(0.0); 2]; T];
            for t in 0..T {
                // SAFETY: `a[t]` holds `cols > c + 7` floats.
                x[t] = unsafe { [vld1q_f32(a[t].as_ptr().add(c)), vld1q_f32(a[t].as_ptr().add(c + 4))] };
            }
            for r in 0..R {
                // SAFETY: `w[r]` holds `cols` weights of `es` bytes.
                let [w0, w1] = unsafe { W::load8(w[r].as_ptr().add(c * es)) };
                for t in 0..T {
                    acc[r][t] = vfmaq_f32(vfmaq_f32(acc[r][t], w0, x[t][0]), w1, x[t][1]);
                }
            }
            c += 8;
        }
        let mut out = [[0.0; T]; R];
        for r in 0..R {
            for t in 0..T {
                // The `cols % lanes` tail (none for the usual widths: skip the call).
                let tail = if body < cols { scalar::dot_row(W::DTYPE, &w[r][body * es..], &a[t][body..]) } else { 0.0 };
                out[r][t] = vaddvq_f32(acc[r][t]) + tail;
            }
        }
        out
    }
}

/// `f32p` kernel: `R x T` accumulators of 4 lanes, each block's 32 weights rebuilt 4 at a
/// time ([`f32p_block`]). The spilled weights of the head are added in scalar.
pub(crate) struct Packed;

impl Kernel for Packed {
    type Act = f32;

    #[target_feature(enable = "neon")]
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[f32]; T], cols: usize) -> [[f32; T]; R] {
        let mut base = [vdupq_n_u32(0); R];
        let mut spills = [&[][..]; R];
        let mut blocks = [core::ptr::null::<u8>(); R];
        let mut nb = cols / QK;
        for r in 0..R {
            let (e, s, b) = f32p_row(w[r], cols);
            (base[r], spills[r], blocks[r], nb) = (vdupq_n_u32(e), s, b.as_ptr().cast(), nb.min(b.len()));
        }
        let mut acc = [[vdupq_n_f32(0.0); T]; R];
        for b in 0..nb {
            for r in 0..R {
                // SAFETY: every row has `nb` blocks.
                let p = unsafe { blocks[r].add(b * size_of::<BlockF32P>()) };
                // SAFETY: a whole block.
                let ws = unsafe { f32p_block(p, base[r]) };
                for (g, wv) in ws.into_iter().enumerate() {
                    for t in 0..T {
                        // SAFETY: `a[t]` holds `cols` floats, whole blocks.
                        let x = unsafe { vld1q_f32(a[t].as_ptr().add(b * QK + 4 * g)) };
                        acc[r][t] = vfmaq_f32(acc[r][t], wv, x);
                    }
                }
            }
        }
        let mut out = [[0.0; T]; R];
        for r in 0..R {
            for t in 0..T {
                out[r][t] = vaddvq_f32(acc[r][t]) + scalar::f32p_spill_dot(spills[r], a[t]);
            }
        }
        out
    }
}

/// The 32 weights of the f32p block at `p` as eight vectors of 4 (its head's spills not
/// applied), under the row's base exponent `base` (in every lane). A table lookup spreads
/// 4 weights' 3 bytes into their lanes (the top byte twice, so the sign lands in bit 31),
/// and each exponent nibble `d` becomes `(base - d) << 23` (zero for 15).
///
/// # Safety
/// NEON is enabled in the (inlining) caller; `p` points at a whole block (112 bytes).
#[inline(always)]
unsafe fn f32p_block(p: *const u8, base: uint32x4_t) -> [float32x4_t; 8] {
    const SPREAD: [u8; 16] = [0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 11];
    // SAFETY: the block's 112 bytes are readable: 16 at 96 and at 12 g; `SPREAD` 16 bytes.
    unsafe {
        let spread = vld1q_u8(SPREAD.as_ptr());
        let (keep, field, fifteen) = (vdupq_n_u32(0x807F_FFFF), vdupq_n_u32(0x7F80_0000), vdupq_n_u32(15));
        let e = vld1q_u8(p.add(96));
        // Nibbles of weights 0..16 (low) and 16..32 (high), widened to 32 lanes.
        let mut ds = [vdupq_n_u32(0); 8];
        for (half, n) in [vandq_u8(e, vdupq_n_u8(15)), vshrq_n_u8::<4>(e)].into_iter().enumerate() {
            let (lo, hi) = (vmovl_u8(vget_low_u8(n)), vmovl_high_u8(n));
            ds[4 * half..4 * half + 4].copy_from_slice(&[
                vmovl_u16(vget_low_u16(lo)),
                vmovl_high_u16(lo),
                vmovl_u16(vget_low_u16(hi)),
                vmovl_high_u16(hi),
            ]);
        }
        let mut out = [vdupq_n_f32(0.0); 8];
        for (g, (o, d)) in out.iter_mut().zip(ds).enumerate() {
            let m = vreinterpretq_u32_u8(vqtbl1q_u8(vld1q_u8(p.add(12 * g)), spread));
            let e = vandq_u32(vshlq_n_u32::<23>(vsubq_u32(base, d)), field);
            let e = vbicq_u32(e, vceqq_u32(d, fifteen));
            *o = vreinterpretq_f32_u32(vorrq_u32(vandq_u32(m, keep), e));
        }
        out
    }
}

/// Decodes an f32p row (`out.len()` weights): its blocks 32 weights at a time, then its
/// spills, as [`scalar::dequant_row`] does.
///
/// # Safety
/// NEON is present; `row` holds `out.len()` weights of f32p.
#[target_feature(enable = "neon")]
unsafe fn dequant_f32p(row: &[u8], out: &mut [f32]) {
    let (base, spills, blocks) = f32p_row(row, out.len());
    let base = vdupq_n_u32(base);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        // SAFETY: a whole block; `o` holds 32 values.
        unsafe {
            for (g, v) in f32p_block((b as *const BlockF32P).cast(), base).into_iter().enumerate() {
                vst1q_f32(o.as_mut_ptr().add(4 * g), v);
            }
        }
    }
    scalar::apply_f32p_spills(spills, out);
}

/// An integer format whose blocks widen to 32 signed bytes, with an f16 scale first.
pub(super) trait Blocks32 {
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
fn nibbles(q: uint8x16_t) -> [int8x16_t; 2] {
    [vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vreinterpretq_s8_u8(vshrq_n_u8::<4>(q))]
}

/// The f16 scale at the start of the block at `p`.
///
/// # Safety
/// `p` points at 2 readable bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn scale(p: *const u8) -> f32 {
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
unsafe fn quant_tile<B: Blocks32, D: Dot32, const R: usize, const T: usize>(
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
unsafe fn quad<B: Blocks32, D: Dot32, const R: usize, const T: usize>(
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
unsafe fn pair<B: Blocks32, D: Dot32, const R: usize, const T: usize>(
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
fn quads(a: [int8x16_t; 2]) -> [int8x16_t; 8] {
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
unsafe fn mull_chain(w: &[int8x16_t; 8], x: &[int8x16_t; 8], vs: core::ops::Range<usize>) -> [int16x8_t; 2] {
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
unsafe fn x16_group<B: X16Blocks, D: Dot4Rows, const T: usize>(
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

/// [`scalar::quantize_act`] 32 values at a time, with the same operations per value
/// (`fcvtns` rounds to nearest even), hence the same bytes.
///
/// # Safety
/// NEON is present.
#[target_feature(enable = "neon")]
unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
    let cols = x.len();
    debug_assert_eq!(out.len(), crate::kernels::act_scratch_len(cols));
    for (b, xs) in x.chunks_exact(QK).enumerate() {
        // SAFETY: `xs` holds 32 floats.
        let v: [float32x4_t; 8] = core::array::from_fn(|i| unsafe { vld1q_f32(xs.as_ptr().add(4 * i)) });
        let m = v.iter().fold(vdupq_n_f32(0.0), |m, &v| vmaxq_f32(m, vabsq_f32(v)));
        let (d, inv) = scalar::act_scale(vmaxvq_f32(m));
        let q: [int32x4_t; 8] = core::array::from_fn(|i| vcvtnq_s32_f32(vmulq_n_f32(v[i], inv)));
        let q16: [int16x8_t; 4] =
            core::array::from_fn(|i| vcombine_s16(vqmovn_s32(q[2 * i]), vqmovn_s32(q[2 * i + 1])));
        let q8 =
            [vcombine_s8(vqmovn_s16(q16[0]), vqmovn_s16(q16[1])), vcombine_s8(vqmovn_s16(q16[2]), vqmovn_s16(q16[3]))];
        // SAFETY: `out` holds `cols` values then `cols / QK` scales.
        unsafe {
            let p = out.as_mut_ptr().add(b * QK).cast::<i8>();
            vst1q_s8(p, q8[0]);
            vst1q_s8(p.add(16), q8[1]);
            out.as_mut_ptr().add(cols + 4 * b).cast::<[u8; 4]>().write(d.to_le_bytes());
        }
    }
}

/// Row decode: floats widen 8 at a time (tail in scalar), blocks 32 at a time.
///
/// # Safety
/// NEON is present.
#[target_feature(enable = "neon")]
unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
    debug_assert_eq!(dtype.row_bytes(out.len()), Some(row.len()));
    // SAFETY: (all arms) `row` holds `out.len()` weights of `dtype`.
    unsafe {
        match dtype {
            DType::F32 => widen_row::<F32>(row, out),
            DType::F16 => widen_row::<F16>(row, out),
            DType::BF16 => widen_row::<BF16>(row, out),
            DType::Q8_0 | DType::Q8_0x16 => blocks_row::<Q8>(row, out),
            // An interleaved row comes in its plain form (as `scalar::dequant_row`).
            DType::Q4_0 | DType::Q4_0x16 => blocks_row::<Q4>(row, out),
            DType::F32P => dequant_f32p(row, out),
        }
    }
}

/// # Safety
/// NEON is present; `row` holds `out.len()` weights.
#[target_feature(enable = "neon")]
unsafe fn widen_row<W: Widen8 + FloatType>(row: &[u8], out: &mut [f32]) {
    let es = W::DTYPE.block_bytes();
    let body = out.len() - out.len() % 8;
    for (c, o) in out[..body].chunks_exact_mut(8).enumerate() {
        // SAFETY: 8 weights at `8 * c`; `o` holds 8 floats.
        unsafe {
            let [v0, v1] = W::load8(row.as_ptr().add(8 * c * es));
            vst1q_f32(o.as_mut_ptr(), v0);
            vst1q_f32(o.as_mut_ptr().add(4), v1);
        }
    }
    scalar::dequant_row(W::DTYPE, &row[body * es..], &mut out[body..]);
}

/// # Safety
/// NEON is present; `row` holds `out.len() / QK` blocks.
#[target_feature(enable = "neon")]
unsafe fn blocks_row<B: Blocks32>(row: &[u8], out: &mut [f32]) {
    let bb = B::DTYPE.block_bytes();
    for (b, o) in out.chunks_exact_mut(QK).enumerate() {
        // SAFETY: block `b` exists; `o` holds 32 floats.
        unsafe {
            let p = row.as_ptr().add(b * bb);
            let (q, d) = (B::load32(p), scale(p));
            for (i, &h) in q.iter().enumerate() {
                let q16 = [vmovl_s8(vget_low_s8(h)), vmovl_high_s8(h)];
                for (j, &v) in q16.iter().enumerate() {
                    let f = [vcvtq_f32_s32(vmovl_s16(vget_low_s16(v))), vcvtq_f32_s32(vmovl_high_s16(v))];
                    let o = o.as_mut_ptr().add(16 * i + 8 * j);
                    vst1q_f32(o, vmulq_n_f32(f[0], d));
                    vst1q_f32(o.add(4), vmulq_n_f32(f[1], d));
                }
            }
        }
    }
}

impl Isa for Neon {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn enable<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

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

/// [`scalar::narrow_f16`] 8 values at a time (`fcvtn`, `fcvtn2`: round to nearest even
/// under the default FPCR, the same bits).
///
/// # Safety
/// NEON is present.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn narrow_f16(x: &[f32], out: &mut [f16]) {
    let n = x.len().min(out.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: 8 floats readable at `x[i..]`, 8 halves writable at `out[i..]`; the
        // conversions are register-only and present in every Advanced SIMD unit.
        unsafe {
            let (lo, hi) = (vld1q_f32(x.as_ptr().add(i)), vld1q_f32(x.as_ptr().add(i + 4)));
            let h: uint16x8_t;
            asm!(
                "fcvtn {h:v}.4h, {lo:v}.4s",
                "fcvtn2 {h:v}.8h, {hi:v}.4s",
                lo = in(vreg) lo,
                hi = in(vreg) hi,
                h = out(vreg) h,
                options(pure, nomem, nostack),
            );
            vst1q_u16(out.as_mut_ptr().add(i).cast(), h);
        }
        i += 8;
    }
    scalar::narrow_f16(&x[i..n], &mut out[i..n]);
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
fn exp4(x: float32x4_t) -> float32x4_t {
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

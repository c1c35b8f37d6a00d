//! The NEON tiers' float weights: exact widening loads 8 at a time (f16 with `fcvtl`), the
//! f32 / f16 / bf16 tiles, and f32p rebuilt 4 at a time.

use crate::kernels::scalar;
use crate::kernels::traits::{FloatType, Kernel, BF16, F16, F32, I8};
use crate::quant::{f32p_row, BlockF32P, QK};
use core::arch::aarch64::*;
use core::arch::asm;
use core::marker::PhantomData;

/// Widens 4 f16 (the low half of `h`, or the high half with `HIGH`) to f32 (`fcvtl`,
/// `fcvtl2`; exact).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn f16_to_f32<const HIGH: bool>(h: uint16x8_t) -> float32x4_t {
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
/// dtypes of weight rows, and the attention state's rows ([`StoredType`](crate::kernels::traits::StoredType), the q8 cache's
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
pub(super) unsafe fn f32p_block(p: *const u8, base: uint32x4_t) -> [float32x4_t; 8] {
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
pub(super) unsafe fn dequant_f32p(row: &[u8], out: &mut [f32]) {
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

//! The NEON tiers' row conversions: the q8 activation quantizer, row decoding, f16 narrowing.

use super::float::{dequant_f32p, Widen8};
use super::quant::{scale, Blocks32, Q4, Q8};
use crate::kernels::scalar;
use crate::kernels::traits::{FloatType, BF16, F16, F32};
use crate::quant::{DType, QK};
use core::arch::aarch64::*;
use core::arch::asm;
use half::f16;

/// [`scalar::quantize_act`] 32 values at a time, with the same operations per value
/// (`fcvtns` rounds to nearest even), hence the same bytes.
///
/// # Safety
/// NEON is present.
#[target_feature(enable = "neon")]
pub(super) unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
    let cols = x.len();
    debug_assert_eq!(out.len(), crate::kernels::traits::act_scratch_len(cols));
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
pub(super) unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
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
            DType::I8 | DType::I32 => crate::kernels::scalar::dequant_row(dtype, row, out),
        }
    }
}

/// # Safety
/// NEON is present; `row` holds `out.len()` weights.
#[target_feature(enable = "neon")]
pub(super) unsafe fn widen_row<W: Widen8 + FloatType>(row: &[u8], out: &mut [f32]) {
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
pub(super) unsafe fn blocks_row<B: Blocks32>(row: &[u8], out: &mut [f32]) {
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

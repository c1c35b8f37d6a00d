//! The simd128 tier's float weights: exact widening loads 8 at a time and the f32 / f16 /
//! bf16 tiles.

use crate::kernels::scalar;
use crate::kernels::traits::{FloatType, Kernel, BF16, F16, F32, I8};
use core::arch::wasm32::*;
use core::marker::PhantomData;

/// An element type whose 8 consecutive values widen exactly to two f32x4: the float dtypes
/// of weight rows, and the attention state's rows
/// ([`StoredType`](crate::kernels::traits::StoredType), the q8 cache's [`I8`] included).
pub(crate) trait Widen8 {
    /// # Safety
    /// `p` points at 8 readable values.
    unsafe fn load8(p: *const u8) -> [v128; 2];
}

impl Widen8 for F32 {
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> [v128; 2] {
        // SAFETY: 32 readable bytes; `v128.load` takes any alignment.
        unsafe { [v128_load(p.cast()), v128_load(p.add(16).cast())] }
    }
}

impl Widen8 for F16 {
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> [v128; 2] {
        // SAFETY: 16 readable bytes.
        let h = unsafe { v128_load(p.cast()) };
        [f16x4_to_f32(u32x4_extend_low_u16x8(h)), f16x4_to_f32(u32x4_extend_high_u16x8(h))]
    }
}

impl Widen8 for I8 {
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> [v128; 2] {
        // SAFETY: 8 readable bytes; i8 widens exactly.
        let h = unsafe { i16x8_load_extend_i8x8(p.cast()) };
        [f32x4_convert_i32x4(i32x4_extend_low_i16x8(h)), f32x4_convert_i32x4(i32x4_extend_high_i16x8(h))]
    }
}

impl Widen8 for BF16 {
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> [v128; 2] {
        // SAFETY: 16 readable bytes. bf16 is the top half of an f32.
        let h = unsafe { v128_load(p.cast()) };
        [i32x4_shl(u32x4_extend_low_u16x8(h), 16), i32x4_shl(u32x4_extend_high_u16x8(h), 16)]
    }
}

/// The f32 values of 4 f16s (their bits in the low half of each lane), exactly, as
/// [`Stored::widen`](crate::kernels::Stored::widen) gives them (NaNs quieted): normals
/// re-biased in the exponent, infinities and NaNs re-biased twice, zeros and subnormals
/// converted from their integer mantissa and scaled by 2^-24 (both exact).
#[inline(always)]
pub(super) fn f16x4_to_f32(h: v128) -> v128 {
    let sign = i32x4_shl(v128_and(h, u32x4_splat(0x8000)), 16);
    let mag = v128_and(h, u32x4_splat(0x7fff));
    let exp = v128_and(mag, u32x4_splat(0x7c00));
    let normal = i32x4_add(i32x4_shl(mag, 13), u32x4_splat((127 - 15) << 23));
    let top = i32x4_eq(exp, u32x4_splat(0x7c00));
    // Infinity and NaN: exponent 255, a NaN quieted (the payload's top bit set).
    let quiet = v128_and(i32x4_ne(v128_and(mag, u32x4_splat(0x3ff)), u32x4_splat(0)), u32x4_splat(0x0040_0000));
    let special = v128_or(i32x4_add(normal, u32x4_splat((127 - 15) << 23)), quiet);
    let tiny = f32x4_mul(f32x4_convert_i32x4(mag), f32x4_splat(f32::from_bits((127 - 24) << 23)));
    let bits = v128_bitselect(special, normal, top);
    let bits = v128_bitselect(tiny, bits, i32x4_eq(exp, u32x4_splat(0)));
    v128_or(bits, sign)
}

/// The sum of a vector's 4 lanes (any order: the float tiles differ from the oracle only
/// in summation order, within the tests' budget).
#[inline(always)]
fn sum4(v: v128) -> f32 {
    let h = f32x4_add(v, i32x4_shuffle::<2, 3, 0, 1>(v, v));
    f32x4_extract_lane::<0>(h) + f32x4_extract_lane::<1>(h)
}

/// Float kernel: `R x T` accumulators of 4 lanes fed 8 columns a step (multiply, then
/// add), the `cols % 8` tail in scalar.
pub(crate) struct Float<W>(PhantomData<W>);

impl<W: Widen8 + FloatType> Kernel for Float<W> {
    type Act = f32;

    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[f32]; T], cols: usize) -> [[f32; T]; R] {
        let es = W::DTYPE.block_bytes();
        let body = cols - cols % 8;
        let mut acc = [[f32x4_splat(0.0); T]; R];
        let mut c = 0;
        while c < body {
            let mut x = [[f32x4_splat(0.0); 2]; T];
            for t in 0..T {
                // SAFETY: `a[t]` holds `cols > c + 7` floats.
                x[t] = unsafe { [v128_load(a[t].as_ptr().add(c).cast()), v128_load(a[t].as_ptr().add(c + 4).cast())] };
            }
            for r in 0..R {
                // SAFETY: `w[r]` holds `cols` weights of `es` bytes.
                let [w0, w1] = unsafe { W::load8(w[r].as_ptr().add(c * es)) };
                for t in 0..T {
                    let s = f32x4_add(f32x4_mul(w0, x[t][0]), f32x4_mul(w1, x[t][1]));
                    acc[r][t] = f32x4_add(acc[r][t], s);
                }
            }
            c += 8;
        }
        let mut out = [[0.0; T]; R];
        for r in 0..R {
            for t in 0..T {
                // The `cols % 8` tail (none for the usual widths: skip the call).
                let tail = if body < cols { scalar::dot_row(W::DTYPE, &w[r][body * es..], &a[t][body..]) } else { 0.0 };
                out[r][t] = sum4(acc[r][t]) + tail;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Stored;
    use half::f16;

    /// [`f16x4_to_f32`] gives [`Stored::widen`]'s bits for every f16 bit pattern (NaNs
    /// included), four at a time.
    #[test]
    fn f16_widening_is_exact_for_every_bit_pattern() {
        for h in (0..=u16::MAX).step_by(4) {
            let hs: [u16; 4] = core::array::from_fn(|i| h + i as u16);
            let v = f16x4_to_f32(u32x4(hs[0].into(), hs[1].into(), hs[2].into(), hs[3].into()));
            let got = [
                u32x4_extract_lane::<0>(v),
                u32x4_extract_lane::<1>(v),
                u32x4_extract_lane::<2>(v),
                u32x4_extract_lane::<3>(v),
            ];
            for (g, &h) in got.iter().zip(&hs) {
                assert_eq!(*g, f16::from_bits(h).widen().to_bits(), "f16 {h:#06x}");
            }
        }
    }
}

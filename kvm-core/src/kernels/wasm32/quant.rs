//! The simd128 tier's integer weights: whole-block `i8 x i8` products summed as the scalar
//! tier does, the q8 activation quantizer, and the integer numerics' product.

use super::Simd128;
use crate::kernels::scalar;
use crate::kernels::traits::{act_scratch_len, IntKernel, Kernel};
use crate::quant::{DType, QK};
use core::arch::wasm32::*;
use core::marker::PhantomData;

/// An integer format whose blocks widen to 32 signed bytes, with an f16 scale first.
pub(crate) trait Blocks32 {
    const DTYPE: DType;

    /// The 32 weights of the block at `p`, as i8.
    ///
    /// # Safety
    /// `p` points at one whole block.
    unsafe fn load32(p: *const u8) -> [v128; 2];
}

/// q8_0 blocks.
pub(crate) struct Q8;

/// q4_0 blocks.
pub(crate) struct Q4;

impl Blocks32 for Q8 {
    const DTYPE: DType = DType::Q8_0;

    #[inline(always)]
    unsafe fn load32(p: *const u8) -> [v128; 2] {
        // SAFETY: a block is the 2 scale bytes then 32 weights.
        unsafe { [v128_load(p.add(2).cast()), v128_load(p.add(18).cast())] }
    }
}

impl Blocks32 for Q4 {
    const DTYPE: DType = DType::Q4_0;

    #[inline(always)]
    unsafe fn load32(p: *const u8) -> [v128; 2] {
        // SAFETY: a block is the 2 scale bytes then 16 bytes of nibbles: weight `i` in the
        // low nibble of byte `i`, weight `16 + i` in its high nibble.
        let q = unsafe { v128_load(p.add(2).cast()) };
        let eight = i8x16_splat(8);
        [i8x16_sub(v128_and(q, u8x16_splat(15)), eight), i8x16_sub(u8x16_shr(q, 4), eight)]
    }
}

/// The exact i32 dot product of a weight block and an activation block: products in i16
/// (at most 128 * 127), two of them added in i16 (at most 32512), pairs widened into i32.
#[inline(always)]
fn dot32(w: [v128; 2], a: [v128; 2]) -> i32 {
    let p: [v128; 2] = core::array::from_fn(|k| {
        let s = i16x8_add(i16x8_extmul_low_i8x16(w[k], a[k]), i16x8_extmul_high_i8x16(w[k], a[k]));
        i32x4_extadd_pairwise_i16x8(s)
    });
    let s = i32x4_add(p[0], p[1]);
    let s = i32x4_add(s, i32x4_shuffle::<2, 3, 0, 1>(s, s));
    i32x4_extract_lane::<0>(s).wrapping_add(i32x4_extract_lane::<1>(s))
}

/// Integer kernel: each block's exact sum by [`dot32`], its term and the canonical sum of
/// the terms as [`scalar::dot_q8_0`] makes them ([`scalar::block_term`]'s operations: the
/// f16 scale widened exactly, two multiplies, no FMA; term `b` into accumulator `b % 8`).
pub(crate) struct Quant<B>(PhantomData<B>);

impl<B: Blocks32> Kernel for Quant<B> {
    type Act = u8;

    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[u8]; T], cols: usize) -> [[f32; T]; R] {
        let (nb, bb) = (cols / QK, B::DTYPE.block_bytes());
        let mut acc = [[[0.0f32; scalar::LANES]; T]; R];
        for b in 0..nb {
            let mut av = [[i8x16_splat(0); 2]; T];
            let mut da = [0.0f32; T];
            for t in 0..T {
                // SAFETY: `a[t]` holds `cols` values then `nb` f32 scales.
                unsafe {
                    let p = a[t].as_ptr().add(b * QK);
                    av[t] = [v128_load(p.cast()), v128_load(p.add(16).cast())];
                    da[t] = f32::from_le_bytes(a[t].as_ptr().add(cols + 4 * b).cast::<[u8; 4]>().read());
                }
            }
            for r in 0..R {
                // SAFETY: `w[r]` holds `nb` blocks of `bb` bytes.
                let (wv, dw) = unsafe {
                    let p = w[r].as_ptr().add(b * bb);
                    (B::load32(p), scalar::widen_f16(u16::from_le_bytes(p.cast::<[u8; 2]>().read())))
                };
                for t in 0..T {
                    acc[r][t][b % scalar::LANES] += dw * da[t] * dot32(wv, av[t]) as f32;
                }
            }
        }
        acc.map(|row| row.map(scalar::reduce_lanes))
    }
}

/// [`scalar::quantize_act`] 32 values at a time, with the same operations per value
/// (`f32x4.nearest` rounds ties to even, as the oracle's `round_even`), hence the same
/// bytes. Safe: the module is compiled with `simd128` and every access is a whole chunk.
pub(super) fn quantize_act(x: &[f32], out: &mut [u8]) {
    let cols = x.len();
    debug_assert_eq!(out.len(), act_scratch_len(cols));
    let (qs, ds) = out.split_at_mut(cols);
    for ((xs, q), d) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(ds.chunks_exact_mut(4)) {
        // SAFETY: `xs` holds 32 floats.
        let v: [v128; 8] = core::array::from_fn(|i| unsafe { v128_load(xs.as_ptr().add(4 * i).cast()) });
        // The largest magnitude (exact whatever the order; finite inputs only).
        let m = v.iter().fold(f32x4_splat(0.0), |m, &v| f32x4_max(m, f32x4_abs(v)));
        let amax = [
            f32x4_extract_lane::<0>(m),
            f32x4_extract_lane::<1>(m),
            f32x4_extract_lane::<2>(m),
            f32x4_extract_lane::<3>(m),
        ]
        .into_iter()
        .fold(0.0f32, f32::max);
        let (scale, inv) = scalar::act_scale(amax);
        d.copy_from_slice(&scale.to_le_bytes());
        let inv = f32x4_splat(inv);
        let q32: [v128; 8] = core::array::from_fn(|i| i32x4_trunc_sat_f32x4(f32x4_nearest(f32x4_mul(v[i], inv))));
        let q16: [v128; 4] = core::array::from_fn(|i| i16x8_narrow_i32x4(q32[2 * i], q32[2 * i + 1]));
        // SAFETY: `q` holds 32 bytes.
        unsafe {
            v128_store(q.as_mut_ptr().cast(), i8x16_narrow_i16x8(q16[0], q16[1]));
            v128_store(q.as_mut_ptr().add(16).cast(), i8x16_narrow_i16x8(q16[2], q16[3]));
        }
    }
}

/// The integer numerics' product ([`crate::kernels::matvec_i8`]): 16 i8 weights widen to
/// i16 and meet 16 input values in `i32x4.dot_i16x8_s` (each pair at most 2^23), lanes and
/// their sum wrapping as the scalar oracle's partial sums do (the same sum modulo 2^32).
impl IntKernel for Simd128 {
    const LANES: usize = 16;

    unsafe fn sums<const R: usize>(q: [&[i8]; R], x: &[i16]) -> [i32; R] {
        debug_assert!(x.len().is_multiple_of(Self::LANES) && q.iter().all(|q| q.len() >= x.len()));
        let mut acc = [i32x4_splat(0); R];
        for c in (0..x.len()).step_by(Self::LANES) {
            // SAFETY: `x` holds `c + 16` values.
            let (x0, x1) = unsafe { (v128_load(x.as_ptr().add(c).cast()), v128_load(x.as_ptr().add(c + 8).cast())) };
            for r in 0..R {
                // SAFETY: `q[r]` holds at least `x.len()` weights.
                let w = unsafe { v128_load(q[r].as_ptr().add(c).cast()) };
                let d = i32x4_add(
                    i32x4_dot_i16x8(i16x8_extend_low_i8x16(w), x0),
                    i32x4_dot_i16x8(i16x8_extend_high_i8x16(w), x1),
                );
                acc[r] = i32x4_add(acc[r], d);
            }
        }
        acc.map(|a| {
            let s = i32x4_add(a, i32x4_shuffle::<2, 3, 0, 1>(a, a));
            i32x4_extract_lane::<0>(s).wrapping_add(i32x4_extract_lane::<1>(s))
        })
    }
}

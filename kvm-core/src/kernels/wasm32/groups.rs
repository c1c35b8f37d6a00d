//! The simd128 tier's row-interleaved q4_0x16 and q8_0x16 groups: a vector holds 4 bytes of
//! each of 4 rows, so the activation quad they meet is one lane broadcast, and a block's
//! exact sums for 4 rows come out as one vector.

use super::float::f16x4_to_f32;
use crate::kernels::scalar;
use crate::kernels::traits::GroupKernel;
use crate::quant::{GroupQ4_0x16, GroupQ8_0x16, QK, X16};
use core::arch::wasm32::*;
use core::marker::PhantomData;

/// The blocks of an interleaved dtype: after a group block's 16 f16 scales, pieces of 64
/// bytes, each the same 4 bytes of all 16 rows, so 16 bytes of a piece are 4 bytes of each
/// of 4 rows.
pub(crate) trait X16Blocks {
    /// Bytes of one group block (16 scales, then the quant bytes).
    const GROUP_BYTES: usize;

    /// Row quad `j` of a group block (`q`: `16 j` bytes past its scales) as signed weights:
    /// bytes `4r..4r + 4` of vector `v` are row `4j + r`'s weights `4v..4v + 4`, so vector
    /// `v` meets quad `v` of the activation block.
    ///
    /// # Safety
    /// `q` points into a whole group block as above.
    unsafe fn load4rows(q: *const u8) -> [v128; 8];
}

/// q4_0x16 groups.
pub(crate) struct Q4x16;

/// q8_0x16 groups.
pub(crate) struct Q8x16;

impl X16Blocks for Q4x16 {
    const GROUP_BYTES: usize = size_of::<GroupQ4_0x16>();

    #[inline(always)]
    unsafe fn load4rows(q: *const u8) -> [v128; 8] {
        let (mut w, eight) = ([i8x16_splat(0); 8], i8x16_splat(8));
        for v in 0..4 {
            // SAFETY: 4 pieces of 64 bytes from the block's quant bytes. Piece `v` holds
            // weights `4v..4v + 4` (low nibbles) and `16 + 4v..` (high), plus 8.
            let p = unsafe { v128_load(q.add(64 * v).cast()) };
            w[v] = i8x16_sub(v128_and(p, u8x16_splat(15)), eight);
            w[4 + v] = i8x16_sub(u8x16_shr(p, 4), eight);
        }
        w
    }
}

impl X16Blocks for Q8x16 {
    const GROUP_BYTES: usize = size_of::<GroupQ8_0x16>();

    #[inline(always)]
    unsafe fn load4rows(q: *const u8) -> [v128; 8] {
        // SAFETY: 8 pieces of 64 bytes from the block's quant bytes.
        core::array::from_fn(|v| unsafe { v128_load(q.add(64 * v).cast()) })
    }
}

/// The activation quad each of [`X16Blocks::load4rows`]' vectors meets (`v`: quad `v` of
/// the block `a`), repeated across a vector.
#[inline(always)]
fn quads(a: [v128; 2]) -> [v128; 8] {
    let [a0, a1] = a;
    [
        i32x4_shuffle::<0, 0, 0, 0>(a0, a0),
        i32x4_shuffle::<1, 1, 1, 1>(a0, a0),
        i32x4_shuffle::<2, 2, 2, 2>(a0, a0),
        i32x4_shuffle::<3, 3, 3, 3>(a0, a0),
        i32x4_shuffle::<0, 0, 0, 0>(a1, a1),
        i32x4_shuffle::<1, 1, 1, 1>(a1, a1),
        i32x4_shuffle::<2, 2, 2, 2>(a1, a1),
        i32x4_shuffle::<3, 3, 3, 3>(a1, a1),
    ]
}

/// `[row 0, row 1, row 2, row 3]` exact sums of `w` (as [`X16Blocks::load4rows`]) with
/// the activation quads `x` ([`quads`]): products in i16 (at most 128 * 127), two pieces'
/// added in i16 (at most 32512), then widened pairwise into i32, two lanes a row.
#[inline(always)]
fn dot4rows(w: &[v128; 8], x: &[v128; 8]) -> v128 {
    let (mut lo, mut hi) = (i32x4_splat(0), i32x4_splat(0));
    for v in (0..8).step_by(2) {
        let l = i16x8_add(i16x8_extmul_low_i8x16(w[v], x[v]), i16x8_extmul_low_i8x16(w[v + 1], x[v + 1]));
        let h = i16x8_add(i16x8_extmul_high_i8x16(w[v], x[v]), i16x8_extmul_high_i8x16(w[v + 1], x[v + 1]));
        lo = i32x4_add(lo, i32x4_extadd_pairwise_i16x8(l));
        hi = i32x4_add(hi, i32x4_extadd_pairwise_i16x8(h));
    }
    i32x4_add(i32x4_shuffle::<0, 2, 4, 6>(lo, hi), i32x4_shuffle::<1, 3, 5, 7>(lo, hi))
}

/// Interleaved groups, one token at a time: accumulator `b % 8` of the canonical sum
/// ([`scalar::sum_blocks`]) of 4 rows is one f32x4, each block's terms made as
/// [`scalar::block_term`] makes them (the f16 scales widened exactly, two multiplies).
pub(crate) struct Interleaved<B>(PhantomData<B>);

impl<B: X16Blocks> GroupKernel for Interleaved<B> {
    unsafe fn group<const T: usize>(g: &[u8], a: [&[u8]; T], cols: usize) -> [[f32; X16]; T] {
        let (nb, gb) = (cols / QK, B::GROUP_BYTES);
        debug_assert_eq!(g.len(), nb * gb);
        let mut out = [[0.0; X16]; T];
        for (o, a) in out.iter_mut().zip(a) {
            // `acc[k][j]`: accumulator `k` of rows `4j..4j + 4`.
            let mut acc = [[f32x4_splat(0.0); 4]; scalar::LANES];
            for b in 0..nb {
                // SAFETY: `g` holds `nb` group blocks; `a` a whole activation (`cols`
                // values, then `nb` f32 scales).
                unsafe {
                    let wb = g.as_ptr().add(b * gb);
                    let p = a.as_ptr().add(b * QK);
                    let x = quads([v128_load(p.cast()), v128_load(p.add(16).cast())]);
                    let da = f32x4_splat(f32::from_le_bytes(a.as_ptr().add(cols + 4 * b).cast::<[u8; 4]>().read()));
                    let h = [v128_load(wb.cast()), v128_load(wb.add(16).cast())];
                    let q = wb.add(2 * X16);
                    for j in 0..4 {
                        let dw = f16x4_to_f32(if j % 2 == 0 {
                            u32x4_extend_low_u16x8(h[j / 2])
                        } else {
                            u32x4_extend_high_u16x8(h[j / 2])
                        });
                        let isum = dot4rows(&B::load4rows(q.add(16 * j)), &x);
                        let term = f32x4_mul(f32x4_mul(dw, da), f32x4_convert_i32x4(isum));
                        acc[b % scalar::LANES][j] = f32x4_add(acc[b % scalar::LANES][j], term);
                    }
                }
            }
            for (j, o) in o.chunks_exact_mut(4).enumerate() {
                // `scalar::reduce_lanes`' tree, 4 rows a vector.
                let s = f32x4_add(
                    f32x4_add(f32x4_add(acc[0][j], acc[1][j]), f32x4_add(acc[2][j], acc[3][j])),
                    f32x4_add(f32x4_add(acc[4][j], acc[5][j]), f32x4_add(acc[6][j], acc[7][j])),
                );
                // SAFETY: `o` holds 4 floats.
                unsafe { v128_store(o.as_mut_ptr().cast(), s) };
            }
        }
        out
    }
}

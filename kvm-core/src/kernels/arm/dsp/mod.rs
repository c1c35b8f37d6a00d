//! The DSP tier: Armv7E-M and Armv8-M Mainline with the DSP extension (Cortex-M4, M7, M33),
//! chosen at build time (`kvm_arm_dsp`, set by the crate's build script when the target's
//! code generation has the extension).
//!
//! Integer formats multiply with `smlad`, two signed 16 x 16 products added into an i32,
//! on pairs of values spread to halfwords: `sxtb16` takes bytes 0 and 2 of a word of q8
//! values (rotated by 8, bytes 1 and 3), and one mask with a shift takes q4_0's nibbles in
//! the same two positions. An activation block is spread once ([`Spread`]) and meets every
//! row of a tile, or, for the interleaved layouts, of every group of the matrix. q4_0's
//! offset of 8 comes out of the sum as `8 * sum(a)`, exact in i32. So the block sums are
//! the scalar tier's, and what follows them is its f32 operations in its order
//! ([`scalar::block_term`], the lanes of [`scalar::sum_blocks`]), so the bits are too. A
//! weight or activation that is not on a 4-byte boundary (never in a model file, whose
//! tensors are 64-aligned) runs the scalar kernel.
//!
//! Float weights, softmax and attention over f16 and q8 rows are the scalar tier's:
//! single-precision FPUs have no SIMD, so any other order would only change the bits;
//! attention over f32 rows is [`super::fpu`]'s assembly in the scalar order. The
//! activation quantizer finds each block's largest magnitude in integer compares
//! (`f32::max` is a library call on these FPUs). A group block takes two `asm!` blocks:
//! one for its 16 rows' integer sums ([`Quant::block`]), one for their scale terms into
//! the rows' lanes ([`add_terms`](groups::add_terms): `vldm` loads 8 scales or sums at
//! once, `vcvtb`/`vcvtt` widen the f16 scales, and since stable rustc grants the `sreg`
//! register class only to double-precision FPUs, the block pushes and pops the FPU
//! registers it uses); the lanes are never zeroed, and `fpu`'s
//! [`reduce`](super::fpu::reduce) adds each row's lanes 8 rows at a time
//! ([`groups::dot_groups`]).
//!
//! Off Arm (host tests), [`op`] emulates the few instructions, so the host checks the
//! kernels' arithmetic against the scalar tier; the Arm code itself is checked on the
//! boards (`scripts/mcu-conformance.sh`).
//!
//! The block sums of each format are in [`quant`]; the row-interleaved kernel, with its
//! scale terms, in [`groups`]; the row-major kernel here.

mod groups;
mod quant;
#[cfg(test)]
pub(super) mod tests;

pub(crate) use groups::Groups;
pub(crate) use quant::{Q4, Q8};

use crate::kernels::scalar::{self, LANES};
use crate::kernels::traits::{Kernel, Kernels, BF16, F16, F32, F32P};
use crate::quant::{DType, QK};
use quant::Quant;

/// The DSP tier.
#[derive(Debug)]
pub(crate) struct Dsp;

impl Kernels for Dsp {
    type F32 = scalar::Float<F32>;
    type F16 = scalar::Float<F16>;
    type BF16 = scalar::Float<BF16>;
    type Q8_0 = Rows<Q8>;
    type Q4_0 = Rows<Q4>;
    type Q4_0x16 = Groups<Q4>;
    type Q8_0x16 = Groups<Q8>;
    type F32P = scalar::Float<F32P>;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        quantize_act(x, out)
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        scalar::dequant_row(dtype, row, out)
    }
}

/// The DSP instructions the kernels use, one function each (`asm!` on Arm; the same
/// results in plain Rust elsewhere, for the host's tests).
pub(crate) mod op {
    #[cfg(kvm_arm_dsp)]
    use core::arch::asm;

    /// Bytes 0 and 2 of `x`, sign-extended into the two halfwords (`sxtb16`).
    #[inline(always)]
    pub fn sxtb16(x: u32) -> u32 {
        #[cfg(kvm_arm_dsp)]
        {
            let r: u32;
            // SAFETY: a register-only instruction of the DSP extension, which this build has.
            unsafe {
                asm!("sxtb16 {r}, {x}", r = lateout(reg) r, x = in(reg) x, options(pure, nomem, nostack, preserves_flags))
            };
            r
        }
        #[cfg(not(kvm_arm_dsp))]
        {
            let half = |b: u32| (b as u8 as i8 as i16 as u16) as u32;
            half(x) | half(x >> 16) << 16
        }
    }

    /// Bytes 1 and 3 of `x`, sign-extended into the two halfwords (`sxtb16 ..., ror #8`).
    #[inline(always)]
    pub fn sxtb16_ror8(x: u32) -> u32 {
        #[cfg(kvm_arm_dsp)]
        {
            let r: u32;
            // SAFETY: as in `sxtb16`.
            unsafe {
                asm!("sxtb16 {r}, {x}, ror #8", r = lateout(reg) r, x = in(reg) x, options(pure, nomem, nostack, preserves_flags))
            };
            r
        }
        #[cfg(not(kvm_arm_dsp))]
        {
            sxtb16(x.rotate_right(8))
        }
    }

    /// `acc + a.lo * b.lo + a.hi * b.hi`, the halfwords signed, wrapping (`smlad`).
    #[inline(always)]
    pub fn smlad(a: u32, b: u32, acc: i32) -> i32 {
        #[cfg(kvm_arm_dsp)]
        {
            let r: i32;
            // SAFETY: as in `sxtb16`; it may set the Q (saturation) flag, which nothing
            // reads, so the flags are not declared preserved.
            unsafe {
                asm!("smlad {r}, {a}, {b}, {acc}", r = lateout(reg) r, a = in(reg) a, b = in(reg) b, acc = in(reg) acc, options(pure, nomem, nostack))
            };
            r
        }
        #[cfg(not(kvm_arm_dsp))]
        {
            let lo = |x: u32| x as u16 as i16 as i32;
            let hi = |x: u32| (x >> 16) as u16 as i16 as i32;
            acc.wrapping_add(lo(a) * lo(b)).wrapping_add(hi(a) * hi(b))
        }
    }

    /// `acc` plus the sum of the four bytes of `x`, unsigned (`usada8` against zero).
    #[inline(always)]
    pub fn usada8(x: u32, acc: u32) -> u32 {
        #[cfg(kvm_arm_dsp)]
        {
            let r: u32;
            // SAFETY: as in `sxtb16`.
            unsafe {
                asm!("usada8 {r}, {x}, {z}, {acc}", r = lateout(reg) r, x = in(reg) x, z = in(reg) 0u32, acc = in(reg) acc, options(pure, nomem, nostack, preserves_flags))
            };
            r
        }
        #[cfg(not(kvm_arm_dsp))]
        {
            x.to_le_bytes().iter().fold(acc, |s, &b| s.wrapping_add(u32::from(b)))
        }
    }
}

use op::{sxtb16, sxtb16_ror8, usada8};

/// The f32 value of the f16 in the low half of `h`, exactly (`f16_le`'s value): the f16's
/// magnitude bits moved to an f32's place (which makes normals and subnormals alike
/// `2^-112` times their value) scaled by `2^112`, which is exact; infinities and NaNs,
/// which no real scale is, by [`scalar::widen_f16`].
#[inline(always)]
fn f16_low(h: u32) -> f32 {
    let mag = (h & 0x7fff) << 13;
    if mag >= 0x1f << 23 {
        return scalar::widen_f16(h as u16);
    }
    f32::from_bits(mag | (h & 0x8000) << 16) * f32::from_bits((127 + 112) << 23)
}

/// Quantizes `x` as [`scalar::quantize_act`] does, to the same bytes. The largest
/// magnitude comes from integer compares of the bits shifted past the sign (magnitudes of
/// floats order as their bits do); a block with a NaN, which `f32::max` would skip, is
/// quantized by the scalar tier. The rounding adds `1.5 * 2^23`, as the scalar tier does,
/// and takes the integer from the sum's low mantissa byte instead of subtracting again.
pub(crate) fn quantize_act(x: &[f32], out: &mut [u8]) {
    const MAGIC: f32 = 12_582_912.0;
    let (qs, ds) = out.split_at_mut(x.len());
    for ((xs, q), d) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(ds.chunks_exact_mut(4)) {
        let top = xs.iter().fold(0u32, |m, v| m.max(v.to_bits() << 1)) >> 1;
        if top > 0x7f80_0000 {
            let mut block = [0u8; QK + 4];
            scalar::quantize_act(xs, &mut block);
            q.copy_from_slice(&block[..QK]);
            d.copy_from_slice(&block[QK..]);
            continue;
        }
        let (scale, inv) = scalar::act_scale(f32::from_bits(top));
        d.copy_from_slice(&scale.to_le_bytes());
        for (q, &v) in q.iter_mut().zip(xs) {
            // |v * inv| <= 127 (or NaN from inf * 0, whose default NaN's low byte is 0 as
            // the scalar `NaN as i8` is).
            *q = (v * inv + MAGIC).to_bits() as u8;
        }
    }
}

/// One q8 activation block spread into halfword pairs: word `v` of the block (values
/// `4v..4v + 4`) gives `w[2v]` = values `4v, 4v + 2` and `w[2v + 1]` = `4v + 1, 4v + 3`
/// (one `ldrd` loads both); then, for q4_0, the `-8 * sum` of its values twice, where
/// q4_0's sums start (one `ldrd` loads two of them).
#[repr(C, align(8))]
pub(crate) struct Spread {
    w: [u32; QK / 2],
    off: [i32; 2],
}

impl Spread {
    /// The block of `words` spread, with its `off` when `SUM` (else zero): each byte `b`
    /// counted as the unsigned `b ^ 0x80 = b + 128` as the word is spread, so the sum costs
    /// two instructions a word and no reloads.
    #[inline(always)]
    fn new<const SUM: bool>(words: &[u32; QK / 4]) -> Spread {
        let mut biased = 0u32;
        let w = core::array::from_fn(|i| {
            let x = words[i / 2];
            if i % 2 == 0 {
                if SUM {
                    biased = usada8(x ^ 0x8080_8080, biased);
                }
                sxtb16(x)
            } else {
                sxtb16_ror8(x)
            }
        });
        // sum (n - 8) * a = sum n * a - 8 * sum a, with sum a = biased - 128 * 32.
        let off = if SUM { (128 * QK as i32 - biased as i32).wrapping_mul(8) } else { 0 };
        Spread { w, off: [off; 2] }
    }

    /// Values `4v, 4v + 2`, as [`Spread::w`] says.
    #[inline(always)]
    fn e(&self, v: usize) -> u32 {
        self.w[2 * v]
    }

    /// Values `4v + 1, 4v + 3`.
    #[inline(always)]
    fn o(&self, v: usize) -> u32 {
        self.w[2 * v + 1]
    }
}

/// A q8 activation (`[act_scratch_len(cols)]` bytes) as its blocks' words and scales' bits;
/// `None` if its values are not on a 4-byte boundary.
#[inline(always)]
fn act_words(act: &[u8], cols: usize) -> Option<(&[[u32; QK / 4]], &[u32])> {
    let (qs, ds) = act.split_at(cols);
    Some((bytemuck::try_cast_slice(qs).ok()?, bytemuck::try_cast_slice(ds).ok()?))
}

/// The scale of an activation block from its bits as stored (little-endian).
#[inline(always)]
fn act_scale(bits: u32) -> f32 {
    f32::from_bits(u32::from_le(bits))
}

/// The DSP kernel of a row-major integer dtype (q8_0 or q4_0).
pub(crate) struct Rows<Q>(core::marker::PhantomData<Q>);

impl<Q: Quant> Kernel for Rows<Q> {
    type Act = u8;

    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[u8]; T], cols: usize) -> [[f32; T]; R] {
        let mut out = [[0.0; T]; R];
        for (t, a) in a.into_iter().enumerate() {
            let Some((qs, ds)) = act_words(a, cols) else {
                for (o, w) in out.iter_mut().zip(w) {
                    o[t] = scalar_row::<Q>(w, a, cols);
                }
                continue;
            };
            let bb = 2 + 4 * Q::WORDS;
            let mut acc = [[0.0f32; LANES]; R];
            for (b, (words, &da)) in qs.iter().zip(ds).enumerate().take(cols / QK) {
                let spread = if Q::NEEDS_SUM { Spread::new::<true>(words) } else { Spread::new::<false>(words) };
                let da = act_scale(da);
                for (acc, w) in acc.iter_mut().zip(w) {
                    let block = &w[b * bb..(b + 1) * bb];
                    let isum = Q::isum(Q::words(&block[2..]), &spread);
                    let dw = f16_low(u32::from(u16::from_le_bytes([block[0], block[1]])));
                    acc[b % LANES] += dw * da * isum as f32;
                }
            }
            for (o, acc) in out.iter_mut().zip(acc) {
                o[t] = scalar::reduce_lanes(acc);
            }
        }
        out
    }
}

/// The scalar kernel of `Q`'s row-major dtype.
fn scalar_row<Q: Quant>(w: &[u8], a: &[u8], cols: usize) -> f32 {
    if Q::NEEDS_SUM {
        scalar::dot_q4_0(w, a, cols)
    } else {
        scalar::dot_q8_0(w, a, cols)
    }
}

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
//! the rows' lanes ([`add_terms`]: `vldm` loads 8 scales or sums at once,
//! `vcvtb`/`vcvtt` widen the f16 scales, and since stable rustc grants the `sreg` register
//! class only to double-precision FPUs, the block pushes and pops the FPU registers it
//! uses); the lanes are never zeroed, and `fpu`'s [`reduce`] adds each row's lanes 8 rows
//! at a time ([`dot_groups`]).
//!
//! Off Arm (host tests), [`op`] emulates the few instructions, so the host checks the
//! kernels' arithmetic against the scalar tier; the Arm code itself is checked on the
//! boards (`scripts/mcu-conformance.sh`).

use core::mem::MaybeUninit;

use super::fpu::{reduce, Lanes};
use crate::kernels::scalar::{self, LANES};
use crate::kernels::traits::{GroupKernel, Kernel, Kernels, BF16, F16, F32, F32P};
use crate::quant::{DType, QK, X16};

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

use op::{smlad, sxtb16, sxtb16_ror8, usada8};

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

/// One multiply-accumulate of a spread pair in [`Q8::block`]'s assembly: `smuad` for a
/// sum's first product (so no sum is zeroed first), `smlad` for the others.
#[cfg(kvm_arm_dsp)]
macro_rules! mac {
    (first, $s:literal, $x:literal) => {
        concat!("smuad {", $s, "}, {t}, {", $x, "}\n")
    };
    (next, $s:literal, $x:literal) => {
        concat!("smlad {", $s, "}, {t}, {", $x, "}, {", $s, "}\n")
    };
}

/// One piece of [`Q8::block`]'s assembly for 4 rows: activation pair `$a` (byte offset),
/// then the 4 rows' words at byte offset `$w` of the piece, two by two; `$f` is `first`
/// for piece 0.
#[cfg(kvm_arm_dsp)]
macro_rules! q8_piece {
    ($f:tt, $a:literal, $w:literal, $w2:literal) => {
        concat!(
            "ldrd {e}, {o}, [{a}, #",
            $a,
            "]\n",
            "ldrd {w0}, {w1}, [{p}, #",
            $w,
            "]\n",
            "sxtb16 {t}, {w0}\n",
            mac!($f, "s0", "e"),
            "sxtb16 {t}, {w0}, ror #8\n",
            mac!(next, "s0", "o"),
            "sxtb16 {t}, {w1}\n",
            mac!($f, "s1", "e"),
            "sxtb16 {t}, {w1}, ror #8\n",
            mac!(next, "s1", "o"),
            "ldrd {w0}, {w1}, [{p}, #",
            $w2,
            "]\n",
            "sxtb16 {t}, {w0}\n",
            mac!($f, "s2", "e"),
            "sxtb16 {t}, {w0}, ror #8\n",
            mac!(next, "s2", "o"),
            "sxtb16 {t}, {w1}\n",
            mac!($f, "s3", "e"),
            "sxtb16 {t}, {w1}, ror #8\n",
            mac!(next, "s3", "o"),
        )
    };
}

/// 4 rows of [`Q8::block`] (from `{p}`): the 8 pieces, then the 4 sums stored at `{out}`,
/// which moves past them.
#[cfg(kvm_arm_dsp)]
macro_rules! q8_rows4 {
    () => {
        concat!(
            q8_piece!(first, 0, 0, 8),
            q8_piece!(next, 8, 64, 72),
            q8_piece!(next, 16, 128, 136),
            q8_piece!(next, 24, 192, 200),
            q8_piece!(next, 32, 256, 264),
            q8_piece!(next, 40, 320, 328),
            q8_piece!(next, 48, 384, 392),
            q8_piece!(next, 56, 448, 456),
            "strd {s0}, {s1}, [{out}], #8\n",
            "strd {s2}, {s3}, [{out}], #8\n",
        )
    };
}

/// One row of one piece of [`Q4::block`]'s assembly: the word in register `$w`, its four
/// nibble pairs (masked by `r7`, `0x000f000f`) into the sum in register `$s`.
#[cfg(kvm_arm_dsp)]
macro_rules! q4_row {
    ($w:literal, $s:literal) => {
        concat!(
            "and {t}, r7, ",
            $w,
            "\n smlad ",
            $s,
            ", {t}, {e}, ",
            $s,
            "\n",
            "and {t}, r7, ",
            $w,
            ", lsr #8\n smlad ",
            $s,
            ", {t}, {o}, ",
            $s,
            "\n",
            "and {t}, r7, ",
            $w,
            ", lsr #4\n smlad ",
            $s,
            ", {t}, {e2}, ",
            $s,
            "\n",
            "and {t}, r7, ",
            $w,
            ", lsr #12\n smlad ",
            $s,
            ", {t}, {o2}, ",
            $s,
            "\n",
        )
    };
}

/// One piece of [`Q4::block`]'s assembly for 4 rows: the activation pairs of its low
/// (`$a`) and high (`$a2`) nibbles, then the 4 rows' words from byte offset `$w`, two
/// rows to an `ldrd`.
#[cfg(kvm_arm_dsp)]
macro_rules! q4_piece {
    ($a:literal, $a2:literal, $w:literal, $w2:literal) => {
        concat!(
            "ldrd {e}, {o}, [{a}, #",
            $a,
            "]\n",
            "ldrd {e2}, {o2}, [{a}, #",
            $a2,
            "]\n",
            "ldrd {w0}, {w1}, [{p}, #",
            $w,
            "]\n",
            q4_row!("{w0}", "{s0}"),
            q4_row!("{w1}", "{s1}"),
            "ldrd {w0}, {w1}, [{p}, #",
            $w2,
            "]\n",
            q4_row!("{w0}", "{s2}"),
            q4_row!("{w1}", "{s3}"),
        )
    };
}

/// 4 rows of [`Q4::block`] (from `{p}`): the sums start at `-8 * sum(a)`
/// (the spread block's `off`), take the 4 pieces, and are stored at byte offset `$o` of
/// the output, whose address was pushed last.
#[cfg(kvm_arm_dsp)]
macro_rules! q4_rows4 {
    ($o:literal, $o2:literal) => {
        concat!(
            "ldrd {s0}, {s1}, [{a}, #64]\n",
            "ldrd {s2}, {s3}, [{a}, #64]\n",
            q4_piece!(0, 32, 0, 8),
            q4_piece!(8, 40, 64, 72),
            q4_piece!(16, 48, 128, 136),
            q4_piece!(24, 56, 192, 200),
            "ldr {t}, [sp]\n",
            "strd {s0}, {s1}, [{t}, #",
            $o,
            "]\n",
            "strd {s2}, {s3}, [{t}, #",
            $o2,
            "]\n",
        )
    };
}

/// An integer weight format: its words per block and the exact block sums of its rows'
/// words with a spread activation block.
pub(crate) trait Quant {
    /// Quant words per block and row (q8_0: 8, q4_0: 4).
    const WORDS: usize;
    /// A block's quant words as one row stores them.
    type Words: Copy;
    /// Whether [`Quant::isum`] needs the activation block's sum ([`Spread`]'s `off`).
    const NEEDS_SUM: bool;

    /// The block's quant words from its plain bytes (`WORDS * 4` of them).
    fn words(qs: &[u8]) -> Self::Words;

    /// The exact integer dot product of the block with the activation block `a`.
    fn isum(w: Self::Words, a: &Spread) -> i32;

    /// [`Quant::isum`] of the 16 rows of a group block whose pieces are `qs` (`[WORDS][16]`
    /// words), into `out`.
    fn block(qs: &[[u32; X16]], a: &Spread, out: &mut MaybeUninit<[i32; X16]>);

    /// [`dot_groups`] of the format's interleaved layout.
    fn dot_groups(w: &[u8], a: &[u8], cols: usize, ys: &mut [f32]) -> bool;

    /// The scalar tier's rows of one group of the interleaved layout (`g`) . `a`.
    fn scalar_group(g: &[u8], a: &[u8], cols: usize) -> [f32; X16];
}

/// q8_0 (and q8_0x16) quants.
pub(crate) struct Q8;
/// q4_0 (and q4_0x16) quants.
pub(crate) struct Q4;

impl Quant for Q8 {
    const WORDS: usize = QK / 4;
    type Words = [u32; QK / 4];
    const NEEDS_SUM: bool = false;

    #[inline(always)]
    fn words(qs: &[u8]) -> [u32; QK / 4] {
        core::array::from_fn(|v| u32::from_le_bytes([qs[4 * v], qs[4 * v + 1], qs[4 * v + 2], qs[4 * v + 3]]))
    }

    #[inline(always)]
    fn isum(w: [u32; QK / 4], a: &Spread) -> i32 {
        let mut s = 0;
        for (v, &x) in w.iter().enumerate() {
            s = smlad(sxtb16(x), a.e(v), s);
            s = smlad(sxtb16_ror8(x), a.o(v), s);
        }
        s
    }

    /// In assembly on Arm, 4 rows at a time: each spread pair meets 4 rows' words loaded
    /// side by side, with the 4 sums in registers (the compiler keeps neither the spread
    /// block nor the sums in registers across the pieces).
    #[inline(always)]
    fn block(qs: &[[u32; X16]], a: &Spread, out: &mut MaybeUninit<[i32; X16]>) {
        assert!(qs.len() == Self::WORDS);
        #[cfg(kvm_arm_dsp)]
        // SAFETY: `p` points at row 0 of piece 0 of `[8][16]` words and moves 4 rows at a
        // time, so offsets 64v + 4k (v < 8, k < 4) from it stay in bounds and word-aligned;
        // `a` points at 16 words, 8-aligned; `out` at 16 words, written once each.
        unsafe {
            core::arch::asm!(
                q8_rows4!(),
                "add {p}, {p}, #16",
                q8_rows4!(),
                "add {p}, {p}, #16",
                q8_rows4!(),
                "add {p}, {p}, #16",
                q8_rows4!(),
                p = inout(reg) qs.as_ptr() => _,
                a = in(reg) core::ptr::from_ref(a),
                out = inout(reg) out.as_mut_ptr() => _,
                e = out(reg) _, o = out(reg) _, w0 = out(reg) _, w1 = out(reg) _, t = out(reg) _,
                s0 = out(reg) _, s1 = out(reg) _, s2 = out(reg) _, s3 = out(reg) _,
                options(nostack),
            );
        }
        #[cfg(not(kvm_arm_dsp))]
        out.write(core::array::from_fn(|r| Self::isum(core::array::from_fn(|v| qs[v][r]), a)));
    }

    fn dot_groups(w: &[u8], a: &[u8], cols: usize, ys: &mut [f32]) -> bool {
        dot_groups::<Self, { QK / 4 }>(w, a, cols, ys)
    }

    fn scalar_group(g: &[u8], a: &[u8], cols: usize) -> [f32; X16] {
        scalar::dot_q8_0x16(bytemuck::cast_slice(g), a, cols)
    }
}

impl Quant for Q4 {
    const WORDS: usize = QK / 8;
    type Words = [u32; QK / 8];
    const NEEDS_SUM: bool = true;

    #[inline(always)]
    fn words(qs: &[u8]) -> [u32; QK / 8] {
        core::array::from_fn(|v| u32::from_le_bytes([qs[4 * v], qs[4 * v + 1], qs[4 * v + 2], qs[4 * v + 3]]))
    }

    /// Word `v` holds nibble bytes `4v..4v + 4`: low nibbles are weights `4v + k`, high
    /// ones `16 + 4v + k`. Masking bits 0-3 and 16-19 after a shift of 0, 8, 4 or 12 puts
    /// weights `4v, 4v + 2` / `4v + 1, 4v + 3` / `16 + 4v, 16 + 4v + 2` / `16 + 4v + 1,
    /// 16 + 4v + 3` in the halfwords, as [`Spread`] has their activations. The sum starts
    /// at `-8 * sum(a)`, the nibbles' offset of 8 times the activations.
    #[inline(always)]
    fn isum(w: [u32; QK / 8], a: &Spread) -> i32 {
        const M: u32 = 0x000f_000f;
        let mut s = a.off[0];
        for (v, &x) in w.iter().enumerate() {
            s = smlad(x & M, a.e(v), s);
            s = smlad((x >> 8) & M, a.o(v), s);
            s = smlad((x >> 4) & M, a.e(QK / 8 + v), s);
            s = smlad((x >> 12) & M, a.o(QK / 8 + v), s);
        }
        s
    }

    /// In assembly on Arm, 4 rows at a time as [`Q8::block`], each `ldrd` loading two
    /// rows' words. That takes 14 registers, one more than the asm operands can have, so
    /// the block saves `r7` (the frame pointer, which the compiler keeps for itself) and
    /// holds the nibble mask there, and keeps `out` on the stack.
    #[inline(always)]
    fn block(qs: &[[u32; X16]], a: &Spread, out: &mut MaybeUninit<[i32; X16]>) {
        assert!(qs.len() == Self::WORDS);
        #[cfg(kvm_arm_dsp)]
        // SAFETY: `p` points at row 0 of piece 0 of `[4][16]` words and moves 4 rows at a
        // time, so offsets 64v + 4k (v < 4, k < 4) from it stay in bounds and word-aligned;
        // `a` points at a `Spread` (18 words, 8-aligned); `out` at 16 words, written once
        // each. The stack gets 2 words, popped before the end; `r7` leaves as it came.
        unsafe {
            core::arch::asm!(
                "push {{r7}}",
                "push {{{t}}}",
                "movw r7, #15",
                "movt r7, #15",
                q4_rows4!(0, 8),
                "add {p}, {p}, #16",
                q4_rows4!(16, 24),
                "add {p}, {p}, #16",
                q4_rows4!(32, 40),
                "add {p}, {p}, #16",
                q4_rows4!(48, 56),
                "add sp, sp, #4",
                "pop {{r7}}",
                p = inout(reg) qs.as_ptr() => _,
                a = in(reg) core::ptr::from_ref(a),
                t = inout(reg) out.as_mut_ptr() => _,
                e = out(reg) _, o = out(reg) _, e2 = out(reg) _, o2 = out(reg) _,
                w0 = out(reg) _, w1 = out(reg) _,
                s0 = out(reg) _, s1 = out(reg) _, s2 = out(reg) _, s3 = out(reg) _,
            );
        }
        #[cfg(not(kvm_arm_dsp))]
        out.write(core::array::from_fn(|r| Self::isum(core::array::from_fn(|v| qs[v][r]), a)));
    }

    fn dot_groups(w: &[u8], a: &[u8], cols: usize, ys: &mut [f32]) -> bool {
        dot_groups::<Self, { QK / 8 }>(w, a, cols, ys)
    }

    fn scalar_group(g: &[u8], a: &[u8], cols: usize) -> [f32; X16] {
        scalar::dot_q4_0x16(bytemuck::cast_slice(g), a, cols)
    }
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

/// A q8_0x16 or q4_0x16 group block as words: the 16 rows' f16 scales two to a word
/// (row `2i` low, `2i + 1` high), then piece `v` of row `r` at `qs[v * 16 + r]`.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct GroupWords<const W: usize> {
    d: [u32; X16 / 2],
    qs: [[u32; X16]; W],
}

// SAFETY: arrays of u32 (alignment 4, no padding); every bit pattern is a valid value.
unsafe impl<const W: usize> bytemuck::Zeroable for GroupWords<W> {}
// SAFETY: as above.
unsafe impl<const W: usize> bytemuck::Pod for GroupWords<W> {}

const _: () =
    assert!(core::mem::size_of::<GroupWords<{ QK / 4 }>>() == core::mem::size_of::<crate::quant::GroupQ8_0x16>());
const _: () =
    assert!(core::mem::size_of::<GroupWords<{ QK / 8 }>>() == core::mem::size_of::<crate::quant::GroupQ4_0x16>());

/// The DSP kernel of a row-interleaved integer dtype (q8_0x16 or q4_0x16).
pub(crate) struct Groups<Q>(core::marker::PhantomData<Q>);

/// Activation blocks spread at a time: every group of a matrix of up to `32 *
/// SPREAD_BLOCKS` columns (tiny-kjv's widest, `d_ff = 512`) meets one spread of the
/// activation, 1,152 bytes of stack; a wider matrix spreads each group's blocks anew.
const SPREAD_BLOCKS: usize = 16;

/// `ys[16 i + r]` = row `r` of group `i` of `w` . activation `a` for each of the
/// `w.len() / gb` groups (`gb` bytes, `cols / 32` blocks of `W` quant words a row each),
/// or `false`, writing nothing, where the data is not word-aligned: the activation is
/// spread once ([`SPREAD_BLOCKS`] at a time), then each group block's 16 integer sums
/// ([`Quant::block`]) become their terms in the rows' lanes ([`add_terms`]), which never
/// start zeroed: block `b < 8` writes lane `b`, so a lane holds the scalar tier's up to the
/// sign of a zero (`0.0 + t` is `t` but for `t = -0.0`), which the rows' trees carry along
/// and the final `+ 0.0` takes off, as the scalar tier's sums are never `-0.0`
/// ([`reduce`]).
#[inline(never)]
fn dot_groups<Q: Quant, const W: usize>(w: &[u8], a: &[u8], cols: usize, ys: &mut [f32]) -> bool {
    let Ok(blocks) = bytemuck::try_cast_slice::<u8, GroupWords<W>>(w) else { return false };
    let Some((qs, ds)) = act_words(a, cols) else { return false };
    let nb = cols / QK;
    let (Some(qs), Some(ds)) = (qs.get(..nb), ds.get(..nb)) else { return false };
    if nb == 0 {
        return false;
    }
    let mut spread = [const { MaybeUninit::<Spread>::uninit() }; SPREAD_BLOCKS];
    let mut lanes: Lanes = [[MaybeUninit::uninit(); X16]; LANES];
    let groups = blocks.chunks_exact(nb).zip(ys.as_chunks_mut::<X16>().0);
    if nb <= SPREAD_BLOCKS {
        let spread = spread_blocks::<Q>(qs, &mut spread);
        for (g, y) in groups {
            add_blocks::<Q, W>(g, spread, ds, 0, &mut lanes);
            // SAFETY: lanes `0..min(nb, 8)` were written by their first block.
            unsafe { reduce(&lanes, nb.min(LANES), y) };
        }
    } else {
        for (g, y) in groups {
            for (i, (g, (qs, ds))) in
                g.chunks(SPREAD_BLOCKS).zip(qs.chunks(SPREAD_BLOCKS).zip(ds.chunks(SPREAD_BLOCKS))).enumerate()
            {
                let spread = spread_blocks::<Q>(qs, &mut spread);
                add_blocks::<Q, W>(g, spread, ds, i * SPREAD_BLOCKS, &mut lanes);
            }
            // SAFETY: as above (`nb > 8`).
            unsafe { reduce(&lanes, LANES, y) };
        }
    }
    true
}

/// Adds the terms of group blocks `g` (blocks `b0..` of a row group) with the spread
/// activation blocks `spread` (scales' bits `ds`) to the lanes: each block's 16 integer
/// sums ([`Quant::block`]) times their scales ([`add_terms`]).
#[inline(always)]
fn add_blocks<Q: Quant, const W: usize>(
    g: &[GroupWords<W>],
    spread: &[Spread],
    ds: &[u32],
    b0: usize,
    lanes: &mut Lanes,
) {
    let mut isums = MaybeUninit::uninit();
    for (b, (gb, (s, &da))) in (b0..).zip(g.iter().zip(spread.iter().zip(ds))) {
        Q::block(&gb.qs, s, &mut isums);
        // SAFETY: `block` wrote all 16.
        let isums = unsafe { isums.assume_init_ref() };
        if b < LANES {
            add_terms::<true>(&gb.d, act_scale(da), isums, &mut lanes[b]);
        } else {
            add_terms::<false>(&gb.d, act_scale(da), isums, &mut lanes[b % LANES]);
        }
    }
}

/// The activation blocks `words` spread into the first `words.len()` of `out`.
#[inline(always)]
fn spread_blocks<'s, Q: Quant>(
    words: &[[u32; QK / 4]],
    out: &'s mut [MaybeUninit<Spread>; SPREAD_BLOCKS],
) -> &'s [Spread] {
    let n = words.len().min(SPREAD_BLOCKS);
    for (o, w) in out.iter_mut().zip(words) {
        o.write(if Q::NEEDS_SUM { Spread::new::<true>(w) } else { Spread::new::<false>(w) });
    }
    // SAFETY: the first `n` were written just above.
    unsafe { &*(core::ptr::from_ref(&out[..n]) as *const [Spread]) }
}

/// Half of [`add_terms`]' assembly: rows `8h..8h + 8` (`{d}`, `{is}` and `{l}` at them,
/// each moved past): the 4 scale words widened to 8 `dw` (`vcvtb`/`vcvtt`, exact), each
/// times `da` (`s24`), times its sum converted; then stored (`first`) or added to the
/// lanes.
#[cfg(kvm_arm_dsp)]
macro_rules! terms8 {
    ($f:tt) => {
        concat!(
            "vldmia {d}!, {{s0-s3}}\n",
            "vcvtb.f32.f16 s4, s0\n vcvtt.f32.f16 s5, s0\n vcvtb.f32.f16 s6, s1\n vcvtt.f32.f16 s7, s1\n",
            "vcvtb.f32.f16 s8, s2\n vcvtt.f32.f16 s9, s2\n vcvtb.f32.f16 s10, s3\n vcvtt.f32.f16 s11, s3\n",
            "vmul.f32 s4, s4, s24\n vmul.f32 s5, s5, s24\n vmul.f32 s6, s6, s24\n vmul.f32 s7, s7, s24\n",
            "vmul.f32 s8, s8, s24\n vmul.f32 s9, s9, s24\n vmul.f32 s10, s10, s24\n vmul.f32 s11, s11, s24\n",
            "vldmia {is}!, {{s12-s19}}\n",
            "vcvt.f32.s32 s12, s12\n vcvt.f32.s32 s13, s13\n vcvt.f32.s32 s14, s14\n vcvt.f32.s32 s15, s15\n",
            "vcvt.f32.s32 s16, s16\n vcvt.f32.s32 s17, s17\n vcvt.f32.s32 s18, s18\n vcvt.f32.s32 s19, s19\n",
            "vmul.f32 s12, s4, s12\n vmul.f32 s13, s5, s13\n vmul.f32 s14, s6, s14\n vmul.f32 s15, s7, s15\n",
            "vmul.f32 s16, s8, s16\n vmul.f32 s17, s9, s17\n vmul.f32 s18, s10, s18\n vmul.f32 s19, s11, s19\n",
            lanes8!($f),
        )
    };
}

/// The end of [`terms8`]: the 8 terms (`s12-s19`) stored, or added to their lanes.
#[cfg(kvm_arm_dsp)]
macro_rules! lanes8 {
    (first) => {
        "vstmia {l}!, {{s12-s19}}\n"
    };
    (next) => {
        concat!(
            "vldm {l}, {{s4-s11}}\n",
            "vadd.f32 s4, s4, s12\n vadd.f32 s5, s5, s13\n vadd.f32 s6, s6, s14\n vadd.f32 s7, s7, s15\n",
            "vadd.f32 s8, s8, s16\n vadd.f32 s9, s9, s17\n vadd.f32 s10, s10, s18\n vadd.f32 s11, s11, s19\n",
            "vstmia {l}!, {{s4-s11}}\n",
        )
    };
}

/// `lane[r] = t_r` (`FIRST`) or `lane[r] += t_r` for the 16 rows of a group block, `t_r =
/// (dw_r * da) * isums[r]` with `dw_r` row `r`'s f16 scale in `d` (two to a word): the
/// scalar tier's block term ([`scalar::block_term`]) and lane sum, but for `0.0 + t` in
/// a lane's first term (see [`dot_groups`]).
#[inline(always)]
fn add_terms<const FIRST: bool>(d: &[u32; X16 / 2], da: f32, isums: &[i32; X16], lane: &mut [MaybeUninit<f32>; X16]) {
    #[cfg(kvm_arm_dsp)]
    // SAFETY: `d`, `isums` and `lane` point at 8, 16 and 16 words, which the two halves
    // read (and write) once each. The FPU registers s0-s24, which the asm operand classes
    // cannot name on a single-precision FPU, are pushed first and popped last, so they
    // leave as they came; `vcvtb`/`vcvtt` widen an f16 exactly, as `f16_low` does, and each
    // row's `(dw * da) * isum` then `lane + t` are the f32 operations of the Rust below, in
    // its order.
    unsafe {
        macro_rules! terms16 {
            ($f:tt) => {
                core::arch::asm!(
                    "vpush {{s0-s24}}",
                    "vmov s24, {da}",
                    terms8!($f),
                    terms8!($f),
                    "vpop {{s0-s24}}",
                    d = inout(reg) d.as_ptr() => _,
                    is = inout(reg) isums.as_ptr() => _,
                    l = inout(reg) lane.as_mut_ptr() => _,
                    da = in(reg) da.to_bits(),
                )
            };
        }
        if FIRST {
            terms16!(first);
        } else {
            terms16!(next);
        }
    }
    #[cfg(not(kvm_arm_dsp))]
    for (r, (l, &isum)) in lane.iter_mut().zip(isums).enumerate() {
        let w = d[r / 2];
        let dw = f16_low(if r.is_multiple_of(2) { w } else { w >> 16 });
        let t = dw * da * isum as f32;
        // SAFETY: a later block's lane was written by the first block of the lane.
        l.write(if FIRST { t } else { (unsafe { l.assume_init() }) + t });
    }
}

impl<Q: Quant> GroupKernel for Groups<Q> {
    unsafe fn group<const T: usize>(g: &[u8], a: [&[u8]; T], cols: usize) -> [[f32; X16]; T] {
        core::array::from_fn(|t| {
            let mut y = [0.0; X16];
            if !Q::dot_groups(g, a[t], cols, &mut y) {
                y = Q::scalar_group(g, a[t], cols);
            }
            y
        })
    }

    unsafe fn single(w: &[u8], gb: usize, cols: usize, a: &[u8], ys: &mut [f32]) -> bool {
        if !Q::dot_groups(w, a, cols, ys) {
            for (g, y) in w.chunks_exact(gb).zip(ys.chunks_exact_mut(X16)) {
                y.copy_from_slice(&Q::scalar_group(g, a, cols));
            }
        }
        true
    }
}

#[cfg(test)]
pub(super) mod tests {
    extern crate std;

    use std::vec;
    use std::vec::Vec;

    use super::*;
    use crate::kernels::tests::values;
    use crate::kernels::traits::act_scratch_len;
    use crate::kernels::walk::run;
    use crate::tensor::Matrix;

    /// Deterministic bytes (xorshift32): any quant byte, so q8 weights -128 and 127 and
    /// every nibble occur.
    pub(in crate::kernels::arm) fn bytes(n: usize, seed: u32) -> Vec<u8> {
        let mut s = seed.wrapping_mul(2_654_435_761) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s >> 11) as u8
            })
            .collect()
    }

    /// A `[rows, cols]` matrix of `dtype` with random quant bytes and finite f16 scales,
    /// every fifth one zero and every seventh subnormal.
    fn matrix(dtype: DType, rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let mut m = bytes(dtype.matrix_bytes(rows, cols).unwrap(), seed);
        let (bb, per_group) = (dtype.block_bytes(), dtype.group_rows());
        let scales: Vec<usize> = if per_group == 1 {
            (0..m.len() / bb).map(|b| b * bb).collect()
        } else {
            (0..m.len() / (bb * X16)).flat_map(|g| (0..X16).map(move |r| g * bb * X16 + 2 * r)).collect()
        };
        for (i, at) in scales.into_iter().enumerate() {
            let h = if i % 5 == 4 {
                0x0000
            } else if i % 7 == 6 {
                0x8000 | (i as u16 & 0x3ff)
            } else {
                u16::from_le_bytes([m[at], m[at + 1] & 0x3b])
            };
            m[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
        m
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn integer_products_give_the_scalar_bits() {
        for dtype in [DType::Q8_0, DType::Q4_0, DType::Q8_0x16, DType::Q4_0x16] {
            let row_counts: &[usize] = if dtype.group_rows() == 1 { &[1, 3, 4, 5, 7, 9] } else { &[16, 32, 48, 80] };
            for &rows in row_counts {
                for cols in [32, 96, 256, 288, 544] {
                    for n in [1, 2, 3] {
                        let seed = (rows * 1000 + cols + n) as u32;
                        let data = matrix(dtype, rows, cols, seed);
                        let w = Matrix::new(dtype, rows, cols, &data).unwrap();
                        let mut xs = values(n * cols, seed);
                        if cols > QK {
                            // A zero activation block (scale 0).
                            xs[QK..2 * QK].fill(0.0);
                        }
                        let mut act = vec![0u8; act_scratch_len(cols) * n];
                        let (mut want, mut got) = (vec![f32::NAN; n * rows], vec![f32::NAN; n * rows]);
                        // SAFETY: both tiers' arithmetic is plain Rust on the host.
                        unsafe {
                            run::<scalar::Scalar, 1, 1, 1>(&w, &xs, &mut want, &mut act);
                            run::<Dsp, 1, 4, 1>(&w, &xs, &mut got, &mut act);
                        }
                        assert_eq!(bits(&got), bits(&want), "{dtype:?} {rows}x{cols}, {n} tokens");
                        assert!(want.iter().any(|&y| y != 0.0), "{dtype:?} {rows}x{cols}: all zero");
                    }
                }
            }
        }
    }

    #[test]
    fn misaligned_data_runs_the_scalar_kernel() {
        let (rows, cols) = (16, 64);
        for dtype in [DType::Q8_0x16, DType::Q4_0x16] {
            let data = matrix(dtype, rows, cols, 3);
            let mut shifted = vec![0u8; data.len() + 1];
            shifted[1..].copy_from_slice(&data);
            let w = Matrix::new(dtype, rows, cols, &shifted[1..]).unwrap();
            let mut act = vec![0u8; act_scratch_len(cols)];
            let xs = values(cols, 5);
            let (mut want, mut got) = (vec![0.0; rows], vec![0.0; rows]);
            // SAFETY: as above.
            unsafe {
                run::<scalar::Scalar, 1, 1, 1>(&w, &xs, &mut want, &mut act);
                run::<Dsp, 1, 4, 1>(&w, &xs, &mut got, &mut act);
            }
            assert_eq!(bits(&got), bits(&want), "{dtype:?}");
        }
    }

    #[test]
    fn activation_quantizer_gives_the_scalar_bytes() {
        let mut x = values(32 * 9, 7);
        x[32..64].fill(0.0);
        x[64..96].fill(-1e-35);
        for (i, v) in x[96..128].iter_mut().enumerate() {
            *v = (i as f32 - 16.0) + 0.5;
        }
        x[128] = f32::NAN;
        x[160] = f32::INFINITY;
        x[192] = -0.0;
        x[224] = f32::MAX;
        let mut want = vec![0u8; act_scratch_len(x.len())];
        let mut got = vec![0xaa; want.len()];
        scalar::quantize_act(&x, &mut want);
        quantize_act(&x, &mut got);
        assert_eq!(got, want);
    }

    #[test]
    fn emulated_instructions() {
        assert_eq!(op::sxtb16(0x80_7f_01_ff), 0x007f_ffff);
        assert_eq!(op::sxtb16_ror8(0x80_7f_01_ff), 0xff80_0001);
        assert_eq!(op::smlad(0xffff_0002, 0x0003_0004, 10), 10 + 8 - 3);
    }
}

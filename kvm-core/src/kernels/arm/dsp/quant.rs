//! The DSP tier's block sums: for each integer format, the exact integer dot product of
//! a block of its quants with a spread activation block, one row at a time in Rust over
//! the DSP instructions ([`super::op`]) and 16 interleaved rows at a time in assembly.

use core::mem::MaybeUninit;

use super::groups::dot_groups;
use super::op::{smlad, sxtb16, sxtb16_ror8};
use super::Spread;
use crate::kernels::scalar;
use crate::quant::{QK, X16};

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

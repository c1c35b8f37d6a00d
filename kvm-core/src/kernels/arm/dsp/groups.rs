//! The DSP tier's kernel of the row-interleaved integer layouts (q8_0x16, q4_0x16): the
//! activation spread once, each group block's 16 integer sums ([`Quant::block`]) turned
//! into their terms in the rows' lanes by FPU assembly ([`add_terms`]).

use core::mem::MaybeUninit;

#[cfg(not(kvm_arm_dsp))]
use super::f16_low;
use super::quant::Quant;
use super::{act_scale, act_words, Spread};
use crate::kernels::arm::fpu::{reduce, Lanes};
use crate::kernels::scalar::LANES;
use crate::kernels::traits::GroupKernel;
use crate::quant::{QK, X16};

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
pub(super) fn dot_groups<Q: Quant, const W: usize>(w: &[u8], a: &[u8], cols: usize, ys: &mut [f32]) -> bool {
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
/// scalar tier's block term ([`scalar::block_term`](crate::kernels::scalar::block_term)) and lane sum, but for `0.0 + t` in
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

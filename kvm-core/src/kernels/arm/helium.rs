//! The Helium tier: Armv8.1-M's M-profile Vector Extension (MVE) on Cortex-M55, for the
//! integer formats.
//!
//! A block's exact i32 sum comes from `vmladav.s8`, which multiplies 16 byte pairs and adds
//! them all into a general-purpose register (the next 16 with `vmladava`). Row-major q8_0
//! and q4_0 blocks are 32 contiguous bytes (q4_0: 16 nibble bytes, split with `vand` and
//! `vshr`); an interleaved q8_0x16 / q4_0x16 block holds each row's bytes in 4-byte pieces
//! 64 bytes apart, which one gather load (`vldrw.u32` with a vector of addresses, stepping
//! to the next row as it loads) puts back in order. q4_0's weights are nibbles plus 8: the
//! sums take `8 * sum(a)` off once per row instead of 8 off every weight.
//!
//! Everything in floating point stays in the scalar FPU, in [`scalar`]'s operations and
//! order, written in assembly so that the compiler cannot vectorize it: QEMU runs MVE's
//! floating-point instructions with flush-to-zero (the standard FPSCR value), which would
//! change bits on tiny scales. The f16 scales widen with the FPU's exact `vcvtb.f32.f16`,
//! four rows' at a time, and four rows' terms go to their lanes in one `vstm`; the lanes'
//! trees are [`super::fpu`]'s. So every result is the scalar tier's bits. Attention over
//! f32 rows runs `fpu`'s kernels too; float weights and the rest run the scalar kernels.
//!
//! MVE lives in the floating-point register file (q0-q7 are d0-d15) and Rust's `asm!` has no
//! register class for it on Arm: each block below names its vector registers itself and
//! declares the d registers they overlap as clobbered. The across-vector sums need an even
//! destination register, so those are named too.

use core::arch::asm;
use core::marker::PhantomData;
use core::mem::MaybeUninit;

use super::fpu::{reduce, Lanes};
use crate::kernels::scalar::{self, reduce_lanes, LANES};
use crate::kernels::traits::{GroupKernel, Kernel, Kernels, BF16, F16, F32, F32P};
use crate::quant::{DType, GroupQ4_0x16, GroupQ8_0x16, QK, X16};

/// The Helium tier.
#[derive(Debug)]
pub(crate) struct Helium;

impl Kernels for Helium {
    type F32 = scalar::Float<F32>;
    type F16 = scalar::Float<F16>;
    type BF16 = scalar::Float<BF16>;
    type Q8_0 = Rows<Q8>;
    type Q4_0 = Rows<Q4>;
    type Q4_0x16 = Groups<Q4>;
    type Q8_0x16 = Groups<Q8>;
    type F32P = scalar::Float<F32P>;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        scalar::quantize_act(x, out)
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        scalar::dequant_row(dtype, row, out)
    }
}

/// `acc + (d_w * d_a) * s` for the little-endian f16 scale `d_w` at `dw`, as
/// [`scalar::block_term`] and [`scalar::sum_blocks`] compute it, in the FPU (`vcvtb.f32.f16`
/// widens the scale exactly, subnormals kept: flush-to-zero is off, as at reset). In
/// assembly so that the compiler cannot move it to MVE's floating point, which QEMU runs with
/// flush-to-zero.
///
/// # Safety
/// `dw` points at 2 readable bytes.
#[inline(always)]
unsafe fn add_term(acc: f32, dw: *const u8, da: f32, s: i32) -> f32 {
    let mut acc = acc;
    // SAFETY: reads the 2 bytes at `dw`; FPU registers only otherwise.
    unsafe {
        asm!(
            "vldr.16 {t}, [{dw}]",
            "vcvtb.f32.f16 {t}, {t}",
            "vmul.f32 {t}, {t}, {da}",
            "vmov {u}, {s}",
            "vcvt.f32.s32 {u}, {u}",
            "vmul.f32 {t}, {t}, {u}",
            "vadd.f32 {acc}, {acc}, {t}",
            acc = inout(sreg) acc,
            t = out(sreg) _,
            u = out(sreg) _,
            da = in(sreg) da,
            s = in(reg) s,
            dw = in(reg) dw,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    acc
}

/// The activation block scale `d_a` of block `b` of the q8 activation `a` of `cols` values.
///
/// # Safety
/// `a` holds a whole activation of `cols` values.
#[inline(always)]
unsafe fn act_scale(a: *const u8, cols: usize, b: usize) -> f32 {
    // SAFETY: the scales follow the `cols` values, 4 bytes per block.
    f32::from_le_bytes(unsafe { a.add(cols + 4 * b).cast::<[u8; 4]>().read() })
}

/// A plain (row-major) integer block format.
pub(crate) trait Block {
    const DTYPE: DType;
    /// The scalar kernel of the format, for rows whose scales are not 2-byte aligned (a blob
    /// at an odd address): `vldr.16` would fault on them.
    type Scalar: Kernel<Act = u8>;

    /// The exact i32 sum of the weights of the block at `w` times the 32 activation bytes
    /// at `a`.
    ///
    /// # Safety
    /// MVE is present; `w` points at one whole block, `a` at 32 readable bytes.
    unsafe fn isum(w: *const u8, a: *const u8) -> i32;
}

/// q8_0 blocks.
#[derive(Debug)]
pub(crate) struct Q8;
/// q4_0 blocks.
#[derive(Debug)]
pub(crate) struct Q4;

impl Block for Q8 {
    const DTYPE: DType = DType::Q8_0;
    type Scalar = scalar::Q8_0;

    #[inline(always)]
    unsafe fn isum(w: *const u8, a: *const u8) -> i32 {
        let s: i32;
        // SAFETY: 32 weights after the 2 scale bytes, 32 activation bytes; byte loads need
        // no alignment.
        unsafe {
            asm!(
                "vldrb.s8 q0, [{w}, #2]",
                "vldrb.s8 q1, [{a}]",
                "vmladav.s8 r0, q0, q1",
                "vldrb.s8 q0, [{w}, #18]",
                "vldrb.s8 q1, [{a}, #16]",
                "vmladava.s8 r0, q0, q1",
                w = in(reg) w,
                a = in(reg) a,
                out("r0") s,
                out("d0") _, out("d1") _, out("d2") _, out("d3") _,
                options(pure, readonly, nostack, preserves_flags),
            );
        }
        s
    }
}

impl Block for Q4 {
    const DTYPE: DType = DType::Q4_0;
    type Scalar = scalar::Q4_0;

    #[inline(always)]
    unsafe fn isum(w: *const u8, a: *const u8) -> i32 {
        let s: i32;
        // SAFETY: 16 nibble bytes after the 2 scale bytes, 32 activation bytes. Weight `i`
        // (low nibble of byte `i`) meets `a[i]`, weight `16 + i` (its high nibble) `a[16 + i]`;
        // the sums of nibbles (`0..16`) are `8 * sum(a)` above the weights' (`-8..8`).
        unsafe {
            asm!(
                "vldrb.u8 q0, [{w}, #2]",
                "vmov.i8 q2, #15",
                "vand q1, q0, q2",
                "vshr.u8 q0, q0, #4",
                "vldrb.s8 q2, [{a}]",
                "vldrb.s8 q3, [{a}, #16]",
                "vmladav.s8 r0, q1, q2",
                "vmladava.s8 r0, q0, q3",
                "vaddv.s8 r2, q2",
                "vaddva.s8 r2, q3",
                "sub.w r0, r0, r2, lsl #3",
                w = in(reg) w,
                a = in(reg) a,
                out("r0") s,
                out("r2") _,
                out("d0") _, out("d1") _, out("d2") _, out("d3") _,
                out("d4") _, out("d5") _, out("d6") _, out("d7") _,
                options(pure, readonly, nostack, preserves_flags),
            );
        }
        s
    }
}

/// Row-major q8_0 / q4_0 kernel: each row's exact block sums from [`Block::isum`], scaled
/// and summed as [`scalar::dot_q8_0`] does.
#[derive(Debug)]
pub(crate) struct Rows<B>(PhantomData<B>);

impl<B: Block> Kernel for Rows<B> {
    type Act = u8;

    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[u8]; T], cols: usize) -> [[f32; T]; R] {
        if w.iter().any(|w| !(w.as_ptr() as usize).is_multiple_of(2)) {
            // SAFETY: forwarded.
            return unsafe { B::Scalar::tile(w, a, cols) };
        }
        let bb = B::DTYPE.block_bytes();
        let nb = cols / QK;
        let mut acc = [[[0.0f32; LANES]; T]; R];
        for b in 0..nb {
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: every row holds `nb` blocks and every activation `cols` values
                // and their scales.
                unsafe {
                    let wb = w[r].as_ptr().add(b * bb);
                    for (t, acc) in acc.iter_mut().enumerate() {
                        let isum = B::isum(wb, a[t].as_ptr().add(b * QK));
                        let da = act_scale(a[t].as_ptr(), cols, b);
                        acc[b % LANES] = add_term(acc[b % LANES], wb, da, isum);
                    }
                }
            }
        }
        acc.map(|acc| acc.map(reduce_lanes))
    }
}

/// An interleaved integer format ([`crate::quant::Group`]).
pub(crate) trait GroupBlock {
    /// Bytes of one group block (16 scales, then the quant bytes).
    const BYTES: usize;
    /// The scalar kernel of the format, for groups that are not 4-byte aligned (a blob at
    /// an address that is not): the gathers would fault on them.
    type Scalar: GroupKernel;
    /// Whether the block sums need [`offset`]: q4_0's nibbles are their weights plus 8.
    const OFFSET: bool;

    /// Adds the 16 rows' terms of the group block at `g` with the activation block at `a`
    /// (32 bytes, scale `da`, [`offset`] `off` where the format needs it) to their
    /// accumulators `acc[0..16]`: the exact block sum `s`, then `acc += (d_w * d_a) * s` in
    /// the FPU as [`scalar::block_term`] does; with `FIRST`, `acc = (d_w * d_a) * s` (the
    /// canonical sum's first term of a lane, `0.0 + t`, but for the sign of a zero: see
    /// [`Groups`]) without reading `acc`.
    ///
    /// # Safety
    /// MVE is present; `g` points at one whole group block, `a` at 32 readable bytes and
    /// `acc` at 16 writable floats (initialized unless `FIRST`).
    unsafe fn add_terms<const FIRST: bool>(g: *const u8, a: *const u8, da: f32, off: i32, acc: *mut f32);
}

/// `8 * sum(a)` of the 32 activation values at `a`: what q4_0's nibble sums exceed its
/// weights' by (`vaddv` of the two halves, into an even register as it requires).
///
/// # Safety
/// MVE is present; `a` points at 32 readable bytes.
#[inline(always)]
unsafe fn offset(a: *const u8) -> i32 {
    let s: i32;
    // SAFETY: reads the 32 bytes at `a`.
    unsafe {
        asm!(
            "vldrb.s8 q0, [{a}]",
            "vldrb.s8 q1, [{a}, #16]",
            "vaddv.s8 r2, q0",
            "vaddva.s8 r2, q1",
            "lsl.w r2, r2, #3",
            a = in(reg) a,
            out("r2") s,
            out("d0") _, out("d1") _, out("d2") _, out("d3") _,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    s
}

/// Byte offsets of a row's 4-byte pieces `0..4` in a group block: pieces are 64 bytes
/// apart (16 rows of 4 bytes).
static PIECES: [u32; 4] = [0, 64, 128, 192];

/// Bytes before a group block's quant bytes: the 16 f16 scales.
const SCALES: usize = 2 * X16;

/// The end of [`quad!`]: the 4 terms (s0-s3) stored at `{acc}` (`first`), or added to the
/// accumulators there (loaded into s4-s7), which moves past them.
macro_rules! lanes4 {
    (first) => {
        "vstmia {acc}!, {{s0-s3}}\n"
    };
    (add) => {
        concat!(
            "vldm {acc}, {{s4-s7}}\n",
            "vadd.f32 s4, s4, s0\n vadd.f32 s5, s5, s1\n vadd.f32 s6, s6, s2\n vadd.f32 s7, s7, s3\n",
            "vstmia {acc}!, {{s4-s7}}\n",
        )
    };
}

/// The next row of a q8_0x16 block into `$r`: its weights `0..16` and `16..32` gathered
/// into q0 and q1 (the addresses in q4 step on by one row), summed against q6 and q7.
macro_rules! q8_row {
    ($r:literal) => {
        concat!(
            "vldrw.u32 q0, [q4, #4]!\n",
            "vldrw.u32 q1, [q4, #256]\n",
            "vmladav.s8 ",
            $r,
            ", q0, q6\n",
            "vmladava.s8 ",
            $r,
            ", q1, q7\n",
        )
    };
}

/// The next row of a q4_0x16 block into `$r`: its 16 nibble bytes gathered into q0, the
/// low nibbles (weights `0..16`) against q6 and the high ones (`16..32`) against q7.
macro_rules! q4_row {
    ($r:literal) => {
        concat!(
            "vldrw.u32 q0, [q4, #4]!\n",
            "vand q1, q0, q5\n",
            "vshr.u8 q0, q0, #4\n",
            "vmladav.s8 ",
            $r,
            ", q1, q6\n",
            "vmladava.s8 ",
            $r,
            ", q0, q7\n",
        )
    };
}

/// Rows `4k..4k + 4` of a group block: their exact sums (`$row!`) in r0, r2, r4, r8, into
/// lanes 0..4 of q2 (`vmov q2[2], q2[0], r0, r4` fills lane 0 from r0 and lane 2 from r4),
/// less `$bias` (q4_0's `8 * sum(a)`), converted to f32 there (exactly: they are far below
/// 2^24, so no rounding and no subnormals); the 4 rows' f16 scales (byte `$ds` of the
/// block, one `vldr` of d6) widened exactly (`vcvtb`/`vcvtt`), times `d_a` (s14), times
/// the sums, into their accumulators ([`lanes4!`]).
macro_rules! quad {
    ($row:ident, $kind:ident, $bias:literal, $ds:literal) => {
        concat!(
            $row!("r0"),
            $row!("r2"),
            $row!("r4"),
            $row!("r8"),
            "vmov q2[2], q2[0], r0, r4\n",
            "vmov q2[3], q2[1], r2, r8\n",
            $bias,
            "vcvt.f32.s32 q2, q2\n",
            "vldr d6, [{g}, #",
            $ds,
            "]\n",
            "vcvtb.f32.f16 s0, s12\n vcvtt.f32.f16 s1, s12\n vcvtb.f32.f16 s2, s13\n vcvtt.f32.f16 s3, s13\n",
            "vmul.f32 s0, s0, s14\n vmul.f32 s1, s1, s14\n vmul.f32 s2, s2, s14\n vmul.f32 s3, s3, s14\n",
            "vmul.f32 s0, s0, s8\n vmul.f32 s1, s1, s9\n vmul.f32 s2, s2, s10\n vmul.f32 s3, s3, s11\n",
            lanes4!($kind),
        )
    };
}

/// `quad!` for the 16 rows of a group block.
macro_rules! rows16 {
    ($row:ident, $kind:ident, $bias:literal) => {
        concat!(
            quad!($row, $kind, $bias, "0"),
            quad!($row, $kind, $bias, "8"),
            quad!($row, $kind, $bias, "16"),
            quad!($row, $kind, $bias, "24"),
        )
    };
}

/// The asm block of [`GroupBlock::add_terms`]: `$setup` (after the addresses in q4, the
/// activation in q6 and q7 and d_a in s14), then the 16 rows.
macro_rules! group_asm {
    ($g:ident, $a:ident, $da:ident, $acc:ident, $setup:literal, $rows:expr $(, $off:ident)?) => {
        // SAFETY (for the caller): every gather reads 4 bytes of the block's quant bytes:
        // row `r`'s piece `v` is at `SCALES + 64 v + 4 r` (q4 starts one row early; q8_0's
        // `#256` is pieces 4..8); the scales are the block's first 32 bytes, the activation
        // block 32 bytes and the accumulators the caller's 16 floats, which `acc` moves
        // past.
        asm!(
            "vldrw.u32 q4, [{pieces}]",
            "vadd.i32 q4, q4, {base}",
            "vldrb.s8 q6, [{a}]",
            "vldrb.s8 q7, [{a}, #16]",
            "vmov s14, {da}",
            $setup,
            $rows,
            g = in(reg) $g,
            a = in(reg) $a,
            da = in(reg) $da.to_bits(),
            acc = inout(reg) $acc => _,
            pieces = in(reg) PIECES.as_ptr(),
            base = in(reg) $g.add(SCALES - 4),
            $(off = in(reg) $off,)?
            out("r0") _, out("r2") _, out("r4") _, out("r8") _,
            out("d0") _, out("d1") _, out("d2") _, out("d3") _, out("d4") _, out("d5") _,
            out("d6") _, out("d7") _, out("d8") _, out("d9") _, out("d10") _, out("d11") _,
            out("d12") _, out("d13") _, out("d14") _, out("d15") _,
            options(nostack, preserves_flags),
        )
    };
}

impl GroupBlock for Q8 {
    const BYTES: usize = core::mem::size_of::<GroupQ8_0x16>();
    type Scalar = scalar::Q8_0x16;
    const OFFSET: bool = false;

    #[inline(always)]
    unsafe fn add_terms<const FIRST: bool>(g: *const u8, a: *const u8, da: f32, _off: i32, acc: *mut f32) {
        // SAFETY: see `group_asm!`; the caller guarantees the pointers.
        unsafe {
            if FIRST {
                group_asm!(g, a, da, acc, "", rows16!(q8_row, first, ""));
            } else {
                group_asm!(g, a, da, acc, "", rows16!(q8_row, add, ""));
            }
        }
    }
}

impl GroupBlock for Q4 {
    const BYTES: usize = core::mem::size_of::<GroupQ4_0x16>();
    type Scalar = scalar::Q4_0x16;
    const OFFSET: bool = true;

    #[inline(always)]
    unsafe fn add_terms<const FIRST: bool>(g: *const u8, a: *const u8, da: f32, off: i32, acc: *mut f32) {
        // The nibbles' sums are `8 * sum(a)` (`off`) above the weights', taken off four
        // rows at a time; q5 holds the low-nibble mask.
        // SAFETY: see `group_asm!`; the caller guarantees the pointers.
        unsafe {
            if FIRST {
                group_asm!(g, a, da, acc, "vmov.i8 q5, #15", rows16!(q4_row, first, "vsub.i32 q2, q2, {off}\n"), off);
            } else {
                group_asm!(g, a, da, acc, "vmov.i8 q5, #15", rows16!(q4_row, add, "vsub.i32 q2, q2, {off}\n"), off);
            }
        }
    }
}

/// Activation blocks whose [`offset`]s a product computes once for every group: those of
/// up to 512 columns (tiny-kjv's widest input, `d_ff`), 64 bytes of stack; a wider one
/// computes them block by block.
const OFFSETS: usize = 16;

/// q8_0x16 / q4_0x16 kernel: each group block's 16 terms per token from
/// [`GroupBlock::add_terms`] into accumulator `b % 8` of each row, then
/// [`scalar::reduce_lanes`]' tree: [`scalar::dot_q8_0x16`]'s bits. The accumulators are
/// lane-major (`[8][16]` per token) and never zeroed: the first 8 blocks write their lanes
/// (`t`, not `0.0 + t`, which differs only for `t = -0.0`), and a row of fewer than 8
/// blocks leaves the other lanes out of the tree ([`reduce`]); the tree's
/// result plus `0.0` is then the scalar tier's, whose sums are never `-0.0`.
#[derive(Debug)]
pub(crate) struct Groups<B>(PhantomData<B>);

impl<B: GroupBlock> Groups<B> {
    /// Row `r` of the group `g` (`nb` group blocks) . the activation `a` into `out[r]`,
    /// `off(b)` being block `b`'s [`offset`] (called only when the format needs it).
    ///
    /// # Safety
    /// MVE is present; `g` is 4-byte aligned and holds `nb` group blocks, `a` a whole
    /// activation of `cols = 32 nb` values and their scales.
    #[inline(never)]
    unsafe fn rows(g: &[u8], a: &[u8], nb: usize, off: impl Fn(usize) -> i32, out: &mut [f32; X16]) {
        let mut acc: Lanes = [[MaybeUninit::uninit(); X16]; LANES];
        for b in 0..nb {
            // SAFETY: `g` holds `nb` group blocks and `a` `32 nb` values and their scales;
            // lane `b % 8` is 16 floats, written first by block `b < 8`.
            unsafe {
                let da = act_scale(a.as_ptr(), QK * nb, b);
                let lane = acc[b % LANES].as_mut_ptr().cast::<f32>();
                let (gb, ab) = (g.as_ptr().add(b * B::BYTES), a.as_ptr().add(b * QK));
                let off = if B::OFFSET { off(b) } else { 0 };
                if b < LANES {
                    B::add_terms::<true>(gb, ab, da, off, lane);
                } else {
                    B::add_terms::<false>(gb, ab, da, off, lane);
                }
            }
        }
        // SAFETY: lanes `0..min(nb, 8)` were written by their first block (`nb >= 1`).
        unsafe { reduce(&acc, nb.clamp(1, LANES), out) };
    }

    /// The groups of `w` (`gb` bytes each, `ys`: 16 values a group) . the activation `a` of
    /// `nb` blocks: the [`offset`]s computed once for all of them where there are at most
    /// [`OFFSETS`], else block by block.
    ///
    /// # Safety
    /// MVE is present; `w` is 4-byte aligned and holds whole groups of `nb` group blocks,
    /// `a` a whole activation of `32 nb` values and their scales.
    #[inline(never)]
    unsafe fn dot(w: &[u8], gb: usize, a: &[u8], nb: usize, ys: &mut [f32]) {
        let groups = w.chunks_exact(gb).zip(ys.as_chunks_mut::<X16>().0);
        // SAFETY: (all calls) as the caller guarantees; block `b < nb` is within `a`.
        unsafe {
            if B::OFFSET && nb <= OFFSETS {
                let mut offs = [0i32; OFFSETS];
                for (b, o) in offs.iter_mut().enumerate().take(nb) {
                    *o = offset(a.as_ptr().add(b * QK));
                }
                for (g, y) in groups {
                    Self::rows(g, a, nb, |b| offs[b], y);
                }
            } else {
                for (g, y) in groups {
                    Self::rows(g, a, nb, |b| offset(a.as_ptr().add(b * QK)), y);
                }
            }
        }
    }
}

impl<B: GroupBlock> GroupKernel for Groups<B> {
    unsafe fn group<const T: usize>(g: &[u8], a: [&[u8]; T], cols: usize) -> [[f32; X16]; T] {
        if !(g.as_ptr() as usize).is_multiple_of(4) {
            // SAFETY: forwarded.
            return unsafe { B::Scalar::group(g, a, cols) };
        }
        core::array::from_fn(|t| {
            let mut out = [0.0; X16];
            // SAFETY: the caller guarantees the shapes; `g` is aligned.
            unsafe { Self::dot(g, g.len(), a[t], cols / QK, &mut out) };
            out
        })
    }

    unsafe fn single(w: &[u8], gb: usize, cols: usize, a: &[u8], ys: &mut [f32]) -> bool {
        let aligned = (w.as_ptr() as usize).is_multiple_of(4);
        if aligned {
            // SAFETY: the caller guarantees the shapes; `w` is aligned.
            unsafe { Self::dot(w, gb, a, cols / QK, ys) };
        }
        aligned
    }
}

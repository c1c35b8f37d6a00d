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
//! order: MVE's floating-point instructions flush subnormals to zero, which would change
//! bits on tiny scales. The f16 scales widen with the FPU's exact `vcvtb.f32.f16`. So every
//! result is the scalar tier's bits. Float weights, attention and the rest run the scalar
//! kernels (the compiler already schedules them for the M55).
//!
//! MVE lives in the floating-point register file (q0-q7 are d0-d15) and Rust's `asm!` has no
//! register class for it on Arm: each block below names its vector registers itself and
//! declares the d registers they overlap as clobbered. The across-vector sums need an even
//! destination register, so those are named too.

use core::arch::asm;
use core::marker::PhantomData;

use crate::kernels::scalar::{self, reduce_lanes, LANES};
use crate::kernels::{GroupKernel, Kernel, Kernels, BF16, F16, F32, F32P};
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

/// The f32 value of the little-endian f16 at `p`, exactly (`vcvtb.f32.f16`: subnormals kept,
/// as `half` does; the FPU's flush-to-zero is off, as at reset).
///
/// # Safety
/// `p` points at 2 readable bytes.
#[inline(always)]
unsafe fn scale(p: *const u8) -> f32 {
    // SAFETY: 2 readable bytes.
    let bits = u16::from_le_bytes(unsafe { p.cast::<[u8; 2]>().read() });
    let out: f32;
    // SAFETY: a register-only conversion of the FPU (FPv5 with half-precision conversions).
    unsafe {
        asm!(
            "vcvtb.f32.f16 {0}, {0}",
            inout(sreg) f32::from_bits(u32::from(bits)) => out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
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
        let bb = B::DTYPE.block_bytes();
        let nb = cols / QK;
        let mut acc = [[[0.0f32; LANES]; T]; R];
        for b in 0..nb {
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: every row holds `nb` blocks and every activation `cols` values
                // and their scales.
                unsafe {
                    let wb = w[r].as_ptr().add(b * bb);
                    let dw = scale(wb);
                    for (t, acc) in acc.iter_mut().enumerate() {
                        let isum = B::isum(wb, a[t].as_ptr().add(b * QK));
                        acc[b % LANES] += dw * act_scale(a[t].as_ptr(), cols, b) * isum as f32;
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

    /// Adds each of the 16 rows' terms of the group block at `g` with the activation block
    /// at `a` (32 bytes, scale `da`) to that row's accumulator, `acc[8 r]`: the exact block
    /// sum `s`, then `acc += (d_w * d_a) * s` in the FPU as [`scalar::block_term`] does.
    ///
    /// # Safety
    /// MVE is present; `g` points at one whole group block, `a` at 32 readable bytes and
    /// `acc` at `8 * 15 + 1` writable floats.
    unsafe fn add_terms(g: *const u8, a: *const u8, da: f32, acc: *mut f32);
}

/// Byte offsets of a row's 4-byte pieces `0..4` in a group block: pieces are 64 bytes
/// apart (16 rows of 4 bytes).
static PIECES: [u32; 4] = [0, 64, 128, 192];

/// Bytes before a group block's quant bytes: the 16 f16 scales.
const SCALES: usize = 2 * X16;

/// Row `r`'s term from its exact sum in r0, the activation scale in s9, its f16 scale at
/// `{g} + ds` (`ds = 2 r`) and its accumulator at `{acc} + off` (`off = 32 r`), in the
/// FPU: `acc += (d_w * d_a) * s`.
macro_rules! term {
    ($ds:literal, $off:literal) => {
        concat!(
            "vmov s8, r0\n",
            "vcvt.f32.s32 s8, s8\n",
            "vldr.16 s10, [{g}, #", $ds, "]\n",
            "vcvtb.f32.f16 s10, s10\n",
            "vmul.f32 s10, s10, s9\n",
            "vmul.f32 s10, s10, s8\n",
            "vldr s11, [{acc}, #", $off, "]\n",
            "vadd.f32 s11, s11, s10\n",
            "vstr s11, [{acc}, #", $off, "]\n",
        )
    };
}

/// The next row of a q8_0x16 block: its weights `0..16` and `16..32` gathered into q0 and
/// q1 (the addresses in q4 step on by one row), summed against q6 and q7 into r0; then its
/// [`term!`].
macro_rules! q8_row {
    ($ds:literal, $off:literal) => {
        concat!(
            "vldrw.u32 q0, [q4, #4]!\n",
            "vldrw.u32 q1, [q4, #256]\n",
            "vmladav.s8 r0, q0, q6\n",
            "vmladava.s8 r0, q1, q7\n",
            term!($ds, $off),
        )
    };
}

/// The next row of a q4_0x16 block: its 16 nibble bytes gathered into q0, the low nibbles
/// (weights `0..16`) against q6 and the high ones (`16..32`) against q7, less `8 * sum(a)`
/// (r10), into r0; then its [`term!`].
macro_rules! q4_row {
    ($ds:literal, $off:literal) => {
        concat!(
            "vldrw.u32 q0, [q4, #4]!\n",
            "vand q1, q0, q5\n",
            "vshr.u8 q0, q0, #4\n",
            "vmladav.s8 r0, q1, q6\n",
            "vmladava.s8 r0, q0, q7\n",
            "sub.w r0, r0, r10\n",
            term!($ds, $off),
        )
    };
}

/// `$row!` for each of the 16 rows of a group block.
macro_rules! rows16 {
    ($row:ident) => {
        concat!(
            $row!("0", "0"),
            $row!("2", "32"),
            $row!("4", "64"),
            $row!("6", "96"),
            $row!("8", "128"),
            $row!("10", "160"),
            $row!("12", "192"),
            $row!("14", "224"),
            $row!("16", "256"),
            $row!("18", "288"),
            $row!("20", "320"),
            $row!("22", "352"),
            $row!("24", "384"),
            $row!("26", "416"),
            $row!("28", "448"),
            $row!("30", "480"),
        )
    };
}

impl GroupBlock for Q8 {
    const BYTES: usize = core::mem::size_of::<GroupQ8_0x16>();

    #[inline(always)]
    unsafe fn add_terms(g: *const u8, a: *const u8, da: f32, acc: *mut f32) {
        // SAFETY: every gather reads 4 bytes of the block's quant bytes: row `r`'s piece
        // `v` is at `SCALES + 64 v + 4 r`, `v < 8` (q4 starts one row early, and `#256` is
        // pieces 4..8); the scales are the block's first 32 bytes; the activation block is
        // 32 bytes; the accumulators are the caller's.
        unsafe {
            asm!(
                "vldrw.u32 q4, [{pieces}]",
                "vadd.i32 q4, q4, {base}",
                "vldrb.s8 q6, [{a}]",
                "vldrb.s8 q7, [{a}, #16]",
                "vmov s9, {da}",
                rows16!(q8_row),
                g = in(reg) g,
                a = in(reg) a,
                da = in(reg) da.to_bits(),
                acc = in(reg) acc,
                pieces = in(reg) PIECES.as_ptr(),
                base = in(reg) g.add(SCALES - 4),
                out("r0") _,
                out("d0") _, out("d1") _, out("d2") _, out("d3") _, out("d4") _, out("d5") _,
                out("d8") _, out("d9") _, out("d12") _, out("d13") _, out("d14") _, out("d15") _,
                options(nostack, preserves_flags),
            );
        }
    }
}

impl GroupBlock for Q4 {
    const BYTES: usize = core::mem::size_of::<GroupQ4_0x16>();

    #[inline(always)]
    unsafe fn add_terms(g: *const u8, a: *const u8, da: f32, acc: *mut f32) {
        // SAFETY: as for q8_0x16, with pieces `v < 4`.
        unsafe {
            asm!(
                "vldrw.u32 q4, [{pieces}]",
                "vadd.i32 q4, q4, {base}",
                "vldrb.s8 q6, [{a}]",
                "vldrb.s8 q7, [{a}, #16]",
                "vaddv.s8 r10, q6",
                "vaddva.s8 r10, q7",
                "lsl.w r10, r10, #3",
                "vmov.i8 q5, #15",
                "vmov s9, {da}",
                rows16!(q4_row),
                g = in(reg) g,
                a = in(reg) a,
                da = in(reg) da.to_bits(),
                acc = in(reg) acc,
                pieces = in(reg) PIECES.as_ptr(),
                base = in(reg) g.add(SCALES - 4),
                out("r0") _,
                out("r10") _,
                out("d0") _, out("d1") _, out("d2") _, out("d3") _, out("d4") _, out("d5") _,
                out("d8") _, out("d9") _, out("d10") _, out("d11") _, out("d12") _, out("d13") _,
                out("d14") _, out("d15") _,
                options(nostack, preserves_flags),
            );
        }
    }
}

/// q8_0x16 / q4_0x16 kernel: each group block's 16 terms per token from
/// [`GroupBlock::add_terms`] into accumulator `b % 8` of each row, then
/// [`scalar::reduce_lanes`]: [`scalar::dot_q8_0x16`]'s bits.
#[derive(Debug)]
pub(crate) struct Groups<B>(PhantomData<B>);

impl<B: GroupBlock> GroupKernel for Groups<B> {
    unsafe fn group<const T: usize>(g: &[u8], a: [&[u8]; T], cols: usize) -> [[f32; X16]; T] {
        let nb = cols / QK;
        let mut acc = [[[0.0f32; LANES]; X16]; T];
        for b in 0..nb {
            for (acc, a) in acc.iter_mut().zip(a) {
                // SAFETY: `g` holds `nb` group blocks and every activation `cols` values and
                // their scales; `acc[0][b % 8]` is followed by 15 rows of 8.
                unsafe {
                    let da = act_scale(a.as_ptr(), cols, b);
                    let acc = acc.as_mut_ptr().cast::<f32>().add(b % LANES);
                    B::add_terms(g.as_ptr().add(b * B::BYTES), a.as_ptr().add(b * QK), da, acc);
                }
            }
        }
        acc.map(|acc| acc.map(reduce_lanes))
    }
}

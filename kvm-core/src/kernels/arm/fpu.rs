//! What both Cortex-M tiers do in the scalar FPU: the last step of a row group's product,
//! each row's lanes added in `scalar::reduce_used`'s tree. Single-precision `vldm`,
//! `vadd` and `vstm`, which every Cortex-M FPU has; off Arm (host tests) the same sums in
//! Rust.

use core::mem::MaybeUninit;

#[cfg(not(target_arch = "arm"))]
use crate::kernels::scalar;
use crate::kernels::scalar::LANES;
use crate::quant::X16;

/// Per-row lane sums of a row group, lane-major (`[8][16]`): block `b`'s 16 terms go into
/// lane `b % 8`.
pub(crate) type Lanes = [[MaybeUninit<f32>; X16]; LANES];

/// 8 additions of [`reduce`]'s assembly: `s$d..s$d + 8 += s$n..s$n + 8`.
#[cfg(target_arch = "arm")]
macro_rules! add8 {
    (A, B) => {
        "vadd.f32 s0, s0, s8\n vadd.f32 s1, s1, s9\n vadd.f32 s2, s2, s10\n vadd.f32 s3, s3, s11\n vadd.f32 s4, s4, s12\n vadd.f32 s5, s5, s13\n vadd.f32 s6, s6, s14\n vadd.f32 s7, s7, s15\n"
    };
    (B, C) => {
        "vadd.f32 s8, s8, s16\n vadd.f32 s9, s9, s17\n vadd.f32 s10, s10, s18\n vadd.f32 s11, s11, s19\n vadd.f32 s12, s12, s20\n vadd.f32 s13, s13, s21\n vadd.f32 s14, s14, s22\n vadd.f32 s15, s15, s23\n"
    };
    (C, D) => {
        "vadd.f32 s16, s16, s24\n vadd.f32 s17, s17, s25\n vadd.f32 s18, s18, s26\n vadd.f32 s19, s19, s27\n vadd.f32 s20, s20, s28\n vadd.f32 s21, s21, s29\n vadd.f32 s22, s22, s30\n vadd.f32 s23, s23, s31\n"
    };
    (A, Z) => {
        "vmov s24, {z}\n vadd.f32 s0, s0, s24\n vadd.f32 s1, s1, s24\n vadd.f32 s2, s2, s24\n vadd.f32 s3, s3, s24\n vadd.f32 s4, s4, s24\n vadd.f32 s5, s5, s24\n vadd.f32 s6, s6, s24\n vadd.f32 s7, s7, s24\n"
    };
}

/// A lane of 8 rows, `$off` bytes from `{l}` (lane `$off / 64`), into register group A
/// (s0-s7), B (s8-s15), C (s16-s23) or D (s24-s31).
#[cfg(target_arch = "arm")]
macro_rules! lane8 {
    (0, A) => {
        "vldm {l}, {{s0-s7}}\n"
    };
    ($off:literal, B) => {
        concat!("add ip, {l}, #", $off, "\n vldm ip, {{s8-s15}}\n")
    };
    ($off:literal, C) => {
        concat!("add ip, {l}, #", $off, "\n vldm ip, {{s16-s23}}\n")
    };
    ($off:literal, D) => {
        concat!("add ip, {l}, #", $off, "\n vldm ip, {{s24-s31}}\n")
    };
}

/// `scalar::reduce_used`'s tree of the first `$used` lanes for 8 rows, plus `0.0`, in
/// A (s0-s7).
#[cfg(target_arch = "arm")]
macro_rules! tree8 {
    (1) => {
        concat!(lane8!(0, A), add8!(A, Z))
    };
    (2) => {
        concat!(lane8!(0, A), lane8!(64, B), add8!(A, B), add8!(A, Z))
    };
    (3) => {
        concat!(lane8!(0, A), lane8!(64, B), add8!(A, B), lane8!(128, B), add8!(A, B), add8!(A, Z))
    };
    (4) => {
        concat!(tree8!(@4), add8!(A, Z))
    };
    (5) => {
        concat!(tree8!(@4), lane8!(256, B), add8!(A, B), add8!(A, Z))
    };
    (6) => {
        concat!(tree8!(@4), lane8!(256, B), lane8!(320, C), add8!(B, C), add8!(A, B), add8!(A, Z))
    };
    (7) => {
        concat!(
            tree8!(@4), lane8!(256, B), lane8!(320, C), add8!(B, C), lane8!(384, C), add8!(B, C), add8!(A, B),
            add8!(A, Z)
        )
    };
    (8) => {
        concat!(
            tree8!(@4), lane8!(256, B), lane8!(320, C), add8!(B, C), lane8!(384, C), lane8!(448, D), add8!(C, D),
            add8!(B, C), add8!(A, B), add8!(A, Z)
        )
    };
    (@4) => {
        concat!(lane8!(0, A), lane8!(64, B), add8!(A, B), lane8!(128, B), lane8!(192, C), add8!(B, C), add8!(A, B))
    };
}

/// `out[r] = reduce_used(lanes, r, used) + 0.0` for the 16 rows: the lanes' tree as
/// `scalar::reduce_used` builds it, 8 rows at a time in the FPU (the lanes of a row are
/// 64 bytes apart), which the compiler's code took row by row.
///
/// # Safety
/// Lanes `0..used` are initialized; `1 <= used <= 8`.
#[inline(never)]
pub(crate) unsafe fn reduce(lanes: &Lanes, used: usize, out: &mut [f32; X16]) {
    #[cfg(target_arch = "arm")]
    // SAFETY: each half reads lanes `0..used` of 8 rows (initialized, as the caller
    // guarantees) and writes 8 floats of `out`; s0-s31, which the operand classes cannot
    // name, are pushed first and popped last. The additions are `reduce_used`'s, in its
    // order, then `+ 0.0`.
    unsafe {
        macro_rules! halves {
            ($used:tt) => {
                core::arch::asm!(
                    "vpush {{s0-s31}}",
                    tree8!($used),
                    "vstmia {o}!, {{s0-s7}}",
                    "add {l}, {l}, #32",
                    tree8!($used),
                    "vstmia {o}!, {{s0-s7}}",
                    "vpop {{s0-s31}}",
                    l = inout(reg) lanes.as_ptr() => _,
                    o = inout(reg) out.as_mut_ptr() => _,
                    z = in(reg) 0u32,
                    out("r12") _,
                )
            };
        }
        match used {
            1 => halves!(1),
            2 => halves!(2),
            3 => halves!(3),
            4 => halves!(4),
            5 => halves!(5),
            6 => halves!(6),
            7 => halves!(7),
            _ => halves!(8),
        }
    }
    #[cfg(not(target_arch = "arm"))]
    for (r, o) in out.iter_mut().enumerate() {
        // SAFETY: forwarded.
        *o = (unsafe { scalar::reduce_used(lanes, r, used) }) + 0.0;
    }
}

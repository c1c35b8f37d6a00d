//! What both Cortex-M tiers do in the scalar FPU, in the scalar tier's operations and
//! order: the last step of a row group's product, each row's lanes added in
//! `scalar::reduce_used`'s tree ([`reduce`]), and attention's dot products and weighted
//! sums over f32 rows ([`dots`], [`weighted_sum`]). Single-precision `vldm`, `vmul`,
//! `vmla` (a multiply, rounded, then an add: not `vfma`), `vadd` and `vstm`, which every
//! Cortex-M FPU has; MVE's vector floating point, which QEMU runs with flush-to-zero,
//! stays unused. Off Arm (host tests) the same sums in Rust.

use core::mem::MaybeUninit;

use crate::kernels::scalar::{self, LANES};
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

/// One chunk of 8 lanes in [`dots`]' assembly: 8 query values (`{x}`) and 8 row values
/// (`{r}`, both moving past them) multiplied into lanes 0-7 (`lo`, s8-s15) or 8-15 (`hi`,
/// s16-s23), `vmul` for a
/// row's first chunk, `vmla` (a multiply, rounded, then an add) for the others: the row
/// value first, as in `r * x`.
#[cfg(target_arch = "arm")]
macro_rules! dot8 {
    ($op:literal, lo) => {
        concat!(
            "vldmia {x}!, {{s0-s7}}\n vldmia {r}!, {{s24-s31}}\n",
            $op,
            " s8, s24, s0\n ",
            $op,
            " s9, s25, s1\n ",
            $op,
            " s10, s26, s2\n ",
            $op,
            " s11, s27, s3\n ",
            $op,
            " s12, s28, s4\n ",
            $op,
            " s13, s29, s5\n ",
            $op,
            " s14, s30, s6\n ",
            $op,
            " s15, s31, s7\n",
        )
    };
    ($op:literal, hi) => {
        concat!(
            "vldmia {x}!, {{s0-s7}}\n vldmia {r}!, {{s24-s31}}\n",
            $op,
            " s16, s24, s0\n ",
            $op,
            " s17, s25, s1\n ",
            $op,
            " s18, s26, s2\n ",
            $op,
            " s19, s27, s3\n ",
            $op,
            " s20, s28, s4\n ",
            $op,
            " s21, s29, s5\n ",
            $op,
            " s22, s30, s6\n ",
            $op,
            " s23, s31, s7\n",
        )
    };
}

/// `out[i] = rows[i] . x` over f32 rows in [`scalar::dots`]' order, bit for bit: 16 lanes
/// (lanes 0-7 in s8-s15, 8-15 in s16-s23) summing columns `l, l + 16, ...`, the halving
/// fold, then the last `d % 16` columns in order. A lane's first product is not added to
/// `0.0`, which changes at most the sign of a zero; the sums that follow carry it, and the
/// `+ 0.0` after the fold takes it off, since the scalar tier's fold is never `-0.0` (its
/// lanes start at `+0.0`, and a sum is `-0.0` only if both terms are).
///
/// # Safety
/// An FPU with 32 single-precision registers (every Cortex-M one) on Arm.
pub(crate) unsafe fn dots(rows: &[f32], x: &[f32], out: &mut [f32]) {
    let d = x.len();
    let body = d - d % scalar::DOT_LANES;
    if body == 0 {
        return scalar::dots(rows, x, out);
    }
    #[cfg(target_arch = "arm")]
    let n = (rows.len() / d).min(out.len());
    #[cfg(target_arch = "arm")]
    if n > 0 {
        // SAFETY: each of the `n` rows reads its first `body` values and `x`'s, in chunks
        // of 16 (`body / 16 >= 1` of them), and moves past the other `d - body`; `out`
        // gets `n` values. s0-s31, which the operand classes cannot name, are pushed
        // first and popped last.
        unsafe {
            core::arch::asm!(
                "vpush {{s0-s31}}",
                "2:",
                "mov {x}, {x0}",
                dot8!("vmul.f32", lo),
                dot8!("vmul.f32", hi),
                "subs {c}, {k}, #1",
                "beq 4f",
                "3:",
                dot8!("vmla.f32", lo),
                dot8!("vmla.f32", hi),
                "subs {c}, {c}, #1",
                "bne 3b",
                "4:",
                "vadd.f32 s8, s8, s16\n vadd.f32 s9, s9, s17\n vadd.f32 s10, s10, s18\n vadd.f32 s11, s11, s19",
                "vadd.f32 s12, s12, s20\n vadd.f32 s13, s13, s21\n vadd.f32 s14, s14, s22\n vadd.f32 s15, s15, s23",
                "vadd.f32 s8, s8, s12\n vadd.f32 s9, s9, s13\n vadd.f32 s10, s10, s14\n vadd.f32 s11, s11, s15",
                "vadd.f32 s8, s8, s10\n vadd.f32 s9, s9, s11",
                "vadd.f32 s8, s8, s9",
                "vmov s9, {z}",
                "vadd.f32 s8, s8, s9",
                "vstmia {o}!, {{s8}}",
                "add {r}, {r}, {skip}",
                "subs {n}, {n}, #1",
                "bne 2b",
                "vpop {{s0-s31}}",
                r = inout(reg) rows.as_ptr() => _,
                o = inout(reg) out.as_mut_ptr() => _,
                n = inout(reg) n => _,
                x0 = in(reg) x.as_ptr(),
                k = in(reg) body / scalar::DOT_LANES,
                skip = in(reg) 4 * (d - body),
                z = in(reg) 0u32,
                x = out(reg) _,
                c = out(reg) _,
            );
        }
    }
    #[cfg(not(target_arch = "arm"))]
    for (row, o) in rows.chunks_exact(d).zip(out.iter_mut()) {
        let (mut lo, mut hi) = ([0.0f32; 8], [0.0f32; 8]);
        for (c, (r, v)) in row[..body].chunks_exact(8).zip(x[..body].chunks_exact(8)).enumerate() {
            let acc = if c % 2 == 0 { &mut lo } else { &mut hi };
            for l in 0..8 {
                acc[l] = if c < 2 { r[l] * v[l] } else { acc[l] + r[l] * v[l] };
            }
        }
        for half in [8, 4, 2, 1] {
            for l in 0..half {
                lo[l] += if half == 8 { hi[l] } else { lo[l + half] };
            }
        }
        *o = lo[0] + 0.0;
    }
    if body < d {
        for (row, o) in rows.chunks_exact(d).zip(out.iter_mut()) {
            *o = scalar::dot_tail(*o, &row[body..], &x[body..]);
        }
    }
}

/// Rows `$j` (s8-s15) and `$j + 1` (s16-s23) of [`weighted_sum`]'s assembly times their
/// weights (s24, s25) added to the 8 columns in s0-s7, in row order: `vmla` is a
/// multiply, rounded, then an add, with the weight first, as in `o + p * v`.
#[cfg(target_arch = "arm")]
macro_rules! wsum8 {
    (s24) => {
        "vmla.f32 s0, s24, s8\n vmla.f32 s1, s24, s9\n vmla.f32 s2, s24, s10\n vmla.f32 s3, s24, s11\n vmla.f32 s4, s24, s12\n vmla.f32 s5, s24, s13\n vmla.f32 s6, s24, s14\n vmla.f32 s7, s24, s15\n"
    };
    (s25) => {
        "vmla.f32 s0, s25, s16\n vmla.f32 s1, s25, s17\n vmla.f32 s2, s25, s18\n vmla.f32 s3, s25, s19\n vmla.f32 s4, s25, s20\n vmla.f32 s5, s25, s21\n vmla.f32 s6, s25, s22\n vmla.f32 s7, s25, s23\n"
    };
}

/// `out[c] += sum_j p[j] * rows[j][c]` over f32 rows in [`scalar::weighted_sum`]'s order
/// (each column its terms in row order, multiply then add), bit for bit: 8 columns at a
/// time held in the FPU while the rows go by two at a time; the last `d % 8` columns are
/// the scalar tier's.
///
/// # Safety
/// An FPU with 32 single-precision registers (every Cortex-M one) on Arm.
pub(crate) unsafe fn weighted_sum(p: &[f32], rows: &[f32], out: &mut [f32]) {
    let d = out.len();
    let n = rows.len().checked_div(d).map_or(0, |r| p.len().min(r));
    let body = d - d % 8;
    if n == 0 || body == 0 {
        return scalar::weighted_sum(&p[..n], rows, out);
    }
    #[cfg(target_arch = "arm")]
    // SAFETY: each of the `body / 8` column blocks reads 8 values of `out`, then 8 of each
    // of the `n` rows (`d` values apart, so within `rows[..n * d]`) and the `n` weights,
    // and writes the 8 values back. s0-s25, which the operand classes cannot name, are
    // pushed first and popped last.
    unsafe {
        core::arch::asm!(
            "vpush {{s0-s25}}",
            "2:",
            "vldm {o}, {{s0-s7}}",
            "mov {pp}, {p}",
            "mov {rc}, {r}",
            "subs {j}, {n}, #2",
            "blo 4f",
            "3:",
            "vldmia {pp}!, {{s24-s25}}",
            "vldm {rc}, {{s8-s15}}",
            "add {t}, {rc}, {stride}",
            "vldm {t}, {{s16-s23}}",
            "add {rc}, {rc}, {stride}, lsl #1",
            wsum8!(s24),
            wsum8!(s25),
            "subs {j}, {j}, #2",
            "bhs 3b",
            "4:",
            "tst {n}, #1",
            "beq 5f",
            "vldr s24, [{pp}]",
            "vldm {rc}, {{s8-s15}}",
            wsum8!(s24),
            "5:",
            "vstmia {o}!, {{s0-s7}}",
            "add {r}, {r}, #32",
            "subs {cb}, {cb}, #1",
            "bne 2b",
            "vpop {{s0-s25}}",
            o = inout(reg) out.as_mut_ptr() => _,
            r = inout(reg) rows.as_ptr() => _,
            cb = inout(reg) body / 8 => _,
            p = in(reg) p.as_ptr(),
            n = in(reg) n,
            stride = in(reg) 4 * d,
            pp = out(reg) _,
            rc = out(reg) _,
            j = out(reg) _,
            t = out(reg) _,
        );
    }
    #[cfg(not(target_arch = "arm"))]
    for c0 in (0..body).step_by(8) {
        let mut acc: [f32; 8] = core::array::from_fn(|c| out[c0 + c]);
        for (&pj, row) in p[..n].iter().zip(rows.chunks_exact(d)) {
            for (c, a) in acc.iter_mut().enumerate() {
                *a += pj * row[c0 + c];
            }
        }
        out[c0..c0 + 8].copy_from_slice(&acc);
    }
    scalar::weighted_sum_columns(&p[..n], rows, body, out);
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::vec;
    use std::vec::Vec;

    use super::*;
    use crate::kernels::tests::values;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Attention over f32 rows: dots and weighted sums give the scalar tier's bits on odd
    /// widths and lengths, with signed zeros (a row whose products are all `-0.0`),
    /// subnormal products and an infinity.
    #[test]
    fn attention_over_f32_rows_gives_the_scalar_bits() {
        for d in [1, 3, 8, 9, 15, 16, 17, 31, 32, 33, 48, 64, 65, 127] {
            for n in [0, 1, 2, 3, 4, 5, 9] {
                let seed = (d * 10 + n) as u32;
                let x = values(d, seed);
                let mut rows = values(n * d, seed + 1);
                if n > 1 {
                    for (r, &v) in rows[d..2 * d].iter_mut().zip(&x) {
                        *r = if v > 0.0 { -0.0 } else { 0.0 };
                    }
                }
                if n > 2 {
                    rows[2 * d] = 1e-40;
                    rows[3 * d - 1] = f32::INFINITY;
                }
                let (mut want, mut got) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                scalar::dots(&rows, &x, &mut want);
                // SAFETY: the arithmetic is plain Rust on the host.
                unsafe { dots(&rows, &x, &mut got) };
                assert_eq!(bits(&got), bits(&want), "dots [{n}, {d}]");
                let p = values(n, seed + 2);
                let (mut want, mut got) = (values(d, seed + 3), values(d, seed + 3));
                scalar::weighted_sum(&p, &rows, &mut want);
                // SAFETY: as above.
                unsafe { weighted_sum(&p, &rows, &mut got) };
                assert_eq!(bits(&got), bits(&want), "weighted_sum [{n}, {d}]");
            }
        }
    }
}

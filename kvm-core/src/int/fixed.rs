//! The integer numerics' arithmetic (docs/integer.md): rounding shifts, saturation, the
//! integer square root, and the tables behind `exp`, `sigmoid`, `1 + elu`, `tanh` and the
//! RoPE sine. Every function is total: no input panics or overflows.

use crate::quant::FX;
pub(crate) use crate::quant::{shr32, shr_round};

include!(concat!(env!("OUT_DIR"), "/int_tables.rs"));

/// 1.0 in fixed point (`FX` fraction bits).
pub(crate) const ONE: i32 = 1 << FX;

/// 1.0 in Q15, the tables' unit.
pub(crate) const Q15: i32 = 1 << 15;

/// `v` saturated to the i32 range.
#[inline]
pub(crate) fn sat32(v: i64) -> i32 {
    v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

/// `x * y * 2^-FX` (rounded, saturating): the product of two fixed-point values.
#[inline]
pub(crate) fn mul_fx(x: i32, y: i32) -> i32 {
    shr32(crate::quant::mul_wide(x, y), FX as i32)
}

/// An f32 in fixed point, from its bits alone (rounded, saturating; NaN is 0): the
/// config's scalars at each step without a float operation.
pub(crate) fn fixed_of(f: f32) -> i32 {
    let bits = f.to_bits();
    let exp = (bits >> 23 & 0xFF) as i32;
    if exp == 0xFF && bits & 0x7F_FFFF != 0 {
        return 0;
    }
    let mant = i64::from(if exp == 0 { bits & 0x7F_FFFF } else { bits & 0x7F_FFFF | 0x80_0000 });
    let signed = if bits >> 31 != 0 { -mant } else { mant };
    // f = mant * 2^(exp - 150), in fixed point mant * 2^(exp - 150 + FX)
    shr32(signed, 150 - FX as i32 - exp.max(1))
}

/// Bits needed for `v`'s magnitude (0 for 0).
#[inline]
pub(crate) fn bit_len(v: u64) -> i32 {
    64 - v.leading_zeros() as i32
}

/// `floor(sqrt(n))`, bit by bit.
pub(crate) fn isqrt(n: u64) -> u64 {
    let (mut x, mut r) = (n, 0u64);
    let mut b = 1u64 << 62;
    while b > n {
        b >>= 2;
    }
    while b != 0 {
        if x >= r + b {
            x -= r + b;
            r = (r >> 1) + b;
        } else {
            r >>= 1;
        }
        b >>= 2;
    }
    r
}

/// `round(a / b)` for `b > 0`, halves away from zero.
#[inline]
pub(crate) fn div_round(a: i64, b: i64) -> i64 {
    let (n, d) = (a.unsigned_abs(), b.unsigned_abs().max(1));
    // A power of two (a norm's width, mostly) by a shift: the same quotient.
    let q = if d.is_power_of_two() { (n + d / 2) >> d.trailing_zeros() } else { (n + d / 2) / d };
    let q = q.min(i64::MAX as u64) as i64;
    if a < 0 {
        -q
    } else {
        q
    }
}

/// `exp(-x)` in Q15 for `x >= 0` in fixed point (0 from `x >= 16`): the product of three
/// table entries, `exp(-a/4) * exp(-b/512) * exp(-c/65536)` for `x = a/4 + b/512 +
/// c/65536`, each product rounded.
#[inline]
pub(crate) fn exp_neg(x: i32) -> i32 {
    if x <= 0 {
        return Q15;
    }
    if x >= 16 << FX {
        return 0;
    }
    let x = x as u32;
    let (a, b, c) = ((x >> 14) as usize, (x >> 7 & 127) as usize, (x & 127) as usize);
    let hi = (u32::from(EXP_HI[a]) * u32::from(EXP_MID[b]) + (1 << 14)) >> 15;
    ((hi * u32::from(EXP_LO[c]) + (1 << 14)) >> 15) as i32
}

/// `sigmoid(z)` in fixed point: `2^31 / (2^15 + exp(-|z|))` rounded, mirrored for `z < 0`.
#[inline]
pub(crate) fn sigmoid(z: i32) -> i32 {
    let e = exp_neg(z.saturating_abs()) as u32;
    let d = Q15 as u32 + e;
    // d <= 2^16: the sum below fits a u32
    let s = ((1u32 << 31) + d / 2) / d;
    if z >= 0 {
        s as i32
    } else {
        ONE - s as i32
    }
}

/// `1 + elu(z)` in fixed point: `1 + z` for `z > 0`, else `exp(z)`.
#[inline]
pub(crate) fn one_plus_elu(z: i32) -> i32 {
    if z > 0 {
        z.saturating_add(ONE)
    } else {
        exp_neg(z.saturating_neg()) << (FX - 15)
    }
}

/// `tanh(u)` in fixed point: `(2^15 - e) * 2^16 / (2^15 + e)`, `e = exp(-2|u|)`, odd.
#[inline]
pub(crate) fn tanh(u: i32) -> i32 {
    let e = exp_neg(u.saturating_abs().saturating_mul(2)) as i64;
    let t = div_round((i64::from(Q15) - e) << FX, i64::from(Q15) + e) as i32;
    if u >= 0 {
        t
    } else {
        -t
    }
}

/// `sin` of a quarter-wave phase `w` in `[0, 2^30]` (`w / 2^30` of `pi / 2`), Q15: the
/// table's two neighbours interpolated over the next 16 bits.
#[inline]
fn sin_quarter(w: u32) -> i32 {
    let (i, frac) = ((w >> 22) as usize, (w >> 6 & 0xFFFF) as i32);
    let lo = i32::from(SIN_QUARTER[i.min(256)]);
    let hi = i32::from(SIN_QUARTER[(i + 1).min(256)]);
    lo + (((hi - lo) * frac + (1 << 15)) >> 16)
}

/// `(cos, sin)` of the phase `p` (`p / 2^32` of a turn), Q15.
#[inline]
pub(crate) fn cos_sin(p: u32) -> (i32, i32) {
    const QUARTER: u32 = 1 << 30;
    let w = p & (QUARTER - 1);
    let (s, c) = (sin_quarter(w), sin_quarter(QUARTER - w));
    match p >> 30 {
        0 => (c, s),
        1 => (-s, c),
        2 => (-c, -s),
        _ => (s, -c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real(v: i32) -> f64 {
        f64::from(v) / f64::from(ONE)
    }

    #[test]
    fn shifts_round_and_saturate() {
        assert_eq!(shr_round(5, 1), 3);
        assert_eq!(shr_round(-5, 1), -2);
        assert_eq!(shr_round(3, -2), 12);
        assert_eq!(shr_round(i64::MAX, -1), i64::MAX);
        assert_eq!(shr_round(i64::MIN, -3), i64::MIN);
        assert_eq!(shr_round(1 << 40, 80), 0);
        assert_eq!(sat32(1 << 40), i32::MAX);
        assert_eq!(div_round(-7, 2), -4);
        assert_eq!(div_round(7, 2), 4);
    }

    #[test]
    fn isqrt_is_the_floor() {
        for n in (0u64..5000).chain([u64::MAX, u64::MAX - 1, 1 << 62, (1 << 62) - 1]) {
            let r = isqrt(n);
            assert!(u128::from(r) * u128::from(r) <= u128::from(n), "{n}");
            assert!(u128::from(r + 1) * u128::from(r + 1) > u128::from(n), "{n}");
        }
    }

    #[test]
    fn exp_and_gates_are_close_to_their_definitions() {
        for i in 0..4000 {
            let x = i * 307;
            let want = libm::exp(-real(x));
            assert!((f64::from(exp_neg(x)) / 32768.0 - want).abs() < 1.5e-4, "exp(-{})", real(x));
        }
        assert_eq!(exp_neg(16 << FX), 0);
        assert_eq!(exp_neg(i32::MAX), 0);
        for z in (-12 * ONE..12 * ONE).step_by(9973) {
            let x = real(z);
            assert!((real(sigmoid(z)) - 1.0 / (1.0 + libm::exp(-x))).abs() < 1e-4, "sigmoid({x})");
            assert!((real(tanh(z)) - libm::tanh(x)).abs() < 2e-4, "tanh({x})");
            let elu = if x > 0.0 { 1.0 + x } else { libm::exp(x) };
            assert!((real(one_plus_elu(z)) - elu).abs() < 1e-4, "1 + elu({x})");
        }
        for z in [i32::MIN, i32::MAX] {
            let _ = (sigmoid(z), tanh(z), one_plus_elu(z));
        }
    }

    #[test]
    fn cos_sin_follow_the_circle() {
        for i in 0..10_000u32 {
            let p = i.wrapping_mul(429_497);
            let a = f64::from(p) / 4294967296.0 * 2.0 * core::f64::consts::PI;
            let (c, s) = cos_sin(p);
            assert!((f64::from(c) / 32768.0 - libm::cos(a)).abs() < 1e-4, "cos {a}");
            assert!((f64::from(s) / 32768.0 - libm::sin(a)).abs() < 1e-4, "sin {a}");
        }
    }
}

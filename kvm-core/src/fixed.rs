//! Fixed-point arithmetic of the integer numerics (docs/integer.md) and of the `i8`
//! product's requantization: the fraction bits, rounding shifts, saturation, wide
//! multiplies, the integer square root, and the tables behind `exp`, `sigmoid`, `1 + elu`,
//! `tanh` and the RoPE sine. A leaf: it imports no other module of the crate, so `quant`,
//! `kernels`, `cache`, `state` and `int` all build on it. Every function is total: no
//! input panics or overflows.

include!(concat!(env!("OUT_DIR"), "/int_tables.rs"));

/// Fraction bits of the integer mode's fixed-point values (`x = v * 2^-FX`).
pub const FX: u32 = 16;

/// `round(v * 2^-k)`, halves rounded up; for `k < 0`, `v * 2^-k` saturating at the i64
/// range (the integer numerics' one rounding rule).
#[inline]
pub fn shr_round(v: i64, k: i32) -> i64 {
    if k <= 0 {
        let k = k.unsigned_abs().min(63);
        if v.unsigned_abs() > (i64::MAX as u64) >> k {
            return if v < 0 { i64::MIN } else { i64::MAX };
        }
        v << k
    } else if k > 62 {
        0
    } else {
        v.saturating_add(1 << (k - 1)) >> k
    }
}

/// `round(v * 2^-k)` saturated to i32.
#[inline]
pub fn shr32(v: i64, k: i32) -> i32 {
    shr_round(v, k).clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

/// [`shr_round`] of an i32 in i32 arithmetic (`round(v * 2^-k)`, halves up; a saturating
/// left shift for `k < 0`): `floor((floor(v / 2^(k-1)) + 1) / 2)` is the same value.
#[inline]
pub(crate) fn rshr(v: i32, k: i32) -> i32 {
    match k {
        ..=0 => v.checked_shl(k.unsigned_abs()).filter(|&w| w >> k.unsigned_abs() == v).unwrap_or(if v < 0 {
            i32::MIN
        } else {
            i32::MAX
        }),
        1..=31 => (v >> (k - 1)).saturating_add(1) >> 1,
        _ => 0,
    }
}

/// `a * b` exactly. On 32-bit Arm without `smull` (ARMv6-M) from four 16 x 16-bit
/// products, which its `muls` does in a cycle, rather than the 64 x 64-bit library
/// multiply; elsewhere the target's own widening multiply.
#[inline]
pub fn mul_wide(a: i32, b: i32) -> i64 {
    if cfg!(all(target_arch = "arm", not(kvm_arm_smull))) {
        mul_halves(a, b)
    } else {
        i64::from(a) * i64::from(b)
    }
}

/// `a * b` from the 16-bit halves' four products (each within 32 bits).
#[inline]
fn mul_halves(a: i32, b: i32) -> i64 {
    let (ah, al, bh, bl) = (a >> 16, a & 0xFFFF, b >> 16, b & 0xFFFF);
    let low = i64::from(al as u32 * bl as u32);
    let mid = i64::from(ah * bl) + i64::from(al * bh);
    (i64::from(ah * bh) << 32) + (mid << 16) + low
}

/// [`requant`] of a sum that is an i32 (a row of at most 512 products): the same value,
/// from a product of two i32s.
#[inline]
pub fn requant32(acc: i32, (m, sh): (i32, i32), s: i32) -> i32 {
    let k = sh - s;
    if (17..=46).contains(&k) && (0..1 << 15).contains(&m) {
        // The usual shifts, in i32 arithmetic (a core without a 64-bit multiply or shift
        // pays a library call for each): acc = hi * 2^16 + lo, and round(acc * m / 2^k) =
        // floor((hi m + floor(lo m / 2^16) + 2^(k-17)) / 2^(k-16)), every term below 2^30.
        let hi = (acc >> 16) * m;
        let lo = ((acc & 0xFFFF) as u32 * m as u32) >> 16;
        return (hi + lo as i32 + (1 << (k - 17))) >> (k - 16);
    }
    let p = mul_wide(acc, m);
    if (1..=62).contains(&k) {
        // |p| < 2^46: no overflow in the rounding add
        ((p + (1 << (k - 1))) >> k).clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
    } else {
        shr32(p, k)
    }
}

/// A row's output of an [`crate::quant::DType::I8`] product: `round(acc * m * 2^(s - sh))` for the exact
/// sum `acc` of its products with an input of exponent `s`, saturating.
#[inline]
pub fn requant(acc: i64, (m, sh): (i32, i32), s: i32) -> i32 {
    shr32(acc.saturating_mul(i64::from(m)), sh - s)
}

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
    shr32(mul_wide(x, y), FX as i32)
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
mod int_tests {
    use super::*;

    #[test]
    fn halves_multiply_exactly() {
        let edge =
            [i32::MIN, i32::MIN + 1, -65537, -65536, -65535, -1, 0, 1, 65535, 65536, 65537, i32::MAX - 1, i32::MAX];
        let mut s = 0x9E37_79B9u32;
        let mut values = edge.to_vec();
        for _ in 0..200 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            values.push(s as i32);
        }
        for &a in &values {
            for &b in &values {
                assert_eq!(mul_halves(a, b), i64::from(a) * i64::from(b), "{a} * {b}");
            }
        }
    }

    #[test]
    fn requant32_is_the_wide_rounding() {
        let wide = |acc: i32, m: i32, k: i32| {
            let p = i64::from(acc) * i64::from(m);
            match k {
                1..=62 => ((p + (1 << (k - 1))) >> k).clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32,
                _ => shr32(p, k),
            }
        };
        let mut s = 0x2545_F491u32;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        let accs = [i32::MIN, i32::MIN + 1, -65537, -65536, -32769, -1, 0, 1, 65535, 65536, i32::MAX];
        for k in -3..70 {
            for m in [0, 1, 1 << 14, (1 << 15) - 1, 1 << 15, 40_000, 65_535] {
                for acc in accs.iter().copied().chain((0..50).map(|_| next() as i32 >> (next() % 32))) {
                    // requant32's input exponent s and head shift sh differ by k
                    assert_eq!(requant32(acc, (m, k + 5), 5), wide(acc, m, k), "acc {acc} m {m} k {k}");
                }
            }
        }
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

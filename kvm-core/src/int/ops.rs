//! The integer numerics' vector operations (docs/integer.md): a product's i16 input, the
//! matrix product against i8 rows, attention rows (i16 under one exponent, bounded in
//! norm), LayerNorm, and the Euclidean norm. Values are fixed point (`FX` fraction bits)
//! unless a comment says otherwise.

use crate::cache::int::Row;
use crate::fixed::{bit_len, div_round, isqrt, mul_wide, rshr, shr32, shr_round, FX};
use crate::kernels;
use crate::quant::i8_row;
use crate::tensor::{Matrix, Vector};

/// `x` as a product's input: `out[c] = round(x[c] * 2^-s)` for the least `s >= 0` that
/// keeps every `|out[c]| <= 32767`; returns `s`, the input's exponent (`x[c] ~ out[c] *
/// 2^s`, in fixed point).
pub(crate) fn to_input(x: &[i32], out: &mut [i16]) -> i32 {
    let max = x.iter().fold(0u32, |m, &v| m.max(v.unsigned_abs()));
    let mut s = (bit_len(u64::from(max)) - 15).max(0);
    if shr_round(i64::from(max), s) > 32767 {
        s += 1;
    }
    for (o, &v) in out.iter_mut().zip(x) {
        *o = rshr(v, s) as i16;
    }
    s
}

/// [`to_input`] of `relu(h)^2` (`h` fixed point, its own scratch): `h` first as an input
/// of exponent `s_h`, whose squares (at most 2^30) replace `h`, then those as one; returns
/// the input's exponent (`relu(h)^2 ~ out * 2^s` in fixed point).
pub(crate) fn relu_sq_input(h: &mut [i32], out: &mut [i16]) -> i32 {
    let s_h = to_input(h, out);
    for (q, &m) in h.iter_mut().zip(out.iter()) {
        let r = i32::from(m.max(0));
        *q = r * r;
    }
    // relu(h)^2 = m^2 * 2^(2 s_h - FX) in fixed point
    to_input(h, out) + 2 * s_h - FX as i32
}

/// `y = w x` for an i8 matrix `w` (`[rows, cols]`) and an input `x` of exponent `s`
/// ([`to_input`]): `y[r] = round(sum(q x) * m_r * 2^(s - sh_r))`, saturating (the
/// kernel tier's [`kernels::matvec_i8`]).
#[inline]
pub(crate) fn matvec(w: &Matrix<'_>, x: &[i16], s: i32, y: &mut [i32]) {
    kernels::matvec_i8(w, x, s, y);
}

/// Row `r` of an i8 matrix in fixed point (the embedding's lookup).
pub(crate) fn dequant_row(w: &Matrix<'_>, r: usize, out: &mut [i32]) {
    let ((m, sh), q) = i8_row(w.data, w.row_bytes(), r);
    for (o, &q) in out.iter_mut().zip(q) {
        *o = shr32(i64::from(q) * i64::from(m), sh - FX as i32);
    }
}

/// `x` (`x[c] * 2^(e_x - FX)` each) as an attention row: `m[c] = round(x[c] * 2^(e_x -
/// e))` for the least `e` (from `e_x - 16`: small rows widen) whose mantissas have a norm
/// below 2^15 (so that the dot product of two rows stays below 2^30); returns `e` (`x[c] ~
/// m[c] * 2^(e - FX)`).
pub(crate) fn to_row(x: &[i32], e_x: i32, m: &mut [i16]) -> i32 {
    let max = x.iter().fold(0u32, |a, &v| a.max(v.unsigned_abs()));
    if max == 0 {
        m.fill(0);
        return e_x;
    }
    // Values cut (or widened) to at most 15 bits, then their squares' sum, bound the
    // shift.
    let sum_sq = |k: i32| -> u64 { x.iter().map(|&v| u64::from(rshr(v, k).unsigned_abs().pow(2))).sum() };
    let p = (bit_len(u64::from(max)) - 15).max(-16);
    let mut k = p + ((bit_len(sum_sq(p)) - 29).max(0) + 1) / 2;
    while sum_sq(k) >= 1 << 30 {
        k += 1;
    }
    for (o, &v) in m.iter_mut().zip(x) {
        *o = rshr(v, k) as i16;
    }
    e_x + k
}

/// `sum a * b` of two attention rows (below 2^30 in magnitude), four products a turn.
#[inline]
pub(crate) fn dot_rows(a: &[i16], b: &[i16]) -> i32 {
    let (ac, bc) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail =
        ac.remainder().iter().zip(bc.remainder()).fold(0i32, |s, (&x, &y)| s.wrapping_add(i32::from(x) * i32::from(y)));
    ac.zip(bc).fold(tail, |s, (x, y)| {
        let p = (i32::from(x[0]) * i32::from(y[0])).wrapping_add(i32::from(x[1]) * i32::from(y[1]));
        let q = (i32::from(x[2]) * i32::from(y[2])).wrapping_add(i32::from(x[3]) * i32::from(y[3]));
        s.wrapping_add(p.wrapping_add(q))
    })
}

/// [`dot_rows`] of a query row and a stored row of either width.
#[inline]
pub(crate) fn dot_row(a: &[i16], b: Row<'_>) -> i32 {
    match b {
        Row::I16(b) => dot_rows(a, b),
        Row::I8(b) => a.iter().zip(b).fold(0i32, |s, (&x, &y)| s.wrapping_add(i32::from(x) * i32::from(y))),
    }
}

/// `round(1e-5 * 2^48)`: LayerNorm's epsilon in the units of [`layer_norm`]'s variance.
const EPS_48: u64 = 2_814_749_767;

/// `x <- LN(x) * w + b` (biased variance, eps 1e-5) of `x` (`x[c] * 2^(e_x - FX)` each;
/// the result is the same for every scale but for eps), into fixed point: the deviations
/// from the rounded mean cut to at most 15 bits (`d'`), their variance from the exact sum
/// of squares, `z = d' / sqrt(var + eps)` to `FX` bits, then `z * w + b`.
pub(crate) fn layer_norm(x: &mut [i32], e_x: i32, w: Vector<'_>, b: Vector<'_>) {
    let n = x.len() as i64;
    if n == 0 {
        return;
    }
    // One pass for the sum and the extremes, whose distance to the mean bounds every
    // deviation's.
    let (sum, lo, hi) =
        x.iter().fold((0i64, i32::MAX, i32::MIN), |(s, lo, hi), &v| (s + i64::from(v), lo.min(v), hi.max(v)));
    let mean = div_round(sum, n);
    let max = (i64::from(hi) - mean).max(mean - i64::from(lo)).unsigned_abs();
    let p = (bit_len(max) - 15).max(0);
    // |x - mean| <= 2^32: no overflow in i64, and d' below 2^15; in i32 arithmetic (no
    // 64-bit shift, a library call on 32-bit cores) where every deviation is below 2^30
    let narrow = max < 1 << 30;
    let dev = |v: i32| match (narrow, p) {
        (true, 0) => v.wrapping_sub(mean as i32),
        (true, _) => (v.wrapping_sub(mean as i32) + (1 << (p - 1))) >> p,
        (false, 0) => (i64::from(v) - mean) as i32,
        (false, _) => ((i64::from(v) - mean + (1 << (p - 1))) >> p) as i32,
    };
    let ss: u64 = x.iter().map(|&v| u64::from(dev(v).unsigned_abs().pow(2))).sum();
    // var of d' in units of 2^-16 (at most 2^46): floor(ss * 2^16 / n), by shifts for a
    // width that is a power of two
    let n64 = n as u64;
    let var = if n64.is_power_of_two() {
        let t = n64.trailing_zeros();
        ((ss >> t) << 16) + (((ss & (n64 - 1)) << 16) >> t)
    } else {
        ((ss / n64) << 16) + ((ss % n64) << 16) / n64
    };
    // eps in the same units: 1e-5 real is 1e-5 * 2^(2 (FX - e_x - p) + 16)
    let eps = shr_round(EPS_48 as i64, 2 * (e_x + p)).max(0) as u64;
    // r = std(d') * 2^16
    let r = isqrt(var.saturating_add(eps).min(1 << 46) << 16).max(1);
    // 2^32 / r as inv * 2^(2 - u): inv in (2^29, 2^30], so that every product below is
    // of two i32s
    let u = bit_len(r) - 1;
    let inv = ((1u64 << (30 + u)) / r) as i32;
    let k = u - 2;
    for ((v, w), b) in x.iter_mut().zip(w.iter_fixed()).zip(b.iter_fixed()) {
        // z = d' / std(d') in fixed point: |d'| <= sqrt(n) std(d'), so |z| < 2^26
        let z = round_product(dev(*v), inv, k);
        let y = ((mul_wide(z, w) + (1 << 15)) >> 16) + i64::from(b);
        *v = y.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32;
    }
}

/// `shr_round(d * inv, k)` for `|d| <= 2^15` and `0 < inv <= 2^30` (a LayerNorm's
/// deviation and reciprocal), as an i32; for the usual `k` in i32 arithmetic: with `inv =
/// ih * 2^15 + il`, `floor((ih d * 2^15 + il d + 2^(k-1)) / 2^k) = floor((ih d +
/// floor((il d + 2^(k-1)) / 2^15)) / 2^(k-15))`, every term below 2^31.
#[inline]
fn round_product(d: i32, inv: i32, k: i32) -> i32 {
    if (15..=31).contains(&k) {
        let (ih, il) = (inv >> 15, inv & 0x7FFF);
        let c = d * il + (1 << (k - 1));
        return (d * ih + (c >> 15)) >> (k - 15);
    }
    let dz = mul_wide(d, inv);
    (if k >= 1 { (dz + (1 << (k - 1))) >> k } else { shr_round(dz, k) }) as i32
}

/// `|x|` of a fixed-point vector, in fixed point.
pub(crate) fn norm(x: &[i32]) -> i32 {
    let max = x.iter().fold(0u32, |m, &v| m.max(v.unsigned_abs()));
    if max == 0 {
        return 0;
    }
    // x cut (or widened) to values below 2^15, whose sum of squares is exact
    let p = bit_len(u64::from(max)) - 15;
    let ss: u64 = x.iter().map(|&v| shr_round(i64::from(v), p).unsigned_abs().pow(2)).sum();
    // sqrt(ss) to as many bits as a u64 holds: isqrt(ss * 4^t) = sqrt(ss) * 2^t
    let t = (62 - bit_len(ss)).max(0) / 2;
    shr32(isqrt(ss << (2 * t)) as i64, t - p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixed::ONE;
    use crate::quant::{quantize_row, to_fixed, DType};
    use crate::sampler::Pcg32;

    fn real(v: i32) -> f64 {
        f64::from(v) / f64::from(ONE)
    }

    fn randn(rng: &mut Pcg32, n: usize, scale: f32) -> [f32; 256] {
        let mut v = [0f32; 256];
        for x in v[..n].iter_mut() {
            *x = (rng.next_f32() - 0.5) * 2.0 * scale;
        }
        v
    }

    #[test]
    fn layer_norm_matches_floats() {
        let mut rng = Pcg32::new(7);
        for (n, scale) in [(128usize, 1.0f32), (32, 30.0), (200, 0.01), (7, 3.0)] {
            let x = randn(&mut rng, n, scale);
            let w = randn(&mut rng, n, 2.0);
            let b = randn(&mut rng, n, 0.5);
            let enc = |v: &[f32]| {
                let mut out = [0u8; 1024];
                for (o, &x) in out.chunks_exact_mut(4).zip(v) {
                    o.copy_from_slice(&to_fixed(x).to_le_bytes());
                }
                out
            };
            let (wb, bb) = (enc(&w[..n]), enc(&b[..n]));
            let (wv, bv) = (Vector::from_le_bytes(&wb[..4 * n]), Vector::from_le_bytes(&bb[..4 * n]));
            let mut xi: [i32; 256] = core::array::from_fn(|i| to_fixed(x[i]));
            // The float norm of the fixed-point input.
            let xr: [f64; 256] = core::array::from_fn(|i| real(xi[i]));
            layer_norm(&mut xi[..n], 0, wv, bv);
            let mean = xr[..n].iter().sum::<f64>() / n as f64;
            let var = xr[..n].iter().map(|&v| (v - mean).powi(2)).sum::<f64>() / n as f64;
            for i in 0..n {
                let want = (xr[i] - mean) / libm::sqrt(var + 1e-5) * f64::from(w[i]) + f64::from(b[i]);
                assert!((real(xi[i]) - want).abs() < 2e-3, "n {n} scale {scale} i {i}: {} vs {want}", real(xi[i]));
            }
        }
    }

    #[test]
    fn round_product_is_the_wide_rounding() {
        let mut rng = Pcg32::new(11);
        let ds = [-(1 << 15), -32767, -1, 0, 1, 32767, 1 << 15];
        let invs = [1, (1 << 29) + 1, (1 << 30) - 1, 1 << 30];
        for k in -2..40 {
            for i in 0..400 {
                let d = if i < 7 { ds[i] } else { (rng.next_u32() % 65537) as i32 - 32768 };
                let inv = if i % 5 < 4 { invs[i % 4] } else { (rng.next_u32() >> 2).max(1) as i32 };
                let want = shr_round(i64::from(d) * i64::from(inv), k) as i32;
                assert_eq!(round_product(d, inv, k), want, "d {d} inv {inv} k {k}");
            }
        }
    }

    #[test]
    fn matvec_matches_floats() {
        let mut rng = Pcg32::new(3);
        let (rows, cols) = (5usize, 128usize);
        let mut data = [0u8; 5 * 132];
        let mut wf = [[0f32; 256]; 5];
        for r in 0..rows {
            wf[r] = randn(&mut rng, cols, 0.2);
            quantize_row(DType::I8, &wf[r][..cols], &mut data[r * 132..(r + 1) * 132]).unwrap();
        }
        let w = Matrix::new(DType::I8, rows, cols, &data).unwrap();
        let x = randn(&mut rng, cols, 3.0);
        let xi: [i32; 256] = core::array::from_fn(|i| to_fixed(x[i]));
        let mut x16 = [0i16; 256];
        let s = to_input(&xi[..cols], &mut x16[..cols]);
        let mut y = [0i32; 5];
        matvec(&w, &x16[..cols], s, &mut y);
        for r in 0..rows {
            let want: f64 = (0..cols).map(|c| f64::from(wf[r][c]) * f64::from(x[c])).sum();
            assert!((real(y[r]) - want).abs() < 0.02 * (1.0 + want.abs()), "row {r}: {} vs {want}", real(y[r]));
        }
    }

    #[test]
    fn rows_keep_dot_products() {
        let mut rng = Pcg32::new(5);
        for scale in [0.001f32, 1.0, 100.0] {
            let (a, b) = (randn(&mut rng, 32, scale), randn(&mut rng, 32, 1.0));
            let ai: [i32; 32] = core::array::from_fn(|i| to_fixed(a[i]));
            let bi: [i32; 32] = core::array::from_fn(|i| to_fixed(b[i]));
            let (mut am, mut bm) = ([0i16; 32], [0i16; 32]);
            let (ea, eb) = (to_row(&ai, 0, &mut am), to_row(&bi, 0, &mut bm));
            let got = f64::from(dot_rows(&am, &bm)) * libm::exp2(f64::from(ea + eb - 32));
            let want: f64 = (0..32).map(|c| f64::from(ai[c]) * f64::from(bi[c])).sum::<f64>() / 65536.0 / 65536.0;
            assert!(
                (got - want).abs() < 1e-3 * (1.0 + want.abs()) * f64::from(scale),
                "scale {scale}: {got} vs {want}"
            );
            let n: f64 = (0..32).map(|c| f64::from(a[c]).powi(2)).sum::<f64>().sqrt();
            assert!((real(norm(&ai)) - n).abs() < 1e-4 * (1.0 + n), "norm {} vs {n}", real(norm(&ai)));
        }
    }
}

//! Small dense helpers of the forward pass: LayerNorm, activations, dot products, RoPE.

use crate::quant::round_bf16;
use crate::tensor::Vector;

/// LayerNorm epsilon of every norm in the model.
pub const LN_EPS: f32 = 1e-5;

/// `out = (x - mean) / sqrt(var + eps) * w + b` with the biased variance, as torch.
pub fn layer_norm(x: &[f32], w: Vector<'_>, b: Vector<'_>, out: &mut [f32]) {
    ln_apply(x, ln_stats(x), w, b, out);
}

/// `out = (x - mean) * inv * w + b` for the stats ([`ln_stats`]) of a whole row: `x`, `w`,
/// `b` and `out` may be a chunk of it.
pub fn ln_apply(x: &[f32], (mean, inv): (f32, f32), w: Vector<'_>, b: Vector<'_>, out: &mut [f32]) {
    for (((o, &v), w), b) in out.iter_mut().zip(x).zip(w.iter()).zip(b.iter()) {
        *o = (v - mean) * inv * w + b;
    }
}

/// In-place [`layer_norm`].
pub fn layer_norm_inplace(x: &mut [f32], w: Vector<'_>, b: Vector<'_>) {
    let (mean, inv) = ln_stats(x);
    for ((v, w), b) in x.iter_mut().zip(w.iter()).zip(b.iter()) {
        *v = (*v - mean) * inv * w + b;
    }
}

/// [`layer_norm`]'s mean and `1 / sqrt(var + eps)`: element `i` normalises to
/// `(x[i] - mean) * inv * w[i] + b[i]`.
pub fn ln_stats(x: &[f32]) -> (f32, f32) {
    let n = x.len() as f32;
    let mean = sum(x) / n;
    let var = sum_by(x, |v| (v - mean) * (v - mean)) / n;
    (mean, 1.0 / libm::sqrtf(var + LN_EPS))
}

/// Independent partial sums of [`dot`] and [`sum_by`]: eight fill one vector register on
/// every SIMD target, where a single running sum would serialise on its latency.
const LANES: usize = 8;

/// No NaN and no infinity in `x` (one branch-free pass, which vectorises).
pub fn all_finite(x: &[f32]) -> bool {
    const EXP: u32 = 0x7F80_0000;
    !x.iter().fold(false, |acc, v| acc | (v.to_bits() & EXP == EXP))
}

/// `sum x_i` in eight partial sums.
pub fn sum(x: &[f32]) -> f32 {
    sum_by(x, |v| v)
}

/// `sum f(x_i)` in [`LANES`] partial sums; out of line, since its unrolled lanes inlined
/// at every norm and softmax would cost the firmware's flash 10 KB.
#[inline(never)]
fn sum_by(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let chunks = x.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|&v| f(v)).sum();
    let mut acc = [0f32; LANES];
    for c in chunks {
        for i in 0..LANES {
            acc[i] += f(c[i]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `a . b` in eight partial sums.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline]
pub fn norm(a: &[f32]) -> f32 {
    libm::sqrtf(dot(a, a))
}

#[inline]
pub fn elu(x: f32) -> f32 {
    if x > 0.0 {
        x
    } else {
        libm::expm1f(x)
    }
}

/// `y += s * x`.
#[inline]
pub fn axpy(y: &mut [f32], s: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += s * x;
    }
}

/// The RoPE exponents `e_j` of the reference's f32 `linspace(0, 1, R/2)` and frequencies
/// `f_j = f32((1/theta) ^ e_j)` (spec §2.5), reproduced bit for bit because a one-ulp
/// slip flips bf16 table entries. `linspace` steps by `s = f32(1 / (R/2 - 1))` from both
/// ends: `e_j = s * j` in the first half, `1 - s * (R/2 - 1 - j)` in the second (which
/// differs from `f32(j / (R/2 - 1))` from 8 pairs on, e.g. j = 3 of 8).
#[inline]
pub fn rope_freq(j: usize, half: usize, theta: f64) -> f32 {
    let e = if half <= 1 {
        0.0
    } else {
        // Pair counts are at most d_qk / 2 <= 2^13, exact f32s.
        let step = 1.0 / (half - 1) as f32;
        if j < half / 2 {
            step * j as f32
        } else {
            1.0 - step * (half - 1 - j) as f32
        }
    };
    let base = (1.0 / theta) as f32;
    libm::pow(base as f64, e as f64) as f32
}

/// Rotated pairs whose frequencies [`Rope`] keeps: those of up to 128 rotated dims (the
/// paper's sliding-window layers rotate 128), 256 bytes in every session, so that no
/// step of the integer numerics computes one in floats.
pub(crate) const ROPE_KEPT: usize = 64;

/// A session's RoPE frequencies ([`rope_freq`] of `R/2` pairs), the first 16 (`ROPE_KEPT`)
/// computed once: each is an f64 power, thousands of instructions in software on a
/// single-precision FPU, which every token's tables would otherwise repeat.
#[derive(Debug, Clone, Copy)]
pub struct Rope {
    theta: f64,
    half: usize,
    kept: [f32; ROPE_KEPT],
}

impl Rope {
    /// The frequencies of `half` pairs for base `theta`.
    pub fn new(half: usize, theta: f64) -> Rope {
        Rope { theta, half, kept: core::array::from_fn(|j| if j < half { rope_freq(j, half, theta) } else { 0.0 }) }
    }

    /// Frequency `f_j`: [`rope_freq`]`(j, half, theta)`.
    #[inline]
    pub fn freq(&self, j: usize) -> f32 {
        match self.kept.get(j) {
            Some(&f) if j < self.half => f,
            _ => rope_freq(j, self.half, self.theta),
        }
    }

    /// Fills the bf16-rounded cos/sin tables of position `pos`: `cos.len() == sin.len() ==
    /// R/2`.
    pub fn tables(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for (j, (c, s)) in cos.iter_mut().zip(sin.iter_mut()).enumerate() {
            let angle = pos as f32 * self.freq(j);
            *c = round_bf16(libm::cos(angle as f64) as f32);
            *s = round_bf16(libm::sin(angle as f64) as f32);
        }
    }
}

/// Rotates adjacent pairs `(2j, 2j+1)` of `x[..2 * cos.len()]` in place.
pub fn rope_apply(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    for (j, (&c, &s)) in cos.iter().zip(sin).enumerate() {
        let (a, b) = (x[2 * j], x[2 * j + 1]);
        x[2 * j] = c * a + s * b;
        x[2 * j + 1] = c * b - s * a;
    }
}

/// `cur += mix * (prev - cur)`, then `prev <- cur` as it was (pre-shift): a token shift
/// towards the previous token's row. With `first`, the previous token is the token itself.
pub fn token_shift(cur: &mut [f32], prev: &mut [f32], mix: Vector<'_>, first: bool) {
    for ((c, p), mix) in cur.iter_mut().zip(prev.iter_mut()).zip(mix.iter()) {
        let x = *c;
        let before = if first { x } else { *p };
        *c = x + mix * (before - x);
        *p = x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_sums_match_running_ones() {
        for n in [0usize, 1, 7, 8, 9, 31, 130] {
            let x: [f32; 130] = core::array::from_fn(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37);
            let x = &x[..n];
            let exact: f64 = x.iter().map(|&v| f64::from(v)).sum();
            assert!((f64::from(sum(x)) - exact).abs() <= 1e-4 * (1.0 + exact.abs()), "sum of {n}");
        }
    }

    #[test]
    fn kept_rope_frequencies_are_the_computed_ones() {
        for half in [1, 2, 8, 15, 16, 17, 40] {
            let rope = Rope::new(half, 10_000.0);
            for j in 0..half {
                assert_eq!(rope.freq(j).to_bits(), rope_freq(j, half, 10_000.0).to_bits(), "{j} of {half}");
            }
        }
    }

    #[test]
    fn rope_exponents_divide_in_f32_as_in_f64() {
        for half in (2..=4096).chain([65_535, 1 << 20, (1 << 24) - 1, 1 << 24]) {
            let js = (0..half.min(4096)).chain([half / 3, half / 2 + 1, half - 2, half - 1]);
            for j in js {
                let want = (j as f64 / (half - 1) as f64) as f32;
                assert_eq!((j as f32 / (half - 1) as f32).to_bits(), want.to_bits(), "{j} / {}", half - 1);
            }
        }
    }
}

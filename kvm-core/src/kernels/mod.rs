//! Matrix x vector and matrix x matrix kernels over every weight format, in tiers.
//!
//! [`scalar`] is the oracle; SIMD tiers (`x86_64::{avx2, avx512}`, `aarch64::neon`, `wasm32`) plug
//! over it. Every tier supplies the same few pieces (`Kernels`): for each dtype a *tile*
//! kernel, the dot products of `R` weight rows with `T` activation vectors, plus an
//! activation quantizer and a row decoder. One driver (`run`) walks every matrix in such
//! tiles, so the SIMD code holds only arithmetic and every tier shares the same loops.
//!
//! Integer formats (q8_0, q4_0) first quantize the activation to q8 blocks in the caller's
//! `act` scratch (ggml's `vec_dot_q8_0_q8_0` approach): the dot products are then exact
//! integer sums scaled once per block, in every tier alike, scalar included.
//!
//! The tier in use starts as the best one the compile-time target features allow and may be
//! switched at run time ([`tier::force_tier`]; with `std`, `init_from_env`). Cortex-M4/M7/M33
//! builds get `arm::dsp` (`smlad` integer products) this way, with no run-time detection.

#[cfg(target_arch = "aarch64")]
mod aarch64;
// The dsp kernels also on the host, for their tests, which run their arithmetic on
// emulated instructions.
#[cfg(any(kvm_arm_dsp, kvm_mve, kvm_armv6m, test))]
mod arm;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64", all(target_arch = "wasm32", target_feature = "simd128")))]
mod attend;
mod fma;
mod gemm;
mod prefetch;
#[cfg(target_arch = "riscv32")]
mod riscv32;
pub mod scalar;
mod table;
pub mod tier;
mod traits;
mod walk;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm32;
#[cfg(target_arch = "x86_64")]
mod x86_64;

pub use fma::fma_chains;
pub use prefetch::prefetch_later;
pub(crate) use prefetch::{prefetch_lines, Access};
use table::table;

#[cfg(feature = "std")]
pub use tier::{detect, init_from_env, TierError};
pub use tier::{force_tier, set_streaming, streaming, tier, Streaming, Tier};
pub use traits::{act_scratch_len, Stored};

use crate::quant::{DType, GroupQ4_0x16, GroupQ8_0x16, QK, X16};
use crate::tensor::Matrix;
use half::f16;

/// Tokens [`matmul`] quantizes at a time when given [`matmul_scratch_len`] bytes: enough
/// that one pass over the weights feeds the arithmetic rather than waiting on memory.
pub const MATMUL_TOKENS: usize = 16;

/// Bytes of scratch [`matmul`] needs for an `[n, cols]` input: to read integer-format
/// weights once per [`MATMUL_TOKENS`] tokens, and, for a batch of several tokens, to
/// transpose it for the float weights' batch kernel. Any multiple of [`act_scratch_len`]
/// down to one token also works, streaming integer weights more often and float ones
/// through decode's tiles.
pub const fn matmul_scratch_len(cols: usize, n: usize) -> usize {
    let tokens = if n < MATMUL_TOKENS { n } else { MATMUL_TOKENS };
    let ints = act_scratch_len(cols) * tokens;
    let floats = if n < gemm::MIN_TOKENS { 0 } else { gemm::scratch_len(cols, n) };
    if ints > floats {
        ints
    } else {
        floats
    }
}

/// `y[r] = sum_c w[r, c] * x[c]` for every row. `x.len() == w.cols`,
/// `y.len() == w.rows`, `act.len() >= act_scratch_len(w.cols)`.
#[inline]
pub fn matvec(w: &Matrix<'_>, x: &[f32], y: &mut [f32], act: &mut [u8]) {
    debug_assert_eq!(x.len(), w.cols);
    // SAFETY: the active tier's CPU features are present (the invariant of `tier`).
    unsafe { (table(tier()).decode.matvec)(w, x, y, act) }
}

/// `ys[t, r] = sum_c w[r, c] * xs[t, c]` for `n = xs.len() / w.cols` tokens at once
/// (`xs: [n, cols]`, `ys: [n, rows]`): each weight row is read once per group of tokens
/// instead of once per token, which is what makes chunked prefill cheaper than `n` calls
/// of [`matvec`]. For integer formats `act.len()` sets the group:
/// `act.len() / act_scratch_len(cols)` tokens ([`matmul_scratch_len`]), at least one.
#[inline]
pub fn matmul(w: &Matrix<'_>, xs: &[f32], ys: &mut [f32], act: &mut [u8]) {
    // SAFETY: as in `matvec`.
    unsafe { (table(tier()).matmul)(w, xs, ys, act) }
}

/// Quantizes one token's input `x` (`[cols]`, whole [`QK`] blocks) into the first
/// [`act_scratch_len`]`(cols)` bytes of `act`: the first half of [`matvec`] on
/// integer-format weights, done once when several products read the same input (see
/// [`matvec_prepared`]). Shapes that do not fit are `debug_assert`ed; in release they
/// write nothing.
#[inline]
pub fn quantize_act(x: &[f32], act: &mut [u8]) {
    let len = act_scratch_len(x.len());
    let fits = x.len().is_multiple_of(QK) && act.len() >= len;
    debug_assert!(fits, "{} values into {} bytes", x.len(), act.len());
    if fits {
        // SAFETY: as in `matvec`; the tiers write `len` bytes for whole blocks.
        unsafe { (table(tier()).quantize_act)(x, &mut act[..len]) }
    }
}

/// [`matvec`] on an input already prepared: float weights read `x`, integer ones `act` as
/// [`quantize_act`] left it for that `x`. The same bits as `matvec`.
#[inline]
pub fn matvec_prepared(w: &Matrix<'_>, x: &[f32], act: &[u8], y: &mut [f32]) {
    debug_assert_eq!(x.len(), w.cols);
    // SAFETY: as in `matvec`.
    unsafe { (table(tier()).decode.matvec_prepared)(w, x, act, y) }
}

/// The integer numerics' product (docs/integer.md): `y[r] =`
/// [`crate::fixed::requant`]`(sum_c q[r, c] * x[c], scale_r, s)` for an [`DType::I8`]
/// matrix `w` and an i16 input `x` of exponent `s` (`x.len() >= w.cols`, `y.len() <=
/// w.rows`). The sums are exact, so every tier gives the same bits.
#[inline]
pub fn matvec_i8(w: &Matrix<'_>, x: &[i16], s: i32, y: &mut [i32]) {
    debug_assert!(w.dtype == DType::I8 && x.len() >= w.cols && y.len() <= w.rows);
    // SAFETY: as in `matvec`.
    unsafe { (table(tier()).matvec_i8)(w, x, s, y) }
}

/// Rows of `dtype` that [`matvec`] takes at a time in the active tier: a product split
/// into parts of a multiple of this many rows (see [`Matrix::row_range`]) runs every part
/// at full speed, with no rows left over to take one by one.
#[inline]
pub fn matvec_rows(dtype: DType) -> usize {
    (table(tier()).decode.rows)(dtype)
}

/// Decodes row `row` of `w` into `out` (`out.len() == w.cols`).
#[inline]
pub fn dequant_row(w: &Matrix<'_>, row: usize, out: &mut [f32]) {
    debug_assert_eq!(out.len(), w.cols);
    let rb = w.row_bytes();
    let group = || &w.data[row / X16 * X16 * rb..(row / X16 + 1) * X16 * rb];
    match w.dtype {
        DType::Q4_0x16 => return scalar::dequant_group::<GroupQ4_0x16>(bytemuck::cast_slice(group()), row % X16, out),
        DType::Q8_0x16 => return scalar::dequant_group::<GroupQ8_0x16>(bytemuck::cast_slice(group()), row % X16, out),
        _ => {}
    }
    let bytes = &w.data[row * rb..(row + 1) * rb];
    // SAFETY: as in `matvec`.
    unsafe { (table(tier()).dequant_row)(w.dtype, bytes, out) }
}

/// `out[i] = rows[i] . x` for each of the `rows.len() / x.len()` rows of `rows`
/// (`[n, x.len()]`, `out`: at least `[n]`): one query's scores against a run of keys. Every
/// tier sums in [`scalar::dots`]' canonical order, so the scores are the same bits on
/// every CPU.
#[inline]
pub fn dots<T: Stored>(rows: &[T], x: &[f32], out: &mut [f32]) {
    // SAFETY: as in `matvec`.
    unsafe { (T::attention(table(tier())).dots)(rows, x, out) }
}

/// [`dots`] of each query of `xs` (`[m, d]`) against every row of `rows` (`[n, d]`):
/// `out[i * n + j] = rows[j] . xs[i]` (`out`: `[m, n]`), each in the canonical order, so
/// the same bits as `m` calls of [`dots`]. Tiers with a multi-query kernel read each row
/// once for several queries (the state's similarities in a fold); the others call
/// [`dots`] per query.
pub fn dots_many<T: Stored>(rows: &[T], xs: &[f32], d: usize, out: &mut [f32]) {
    if d == 0 {
        out.fill(0.0);
        return;
    }
    let n = rows.len() / d;
    if n == 0 {
        return;
    }
    if let Some(f) = T::attention(table(tier())).dots_many {
        // SAFETY: as in `matvec`; `d > 0` and at least one row, as the kernel needs.
        return unsafe { f(rows, xs, d, out) };
    }
    for (x, o) in xs.chunks_exact(d).zip(out.chunks_exact_mut(n)) {
        dots(rows, x, o);
    }
}

/// `out[c] += sum_j p[j] * rows[j][c]` for the `p.len()` rows of `rows` (`[n, out.len()]`):
/// attention's weighted sum of values. Every tier gives [`scalar::weighted_sum`]'s bits.
#[inline]
pub fn weighted_sum<T: Stored>(p: &[f32], rows: &[T], out: &mut [f32]) {
    debug_assert!(rows.len() >= p.len() * out.len());
    // SAFETY: as in `matvec`.
    unsafe { (T::attention(table(tier())).weighted_sum)(p, rows, out) }
}

/// [`weighted_sum`] of several queries over the same `n` rows (`rows`: `[n, d]`):
/// `outs[i] += sum_j ps[i * stride + j] * rows[j]` for each query `i` of `outs` (`[m, d]`),
/// the same bits as `m` calls of [`weighted_sum`]. Tiers with a multi-query kernel load
/// each row once for several queries (attention over a prefill segment); the others call
/// [`weighted_sum`] per query.
///
/// # Panics
/// If `ps` holds fewer than `(m - 1) * stride + n` scores.
pub fn weighted_sum_many<T: Stored>(ps: &[f32], stride: usize, rows: &[T], d: usize, outs: &mut [f32]) {
    if d == 0 {
        return;
    }
    let (m, n) = (outs.len() / d, rows.len() / d);
    if m == 0 || n == 0 {
        return;
    }
    assert!(ps.len() >= (m - 1) * stride + n, "weighted_sum_many: {m} queries of {n} scores");
    if let Some(f) = T::attention(table(tier())).weighted_sum_many {
        // SAFETY: as in `matvec`; `d > 0` and `ps` long enough, as the kernel needs.
        return unsafe { f(ps, stride, rows, d, outs) };
    }
    for (i, out) in outs.chunks_exact_mut(d).enumerate() {
        weighted_sum(&ps[i * stride..i * stride + n], rows, out);
    }
}

/// The largest of `x`, NaNs ignored (`-inf` if none is left): softmax's maximum.
#[inline]
pub fn max(x: &[f32]) -> f32 {
    // SAFETY: as in `matvec`.
    unsafe { (table(tier()).max)(x) }
}

/// The first position of the largest of `x`, NaNs ignored; `None` if no value is above
/// `-inf`: greedy decoding's pick. Two passes over `x` (its maximum, then where it first
/// is), each a few microseconds over 50k logits with SIMD.
#[inline]
pub fn argmax(x: &[f32]) -> Option<usize> {
    let t = table(tier());
    // SAFETY: as in `matvec`.
    let max = unsafe { (t.max)(x) };
    // SAFETY: as above.
    (max > f32::NEG_INFINITY).then(|| unsafe { (t.find)(x, max) }).flatten()
}

/// `x[i] = e^(x[i] - max)` for softmax, with [`scalar::exp_approx`] (within 2 ulp of
/// `expf`; every tier gives its bits).
#[inline]
pub fn exp_sub(x: &mut [f32], max: f32) {
    // SAFETY: as in `matvec`.
    unsafe { (table(tier()).exp_sub)(x, max) }
}

/// `out[i] = f16(x[i])` for the first `min(x.len(), out.len())` values, rounded to
/// nearest even as `half` and `vcvtps2ph` do (every tier gives [`scalar::narrow_f16`]'s
/// bits): how f16 cache rows are written.
#[inline]
pub fn narrow_f16(x: &[f32], out: &mut [f16]) {
    // SAFETY: as in `matvec`.
    unsafe { (table(tier()).narrow_f16)(x, out) }
}

#[cfg(test)]
pub(crate) mod tests;

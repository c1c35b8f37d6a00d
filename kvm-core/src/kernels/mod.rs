//! Matrix x vector and matrix x matrix kernels over every weight format, in tiers.
//!
//! [`scalar`] is the oracle; SIMD tiers (`x86_64::{avx2, avx512}`, `aarch64::neon`) plug
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
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod attend;
mod gemm;
mod prefetch;
#[cfg(target_arch = "riscv32")]
mod riscv32;
pub mod scalar;
mod table;
pub mod tier;
mod walk;
#[cfg(target_arch = "x86_64")]
mod x86_64;

pub use prefetch::prefetch_later;
pub(crate) use prefetch::{prefetch_lines, Access};
use table::table;

#[cfg(feature = "std")]
pub use tier::{detect, init_from_env, TierError};
pub use tier::{force_tier, set_streaming, streaming, tier, Streaming, Tier};

use crate::quant::{DType, GroupQ4_0x16, GroupQ8_0x16, QK, X16};
use crate::tensor::Matrix;
use half::f16;

/// Bytes of activation scratch [`matvec`] needs for an input of `cols` values: one token's
/// q8 activation, `cols` i8 values then one little-endian f32 scale per block of [`QK`]
/// (float weights use none of it).
pub const fn act_scratch_len(cols: usize) -> usize {
    cols / QK * (QK + 4)
}

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
/// [`crate::quant::requant`]`(sum_c q[r, c] * x[c], scale_r, s)` for an [`DType::I8`]
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

/// An element attention reads from the session state: `f32`, [`struct@f16`] (the compact
/// cache, half the bytes) or `i8` (the q8 cache's values, whose per-row scales the caller
/// applies). Kernels widen it exactly to f32 before any arithmetic, so the same values give
/// the same bits whichever way they are stored.
pub trait Stored: Copy + Send + Sync + sealed::Entries {
    /// The exact f32 value.
    fn widen(self) -> f32;
}

impl Stored for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Stored for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        scalar::widen_f16(self.to_bits())
    }
}

impl Stored for i8 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self as f32
    }
}

/// The active tier's attention entries for each [`Stored`] type (sealed: f32, f16, i8).
mod sealed {
    use super::table::table;
    use super::{f16, tier};

    pub trait Entries: Sized {
        fn dots(rows: &[Self], x: &[f32], out: &mut [f32]);
        fn dots_many(rows: &[Self], xs: &[f32], d: usize, out: &mut [f32]) -> bool;
        fn weighted_sum(p: &[f32], rows: &[Self], out: &mut [f32]);
        fn weighted_sum_many(ps: &[f32], stride: usize, rows: &[Self], d: usize, outs: &mut [f32]) -> bool;
    }

    /// `Entries` for `$t` from the table's `$field` ([`super::table::Attention`]).
    macro_rules! entries {
        ($t:ty, $field:ident) => {
            impl Entries for $t {
                fn dots(rows: &[$t], x: &[f32], out: &mut [f32]) {
                    // SAFETY: the active tier's CPU features are present (`tier`'s invariant).
                    unsafe { (table(tier()).$field.dots)(rows, x, out) }
                }
                fn dots_many(rows: &[$t], xs: &[f32], d: usize, out: &mut [f32]) -> bool {
                    // SAFETY: as in `dots`.
                    table(tier()).$field.dots_many.map(|f| unsafe { f(rows, xs, d, out) }).is_some()
                }
                fn weighted_sum(p: &[f32], rows: &[$t], out: &mut [f32]) {
                    // SAFETY: as in `dots`.
                    unsafe { (table(tier()).$field.weighted_sum)(p, rows, out) }
                }
                fn weighted_sum_many(ps: &[f32], stride: usize, rows: &[$t], d: usize, outs: &mut [f32]) -> bool {
                    let f = table(tier()).$field.weighted_sum_many;
                    // SAFETY: as in `dots`; `d > 0` and `ps` long enough (`weighted_sum_many`).
                    f.map(|f| unsafe { f(ps, stride, rows, d, outs) }).is_some()
                }
            }
        };
    }
    entries!(f32, f32);
    entries!(f16, f16);
    entries!(i8, i8);
}

/// `out[i] = rows[i] . x` for each of the `rows.len() / x.len()` rows of `rows`
/// (`[n, x.len()]`, `out`: at least `[n]`): one query's scores against a run of keys. Every
/// tier sums in [`scalar::dots`]' canonical order, so the scores are the same bits on
/// every CPU.
#[inline]
pub fn dots<T: Stored>(rows: &[T], x: &[f32], out: &mut [f32]) {
    T::dots(rows, x, out)
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
    if n == 0 || T::dots_many(rows, xs, d, out) {
        return;
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
    T::weighted_sum(p, rows, out)
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
    if T::weighted_sum_many(ps, stride, rows, d, outs) {
        return;
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

/// One tier's kernel for one weight dtype.
pub(crate) trait Kernel {
    /// What activations are made of: `f32` for float weights, q8 bytes (the
    /// [`act_scratch_len`] layout) for integer ones.
    type Act;

    /// Returns `out[r][t] = w[r] . a[t]` for `R` weight rows and `T` activation vectors
    /// of `cols` values each.
    ///
    /// # Safety
    /// The CPU supports the kernel's tier; every `w[r]` holds `dtype.row_bytes(cols)`
    /// bytes and every `a[t]` one whole activation (`cols` floats, or
    /// `act_scratch_len(cols)` bytes).
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[Self::Act]; T], cols: usize) -> [[f32; T]; R];
}

/// The kernel of a row-interleaved integer dtype ([`DType::group_rows`] > 1): the rows of
/// one group against `T` q8 activations, each row's result the plain dtype's bits.
pub(crate) trait GroupKernel {
    /// Returns `out[t][r] = row r of the group . a[t]`.
    ///
    /// # Safety
    /// The CPU supports the kernel's tier; `g` is one whole group (`X16 * row_bytes(cols)`
    /// bytes) and every `a[t]` one whole activation (`act_scratch_len(cols)` bytes).
    unsafe fn group<const T: usize>(g: &[u8], a: [&[u8]; T], cols: usize) -> [[f32; X16]; T];

    /// Whether [`GroupKernel::streams`] reads its groups' blocks in turn, streaming the
    /// weights from several places at once; if not, a single token takes one group at a
    /// time, in order (`streams::<1>`).
    const SIDE_BY_SIDE: bool = false;

    /// Returns `out[s] = group g[s] . a` for `S` groups against one activation, the same
    /// bits as [`GroupKernel::group`] for each (which this default calls, group by group).
    ///
    /// # Safety
    /// As [`GroupKernel::group`] for every group.
    unsafe fn streams<const S: usize>(g: [&[u8]; S], a: &[u8], cols: usize) -> [[f32; X16]; S] {
        // SAFETY: forwarded.
        core::array::from_fn(|s| unsafe { Self::group::<1>(g[s], [a], cols) }[0])
    }

    /// Sets `ys[16 i + r]` to row `r` of group `i` . `a` for every group of `w` (`[n, gb]`
    /// bytes: `n` whole groups of `gb` bytes) against one activation `a`, `ys` holding at
    /// least `16 n` values: a single token's product. By default the groups go through
    /// [`GroupKernel::streams`] or [`GroupKernel::group`] as [`GroupKernel::SIDE_BY_SIDE`]
    /// says; a tier overrides it to prepare `a` once for the whole matrix.
    ///
    /// # Safety
    /// As [`GroupKernel::group`] for every group.
    unsafe fn single(w: &[u8], gb: usize, cols: usize, a: &[u8], ys: &mut [f32]) {
        // SAFETY: forwarded.
        unsafe { walk::single_groups::<Self>(w, gb, cols, a, ys) }
    }
}

/// One tier's tile of the integer numerics' product ([`matvec_i8`]), which `walk`'s driver
/// runs over a matrix in partial sums of 512 columns, with the oracle's scalar code for the
/// columns past the last whole step.
pub(crate) trait IntKernel {
    /// Columns one step of [`IntKernel::sums`] takes.
    const LANES: usize;

    /// Returns `out[r] = sum_c q[r][c] * x[c]` over the columns of `x`, each sum in i32,
    /// wrapping (as the scalar oracle's partial sums).
    ///
    /// # Safety
    /// The CPU supports the tier; `x.len()` is a multiple of [`IntKernel::LANES`] and every
    /// `q[r]` holds at least `x.len()` weights.
    unsafe fn sums<const R: usize>(q: [&[i8]; R], x: &[i16]) -> [i32; R];

    /// Whether `walk`'s driver hands this tier a mostly zero input (the MLP's `relu(h)^2`)
    /// as the list of its nonzero columns ([`IntKernel::sparse_sums`]): for cores without
    /// SIMD, where a skipped column saves a load, a multiply and an add a row.
    const SPARSE: bool = false;

    /// Returns `out[r] = sum q[r][c] * v` over the nonzero columns `(c, v)` of an input
    /// (each a [`NonZero`]), wrapping in i32: an input's products but for its zeros,
    /// which leave the sums as they are.
    ///
    /// # Safety
    /// The CPU supports the tier; every `q[r]` holds a weight at each column of `nz`.
    unsafe fn sparse_sums<const R: usize>(q: [&[i8]; R], nz: &[NonZero]) -> [i32; R] {
        portable_sparse(q, nz)
    }
}

/// [`IntKernel::sparse_sums`] in plain Rust: a listed column's value meets each row's
/// weight there.
pub(crate) fn portable_sparse<const R: usize>(q: [&[i8]; R], nz: &[NonZero]) -> [i32; R] {
    let mut out = [0i32; R];
    for &NonZero { c, v } in nz {
        for (o, q) in out.iter_mut().zip(q) {
            *o = o.wrapping_add(i32::from(q[usize::from(c)]) * i32::from(v));
        }
    }
    out
}

/// A nonzero column `c` of a product's input, its value `v` (the column in the low half
/// of a little-endian word, for the assembly tiles).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct NonZero {
    pub(crate) c: u16,
    pub(crate) v: i16,
}

/// Everything a tier supplies; [`run`] turns it into `matvec`/`matmul`.
pub(crate) trait Kernels {
    type F32: Kernel<Act = f32>;
    type F16: Kernel<Act = f32>;
    type BF16: Kernel<Act = f32>;
    type Q8_0: Kernel<Act = u8>;
    type Q4_0: Kernel<Act = u8>;
    type Q4_0x16: GroupKernel;
    type Q8_0x16: GroupKernel;
    type F32P: Kernel<Act = f32>;

    /// Quantizes `x` (`[cols]`, `cols % QK == 0`) into `out` (`[act_scratch_len(cols)]`),
    /// producing exactly the bytes of [`scalar::quantize_act`], so that every tier's integer
    /// sums agree with the reference.
    ///
    /// # Safety
    /// The CPU supports the tier.
    unsafe fn quantize_act(x: &[f32], out: &mut [u8]);

    /// Decodes one row of `dtype` (`row.len() == dtype.row_bytes(out.len())`).
    ///
    /// # Safety
    /// The CPU supports the tier.
    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]);

    /// The tier's float batch product ([`gemm::run`] with its [`gemm::Gemm`] kernel), where
    /// it has one: the caller walks decode's tiles when it is `None` or returns `false`.
    const GEMM: Option<gemm::RunFn> = None;
}

/// A float dtype as a type, so that one kernel can be generic over the three.
pub(crate) trait FloatType {
    const DTYPE: DType;
}

/// [`DType::F32`] as a type.
pub(crate) struct F32;
/// [`DType::F16`] as a type.
pub(crate) struct F16;
/// [`DType::BF16`] as a type.
pub(crate) struct BF16;
/// [`DType::F32P`] as a type.
pub(crate) struct F32P;

impl FloatType for F32 {
    const DTYPE: DType = DType::F32;
}
impl FloatType for F16 {
    const DTYPE: DType = DType::F16;
}
impl FloatType for BF16 {
    const DTYPE: DType = DType::BF16;
}
impl FloatType for F32P {
    const DTYPE: DType = DType::F32P;
}

/// The q8 cache's `i8` values as a type, for the tiers' row loaders.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) struct I8;

/// A [`Stored`] element's loader type: the SIMD tiers read attention's state rows with the
/// loaders they have for weight rows of that dtype (and [`I8`]'s), so one loop body serves
/// every stored type.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) trait StoredType: Stored {
    type Float;
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
impl StoredType for f32 {
    type Float = F32;
}
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
impl StoredType for f16 {
    type Float = F16;
}
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
impl StoredType for i8 {
    type Float = I8;
}

#[cfg(test)]
pub(crate) mod tests;

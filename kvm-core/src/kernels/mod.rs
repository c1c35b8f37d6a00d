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
//! switched at run time ([`tier::force_tier`]; with `std`, `init_from_env`).

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(all(target_arch = "arm", kvm_mve))]
mod arm;
pub mod scalar;
pub mod tier;
#[cfg(target_arch = "x86_64")]
mod x86_64;

#[cfg(feature = "std")]
pub use tier::{detect, init_from_env, TierError};
pub use tier::{force_tier, tier, Tier};

use crate::error::{Error, Result};
use crate::quant::{DType, GroupQ4_0x16, GroupQ8_0x16, QK, X16};
use half::f16;

/// A row-major weight matrix `[rows, cols]` borrowed from the model blob.
#[derive(Debug, Clone, Copy)]
pub struct Matrix<'a> {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    /// `rows * dtype.row_bytes(cols)` bytes.
    pub data: &'a [u8],
}

impl Default for Matrix<'_> {
    /// The empty `[0, 0]` f32 matrix.
    fn default() -> Self {
        Matrix { dtype: DType::F32, rows: 0, cols: 0, data: &[] }
    }
}

impl<'a> Matrix<'a> {
    /// Wraps `data` as a `[rows, cols]` matrix of `dtype`.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] if `data` is not exactly the matrix's size or the shape does
    /// not fit the dtype ([`DType::matrix_bytes`]).
    pub fn new(dtype: DType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self> {
        if dtype.matrix_bytes(rows, cols) != Some(data.len()) {
            return Err(Error::OutOfBounds);
        }
        Ok(Matrix { dtype, rows, cols, data })
    }

    /// Bytes of one row.
    #[inline]
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    /// Rows `[r0, r1)` as a matrix of their own (used to split work across threads);
    /// both are multiples of the dtype's [`DType::group_rows`].
    #[inline]
    pub fn row_range(&self, r0: usize, r1: usize) -> Matrix<'a> {
        debug_assert!(r0.is_multiple_of(self.dtype.group_rows()) && r1.is_multiple_of(self.dtype.group_rows()));
        let rb = self.row_bytes();
        Matrix { dtype: self.dtype, rows: r1 - r0, cols: self.cols, data: &self.data[r0 * rb..r1 * rb] }
    }
}

/// Bytes of activation scratch [`matvec`] needs for an input of `cols` values: one token's
/// q8 activation, `cols` i8 values then one little-endian f32 scale per block of [`QK`]
/// (float weights use none of it).
pub const fn act_scratch_len(cols: usize) -> usize {
    cols / QK * (QK + 4)
}

/// Tokens [`matmul`] quantizes at a time when given [`matmul_scratch_len`] bytes: enough
/// that one pass over the weights feeds the arithmetic rather than waiting on memory.
pub const MATMUL_TOKENS: usize = 16;

/// Bytes of activation scratch [`matmul`] needs to read integer-format weights once per
/// [`MATMUL_TOKENS`] tokens of an `[n, cols]` input. Any multiple of
/// [`act_scratch_len`] down to one token also works, streaming the weights more often.
pub const fn matmul_scratch_len(cols: usize, n: usize) -> usize {
    let tokens = if n < MATMUL_TOKENS { n } else { MATMUL_TOKENS };
    act_scratch_len(cols) * tokens
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
    use super::{f16, table, tier};

    pub trait Entries: Sized {
        fn dots(rows: &[Self], x: &[f32], out: &mut [f32]);
        fn dots_many(rows: &[Self], xs: &[f32], d: usize, out: &mut [f32]) -> bool;
        fn weighted_sum(p: &[f32], rows: &[Self], out: &mut [f32]);
    }

    /// `Entries` for `$t` from the table's `$field` ([`super::Attention`]).
    macro_rules! entries {
        ($t:ty, $field:ident) => {
            // SAFETY (every call): the active tier's CPU features are present (`tier`'s
            // invariant).
            impl Entries for $t {
                fn dots(rows: &[$t], x: &[f32], out: &mut [f32]) {
                    unsafe { (table(tier()).$field.dots)(rows, x, out) }
                }
                fn dots_many(rows: &[$t], xs: &[f32], d: usize, out: &mut [f32]) -> bool {
                    table(tier()).$field.dots_many.map(|f| unsafe { f(rows, xs, d, out) }).is_some()
                }
                fn weighted_sum(p: &[f32], rows: &[$t], out: &mut [f32]) {
                    unsafe { (table(tier()).$field.weighted_sum)(p, rows, out) }
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

/// What [`prefetch_lines`] brings cache lines in for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Loads soon, on this core: into L1.
    Read,
    /// Stores soon, on this core: into L1, owned.
    Write,
    /// Loads a little later, perhaps on another core: into L2, leaving L1 to the work at hand.
    Later,
}

/// Asks the CPU to bring the cache lines of `bytes` in, so that loads or stores to them
/// soon after do not wait on memory or on another core (a hint: never faults, changes
/// nothing, and is nothing where the architecture has no such hint).
#[inline]
pub(crate) fn prefetch_lines<T>(bytes: &[T], access: Access) {
    prefetch_range(bytes.as_ptr() as usize, core::mem::size_of_val(bytes), access);
}

/// Asks the CPU to bring the `len` bytes at address `addr` into its L2 cache, for loads a
/// little later, perhaps by another core: the weights of the next matrix products, loaded
/// by a thread that would otherwise wait for them. A hint that reads nothing: it never
/// faults, not even where nothing is mapped, so `addr` may outlive what it pointed to.
#[inline]
pub fn prefetch_later(addr: usize, len: usize) {
    prefetch_range(addr, len, Access::Later);
}

/// [`prefetch_lines`] of the `len` bytes at address `addr`, which need not be mapped.
#[inline]
fn prefetch_range(addr: usize, len: usize, access: Access) {
    // `wrapping_add`: the address is never dereferenced, so it needs no provenance.
    let p = addr as *const u8;
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(64) {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0, _MM_HINT_T1};
        let p = p.wrapping_add(off).cast();
        // SAFETY: a prefetch reads and writes nothing architecturally and never faults
        // (`prefetchw` is a NOP on CPUs without it).
        unsafe {
            match access {
                Access::Read => _mm_prefetch::<_MM_HINT_T0>(p),
                Access::Write => _mm_prefetch::<_MM_HINT_ET0>(p),
                Access::Later => _mm_prefetch::<_MM_HINT_T1>(p),
            }
        };
    }
    #[cfg(target_arch = "aarch64")]
    for off in (0..len).step_by(64) {
        use core::arch::asm;
        let p = p.wrapping_add(off);
        // SAFETY: as above (`prfm`, a hint).
        unsafe {
            match access {
                Access::Read => asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags)),
                Access::Write => asm!("prfm pstl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags)),
                Access::Later => asm!("prfm pldl2keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags)),
            }
        };
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (p, len, access);
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

/// A multi-query [`dots_many`] kernel: `rows`, `xs`, `d`, `out`.
type DotsMany<T> = unsafe fn(&[T], &[f32], usize, &mut [f32]);

/// A tier's attention entries for rows stored as `T`.
struct Attention<T: 'static> {
    dots: unsafe fn(&[T], &[f32], &mut [f32]),
    weighted_sum: unsafe fn(&[f32], &[T], &mut [f32]),
    /// The multi-query [`dots_many`] kernel (`rows`, `xs`, `d`, `out`; `d > 0`, at least
    /// one row), where the tier has one.
    dots_many: Option<DotsMany<T>>,
}

/// A tier's entry points, picked once per call by [`table`] (tract's kernel table).
struct Table {
    decode: Decode,
    matmul: unsafe fn(&Matrix<'_>, &[f32], &mut [f32], &mut [u8]),
    quantize_act: unsafe fn(&[f32], &mut [u8]),
    dequant_row: unsafe fn(DType, &[u8], &mut [f32]),
    max: unsafe fn(&[f32]) -> f32,
    find: unsafe fn(&[f32], f32) -> Option<usize>,
    exp_sub: unsafe fn(&mut [f32], f32),
    narrow_f16: unsafe fn(&[f32], &mut [f16]),
    f32: Attention<f32>,
    f16: Attention<f16>,
    i8: Attention<i8>,
}

/// A tier's one-token products, with tiles of `RF` rows for float weights and `RQ` for
/// integer ones ([`decode`]).
struct Decode {
    matvec: unsafe fn(&Matrix<'_>, &[f32], &mut [f32], &mut [u8]),
    matvec_prepared: unsafe fn(&Matrix<'_>, &[f32], &[u8], &mut [f32]),
    rows: fn(DType) -> usize,
}

/// The [`Decode`] entries of tier `K` with `RF`-row float tiles and `RQ`-row integer ones.
const fn decode<K: Kernels, const RF: usize, const RQ: usize>() -> Decode {
    Decode { matvec: run::<K, RF, RQ, 1>, matvec_prepared: prepared::<K, RF, RQ, 1>, rows: rows::<K, RF, RQ> }
}

/// The [`Attention`] entries of a SIMD tier's module for `T`: its generic `dots`,
/// `weighted_sum` and (if it has one) `dots_many`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! attention {
    ($($m:ident)::+, $t:ty, many) => {
        Attention {
            dots: $($m::)+dots::<$t>,
            weighted_sum: $($m::)+weighted_sum::<$t>,
            dots_many: Some($($m::)+dots_many::<$t>),
        }
    };
    ($($m:ident)::+, $t:ty) => {
        Attention { dots: $($m::)+dots::<$t>, weighted_sum: $($m::)+weighted_sum::<$t>, dots_many: None }
    };
}

/// The table of `tier`; a tier of another architecture gets the scalar one.
fn table(tier: Tier) -> &'static Table {
    // Tile shapes: matvec takes several rows per tile so each activation load serves
    // them all, and since a tile's rows come from as many runs of the matrix, decode
    // streams from memory at that many places (paper-120m decode on AVX-512 Xeons: f32
    // 16 rows 1.09x as fast as 4 on two threads of one; on another, 8 rows against 16,
    // f32 1.05x / about level and f16 1.10x / 1.04x on one / two threads; AVX2's integer
    // tile spills past 4 rows, its float one past 8); matmul also takes several tokens so
    // each weight decode does.
    static SCALAR: Table = Table {
        decode: decode::<scalar::Scalar, 1, 1>(),
        matmul: run::<scalar::Scalar, 1, 1, 1>,
        quantize_act: <scalar::Scalar as Kernels>::quantize_act,
        dequant_row: scalar::Scalar::dequant_row,
        max: scalar::max,
        find: scalar::find,
        exp_sub: scalar::exp_sub,
        narrow_f16: scalar::narrow_f16,
        f32: Attention { dots: scalar::dots, weighted_sum: scalar::weighted_sum, dots_many: None },
        f16: Attention { dots: scalar::dots, weighted_sum: scalar::weighted_sum, dots_many: None },
        i8: Attention { dots: scalar::dots, weighted_sum: scalar::weighted_sum, dots_many: None },
    };
    #[cfg(target_arch = "x86_64")]
    static AVX2: Table = Table {
        decode: decode::<x86_64::avx2::Avx2, 8, 4>(),
        matmul: run::<x86_64::avx2::Avx2, 2, 2, 4>,
        quantize_act: <x86_64::avx2::Avx2 as Kernels>::quantize_act,
        dequant_row: x86_64::avx2::Avx2::dequant_row,
        max: x86_64::avx2::max,
        find: x86_64::avx2::find,
        exp_sub: x86_64::avx2::exp_sub,
        narrow_f16: x86_64::avx2::narrow_f16,
        f32: attention!(x86_64::avx2, f32, many),
        f16: attention!(x86_64::avx2, f16, many),
        i8: attention!(x86_64::avx2, i8, many),
    };
    #[cfg(target_arch = "x86_64")]
    static AVX512: Table = Table {
        decode: decode::<x86_64::avx512::Avx512, 8, 16>(),
        matmul: run::<x86_64::avx512::Avx512, 4, 4, 4>,
        quantize_act: <x86_64::avx512::Avx512 as Kernels>::quantize_act,
        dequant_row: x86_64::avx512::Avx512::dequant_row,
        max: x86_64::avx512::max,
        find: x86_64::avx512::find,
        exp_sub: x86_64::avx512::exp_sub,
        narrow_f16: x86_64::avx2::narrow_f16,
        f32: attention!(x86_64::avx512, f32, many),
        f16: attention!(x86_64::avx512, f16, many),
        i8: attention!(x86_64::avx512, i8, many),
    };
    #[cfg(target_arch = "aarch64")]
    static NEON: Table = Table {
        decode: decode::<aarch64::neon::Neon, 4, 4>(),
        matmul: run::<aarch64::neon::Neon, 4, 4, 4>,
        quantize_act: <aarch64::neon::Neon as Kernels>::quantize_act,
        dequant_row: aarch64::neon::Neon::dequant_row,
        max: aarch64::neon::max,
        find: aarch64::neon::find,
        exp_sub: aarch64::neon::exp_sub,
        narrow_f16: aarch64::neon::narrow_f16,
        f32: attention!(aarch64::neon, f32),
        f16: attention!(aarch64::neon, f16),
        i8: attention!(aarch64::neon, i8),
    };
    #[cfg(target_arch = "aarch64")]
    static NEON_DOT: Table = Table {
        decode: decode::<aarch64::neon::NeonDot, 4, 4>(),
        matmul: run::<aarch64::neon::NeonDot, 4, 4, 4>,
        quantize_act: <aarch64::neon::NeonDot as Kernels>::quantize_act,
        dequant_row: aarch64::neon::NeonDot::dequant_row,
        max: aarch64::neon::max,
        find: aarch64::neon::find,
        exp_sub: aarch64::neon::exp_sub,
        narrow_f16: aarch64::neon::narrow_f16,
        f32: attention!(aarch64::neon, f32),
        f16: attention!(aarch64::neon, f16),
        i8: attention!(aarch64::neon, i8),
    };
    // Integer products only; the float kernels are the scalar ones (see `arm::helium`).
    #[cfg(all(target_arch = "arm", kvm_mve))]
    static HELIUM: Table = Table {
        decode: decode::<arm::helium::Helium, 1, 1>(),
        matmul: run::<arm::helium::Helium, 1, 1, 1>,
        quantize_act: <arm::helium::Helium as Kernels>::quantize_act,
        dequant_row: arm::helium::Helium::dequant_row,
        max: scalar::max,
        find: scalar::find,
        exp_sub: scalar::exp_sub,
        narrow_f16: scalar::narrow_f16,
        f32: Attention { dots: scalar::dots, weighted_sum: scalar::weighted_sum, dots_many: None },
        f16: Attention { dots: scalar::dots, weighted_sum: scalar::weighted_sum, dots_many: None },
        i8: Attention { dots: scalar::dots, weighted_sum: scalar::weighted_sum, dots_many: None },
    };
    match tier {
        #[cfg(all(target_arch = "arm", kvm_mve))]
        Tier::Helium => &HELIUM,
        #[cfg(target_arch = "x86_64")]
        Tier::Avx2 => &AVX2,
        #[cfg(target_arch = "x86_64")]
        Tier::Avx512 => &AVX512,
        #[cfg(target_arch = "aarch64")]
        Tier::Neon => &NEON,
        #[cfg(target_arch = "aarch64")]
        Tier::NeonDot => &NEON_DOT,
        _ => &SCALAR,
    }
}

/// `ys[t, r] = w[r] . xs[t]` for every row and each of the `n = xs.len() / cols` tokens
/// (`xs: [n, cols]`, `ys: [n, rows]`), with tier `K` in tiles of `T` tokens and `RF` rows
/// (float weights) or `RQ` rows (integer weights). Shapes that do not
/// fit are `debug_assert`ed; in release they shrink the work and never read out of bounds.
///
/// # Safety
/// The CPU supports `K`'s tier.
unsafe fn run<K: Kernels, const RF: usize, const RQ: usize, const T: usize>(
    w: &Matrix<'_>,
    xs: &[f32],
    ys: &mut [f32],
    act: &mut [u8],
) {
    let Some((data, rb)) = checked(w, xs, ys) else { return };
    let (cols, ld) = (w.cols, w.rows);
    // SAFETY (both arms): the caller guarantees the tier.
    unsafe {
        if !w.dtype.quantizes_act() {
            walk::<K, RF, RQ, T>(w.dtype, data, rb, cols, Acts::Floats(xs), ys, ld);
        } else {
            quantized::<K>(cols, xs, ys, ld, act, |a, per, yg| {
                walk::<K, RF, RQ, T>(w.dtype, data, rb, cols, Acts::Quantized(a, per), yg, ld)
            });
        }
    }
}

/// [`run`] for one token whose q8 activation `act` is already made (integer weights).
///
/// # Safety
/// As [`run`].
unsafe fn prepared<K: Kernels, const RF: usize, const RQ: usize, const T: usize>(
    w: &Matrix<'_>,
    x: &[f32],
    act: &[u8],
    y: &mut [f32],
) {
    let Some((data, rb)) = checked(w, x, y) else { return };
    // The input was made just before, on another core when a pool's part runs this: all
    // its lines at once, rather than one block's at a time as the walk reaches them.
    let acts = if !w.dtype.quantizes_act() {
        prefetch_lines(x, Access::Read);
        Acts::Floats(x)
    } else {
        let per = act_scratch_len(w.cols);
        debug_assert!(act.len() >= per, "act holds {} bytes, needs {per}", act.len());
        let a = &act[..per.min(act.len())];
        prefetch_lines(a, Access::Read);
        Acts::Quantized(a, per)
    };
    // SAFETY: the caller guarantees the tier.
    unsafe { walk::<K, RF, RQ, T>(w.dtype, data, rb, w.cols, acts, y, w.rows) };
}

/// [`matvec_rows`] of tier `K` with `RF`-row float tiles and `RQ`-row integer ones.
fn rows<K: Kernels, const RF: usize, const RQ: usize>(dtype: DType) -> usize {
    let groups = |side_by_side: bool| X16 * if side_by_side { STREAMS } else { 1 };
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 | DType::F32P => RF,
        DType::Q8_0 | DType::Q4_0 => RQ,
        DType::Q4_0x16 => groups(K::Q4_0x16::SIDE_BY_SIDE),
        DType::Q8_0x16 => groups(K::Q8_0x16::SIDE_BY_SIDE),
    }
}

/// The weights of `w` cut to whole rows, and their row bytes; `None` (with `ys` zeroed
/// for empty sums) when there is nothing to multiply.
fn checked<'w>(w: &Matrix<'w>, xs: &[f32], ys: &mut [f32]) -> Option<(&'w [u8], usize)> {
    let cols = w.cols;
    let rb = w.dtype.row_bytes(cols).unwrap_or(0);
    if rb == 0 || w.rows == 0 {
        debug_assert!(w.dtype.row_bytes(cols).is_some(), "cols {cols} is not a whole number of {:?} blocks", w.dtype);
        // Empty sums (`cols == 0`) or nothing to write (`rows == 0`).
        ys.fill(0.0);
        return None;
    }
    debug_assert_eq!(w.data.len(), w.rows * rb);
    debug_assert_eq!(xs.len() % cols, 0);
    debug_assert_eq!(ys.len(), xs.len() / cols * w.rows);
    Some((&w.data[..w.rows.min(w.data.len() / rb) * rb], rb))
}

/// The activations a weight walk reads: `[n, cols]` floats, or `[n, stride]` q8 bytes.
#[derive(Clone, Copy)]
enum Acts<'a> {
    Floats(&'a [f32]),
    Quantized(&'a [u8], usize),
}

/// `ys[t * ld + r] = w[r] . a[t]` for the weights `w` (`[rows, rb]` of `dtype`) against
/// activations of the matching kind (floats for float dtypes, q8 for integer ones; a
/// mismatch computes nothing).
///
/// # Safety
/// As [`tiles`].
unsafe fn walk<K: Kernels, const RF: usize, const RQ: usize, const T: usize>(
    dtype: DType,
    w: &[u8],
    rb: usize,
    cols: usize,
    acts: Acts<'_>,
    ys: &mut [f32],
    ld: usize,
) {
    // SAFETY (all arms): forwarded.
    unsafe {
        match (dtype, acts) {
            (DType::F32, Acts::Floats(x)) => tiles::<K::F32, RF, T>(w, rb, cols, x, cols, ys, ld),
            (DType::F16, Acts::Floats(x)) => tiles::<K::F16, RF, T>(w, rb, cols, x, cols, ys, ld),
            (DType::BF16, Acts::Floats(x)) => tiles::<K::BF16, RF, T>(w, rb, cols, x, cols, ys, ld),
            (DType::F32P, Acts::Floats(x)) => tiles::<K::F32P, RF, T>(w, rb, cols, x, cols, ys, ld),
            (DType::Q8_0, Acts::Quantized(a, per)) => tiles::<K::Q8_0, RQ, T>(w, rb, cols, a, per, ys, ld),
            (DType::Q4_0, Acts::Quantized(a, per)) => tiles::<K::Q4_0, RQ, T>(w, rb, cols, a, per, ys, ld),
            (DType::Q4_0x16, Acts::Quantized(a, per)) => groups::<K::Q4_0x16, T>(w, rb, cols, a, per, ys, ld),
            (DType::Q8_0x16, Acts::Quantized(a, per)) => groups::<K::Q8_0x16, T>(w, rb, cols, a, per, ys, ld),
            _ => debug_assert!(false, "{dtype:?} weights against the other kind of activation"),
        }
    }
}

/// [`run`] for an integer format: quantizes as many tokens as `act` holds, then lets
/// `walk(act, stride, ys)` stream the weights once over that group; `ys` is `[n, ld]`.
///
/// # Safety
/// The CPU supports `K`'s tier, and `walk` needs nothing more.
unsafe fn quantized<K: Kernels>(
    cols: usize,
    xs: &[f32],
    ys: &mut [f32],
    ld: usize,
    act: &mut [u8],
    walk: impl Fn(&[u8], usize, &mut [f32]),
) {
    let per = act_scratch_len(cols);
    let group = act.len() / per;
    debug_assert!(group > 0, "act scratch holds {} bytes, needs {per}", act.len());
    if group == 0 {
        return;
    }
    for (xg, yg) in xs.chunks(group * cols).zip(ys.chunks_mut(group * ld)) {
        let a = &mut act[..xg.len() / cols * per];
        for (x, a) in xg.chunks_exact(cols).zip(a.chunks_exact_mut(per)) {
            // SAFETY: the caller guarantees the tier.
            unsafe { K::quantize_act(x, a) };
        }
        walk(a, per, yg);
    }
}

/// Groups a single token reads side by side ([`GroupKernel::streams`]).
const STREAMS: usize = 4;

/// Walks `w` (`[rows / 16]` groups of 16 rows of `rb` bytes) x `a` (`[n, stride]`), each
/// group against `T` tokens at a time, then single tokens: `ys[t * ld + r] = w[r] . a[t]`.
///
/// A single token (decode) reads [`STREAMS`] groups side by side, from equal runs of the
/// matrix, as [`tiles`] does with its rows, when the tier's kernel can
/// ([`GroupKernel::SIDE_BY_SIDE`]): in paper-120m decode on an AVX-512 Xeon, q8_0x16 ran
/// 1.16x (avx512) and 1.34x (avx2) as fast as one group at a time, q4_0x16 1.02x and
/// 1.10x.
///
/// # Safety
/// As [`tiles`].
unsafe fn groups<G: GroupKernel, const T: usize>(
    w: &[u8],
    rb: usize,
    cols: usize,
    a: &[u8],
    stride: usize,
    ys: &mut [f32],
    ld: usize,
) {
    let n = (a.len() / stride).min(ys.len() / ld.max(1));
    let gb = X16 * rb;
    if n == 1 {
        let a = &a[..stride];
        // SAFETY (both arms): forwarded.
        return unsafe {
            if G::SIDE_BY_SIDE {
                single::<G, STREAMS>(w, gb, cols, a, ys)
            } else {
                single::<G, 1>(w, gb, cols, a, ys)
            }
        };
    }
    let act = |t: usize| &a[t * stride..(t + 1) * stride];
    for (i, g) in w.chunks_exact(gb).enumerate() {
        let mut t0 = 0;
        while t0 < n {
            let out: &[[f32; X16]] = if t0 + T <= n {
                // SAFETY: forwarded; `g` is one group and each activation `stride` bytes.
                &unsafe { G::group::<T>(g, core::array::from_fn(|j| act(t0 + j)), cols) }
            } else {
                // SAFETY: as above.
                &unsafe { G::group::<1>(g, [act(t0)], cols) }
            };
            for (j, y) in out.iter().enumerate() {
                ys[(t0 + j) * ld + i * X16..][..X16].copy_from_slice(y);
            }
            t0 += out.len();
        }
    }
}

/// [`groups`] for one token `a`: `S` groups at a time through [`GroupKernel::streams`],
/// group `i` of each of `S` equal runs of the matrix, then the groups left over one by one.
///
/// # Safety
/// As [`tiles`].
unsafe fn single<G: GroupKernel, const S: usize>(w: &[u8], gb: usize, cols: usize, a: &[u8], ys: &mut [f32]) {
    let group = |i: usize| &w[i * gb..(i + 1) * gb];
    let count = w.len() / gb;
    let q = count / S;
    for i in 0..q {
        let is: [usize; S] = core::array::from_fn(|s| s * q + i);
        // (Not `is.map(group)`: its out-of-line `try_map` stalled the loop, 3% of a
        // two-thread q4_0 step.)
        // SAFETY: forwarded; each group is whole and `a` one activation.
        let out = unsafe { G::streams::<S>(core::array::from_fn(|s| group(is[s])), a, cols) };
        for (i, y) in is.into_iter().zip(out) {
            ys[i * X16..][..X16].copy_from_slice(&y);
        }
    }
    for i in S * q..count {
        // SAFETY: as above.
        let [y] = unsafe { G::group::<1>(group(i), [a], cols) };
        ys[i * X16..][..X16].copy_from_slice(&y);
    }
}

/// Walks `w` (`[rows, rb]`) x `a` (`[n, stride]`) in `R x T` tiles, then single rows and
/// single tokens for the remainders: `ys[t * ld + r] = w[r] . a[t]`.
///
/// A tile's `R` rows come from `R` equal runs of the matrix (rows `i`, `i + q`, `i + 2q`,
/// ... for `q = rows / R`), so the weights stream from memory at `R` places at once: the
/// hardware prefetchers follow each run, and more of memory's latency overlaps than in one
/// stream (decode reads each weight once per token, at memory's speed).
///
/// # Safety
/// The CPU supports `K`'s tier; `rb == dtype.row_bytes(cols)` and `stride` is the length
/// of one activation.
unsafe fn tiles<K: Kernel, const R: usize, const T: usize>(
    w: &[u8],
    rb: usize,
    cols: usize,
    a: &[K::Act],
    stride: usize,
    ys: &mut [f32],
    ld: usize,
) {
    let n = (a.len() / stride).min(ys.len() / ld.max(1));
    let rows = w.len() / rb;
    let q = rows / R;
    let row = |r: usize| &w[r * rb..(r + 1) * rb];
    for i in 0..q {
        let rs: [usize; R] = core::array::from_fn(|s| s * q + i);
        // SAFETY: forwarded; each row is `rb` bytes.
        unsafe { token_tiles::<K, R, T>(core::array::from_fn(|s| row(rs[s])), rs, cols, a, stride, n, ys, ld) };
    }
    for r in R * q..rows {
        // SAFETY: as above.
        unsafe { token_tiles::<K, 1, T>([row(r)], [r], cols, a, stride, n, ys, ld) };
    }
}

/// The token loop of [`tiles`] for the `R` rows `rs`.
///
/// # Safety
/// As [`tiles`].
#[allow(clippy::too_many_arguments)]
unsafe fn token_tiles<K: Kernel, const R: usize, const T: usize>(
    wr: [&[u8]; R],
    rs: [usize; R],
    cols: usize,
    a: &[K::Act],
    stride: usize,
    n: usize,
    ys: &mut [f32],
    ld: usize,
) {
    let act = |t: usize| &a[t * stride..(t + 1) * stride];
    let mut t0 = 0;
    while t0 + T <= n {
        // SAFETY: forwarded; each activation is `stride` elements.
        let out = unsafe { K::tile::<R, T>(wr, core::array::from_fn(|j| act(t0 + j)), cols) };
        store(&out, ys, ld, rs, t0);
        t0 += T;
    }
    while t0 < n {
        // SAFETY: as above.
        let out = unsafe { K::tile::<R, 1>(wr, [act(t0)], cols) };
        store(&out, ys, ld, rs, t0);
        t0 += 1;
    }
}

/// Writes an `R x T` tile into `ys` (`[n, ld]`) at rows `rs`, token `t0`.
#[inline]
fn store<const R: usize, const T: usize>(out: &[[f32; T]; R], ys: &mut [f32], ld: usize, rs: [usize; R], t0: usize) {
    for (row, r) in out.iter().zip(rs) {
        for (j, &v) in row.iter().enumerate() {
            ys[(t0 + j) * ld + r] = v;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    extern crate std;

    use std::vec;
    use std::vec::Vec;

    use super::*;
    use crate::quant::{quantize_matrix, RowGroup};

    /// Deterministic values in `[-1, 1)` (xorshift32) with a larger outlier every 37th, as
    /// real weights and activations have.
    pub(crate) fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let u = (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
                if i % 37 == 5 {
                    8.0 * u
                } else {
                    u
                }
            })
            .collect()
    }

    /// A `[rows, cols]` matrix of `dtype` filled with [`values`].
    fn encode(dtype: DType, rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let src: Vec<f32> = (0..rows).flat_map(|r| values(cols, seed + r as u32)).collect();
        let mut bytes = vec![0u8; dtype.matrix_bytes(rows, cols).unwrap()];
        quantize_matrix(dtype, cols, &src, &mut bytes).unwrap();
        bytes
    }

    /// Row `r` of `w` in its plain (row-major) form.
    fn plain_row(w: &Matrix<'_>, r: usize) -> Vec<u8> {
        let rb = w.row_bytes();
        fn blocks<G: RowGroup>(w: &Matrix<'_>, r: usize) -> Vec<u8> {
            let rb = w.row_bytes();
            let groups: &[G] = bytemuck::cast_slice(&w.data[r / X16 * X16 * rb..(r / X16 + 1) * X16 * rb]);
            groups.iter().flat_map(|g| bytemuck::bytes_of(&g.block(r % X16)).to_vec()).collect()
        }
        match w.dtype {
            DType::Q4_0x16 => blocks::<GroupQ4_0x16>(w, r),
            DType::Q8_0x16 => blocks::<GroupQ8_0x16>(w, r),
            _ => w.data[r * rb..(r + 1) * rb].to_vec(),
        }
    }

    const ROWS: [usize; 9] = [1, 2, 3, 4, 5, 7, 9, 17, 33];
    const TOKENS: [usize; 7] = [1, 2, 3, 4, 5, 7, 17];

    /// Row counts to test: around every tile height, or whole groups around the
    /// [`STREAMS`] a single token reads side by side.
    fn rows_of(dtype: DType) -> Vec<usize> {
        match dtype.group_rows() {
            1 => ROWS.to_vec(),
            g => [1, 2, 3, 4, 5, 9].map(|n| n * g).to_vec(),
        }
    }

    /// Columns to test: odd lengths for floats (SIMD body plus scalar tail), 32 k for blocks.
    fn cols_of(dtype: DType) -> &'static [usize] {
        match dtype.block_len() {
            1 => &[1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 255, 1023],
            // 1, 3, 7, 8, 9, 13, 32 blocks: whole groups of 8 and every kind of remainder.
            _ => &[32, 96, 224, 256, 288, 416, 1024],
        }
    }

    /// The scalar tier's `ys` (`[n, rows]`) for `xs` (`[n, cols]`), pair by pair.
    /// Interleaved dtypes give their plain form's results: q4_0x16 and q8_0x16 are checked
    /// against the q4_0 and q8_0 oracles on the de-interleaved rows.
    fn reference(w: &Matrix<'_>, xs: &[f32]) -> Vec<f32> {
        let mut act = vec![0u8; act_scratch_len(w.cols)];
        let mut ys = Vec::new();
        for x in xs.chunks_exact(w.cols) {
            if w.dtype.quantizes_act() {
                scalar::quantize_act(x, &mut act);
            }
            for r in 0..w.rows {
                let row = plain_row(w, r);
                ys.push(match w.dtype {
                    DType::Q8_0 | DType::Q8_0x16 => scalar::dot_q8_0(&row, &act, w.cols),
                    DType::Q4_0 | DType::Q4_0x16 => scalar::dot_q4_0(&row, &act, w.cols),
                    float => scalar::dot_row(float, &row, x),
                });
            }
        }
        ys
    }

    /// `sum_c |w[r, c] x[c]|` for every token and row: the scale of a dot product's
    /// rounding error.
    fn magnitudes(w: &Matrix<'_>, xs: &[f32]) -> Vec<f32> {
        let mut row = vec![0.0; w.cols];
        let mut out = Vec::new();
        for x in xs.chunks_exact(w.cols) {
            for r in 0..w.rows {
                scalar::dequant_row(w.dtype, &plain_row(w, r), &mut row);
                out.push(row.iter().zip(x).map(|(a, b)| (a * b).abs()).sum());
            }
        }
        out
    }

    /// Float tiers differ from the reference only in summation order (and FMA's single
    /// rounding): a few ulps of the magnitude.
    const BUDGET: f32 = 1e-5;

    /// Integer formats: every tier gives the reference's bits exactly.
    fn assert_bits(got: &[f32], want: &[f32], what: &dyn core::fmt::Display) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{what}: [{i}] {g} vs {w}");
        }
    }

    /// [`assert_bits`] for integer dtypes, [`assert_close`] for float ones.
    fn assert_matches(dtype: DType, got: &[f32], want: &[f32], mag: &[f32], what: &dyn core::fmt::Display) {
        if dtype.quantizes_act() {
            assert_bits(got, want, what);
        } else {
            assert_close(got, want, mag, what);
        }
    }

    fn assert_close(got: &[f32], want: &[f32], mag: &[f32], what: &dyn core::fmt::Display) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, ((g, w), m)) in got.iter().zip(want).zip(mag).enumerate() {
            assert!((g - w).abs() <= BUDGET * m + f32::MIN_POSITIVE, "{what}: [{i}] {g} vs {w} (magnitude {m})");
        }
    }

    /// `matvec`, `matmul` (with scratch for 1, 3 and all tokens) and `dequant_row` through
    /// the public dispatch, against the scalar reference, for every dtype and shape: integer
    /// formats bit for bit, float ones within [`BUDGET`].
    fn suite(t: Tier) {
        for dtype in DType::ALL {
            for &cols in cols_of(dtype) {
                for rows in rows_of(dtype) {
                    let bytes = encode(dtype, rows, cols, (rows * cols) as u32);
                    let w = Matrix::new(dtype, rows, cols, &bytes).unwrap();
                    let x = values(cols, 7);
                    let mut y = vec![f32::NAN; rows];
                    let mut act = vec![0u8; act_scratch_len(cols)];
                    matvec(&w, &x, &mut y, &mut act);
                    let what = format_args!("{t} matvec {dtype:?} [{rows}, {cols}]");
                    assert_matches(dtype, &y, &reference(&w, &x), &magnitudes(&w, &x), &what);
                    // The same product on an input quantized beforehand: the same bits.
                    let mut prepared = vec![f32::NAN; rows];
                    let mut act = vec![0u8; act_scratch_len(cols)];
                    if dtype.quantizes_act() {
                        quantize_act(&x, &mut act);
                    }
                    matvec_prepared(&w, &x, &act, &mut prepared);
                    assert_bits(&prepared, &y, &format_args!("{t} matvec_prepared {dtype:?} [{rows}, {cols}]"));
                    let mut out = vec![f32::NAN; cols];
                    dequant_row(&w, rows - 1, &mut out);
                    let mut want = vec![0.0; cols];
                    scalar::dequant_row(dtype, &plain_row(&w, rows - 1), &mut want);
                    assert_eq!(out, want, "{t} dequant_row {dtype:?} [{rows}, {cols}]");
                }
                let rows = 5usize.next_multiple_of(dtype.group_rows());
                let bytes = encode(dtype, rows, cols, cols as u32);
                let w = Matrix::new(dtype, rows, cols, &bytes).unwrap();
                for n in TOKENS {
                    let xs = values(n * cols, n as u32);
                    let (want, mag) = (reference(&w, &xs), magnitudes(&w, &xs));
                    for group in [1, 3, n] {
                        let mut ys = vec![f32::NAN; n * rows];
                        let mut act = vec![0u8; act_scratch_len(cols) * group];
                        matmul(&w, &xs, &mut ys, &mut act);
                        let what =
                            format_args!("{t} matmul {dtype:?} [{rows}, {cols}] x {n} tokens, {group} at a time");
                        assert_matches(dtype, &ys, &want, &mag, &what);
                    }
                }
            }
        }
    }

    /// f32p rows with every spill slot used (weights far below the row's largest, a
    /// subnormal) and zeros of both signs: products within [`BUDGET`] of the reference,
    /// rows decoded to the source's bits.
    fn f32p_spills_zeros_and_subnormals(t: Tier) {
        use crate::quant::{f32p_slots, f32p_spills};
        let (rows, cols) = (9, 96);
        let mut src = Vec::new();
        for r in 0..rows {
            let mut row = values(cols, 40 + r as u32);
            (row[3], row[50], row[95]) = (0.0, -0.0, -0.0);
            row[10 + r] = -1e-41; // subnormal
            let mut c = 20;
            while f32p_spills(&row) < f32p_slots(cols) {
                row[c] = 3e-9 * (c as f32 - 40.0);
                c += 7;
            }
            src.extend(row);
        }
        let mut bytes = vec![0u8; DType::F32P.matrix_bytes(rows, cols).unwrap()];
        quantize_matrix(DType::F32P, cols, &src, &mut bytes).unwrap();
        let w = Matrix::new(DType::F32P, rows, cols, &bytes).unwrap();
        // One token, one tile, and tiles then single tokens.
        for n in [1, 3, 9] {
            let xs = values(n * cols, 9);
            let mut ys = vec![f32::NAN; n * rows];
            matmul(&w, &xs, &mut ys, &mut []);
            let what = format_args!("{t} f32p with spills x {n} tokens");
            assert_close(&ys, &reference(&w, &xs), &magnitudes(&w, &xs), &what);
        }
        let mut out = vec![f32::NAN; cols];
        for r in 0..rows {
            dequant_row(&w, r, &mut out);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&src[r * cols..(r + 1) * cols]), "{t} f32p row {r}");
        }
    }

    fn supported_tiers() -> impl Iterator<Item = Tier> {
        Tier::ALL.into_iter().filter(|&t| tier::supported(t))
    }

    #[test]
    fn every_supported_tier_matches_scalar() {
        let before = tier();
        for t in supported_tiers() {
            // SAFETY: the CPU supports `t`.
            unsafe { force_tier(t) };
            assert_eq!(tier(), t);
            suite(t);
            f32p_spills_zeros_and_subnormals(t);
        }
        #[cfg(feature = "std")]
        env_selects_tier();
        // SAFETY: it was active before.
        unsafe { force_tier(before) };
    }

    /// `KVM_KERNELS` through `init_from_env`; runs inside the one test that switches the
    /// process-wide tier, so that no other test sees it change.
    #[cfg(feature = "std")]
    fn env_selects_tier() {
        let set = |v: Option<&str>| match v {
            Some(v) => std::env::set_var("KVM_KERNELS", v),
            None => std::env::remove_var("KVM_KERNELS"),
        };
        set(Some("scalar"));
        assert_eq!(init_from_env(), Ok(Tier::Scalar));
        assert_eq!(tier(), Tier::Scalar);
        set(Some("sse9"));
        assert_eq!(init_from_env(), Err(TierError::UnknownName));
        assert_eq!(tier(), Tier::Scalar, "a refused value leaves the tier alone");
        if let Some(missing) = Tier::ALL.into_iter().find(|&t| !tier::supported(t)) {
            set(Some(missing.name()));
            assert_eq!(init_from_env(), Err(TierError::Unsupported(missing)));
        }
        set(None);
        assert_eq!(init_from_env(), Ok(detect()));
        assert_eq!(tier(), detect());
    }

    #[test]
    fn simd_activation_quantizers_match_scalar_bytes() {
        let mut x = values(32 * 37, 11);
        // A zero block, a tiny one and exact ties (x * 127 / amax = k + 0.5).
        x[32..64].fill(0.0);
        x[64..96].fill(1e-35);
        for (i, v) in x[96..128].iter_mut().enumerate() {
            *v = (i as f32 - 16.0) + 0.5;
        }
        x[127] = 127.0;
        let mut want = vec![0u8; act_scratch_len(x.len())];
        scalar::quantize_act(&x, &mut want);
        assert_eq!(&want[96..99], &[(-16i8) as u8, (-14i8) as u8, (-14i8) as u8], "ties go to even");
        for t in supported_tiers() {
            let mut got = vec![0xAAu8; want.len()];
            // SAFETY: the CPU supports `t`; the table is called directly.
            unsafe { (table(t).quantize_act)(&x, &mut got) };
            assert_eq!(got, want, "{t}");
        }
    }

    /// `weighted_sum` and `dots` entries over rows stored as `T` give the scalar tier's bits
    /// on the widened rows, on odd widths and lengths, and dots stay within [`BUDGET`] of
    /// the f64 sums.
    fn check_stored_entries<T: Stored>(t: Tier, entries: &Attention<T>, store: fn(f32) -> T) {
        let (weighted_sum, dots) = (entries.weighted_sum, entries.dots);
        let stored = |n: usize, seed: u32| -> (Vec<T>, Vec<f32>) {
            let rows: Vec<T> = values(n, seed).into_iter().map(store).collect();
            let wide = rows.iter().map(|r| r.widen()).collect();
            (rows, wide)
        };
        let name = core::any::type_name::<T>();
        for d in [1, 3, 4, 7, 8, 15, 16, 17, 31, 33, 64, 65, 127, 128, 129, 200, 257] {
            for n in [0, 1, 2, 5, 9] {
                let (p, (rows, wide)) = (values(n, d as u32), stored(n * d, 3 + n as u32));
                let start = values(d, 99);
                let (mut want, mut got) = (start.clone(), start.clone());
                scalar::weighted_sum(&p, &wide, &mut want);
                // SAFETY: the CPU supports `t`; the table is called directly.
                unsafe { weighted_sum(&p, &rows, &mut got) };
                assert_bits(&got, &want, &format_args!("{t} weighted_sum {name} [{n}, {d}]"));
            }
        }
        for d in [1, 3, 15, 16, 17, 31, 32, 33, 64, 127, 128, 129] {
            for n in [0, 1, 3, 4, 5, 9] {
                let ((rows, wide), x) = (stored(n * d, d as u32), values(d, 5 + n as u32));
                let (mut want, mut got) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                scalar::dots(&wide, &x, &mut want);
                // SAFETY: as above.
                unsafe { dots(&rows, &x, &mut got) };
                assert_bits(&got, &want, &format_args!("{t} dots {name} [{n}, {d}]"));
                let exact: Vec<f32> = wide
                    .chunks_exact(d)
                    .map(|r| r.iter().zip(&x).map(|(a, b)| (a * b) as f64).sum::<f64>() as f32)
                    .collect();
                let mag: Vec<f32> =
                    wide.chunks_exact(d).map(|r| r.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum()).collect();
                assert_close(&got, &exact, &mag, &format_args!("{t} dots {name} [{n}, {d}] vs f64"));
            }
        }
    }

    /// i8 values spread over their range, from [`values`].
    fn to_i8(x: f32) -> i8 {
        (x * 15.0).clamp(-127.0, 127.0) as i8
    }

    /// Attention's helpers: `dots`, `weighted_sum` (over f32 rows, the f16 cache's rows and
    /// the q8 cache's values) and `exp_sub` give the scalar tier's bits in every tier (they
    /// keep its operations and order), on odd widths and lengths.
    #[test]
    fn attention_helpers_match_scalar_bits() {
        for t in supported_tiers() {
            let tb = table(t);
            check_stored_entries(t, &tb.f32, |x| x);
            check_stored_entries(t, &tb.f16, f16::from_f32);
            check_stored_entries(t, &tb.i8, to_i8);
            for len in [0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 100, 769] {
                // From far below the clamp to above it, through 0.
                let mut want: Vec<f32> = values(len, len as u32).iter().map(|v| v * 30.0 - 8.0).collect();
                want.iter_mut().step_by(5).for_each(|v| *v *= 4.0);
                let mut got = want.clone();
                scalar::exp_sub(&mut want, 2.5);
                // SAFETY: as above.
                unsafe { (tb.exp_sub)(&mut got, 2.5) };
                assert_bits(&got, &want, &format_args!("{t} exp_sub [{len}]"));
            }
        }
    }

    /// `max` and `find` agree with a running maximum and the first position of it in every
    /// tier, and so does `argmax`, on odd lengths: NaNs skipped, the first of ties, zeros of
    /// both signs equal, and no position when nothing is above `-inf`.
    #[test]
    fn maxima_and_their_first_positions_match_a_running_maximum() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let mut cases: Vec<Vec<f32>> = [0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 100, 769, 50_304]
            .iter()
            .map(|&len| {
                // Values that repeat (ties of the largest), with a NaN every 7th.
                let mut x: Vec<f32> = (0..len).map(|i| ((i * 7919) % 1009) as f32 - 500.0).collect();
                x.iter_mut().step_by(7).for_each(|v| *v = nan);
                x
            })
            .collect();
        cases.extend([
            vec![nan; 9],
            vec![-inf, nan, -inf],
            vec![-1.0, -0.0, 0.0, -0.0],
            vec![2.0; 40],
            (0..70).map(|i| if i == 66 { inf } else { i as f32 }).collect(),
        ]);
        for t in supported_tiers() {
            let tb = table(t);
            for x in &cases {
                let running = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let first = x.iter().position(|&v| v == running);
                // SAFETY: as above.
                let (max, found) = unsafe { ((tb.max)(x), (tb.find)(x, running)) };
                assert!(max == running, "{t} max of {} values: {max} != {running}", x.len());
                assert_eq!(found, first, "{t} find of {} values", x.len());
            }
        }
        for x in &cases {
            let best = (0..x.len()).filter(|&i| x[i] > f32::NEG_INFINITY).fold(None, |b: Option<usize>, i| {
                if b.is_none_or(|b| x[i] > x[b]) {
                    Some(i)
                } else {
                    b
                }
            });
            assert_eq!(argmax(x), best, "argmax of {} values", x.len());
        }
    }

    /// Every tier narrows to f16 with [`scalar::narrow_f16`]'s bits (`half`'s), on odd
    /// lengths: normals, subnormals and underflow, ties, overflow, infinities and NaNs.
    #[test]
    fn narrow_f16_matches_scalar_bits() {
        // Each of these and its negation.
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let (snan, payload) = (f32::from_bits(0x7f80_0001), f32::from_bits(0x7fc1_2345));
        let magnitudes = [
            0.0, 1.0, 1.5, 65504.0, 65519.99, 65520.0, 1e9, 3.4e38, inf, nan, snan, payload, 6.1e-5, 5.96e-8, 2.98e-8,
            2.99e-8, 1e-10, 3e-6, 1.2e-38, 1.0004883, 1.0014648, 2049.0, 2051.0,
        ];
        let specials: Vec<f32> = magnitudes.iter().flat_map(|&v| [v, -v]).collect();
        for t in supported_tiers() {
            let tb = table(t);
            for len in [0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 769] {
                let mut x: Vec<f32> = values(len, len as u32 + 7).iter().map(|v| v * 3e4).collect();
                // Small magnitudes too (subnormal f16s), and the specials at odd places.
                x.iter_mut().skip(1).step_by(4).for_each(|v| *v *= 1e-9);
                for (v, &s) in x.iter_mut().skip(2).step_by(3).zip(specials.iter().cycle()) {
                    *v = s;
                }
                let (mut want, mut got) = (vec![f16::ZERO; len], vec![f16::ZERO; len]);
                scalar::narrow_f16(&x, &mut want);
                // SAFETY: `supported_tiers` yields only tiers this CPU runs.
                unsafe { (tb.narrow_f16)(&x, &mut got) };
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{t} narrow_f16 [{len}] at {i}: {} from {}", g, x[i]);
                }
            }
        }
    }

    /// Multi-query kernels give [`dots`]' bits for every query, f32, f16 and i8 rows, on
    /// odd shapes; the public function handles empty rows and zero widths.
    #[test]
    fn dots_many_matches_dots_per_query() {
        fn check<T: Stored>(t: Tier, f: Option<DotsMany<T>>, conv: fn(f32) -> T) {
            let Some(f) = f else { return };
            for d in [1, 3, 15, 16, 17, 33, 128, 129] {
                for (m, n) in [(1, 1), (3, 5), (4, 4), (5, 9), (8, 3), (9, 8)] {
                    let rows: Vec<T> = values(n * d, d as u32).into_iter().map(conv).collect();
                    let xs = values(m * d, 7 + m as u32);
                    let mut want = vec![f32::NAN; m * n];
                    for (x, o) in xs.chunks_exact(d).zip(want.chunks_exact_mut(n)) {
                        scalar::dots(&rows, x, o);
                    }
                    let mut got = vec![f32::NAN; m * n];
                    // SAFETY: the CPU supports `t`; `d > 0` and there are rows.
                    unsafe { f(&rows, &xs, d, &mut got) };
                    assert_bits(&got, &want, &format_args!("{t} dots_many [{m} x {n}, {d}]"));
                }
            }
        }
        for t in supported_tiers() {
            check(t, table(t).f32.dots_many, |x| x);
            check(t, table(t).f16.dots_many, f16::from_f32);
            check(t, table(t).i8.dots_many, to_i8);
        }
        let mut out = [1.0f32; 4];
        dots_many::<f32>(&[], &[0.5; 6], 3, &mut out);
        assert_eq!(out, [1.0; 4], "no rows: nothing written");
        dots_many::<f32>(&[], &[], 0, &mut out);
        assert_eq!(out, [0.0; 4], "zero width: empty sums");
    }

    /// The scalar tier's f16 widening is exact for every one of the 65536 bit patterns
    /// (what `half` and the F16C/fcvtl instructions give, quiet NaNs included).
    #[test]
    fn widen_f16_is_exact_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let (got, want) = (scalar::widen_f16(h), f16::from_bits(h).to_f32());
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}: {got} vs {want}");
        }
    }

    #[test]
    fn exp_approx_is_within_two_ulp_of_expf() {
        let mut worst = 0f32;
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f32 / 200_000.0;
            let (got, want) = (scalar::exp_approx(x), libm::expf(x));
            let ulp = f32::from_bits(want.to_bits() + 1) - want;
            worst = worst.max((got - want).abs() / ulp);
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(scalar::exp_approx(0.0), 1.0);
        assert_eq!(scalar::exp_approx(-1000.0), scalar::exp_approx(scalar::exp::LO));
        assert!(scalar::exp_approx(f32::NAN).is_nan());
        assert!(scalar::exp_approx(f32::INFINITY).is_finite());
    }

    #[test]
    fn q8_activation_error_is_half_a_step() {
        let cols = 1024;
        let x = values(cols, 5);
        let mut act = vec![0u8; act_scratch_len(cols)];
        scalar::quantize_act(&x, &mut act);
        for dtype in [DType::Q8_0, DType::Q4_0] {
            let bytes = encode(dtype, 4, cols, 9);
            let w = Matrix::new(dtype, 4, cols, &bytes).unwrap();
            let rb = w.row_bytes();
            let mut row = vec![0.0; cols];
            for (r, (want, mag)) in reference(&w, &x).iter().zip(magnitudes(&w, &x)).enumerate() {
                let bytes = &bytes[r * rb..][..rb];
                scalar::dequant_row(dtype, bytes, &mut row);
                // Each activation moves by at most half its block's step d_a.
                let bound: f32 = row
                    .chunks_exact(QK)
                    .zip(x.chunks_exact(QK))
                    .map(|(w, x)| {
                        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                        w.iter().map(|v| v.abs()).sum::<f32>() * amax / 127.0 * 0.5
                    })
                    .sum();
                let exact = scalar::dot_row(dtype, bytes, &x);
                let err = (want - exact).abs();
                assert!(err <= bound * 1.001 + BUDGET * mag, "{dtype:?} row {r}: {want} vs {exact}, bound {bound}");
                // Rounding errors largely cancel: far below the worst case.
                assert!(err <= 0.2 * bound, "{dtype:?} row {r}: error {err}, worst case {bound}");
            }
        }
    }

    /// Files may hold q8_0 weights of -128 (our quantizer never writes them): the sign
    /// trick and the biased dots must keep them exact, against activations of +-127.
    #[test]
    fn extreme_q8_0_weights_stay_exact() {
        let (rows, cols) = (5, 256);
        let mut bytes = encode(DType::Q8_0, rows, cols, 3);
        for (i, b) in bytes.iter_mut().enumerate() {
            let in_block = i % 34;
            if in_block >= 2 {
                *b = [0x80, 0x7f, 0x80, 0x81][(i / 34 + in_block) % 4];
            }
        }
        let w = Matrix::new(DType::Q8_0, rows, cols, &bytes).unwrap();
        let x: Vec<f32> = (0..cols).map(|c| if c % 3 == 0 { -1.0 } else { 1.0 }).collect();
        let want = reference(&w, &x);
        for t in supported_tiers() {
            let mut y = vec![f32::NAN; rows];
            let mut act = vec![0u8; act_scratch_len(cols)];
            // SAFETY: the CPU supports `t`; the table is called directly, not installed.
            unsafe { (table(t).decode.matvec)(&w, &x, &mut y, &mut act) };
            assert_bits(&y, &want, &format_args!("{t} q8_0 extremes"));
        }
    }

    /// Raw `[rows, nb blocks]` of `dtype` with adversarial contents: scales from the
    /// largest f16 down to subnormals, zeros and negatives; weights at both ends of their
    /// range (q8_0's -128, which our quantizer never writes, included) and zero blocks.
    fn adversarial_weights(dtype: DType, rows: usize, nb: usize, seed: u32) -> Vec<u8> {
        const SCALES: [u16; 8] = [0x7bff, 0x0001, 0x03ff, 0x3c00, 0xbc00, 0x0000, 0x8000, 0x5a1f];
        let bb = dtype.block_bytes();
        let mut bits = values(rows * nb * bb, seed).into_iter().map(|v| v.to_bits() >> 7);
        let mut out = vec![0u8; rows * nb * bb];
        for (i, block) in out.chunks_exact_mut(bb).enumerate() {
            let pick = bits.next().unwrap_or(0);
            let d = if i % 3 == 0 { SCALES[pick as usize % 8] } else { 0x2000 | (pick as u16 & 0x3fff) };
            block[..2].copy_from_slice(&d.to_le_bytes());
            for q in &mut block[2..] {
                let r = bits.next().unwrap_or(0);
                *q = match (i % 5, r % 4) {
                    (0, _) => 0,
                    (1, _) if dtype == DType::Q8_0 => [0x80, 0x7f][r as usize % 2],
                    (1, _) => [0x00, 0xff, 0x0f, 0xf0][r as usize % 4],
                    (_, 0) => 0x80,
                    _ => (r >> 3) as u8,
                };
            }
        }
        out
    }

    /// Activations of `n` tokens with large magnitudes, zero and tiny blocks, and ties.
    fn adversarial_activations(n: usize, cols: usize, seed: u32) -> Vec<f32> {
        let mut x = values(n * cols, seed);
        for (b, block) in x.chunks_exact_mut(QK).enumerate() {
            match b % 6 {
                0 => block.iter_mut().for_each(|v| *v *= 3.0e4),
                1 => block.fill(0.0),
                2 => block.iter_mut().for_each(|v| *v *= 1e-36),
                3 => block.iter_mut().enumerate().for_each(|(i, v)| *v = i as f32 - 15.5),
                _ => {}
            }
        }
        x
    }

    /// Every tier's integer matvec and matmul (1, 3 or all tokens per group) give the
    /// scalar reference's bits, on odd block counts, every small tile remainder and
    /// adversarial data: the canonical order of `scalar::sum_blocks` holds everywhere.
    #[test]
    fn integer_tiers_are_bit_identical() {
        for dtype in [DType::Q8_0, DType::Q4_0] {
            for nb in [1, 3, 7, 8, 9, 17, 24, 100] {
                let cols = nb * QK;
                for rows in (1..=9).chain([17, 33]) {
                    let seed = (nb * 31 + rows) as u32;
                    let plain = encode(dtype, rows, cols, seed);
                    let wild = adversarial_weights(dtype, rows, nb, seed);
                    for (kind, bytes) in [("plain", &plain), ("adversarial", &wild)] {
                        let w = Matrix::new(dtype, rows, cols, bytes).unwrap();
                        let tokens: &[usize] = if rows % 4 == 1 { &[1, 2, 3, 4, 5, 7, 8, 16, 17] } else { &[1, 4, 5] };
                        for &n in tokens {
                            let xs = if kind == "plain" {
                                values(n * cols, seed + n as u32)
                            } else {
                                adversarial_activations(n, cols, seed + n as u32)
                            };
                            let want = reference(&w, &xs);
                            for t in supported_tiers() {
                                for group in [1, 3, n] {
                                    let mut ys = vec![f32::NAN; n * rows];
                                    let mut act = vec![0u8; act_scratch_len(cols) * group];
                                    // SAFETY: the CPU supports `t`; the table is called directly.
                                    unsafe { (table(t).matmul)(&w, &xs, &mut ys, &mut act) };
                                    let what = format_args!("{t} {kind} {dtype:?} [{rows}, {nb} blocks] x {n}/{group}");
                                    assert_bits(&ys, &want, &what);
                                }
                                let mut y = vec![f32::NAN; rows];
                                let mut act = vec![0u8; act_scratch_len(cols)];
                                // SAFETY: as above.
                                unsafe { (table(t).decode.matvec)(&w, &xs[..cols], &mut y, &mut act) };
                                assert_bits(
                                    &y,
                                    &want[..rows],
                                    &format_args!("{t} {kind} {dtype:?} matvec [{rows}, {nb}]"),
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// `plain` (row-major blocks of `dtype.plain()`, `[rows, nb]`) stored as `dtype`'s groups.
    fn interleave(dtype: DType, plain: &[u8], nb: usize) -> Vec<u8> {
        fn store<G: RowGroup>(plain: &[u8], nb: usize, out: &mut [u8]) {
            let bb = G::PLAIN.block_bytes();
            let g: &mut [G] = bytemuck::cast_slice_mut(out);
            for (i, block) in plain.chunks_exact(bb).enumerate() {
                let (r, b) = (i / nb, i % nb);
                g[r / X16 * nb + b].set_block(r % X16, bytemuck::from_bytes(block));
            }
        }
        let mut out = vec![0u8; plain.len()];
        match dtype {
            DType::Q4_0x16 => store::<GroupQ4_0x16>(plain, nb, &mut out),
            DType::Q8_0x16 => store::<GroupQ8_0x16>(plain, nb, &mut out),
            _ => unreachable!("{dtype:?} is not interleaved"),
        }
        out
    }

    /// Interleaved dtypes on adversarial data (extreme scales, quants at both ends, a row
    /// of nothing but the largest magnitude, 15 or -128, against activations of +-127,
    /// which fill the widening kernels' i16 lanes nearly to the brim): every tier gives the
    /// plain dtype's reference bits.
    #[test]
    fn interleaved_dtypes_are_bit_identical_on_extremes() {
        for dtype in [DType::Q4_0x16, DType::Q8_0x16] {
            let flat = dtype.plain();
            for nb in [1, 7, 8, 9, 17] {
                let cols = nb * QK;
                for groups in [1, 2, 5, 9] {
                    let rows = groups * X16;
                    let seed = (nb * 7 + groups) as u32;
                    let mut plain = adversarial_weights(flat, rows, nb, seed);
                    let rb = flat.row_bytes(cols).unwrap();
                    for block in plain[3 * rb..4 * rb].chunks_exact_mut(flat.block_bytes()) {
                        block[2..].fill(if flat == DType::Q8_0 { 0x80 } else { 0xff });
                    }
                    let bytes = interleave(dtype, &plain, nb);
                    let w = Matrix::new(dtype, rows, cols, &bytes).unwrap();
                    for n in [1, 2, 5] {
                        let mut xs = adversarial_activations(n, cols, seed + n as u32);
                        // The last token: blocks of all -1 or all 1, quantized to -127 or 127.
                        for (b, block) in xs[(n - 1) * cols..].chunks_exact_mut(QK).enumerate() {
                            block.fill(if b % 3 == 0 { 1.0 } else { -1.0 });
                        }
                        let want = reference(&w, &xs);
                        for t in supported_tiers() {
                            for group in [1, n] {
                                let mut ys = vec![f32::NAN; n * rows];
                                let mut act = vec![0u8; act_scratch_len(cols) * group];
                                // SAFETY: the CPU supports `t`; the table is called directly.
                                unsafe { (table(t).matmul)(&w, &xs, &mut ys, &mut act) };
                                assert_bits(
                                    &ys,
                                    &want,
                                    &format_args!("{t} {dtype:?} [{rows}, {nb} blocks] x {n}/{group}"),
                                );
                            }
                            let mut y = vec![f32::NAN; rows];
                            let mut act = vec![0u8; act_scratch_len(cols)];
                            let x = &xs[(n - 1) * cols..];
                            // SAFETY: as above.
                            unsafe { (table(t).decode.matvec)(&w, x, &mut y, &mut act) };
                            assert_bits(
                                &y,
                                &want[(n - 1) * rows..],
                                &format_args!("{t} {dtype:?} matvec [{rows}, {nb}]"),
                            );
                        }
                    }
                }
            }
        }
    }

    /// The canonical order itself: 8 lanes, block `b` in lane `b % 8`, then the fixed tree.
    #[test]
    fn canonical_block_sum_order() {
        let terms = [1.0e8f32, 1.0, -1.0e8, 1.0, 3.0, 0.5, 0.25, 0.125, 1.0, 2.0];
        let mut acc = [0.0f32; 8];
        for (b, &t) in terms.iter().enumerate() {
            acc[b % 8] += t;
        }
        let want = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        assert_eq!(scalar::sum_blocks(terms.into_iter()).to_bits(), want.to_bits());
        assert_eq!(scalar::sum_blocks(core::iter::empty()).to_bits(), 0.0f32.to_bits());
    }

    /// A debug build stops at the shape; a release build writes nothing.
    #[test]
    fn quantizing_an_activation_of_the_wrong_shape_writes_nothing() {
        let x = values(64, 1);
        for (values, bytes) in [(64, act_scratch_len(64) - 1), (40, 100)] {
            let mut act = vec![0xAAu8; bytes];
            let run = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| quantize_act(&x[..values], &mut act)));
            assert_eq!(run.is_err(), cfg!(debug_assertions), "{values} values into {bytes} bytes");
            assert!(act.iter().all(|&b| b == 0xAA), "{values} values into {bytes} bytes");
        }
    }

    #[test]
    fn prefetching_changes_nothing() {
        let v = values(1000, 3);
        for access in [Access::Read, Access::Write, Access::Later] {
            for (start, len) in [(0, 0), (0, 1), (1, 17), (3, 997), (999, 1)] {
                prefetch_lines(&v[start..start + len], access);
            }
            prefetch_lines::<f16>(&[], access);
        }
        assert_eq!(v, values(1000, 3));
        // Addresses that point at nothing: a freed buffer's, and the null page.
        let freed = {
            let v = vec![0u8; 1 << 16];
            v.as_ptr() as usize
        };
        prefetch_later(freed, 1 << 16);
        prefetch_later(0, 4096);
    }

    #[test]
    fn empty_shapes() {
        for dtype in DType::ALL {
            let w = Matrix::new(dtype, 0, 64, &[]).unwrap();
            let mut act = vec![0u8; act_scratch_len(64)];
            matvec(&w, &values(64, 1), &mut [], &mut act);
            matmul(&w, &values(128, 1), &mut [], &mut act);
        }
        let w = Matrix::new(DType::F32, 3, 0, &[]).unwrap();
        let mut y = [f32::NAN; 3];
        matvec(&w, &[], &mut y, &mut []);
        assert_eq!(y, [0.0; 3]);
        // Interleaved dtypes hold whole groups of rows only.
        let bytes = vec![0u8; 17 * DType::Q4_0x16.row_bytes(64).unwrap()];
        assert!(Matrix::new(DType::Q4_0x16, 17, 64, &bytes).is_err());
        assert!(Matrix::new(DType::Q4_0, 17, 64, &bytes).is_ok());
    }

    #[test]
    fn scratch_lengths() {
        assert_eq!(act_scratch_len(768), 768 + 24 * 4);
        assert_eq!(matmul_scratch_len(768, 3), 3 * act_scratch_len(768));
        assert_eq!(matmul_scratch_len(768, 1000), MATMUL_TOKENS * act_scratch_len(768));
    }

    #[test]
    fn compiled_tier_is_supported() {
        assert!(tier::supported(tier::COMPILED));
        for t in Tier::ALL {
            assert_eq!(Tier::from_name(t.name()), Some(t));
        }
        assert_eq!(Tier::from_name("sse"), None);
    }
}

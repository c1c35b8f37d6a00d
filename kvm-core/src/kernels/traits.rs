//! The contract between the API above and the tiers below: what every tier supplies
//! ([`Kernels`] and its tiles, [`Kernel`], [`GroupKernel`], [`IntKernel`]), the element
//! types its kernels read ([`Stored`], the dtypes as types), the q8 activation layout they
//! share ([`act_scratch_len`]), and the dispatch table's shape ([`Table`]), which
//! [`table`](mod@super::table) fills for each tier and the API calls through.

use crate::quant::{DType, QK, X16};
use crate::tensor::Matrix;
use half::f16;

/// Bytes of activation scratch [`super::matvec`] needs for an input of `cols` values: one
/// token's q8 activation, `cols` i8 values then one little-endian f32 scale per block of
/// [`QK`] (float weights use none of it).
pub const fn act_scratch_len(cols: usize) -> usize {
    cols / QK * (QK + 4)
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
    /// least `16 n` values, and returns `true`: a single token's product, where a tier
    /// prepares `a` once for the whole matrix. By default (and where it returns `false`)
    /// the walk takes the groups through [`GroupKernel::streams`] or [`GroupKernel::group`]
    /// as [`GroupKernel::SIDE_BY_SIDE`] says.
    ///
    /// # Safety
    /// As [`GroupKernel::group`] for every group.
    unsafe fn single(_w: &[u8], _gb: usize, _cols: usize, _a: &[u8], _ys: &mut [f32]) -> bool {
        false
    }
}

/// One tier's tile of the integer numerics' product ([`super::matvec_i8`]), which `walk`'s driver
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

/// An assembly tile of four rows (ARMv6-M's, RV32's): `tile(rows, data, n, out)` writes
/// the four rows' wrapping sums over the `n` elements of `data` (an input, or a list of
/// its nonzero columns).
#[cfg(any(kvm_armv6m, target_arch = "riscv32"))]
pub(crate) type AsmTile<T> = unsafe extern "C" fn(*const [*const i8; 4], *const T, usize, *mut [i32; 4]);

/// [`IntKernel::sums`] or [`IntKernel::sparse_sums`] by `tile` where `q` is four rows and
/// `data` not empty, else by `other` (the rows a tiling leaves over).
///
/// # Safety
/// `tile` is sound for four rows that each hold a weight at every column `data` reaches.
#[cfg(any(kvm_armv6m, target_arch = "riscv32"))]
pub(crate) unsafe fn four_rows<T, const R: usize>(
    tile: AsmTile<T>,
    q: [&[i8]; R],
    data: &[T],
    other: impl FnOnce([&[i8]; R]) -> [i32; R],
) -> [i32; R] {
    let Ok(rows) = <&[&[i8]; 4]>::try_from(&q[..]) else {
        return other(q);
    };
    if data.is_empty() {
        return [0; R];
    }
    let mut out = [0i32; 4];
    // SAFETY: the caller's contract; `out` is four i32s.
    unsafe { tile(&rows.map(<[i8]>::as_ptr), data.as_ptr(), data.len(), &mut out) };
    core::array::from_fn(|r| out[r])
}

/// A nonzero column `c` of a product's input, its value `v` (the column in the low half
/// of a little-endian word, for the assembly tiles).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct NonZero {
    pub(crate) c: u16,
    pub(crate) v: i16,
}

/// Everything a tier supplies; [`super::walk::run`] turns it into `matvec`/`matmul`.
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
    /// producing exactly the bytes of [`super::scalar::quantize_act`], so that every tier's integer
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

    /// The tier's float batch product ([`super::gemm::run`] with its
    /// [`super::gemm::Gemm`] kernel), where it has one: the caller walks decode's tiles when
    /// it is `None` or returns `false`.
    const GEMM: Option<RunFn> = None;
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
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64", all(target_arch = "wasm32", target_feature = "simd128")))]
pub(crate) struct I8;

/// A [`Stored`] element's loader type: the SIMD tiers read attention's state rows with the
/// loaders they have for weight rows of that dtype (and [`I8`]'s), so one loop body serves
/// every stored type.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64", all(target_arch = "wasm32", target_feature = "simd128")))]
pub(crate) trait StoredType: Stored {
    type Float;
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64", all(target_arch = "wasm32", target_feature = "simd128")))]
impl StoredType for f32 {
    type Float = F32;
}
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64", all(target_arch = "wasm32", target_feature = "simd128")))]
impl StoredType for f16 {
    type Float = F16;
}
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64", all(target_arch = "wasm32", target_feature = "simd128")))]
impl StoredType for i8 {
    type Float = I8;
}

/// An element attention reads from the session state: `f32`, [`struct@f16`] (the compact
/// cache, half the bytes) or `i8` (the q8 cache's values, whose per-row scales the caller
/// applies). Kernels widen it exactly to f32 before any arithmetic, so the same values give
/// the same bits whichever way they are stored.
pub trait Stored: Copy + Send + Sync + sealed::Select {
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
    /// Exactly, as `vcvtph2ps` / `fcvtl` give it (NaNs quieted), in integer operations and
    /// one exact multiply: branch-light where `half` would check the CPU per value.
    #[inline(always)]
    fn widen(self) -> f32 {
        let h = self.to_bits();
        let sign = u32::from(h & 0x8000) << 16;
        let mag = u32::from(h & 0x7fff);
        let bits = match mag >> 10 {
            // Zero and subnormals: m * 2^-24, an exact integer conversion and power-of-two scaling.
            0 => (mag as f32 * f32::from_bits((127 - 24) << 23)).to_bits(),
            // Infinity, or a quiet NaN keeping the payload.
            0x1f if mag & 0x3ff == 0 => 0x7f80_0000,
            0x1f => 0x7fc0_0000 | (mag & 0x3ff) << 13,
            // Normals: re-bias the exponent (15 -> 127).
            _ => (mag << 13) + ((127 - 15) << 23),
        };
        f32::from_bits(sign | bits)
    }
}

impl Stored for i8 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self as f32
    }
}

/// Which of a table's attention entries serve each [`Stored`] type (sealed: f32, f16, i8).
mod sealed {
    use super::{Attention, Table};
    use half::f16;

    pub trait Select: Sized + 'static {
        /// `t`'s entries for rows stored as `Self`.
        fn attention(t: &Table) -> &Attention<Self>;
    }

    impl Select for f32 {
        #[inline(always)]
        fn attention(t: &Table) -> &Attention<f32> {
            &t.f32
        }
    }

    impl Select for f16 {
        #[inline(always)]
        fn attention(t: &Table) -> &Attention<f16> {
            &t.f16
        }
    }

    impl Select for i8 {
        #[inline(always)]
        fn attention(t: &Table) -> &Attention<i8> {
            &t.i8
        }
    }
}

/// A tier's float batch product, [`super::gemm::run`] of its kernel: `(w, xs, ys, ld,
/// scratch) -> ran`.
pub(crate) type RunFn = unsafe fn(&Matrix<'_>, &[f32], &mut [f32], usize, &mut [u8]) -> bool;

/// A tier's entry points, picked once per call by [`super::table::table`] (tract's kernel
/// table). `pub` in this private module, unnameable outside the crate, for [`Stored`]'s
/// sealed selector; its fields are the kernels' own.
#[derive(Debug)]
pub struct Table {
    pub(super) decode: Decode,
    pub(super) matmul: unsafe fn(&Matrix<'_>, &[f32], &mut [f32], &mut [u8]),
    pub(super) quantize_act: unsafe fn(&[f32], &mut [u8]),
    pub(super) dequant_row: unsafe fn(DType, &[u8], &mut [f32]),
    pub(super) max: unsafe fn(&[f32]) -> f32,
    pub(super) find: unsafe fn(&[f32], f32) -> Option<usize>,
    pub(super) exp_sub: unsafe fn(&mut [f32], f32),
    pub(super) narrow_f16: unsafe fn(&[f32], &mut [f16]),
    /// The integer numerics' product ([`super::matvec_i8`]).
    pub(super) matvec_i8: unsafe fn(&Matrix<'_>, &[i16], i32, &mut [i32]),
    pub(super) f32: Attention<f32>,
    pub(super) f16: Attention<f16>,
    pub(super) i8: Attention<i8>,
}

/// A tier's one-token products, with tiles of `RF` rows for float weights and `RQ` for
/// integer ones (`table.rs`'s `decode`).
#[derive(Debug)]
pub(super) struct Decode {
    pub(super) matvec: unsafe fn(&Matrix<'_>, &[f32], &mut [f32], &mut [u8]),
    pub(super) matvec_prepared: unsafe fn(&Matrix<'_>, &[f32], &[u8], &mut [f32]),
    pub(super) rows: fn(DType) -> usize,
}

/// A multi-query [`super::dots_many`] kernel: `rows`, `xs`, `d`, `out`.
pub(super) type DotsMany<T> = unsafe fn(&[T], &[f32], usize, &mut [f32]);

/// A multi-query [`super::weighted_sum_many`] kernel: `ps`, `stride`, `rows`, `d`, `outs`.
pub(super) type WeightedSumMany<T> = unsafe fn(&[f32], usize, &[T], usize, &mut [f32]);

/// A tier's attention entries for rows stored as `T` (`pub` as [`Table`] is).
#[derive(Debug)]
pub struct Attention<T: 'static> {
    pub(super) dots: unsafe fn(&[T], &[f32], &mut [f32]),
    pub(super) weighted_sum: unsafe fn(&[f32], &[T], &mut [f32]),
    /// The multi-query [`super::dots_many`] kernel (`rows`, `xs`, `d`, `out`; `d > 0`, at least
    /// one row), where the tier has one.
    pub(super) dots_many: Option<DotsMany<T>>,
    /// The multi-query [`super::weighted_sum_many`] kernel (`d > 0`), where the tier has one.
    pub(super) weighted_sum_many: Option<WeightedSumMany<T>>,
}

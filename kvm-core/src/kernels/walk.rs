//! The tile driver: one walk over a matrix in tiles of weight rows by tokens (or groups of
//! interleaved rows), shared by every tier, so a tier's code holds only arithmetic.

use super::prefetch::{prefetch_lines, Access};
use super::traits::{act_scratch_len, GroupKernel, IntKernel, Kernel, Kernels, NonZero};
use crate::quant::{DType, X16};
use crate::tensor::Matrix;

/// `ys[t, r] = w[r] . xs[t]` for every row and each of the `n = xs.len() / cols` tokens
/// (`xs: [n, cols]`, `ys: [n, rows]`), with tier `K` in tiles of `T` tokens and `RF` rows
/// (float weights) or `RQ` rows (integer weights). Shapes that do not
/// fit are `debug_assert`ed; in release they shrink the work and never read out of bounds.
///
/// # Safety
/// The CPU supports `K`'s tier.
pub(super) unsafe fn run<K: Kernels, const RF: usize, const RQ: usize, const T: usize>(
    w: &Matrix<'_>,
    xs: &[f32],
    ys: &mut [f32],
    act: &mut [u8],
) {
    let Some((data, rb)) = checked(w, xs, ys) else { return };
    let (cols, ld) = (w.cols, w.rows);
    // SAFETY: (both arms) the caller guarantees the tier.
    unsafe {
        if !w.dtype.quantizes_act() {
            let whole = Matrix { dtype: w.dtype, rows: data.len() / rb, cols, data };
            if !K::GEMM.is_some_and(|gemm| gemm(&whole, xs, ys, ld, act)) {
                walk::<K, RF, RQ, T>(w.dtype, data, rb, cols, Input::Floats(xs), ys, ld);
            }
        } else {
            quantized::<K>(cols, xs, ys, ld, act, |a, per, yg| {
                walk::<K, RF, RQ, T>(w.dtype, data, rb, cols, Input::Quantized(a, per), yg, ld)
            });
        }
    }
}

/// [`run`] for one token whose q8 activation `act` is already made (integer weights).
///
/// # Safety
/// As [`run`].
pub(super) unsafe fn prepared<K: Kernels, const RF: usize, const RQ: usize, const T: usize>(
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
        Input::Floats(x)
    } else {
        let per = act_scratch_len(w.cols);
        debug_assert!(act.len() >= per, "act holds {} bytes, needs {per}", act.len());
        let a = &act[..per.min(act.len())];
        prefetch_lines(a, Access::Read);
        Input::Quantized(a, per)
    };
    // SAFETY: the caller guarantees the tier.
    unsafe { walk::<K, RF, RQ, T>(w.dtype, data, rb, w.cols, acts, y, w.rows) };
}

/// [`matvec_rows`] of tier `K` with `RF`-row float tiles and `RQ`-row integer ones.
pub(super) fn rows<K: Kernels, const RF: usize, const RQ: usize>(dtype: DType) -> usize {
    let groups = |side_by_side: bool| X16 * if side_by_side { STREAMS } else { 1 };
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 | DType::F32P | DType::I8 | DType::I32 => RF,
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
enum Input<'a> {
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
    input: Input<'_>,
    ys: &mut [f32],
    ld: usize,
) {
    // SAFETY: (all arms) forwarded.
    unsafe {
        match (dtype, input) {
            (DType::F32, Input::Floats(x)) => tiles::<K::F32, RF, T>(w, rb, cols, x, cols, ys, ld),
            (DType::F16, Input::Floats(x)) => tiles::<K::F16, RF, T>(w, rb, cols, x, cols, ys, ld),
            (DType::BF16, Input::Floats(x)) => tiles::<K::BF16, RF, T>(w, rb, cols, x, cols, ys, ld),
            (DType::F32P, Input::Floats(x)) => tiles::<K::F32P, RF, T>(w, rb, cols, x, cols, ys, ld),
            (DType::Q8_0, Input::Quantized(a, per)) => tiles::<K::Q8_0, RQ, T>(w, rb, cols, a, per, ys, ld),
            (DType::Q4_0, Input::Quantized(a, per)) => tiles::<K::Q4_0, RQ, T>(w, rb, cols, a, per, ys, ld),
            (DType::Q4_0x16, Input::Quantized(a, per)) => groups::<K::Q4_0x16, T>(w, rb, cols, a, per, ys, ld),
            (DType::Q8_0x16, Input::Quantized(a, per)) => groups::<K::Q8_0x16, T>(w, rb, cols, a, per, ys, ld),
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
/// ([`GroupKernel::SIDE_BY_SIDE`]), so more of memory's latency overlaps than in one
/// stream.
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
        // SAFETY: forwarded.
        if !unsafe { G::single(w, gb, cols, a, ys) } {
            // SAFETY: forwarded.
            unsafe { single_groups::<G>(w, gb, cols, a, ys) }
        }
        return;
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

/// [`groups`] for one token where the kernel has no [`GroupKernel::single`]: [`single`]
/// with [`STREAMS`] groups at a time when the kernel reads them side by side, else one.
///
/// # Safety
/// As [`tiles`].
unsafe fn single_groups<G: GroupKernel + ?Sized>(w: &[u8], gb: usize, cols: usize, a: &[u8], ys: &mut [f32]) {
    // SAFETY: (both arms) forwarded.
    unsafe {
        if G::SIDE_BY_SIDE {
            single::<G, STREAMS>(w, gb, cols, a, ys)
        } else {
            single::<G, 1>(w, gb, cols, a, ys)
        }
    }
}

/// [`groups`] for one token `a`: `S` groups at a time through [`GroupKernel::streams`],
/// group `i` of each of `S` equal runs of the matrix, then the groups left over one by one.
///
/// # Safety
/// As [`tiles`].
unsafe fn single<G: GroupKernel + ?Sized, const S: usize>(w: &[u8], gb: usize, cols: usize, a: &[u8], ys: &mut [f32]) {
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
    let batch = Batch { a, stride, n: (a.len() / stride).min(ys.len() / ld.max(1)) };
    let rows = w.len() / rb;
    let q = rows / R;
    let row = |r: usize| &w[r * rb..(r + 1) * rb];
    for i in 0..q {
        let rs: [usize; R] = core::array::from_fn(|s| s * q + i);
        // SAFETY: forwarded; each row is `rb` bytes.
        unsafe { token_tiles::<K, R, T>(core::array::from_fn(|s| row(rs[s])), rs, cols, batch, ys, ld) };
    }
    for r in R * q..rows {
        // SAFETY: as above.
        unsafe { token_tiles::<K, 1, T>([row(r)], [r], cols, batch, ys, ld) };
    }
}

/// The activations of a tile walk: `n` tokens, token `t`'s at `a[t * stride..][..stride]`.
struct Batch<'a, A> {
    a: &'a [A],
    stride: usize,
    n: usize,
}

impl<A> Clone for Batch<'_, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for Batch<'_, A> {}

/// The token loop of [`tiles`] for the `R` rows `rs`.
///
/// # Safety
/// As [`tiles`].
unsafe fn token_tiles<K: Kernel, const R: usize, const T: usize>(
    wr: [&[u8]; R],
    rs: [usize; R],
    cols: usize,
    batch: Batch<'_, K::Act>,
    ys: &mut [f32],
    ld: usize,
) {
    let Batch { a, stride, n } = batch;
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

/// The columns of one partial sum of [`super::matvec_i8`]: at most 512 products of an i8
/// weight and an i16 input, whose i32 sum the scalar oracle takes wrapping.
const I8_PART: usize = 512;

/// [`super::matvec_i8`] with tier `K`'s integer tile: `R` rows at a time from `R` equal
/// runs of the matrix (as [`tiles`]), then the rows left over one by one; each row's
/// products in partial sums of [`I8_PART`] columns, the tile over whole multiples of
/// [`IntKernel::LANES`] and the scalar oracle's dot over the rest, added in i64, then
/// requantized as the oracle does. Wrapping i32 sums do not depend on their order, so the
/// bits are the oracle's.
///
/// # Safety
/// The CPU supports `K`'s tier.
// Never inlined: its list of nonzero columns (1 KiB) then takes stack only while an
// integer product runs, not in the frames of every session's step on a microcontroller.
#[inline(never)]
pub(super) unsafe fn matvec_i8<K: IntKernel, const R: usize>(w: &Matrix<'_>, x: &[i16], s: i32, y: &mut [i32]) {
    let (rb, cols) = (w.row_bytes(), w.cols);
    let x = &x[..cols.min(x.len())];
    let rows = y.len().min(w.data.len() / rb.max(1));
    let q = rows / R;
    let row = |r: usize| crate::quant::i8_row(w.data, rb, r);
    // The list is set up (1 KiB) only for an input that qualifies.
    let mut list;
    let nz = match K::SPARSE && listable(x) {
        true => {
            list = [NonZero::default(); SPARSE_MAX];
            Some(nonzeros(x, &mut list))
        }
        false => None,
    };
    for i in 0..q {
        let rs: [usize; R] = core::array::from_fn(|j| j * q + i);
        let tile = core::array::from_fn(|j| row(rs[j]));
        // SAFETY: forwarded; a list's columns are below `x.len()`, which every row holds.
        let out = unsafe {
            match nz {
                Some(nz) => sparse_tile::<K, R>(tile, nz, s),
                None => i8_tile::<K, R>(tile, x, s),
            }
        };
        for (r, o) in rs.into_iter().zip(out) {
            y[r] = o;
        }
    }
    for (r, y) in y.iter_mut().enumerate().take(rows).skip(R * q) {
        // SAFETY: as above.
        [*y] = unsafe {
            match nz {
                Some(nz) => sparse_tile::<K, 1>([row(r)], nz, s),
                None => i8_tile::<K, 1>([row(r)], x, s),
            }
        };
    }
}

/// Nonzero columns a sparse product lists at most (4 bytes each, on the stack).
const SPARSE_MAX: usize = 256;

/// Whether `x` is an input of one partial sum, at least half zeros, whose nonzero columns
/// fit a list (else the dense tiles take it).
fn listable(x: &[i16]) -> bool {
    let n = x.iter().filter(|&&v| v != 0).count();
    x.len() <= I8_PART && 2 * n <= x.len() && n <= SPARSE_MAX
}

/// The nonzero columns of a [`listable`] `x`, in `list`.
fn nonzeros<'l>(x: &[i16], list: &'l mut [NonZero; SPARSE_MAX]) -> &'l [NonZero] {
    let cols = x.iter().enumerate().filter(|&(_, &v)| v != 0);
    let mut n = 0;
    for (e, (c, &v)) in list.iter_mut().zip(cols) {
        *e = NonZero { c: c as u16, v };
        n += 1;
    }
    &list[..n]
}

/// [`i8_tile`] of a listed input (one partial sum).
///
/// # Safety
/// The CPU supports `K`'s tier; each row holds a weight at every listed column.
#[inline(always)]
unsafe fn sparse_tile<K: IntKernel, const R: usize>(
    rows: [((i32, i32), &[i8]); R],
    nz: &[NonZero],
    s: i32,
) -> [i32; R] {
    // SAFETY: forwarded.
    let sums = unsafe { K::sparse_sums::<R>(rows.map(|(_, q)| q), nz) };
    core::array::from_fn(|r| crate::fixed::requant32(sums[r], rows[r].0, s))
}

/// The outputs of `R` rows (each its scale and weights) against `x` ([`matvec_i8`]).
///
/// # Safety
/// The CPU supports `K`'s tier.
#[inline(always)]
unsafe fn i8_tile<K: IntKernel, const R: usize>(rows: [((i32, i32), &[i8]); R], x: &[i16], s: i32) -> [i32; R] {
    // Part `c`'s sums: the tile over whole steps, the oracle's dot over the rest.
    let part = |c: usize, xs: &[i16]| {
        let qs: [&[i8]; R] = core::array::from_fn(|r| &rows[r].1[c * I8_PART..][..xs.len()]);
        let body = xs.len() - xs.len() % K::LANES;
        // SAFETY: the caller guarantees the tier; each row holds `xs.len()` weights from
        // here and `body` is whole steps.
        let mut sums = unsafe { K::sums::<R>(qs, &xs[..body]) };
        if body < xs.len() {
            for (p, q) in sums.iter_mut().zip(qs) {
                *p = p.wrapping_add(super::scalar::dot_i8(&q[body..], &xs[body..]));
            }
        }
        sums
    };
    if x.len() <= I8_PART {
        // One partial sum a row: the oracle's product of two i32s.
        let sums = part(0, x);
        return core::array::from_fn(|r| crate::fixed::requant32(sums[r], rows[r].0, s));
    }
    let mut acc = [0i64; R];
    for (c, xs) in x.chunks(I8_PART).enumerate() {
        for (a, p) in acc.iter_mut().zip(part(c, xs)) {
            *a += i64::from(p);
        }
    }
    core::array::from_fn(|r| crate::fixed::requant(acc[r], rows[r].0, s))
}

//! The attention drivers: the row, query and column loops of [`super::dots`],
//! [`super::dots_many`], [`super::weighted_sum`], [`super::weighted_sum_many`] and
//! [`super::exp_sub`], shared by every SIMD tier (as [`super::walk`] is for the matrix
//! products), so a tier supplies only its inner tiles.
//!
//! Each entry point enters the tier's target features once ([`Isa::enable`]) and runs the
//! driver inside them: the drivers and the closures around them are `#[inline(always)]`,
//! so the tier's tiles (`#[inline]` under the same features) inline into one loop as if
//! the tier had written it out.
//!
//! The loops take rows, queries and columns in a fixed order and every tile sums in
//! [`scalar::dots`]' or [`scalar::weighted_sum`]'s canonical order, so the bits are the
//! scalar tier's whatever the tile shapes.

use super::scalar;
use super::traits::Stored;

/// A SIMD tier's target features, entered once per kernel call.
pub(crate) trait Isa {
    /// Runs `f` with the tier's target features enabled, so that what `f` inlines can use
    /// them.
    ///
    /// # Safety
    /// The CPU supports the tier.
    unsafe fn enable<R>(f: impl FnOnce() -> R) -> R;
}

/// The inner tiles of a tier's one-query attention over rows stored as `T`.
pub(crate) trait Attend<T: Stored>: Isa {
    /// Columns each `V` of [`Attend::sum_columns`] adds (a vector's lanes, or NEON's pair).
    const SUM_COLUMNS: usize;

    /// Prefetches a block of [`dots`]' rows before their products, where the tier does it in
    /// software (x86_64: the hardware follows too few streams); by default nothing.
    #[inline(always)]
    fn prefetch_rows(_rows: &[T]) {}

    /// `R` rows of [`dots`] (`rows`: `[R, x.len()]`), each in [`scalar::dots`]' canonical
    /// order.
    ///
    /// # Safety
    /// The tier's features are enabled.
    unsafe fn dot_rows<const R: usize>(rows: &[T], x: &[f32]) -> [f32; R];

    /// Columns `[c, c + V SUM_COLUMNS)` of [`weighted_sum`] (`rows`: `[p.len(), d]`), held
    /// in registers across all the rows.
    ///
    /// # Safety
    /// The tier's features are enabled; `c + V SUM_COLUMNS <= d == out.len()` and
    /// `rows.len() >= p.len() * d`.
    unsafe fn sum_columns<const V: usize>(p: &[f32], rows: &[T], d: usize, c: usize, out: &mut [f32]);
}

/// The inner tiles of a tier's multi-query attention over rows stored as `T` (the x86_64
/// tiers'; the NEON ones take one query at a time).
#[cfg(target_arch = "x86_64")]
pub(crate) trait AttendMany<T: Stored>: Attend<T> {
    /// Rows `j0..j0 + R` against queries `i0..i0 + Q` of [`dots_many`] (`rows`: `[n, d]`,
    /// `xs`: `[m, d]`, `out`: `[m, n]`), each dot as [`Attend::dot_rows`] computes it.
    ///
    /// # Safety
    /// The tier's features are enabled; the rows and queries exist.
    unsafe fn dots_tile<const R: usize, const Q: usize>(
        rows: &[T],
        xs: &[f32],
        d: usize,
        n: usize,
        at: (usize, usize),
        out: &mut [f32],
    );

    /// Columns `[c, c + V SUM_COLUMNS)` of [`weighted_sum_many`] for `Q` queries (`p[q]`:
    /// `[n]`, `rows`: `[n, d]`, `outs`: `[Q, d]`), each as [`Attend::sum_columns`] adds.
    ///
    /// # Safety
    /// The tier's features are enabled.
    unsafe fn sum_many<const Q: usize, const V: usize>(
        p: [&[f32]; Q],
        rows: &[T],
        d: usize,
        c: usize,
        outs: &mut [f32],
    );
}

/// A tier's softmax exponentials, [`exp_sub`]'s inner step.
pub(crate) trait Exp: Isa {
    /// Values one [`Exp::exp_sub_lanes`] takes.
    const LANES: usize;

    /// [`scalar::exp_sub`] of one vector's `LANES` values.
    ///
    /// # Safety
    /// The tier's features are enabled; `x.len() == LANES`.
    unsafe fn exp_sub_lanes(x: &mut [f32], max: f32);

    /// [`scalar::exp_sub`] of the fewer than `LANES` values left over.
    ///
    /// # Safety
    /// The tier's features are enabled.
    unsafe fn exp_sub_tail(x: &mut [f32], max: f32) {
        scalar::exp_sub(x, max)
    }
}

/// [`super::dots`] with tier `A`'s tiles: four rows at a time (independent chains to hide
/// the adds' latency), then one by one.
///
/// # Safety
/// The CPU supports `A`'s tier.
pub(super) unsafe fn dots<A: Attend<T>, T: Stored>(rows: &[T], x: &[f32], out: &mut [f32]) {
    // SAFETY: the caller's promise; the features are enabled inside.
    unsafe {
        A::enable(
            #[inline(always)]
            || dots_in::<A, T>(rows, x, out),
        )
    }
}

/// [`dots`] inside `A`'s features.
///
/// # Safety
/// `A`'s features are enabled.
#[inline(always)]
unsafe fn dots_in<A: Attend<T>, T: Stored>(rows: &[T], x: &[f32], out: &mut [f32]) {
    let d = x.len();
    if d == 0 {
        out.fill(0.0);
        return;
    }
    let n = (rows.len() / d).min(out.len());
    let mut i = 0;
    while i + 4 <= n {
        let block = &rows[i * d..(i + 4) * d];
        A::prefetch_rows(block);
        // SAFETY: (both loops) the features are enabled; whole rows.
        out[i..i + 4].copy_from_slice(&unsafe { A::dot_rows::<4>(block, x) });
        i += 4;
    }
    while i < n {
        // SAFETY: see above.
        out[i] = unsafe { A::dot_rows::<1>(&rows[i * d..(i + 1) * d], x) }[0];
        i += 1;
    }
}

/// [`super::dots_many`] with tier `A`'s tiles: `R x Q` tiles (each row read once per `Q`
/// queries), the rows left over one at a time against the same queries, and the queries
/// left over through [`dots`].
///
/// # Safety
/// The CPU supports `A`'s tier; `d > 0`.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn dots_many<A: AttendMany<T>, T: Stored, const R: usize, const Q: usize>(
    rows: &[T],
    xs: &[f32],
    d: usize,
    out: &mut [f32],
) {
    // SAFETY: as in `dots`.
    unsafe {
        A::enable(
            #[inline(always)]
            || dots_many_in::<A, T, R, Q>(rows, xs, d, out),
        )
    }
}

/// [`dots_many`] inside `A`'s features.
///
/// # Safety
/// `A`'s features are enabled; `d > 0`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dots_many_in<A: AttendMany<T>, T: Stored, const R: usize, const Q: usize>(
    rows: &[T],
    xs: &[f32],
    d: usize,
    out: &mut [f32],
) {
    let n = rows.len() / d;
    if n == 0 {
        return;
    }
    let m = (xs.len() / d).min(out.len() / n);
    let mut i = 0;
    while i + Q <= m {
        let mut j = 0;
        while j + R <= n {
            // SAFETY: (all calls) the features are enabled; the rows and queries exist.
            unsafe { A::dots_tile::<R, Q>(rows, xs, d, n, (i, j), out) };
            j += R;
        }
        while j < n {
            // SAFETY: see above.
            unsafe { A::dots_tile::<1, Q>(rows, xs, d, n, (i, j), out) };
            j += 1;
        }
        i += Q;
    }
    for i in i..m {
        // Through the entry point, not `dots_in`: `dots` keeps the one copy of its loop, so
        // its four-row tile stays inlined there (a second copy left it out of line).
        // SAFETY: see above.
        unsafe { dots::<A, T>(rows, &xs[i * d..(i + 1) * d], &mut out[i * n..(i + 1) * n]) };
    }
}

/// [`super::weighted_sum`] with tier `A`'s tiles: `V` vectors of columns at a time held in
/// registers across all the rows, then one, then the scalar columns.
///
/// # Safety
/// The CPU supports `A`'s tier.
pub(super) unsafe fn weighted_sum<A: Attend<T>, T: Stored, const V: usize>(p: &[f32], rows: &[T], out: &mut [f32]) {
    // SAFETY: as in `dots`.
    unsafe {
        A::enable(
            #[inline(always)]
            || weighted_sum_from::<A, T, V>(p, rows, 0, out),
        )
    }
}

/// Columns `[c, out.len())` of [`weighted_sum`] inside `A`'s features.
///
/// # Safety
/// `A`'s features are enabled.
#[inline(always)]
unsafe fn weighted_sum_from<A: Attend<T>, T: Stored, const V: usize>(
    p: &[f32],
    rows: &[T],
    mut c: usize,
    out: &mut [f32],
) {
    let d = out.len();
    if d == 0 {
        return;
    }
    let n = p.len().min(rows.len() / d);
    let w = A::SUM_COLUMNS;
    while c + V * w <= d {
        // SAFETY: the features are enabled; columns [c, c + V w) exist in `out` and every
        // row.
        unsafe { A::sum_columns::<V>(&p[..n], rows, d, c, out) };
        c += V * w;
    }
    while c + w <= d {
        // SAFETY: as above, for w columns.
        unsafe { A::sum_columns::<1>(&p[..n], rows, d, c, out) };
        c += w;
    }
    scalar::weighted_sum_columns(&p[..n], rows, c, out);
}

/// [`super::weighted_sum_many`] with tier `A`'s tiles: four queries at a time over `MV`
/// vectors of columns, so each row is loaded and widened once per four queries, their
/// columns left over and the queries left over through [`weighted_sum`]'s loop (`V`
/// vectors wide).
///
/// # Safety
/// The CPU supports `A`'s tier; `d > 0`; `ps` holds `(m - 1) * stride + n` scores.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn weighted_sum_many<A: AttendMany<T>, T: Stored, const V: usize, const MV: usize>(
    ps: &[f32],
    stride: usize,
    rows: &[T],
    d: usize,
    outs: &mut [f32],
) {
    // SAFETY: as in `dots`.
    unsafe {
        A::enable(
            #[inline(always)]
            || weighted_sum_many_in::<A, T, V, MV>(ps, stride, rows, d, outs),
        )
    }
}

/// [`weighted_sum_many`] inside `A`'s features.
///
/// # Safety
/// As [`weighted_sum_many`], with `A`'s features enabled.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn weighted_sum_many_in<A: AttendMany<T>, T: Stored, const V: usize, const MV: usize>(
    ps: &[f32],
    stride: usize,
    rows: &[T],
    d: usize,
    outs: &mut [f32],
) {
    let (m, n) = (outs.len() / d, rows.len() / d);
    let mut i = 0;
    while i + 4 <= m {
        let p: [&[f32]; 4] = core::array::from_fn(|q| &ps[(i + q) * stride..(i + q) * stride + n]);
        let mut c = 0;
        while c + MV * A::SUM_COLUMNS <= d {
            // SAFETY: (all calls) the features are enabled; the columns exist.
            unsafe { A::sum_many::<4, MV>(p, rows, d, c, &mut outs[i * d..(i + 4) * d]) };
            c += MV * A::SUM_COLUMNS;
        }
        for q in 0..4 {
            // SAFETY: see above.
            unsafe { weighted_sum_from::<A, T, V>(p[q], rows, c, &mut outs[(i + q) * d..(i + q + 1) * d]) };
        }
        i += 4;
    }
    for i in i..m {
        // SAFETY: see above.
        unsafe {
            weighted_sum_from::<A, T, V>(&ps[i * stride..i * stride + n], rows, 0, &mut outs[i * d..(i + 1) * d])
        };
    }
}

/// [`super::exp_sub`] with tier `A`'s vectors, then its tail.
///
/// # Safety
/// The CPU supports `A`'s tier.
pub(super) unsafe fn exp_sub<A: Exp>(x: &mut [f32], max: f32) {
    // SAFETY: as in `dots`.
    unsafe {
        A::enable(
            #[inline(always)]
            || exp_sub_in::<A>(x, max),
        )
    }
}

/// [`exp_sub`] inside `A`'s features (or a tier's that includes them).
///
/// # Safety
/// `A`'s features are enabled.
#[inline(always)]
pub(super) unsafe fn exp_sub_in<A: Exp>(x: &mut [f32], max: f32) {
    let mut chunks = x.chunks_exact_mut(A::LANES);
    for c in &mut chunks {
        // SAFETY: (both calls) the features are enabled; `c` holds `LANES` values.
        unsafe { A::exp_sub_lanes(c, max) };
    }
    // SAFETY: see above.
    unsafe { A::exp_sub_tail(chunks.into_remainder(), max) };
}

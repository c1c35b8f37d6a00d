//! How the rows attention reads are stored: the state's normalised keys and values and the
//! window's keys and values. [`CacheDtype::F32`] keeps the reference's numerics exactly;
//! [`CacheDtype::F16`] halves what every decode step reads from them (and their share of
//! the arena), as llama.cpp's f16 KV cache does; [`CacheDtype::Q8`] quarters it (one i8 per
//! value and one f32 scale per row, as llama.cpp's q8_0 KV cache). The state's sums, radii
//! and gates stay f32 either way, so merges keep accumulating at full precision. The
//! integer numerics' rows are `int`'s.

use core::marker::PhantomData;

use half::f16;

use crate::kernels::{self, Stored};

pub(crate) mod int;

/// Element type of the stored attention rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u32)]
pub enum CacheDtype {
    /// Exact: the reference's numerics.
    #[default]
    F32 = 0,
    /// Half the bytes; values round to nearest f16 (saturating at +-65504).
    F16 = 1,
    /// A quarter of the bytes (plus 4 per row): each row as i8 times one f32 scale, its
    /// largest magnitude at +-127.
    Q8 = 2,
}

impl CacheDtype {
    /// Every cache dtype.
    pub const ALL: [CacheDtype; 3] = [CacheDtype::F32, CacheDtype::F16, CacheDtype::Q8];

    /// Parses the on-disk tag.
    pub const fn from_u32(v: u32) -> Option<CacheDtype> {
        match v {
            0 => Some(CacheDtype::F32),
            1 => Some(CacheDtype::F16),
            2 => Some(CacheDtype::Q8),
            _ => None,
        }
    }

    /// `"f32"`, `"f16"` or `"q8"`.
    pub const fn name(self) -> &'static str {
        match self {
            CacheDtype::F32 => "f32",
            CacheDtype::F16 => "f16",
            CacheDtype::Q8 => "q8",
        }
    }

    /// Parses [`CacheDtype::name`].
    pub fn from_name(s: &str) -> Option<CacheDtype> {
        CacheDtype::ALL.into_iter().find(|c| c.name() == s)
    }

    /// Bytes of a row of `d` elements.
    pub const fn row_bytes(self, d: usize) -> usize {
        match self {
            CacheDtype::F32 => 4 * d,
            CacheDtype::F16 => 2 * d,
            CacheDtype::Q8 => d + 4,
        }
    }

    /// f32 words of the arena holding `n` elements in rows of `d` (`d` divides `n`): the
    /// elements, then for q8 the rows' scales.
    pub(crate) const fn words(self, n: usize, d: usize) -> usize {
        match self {
            CacheDtype::F32 => n,
            CacheDtype::F16 => n.div_ceil(2),
            CacheDtype::Q8 => n.div_ceil(4) + rows_of(n, d),
        }
    }
}

/// Where the rows a read of a state slot sees live: its normalised key `LN_s_k(sk)` and
/// the value a read sees, `[n_heads, state_len, d]` each per layer, stored as the cache
/// dtype. Both choices give the same bits; they trade arena for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u32)]
pub enum SlotReads {
    /// In every layer's state, refreshed when a slot's sums change.
    #[default]
    Stored = 0,
    /// Not in the state: recomputed from the sums when a layer's attention begins, into
    /// one layer's worth of scratch, so the arena holds one layer's rows instead of
    /// `n_layers`. Costs `n_heads * slots * (d_qk + d_v)` normalisations per layer and
    /// token.
    Recomputed = 1,
}

impl SlotReads {
    /// Both choices.
    pub const ALL: [SlotReads; 2] = [SlotReads::Stored, SlotReads::Recomputed];

    /// Parses the on-disk tag.
    pub const fn from_u32(v: u32) -> Option<SlotReads> {
        match v {
            0 => Some(SlotReads::Stored),
            1 => Some(SlotReads::Recomputed),
            _ => None,
        }
    }

    /// `"stored"` or `"recomputed"`.
    pub const fn name(self) -> &'static str {
        match self {
            SlotReads::Stored => "stored",
            SlotReads::Recomputed => "recomputed",
        }
    }

    /// Parses [`SlotReads::name`].
    pub fn from_name(s: &str) -> Option<SlotReads> {
        SlotReads::ALL.into_iter().find(|r| r.name() == s)
    }
}

/// Rows of `n` elements in rows of `d` (0 when `d` is 0): the q8 cache's scale count.
const fn rows_of(n: usize, d: usize) -> usize {
    match n.checked_div(d) {
        Some(rows) => rows,
        None => 0,
    }
}

/// Stored rows, read-only: shareable across threads (heads attend in parallel).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    /// Values, and one scale per row.
    Q8(&'a [i8], &'a [f32]),
}

/// Stored rows, writable.
pub(crate) enum RowsMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    Q8(&'a mut [i8], &'a mut [f32]),
}

/// Rows of q8 whose scaled coefficients [`Rows::weighted_sum`] prepares at a time.
const Q8_ROWS: usize = 64;

/// Queries whose q8 weights [`Rows::weighted_sum_many`] scales at once (a prefill
/// segment's; 2 KiB of stack with [`Q8_ROWS`]).
const Q8_QUERIES: usize = 8;

impl<'a> Rows<'a> {
    /// The first `n` elements of `dtype`, in rows of `d`, stored in `words` (at least
    /// [`CacheDtype::words`]`(n, d)` of them).
    pub fn from_words(words: &'a [f32], n: usize, d: usize, dtype: CacheDtype) -> Rows<'a> {
        match dtype {
            CacheDtype::F32 => Rows::F32(&words[..n]),
            CacheDtype::F16 => Rows::F16(&bytemuck::cast_slice(words)[..n]),
            CacheDtype::Q8 => {
                let (q, s) = words.split_at(n.div_ceil(4));
                Rows::Q8(&bytemuck::cast_slice(q)[..n], &s[..rows_of(n, d)])
            }
        }
    }

    /// Elements held.
    #[inline]
    pub fn len(self) -> usize {
        match self {
            Rows::F32(r) => r.len(),
            Rows::F16(r) => r.len(),
            Rows::Q8(r, _) => r.len(),
        }
    }

    /// Rows `[r0, r1)` of width `d`.
    #[inline]
    pub fn rows(self, r0: usize, r1: usize, d: usize) -> Rows<'a> {
        match self {
            Rows::F32(r) => Rows::F32(&r[r0 * d..r1 * d]),
            Rows::F16(r) => Rows::F16(&r[r0 * d..r1 * d]),
            Rows::Q8(r, s) => Rows::Q8(&r[r0 * d..r1 * d], &s[r0..r1]),
        }
    }

    /// `out[i] = row[i] . x` for every row ([`kernels::dots`]; a q8 row's sum is scaled
    /// after, so every tier still gives the same bits).
    #[inline]
    pub fn dots(self, x: &[f32], out: &mut [f32]) {
        match self {
            Rows::F32(r) => kernels::dots(r, x, out),
            Rows::F16(r) => kernels::dots(r, x, out),
            Rows::Q8(r, s) => {
                kernels::dots(r, x, out);
                out.iter_mut().zip(s).for_each(|(o, &s)| *o *= s);
            }
        }
    }

    /// `out[i * n + j] = row[j] . xs[i]` for every query of `xs` (`[m, d]`) against these
    /// `n` rows of width `d` ([`kernels::dots_many`]).
    #[inline]
    pub fn dots_many(self, xs: &[f32], d: usize, out: &mut [f32]) {
        match self {
            Rows::F32(r) => kernels::dots_many(r, xs, d, out),
            Rows::F16(r) => kernels::dots_many(r, xs, d, out),
            Rows::Q8(r, s) => {
                kernels::dots_many(r, xs, d, out);
                for query in out[..xs.len() / d.max(1) * s.len()].chunks_exact_mut(s.len().max(1)) {
                    query.iter_mut().zip(s).for_each(|(o, &s)| *o *= s);
                }
            }
        }
    }

    /// `out += sum_j p[j] * row[j]` ([`kernels::weighted_sum`]; q8 rows as
    /// `(p[j] * s[j]) * q[j]`, a few dozen rows a call, which adds in the same order).
    #[inline]
    pub fn weighted_sum(self, p: &[f32], out: &mut [f32]) {
        match self {
            Rows::F32(r) => kernels::weighted_sum(p, r, out),
            Rows::F16(r) => kernels::weighted_sum(p, r, out),
            Rows::Q8(r, s) => {
                let d = out.len();
                let mut c = [0f32; Q8_ROWS];
                for ((p, s), r) in p.chunks(Q8_ROWS).zip(s.chunks(Q8_ROWS)).zip(r.chunks(Q8_ROWS * d.max(1))) {
                    c.iter_mut().zip(p.iter().zip(s)).for_each(|(c, (&p, &s))| *c = p * s);
                    kernels::weighted_sum(&c[..p.len()], r, out);
                }
            }
        }
    }

    /// [`Rows::weighted_sum`] of several queries (`outs`: `[m, d]`), query `i`'s weights at
    /// `ps[i * stride..]` ([`kernels::weighted_sum_many`]; q8 rows' weights scaled as
    /// `weighted_sum` scales them, for up to [`Q8_QUERIES`] queries at once).
    pub fn weighted_sum_many(self, ps: &[f32], stride: usize, d: usize, outs: &mut [f32]) {
        match self {
            Rows::F32(r) => kernels::weighted_sum_many(ps, stride, r, d, outs),
            Rows::F16(r) => kernels::weighted_sum_many(ps, stride, r, d, outs),
            Rows::Q8(r, s) if d > 0 => {
                // c: [queries, Q8_ROWS], each query's weights of a run of rows times their scales
                let mut c = [0f32; Q8_QUERIES * Q8_ROWS];
                for (g, outs) in outs.chunks_mut(Q8_QUERIES * d).enumerate() {
                    let (m, ps) = (outs.len() / d, &ps[g * Q8_QUERIES * stride..]);
                    for (j0, (s, r)) in s.chunks(Q8_ROWS).zip(r.chunks(Q8_ROWS * d)).enumerate() {
                        let j0 = j0 * Q8_ROWS;
                        for (i, c) in c.chunks_exact_mut(Q8_ROWS).take(m).enumerate() {
                            let p = &ps[i * stride + j0..i * stride + j0 + s.len()];
                            c.iter_mut().zip(p.iter().zip(s)).for_each(|(c, (&p, &s))| *c = p * s);
                        }
                        kernels::weighted_sum_many(&c[..(m - 1) * Q8_ROWS + s.len()], Q8_ROWS, r, d, outs);
                    }
                }
            }
            Rows::Q8(..) => {}
        }
    }

    /// Row `r` (of width `out.len()`), widened into `out`.
    pub fn get(self, r: usize, out: &mut [f32]) {
        let d = out.len();
        match self {
            Rows::F32(x) => out.copy_from_slice(&x[r * d..(r + 1) * d]),
            Rows::F16(x) => out.iter_mut().zip(&x[r * d..(r + 1) * d]).for_each(|(o, h)| *o = h.widen()),
            Rows::Q8(x, s) => out.iter_mut().zip(&x[r * d..(r + 1) * d]).for_each(|(o, &q)| *o = q as f32 * s[r]),
        }
    }

    /// `out[c] += row_r[c] * s` (width `out.len()`).
    pub fn add_scaled(self, r: usize, s: f32, out: &mut [f32]) {
        let d = out.len();
        match self {
            Rows::F32(x) => out.iter_mut().zip(&x[r * d..(r + 1) * d]).for_each(|(o, &v)| *o += v * s),
            Rows::F16(x) => out.iter_mut().zip(&x[r * d..(r + 1) * d]).for_each(|(o, h)| *o += h.widen() * s),
            Rows::Q8(x, sc) => {
                out.iter_mut().zip(&x[r * d..(r + 1) * d]).for_each(|(o, &q)| *o += q as f32 * sc[r] * s)
            }
        }
    }
}

impl<'a> RowsMut<'a> {
    /// As [`Rows::from_words`], writable.
    pub fn from_words(words: &'a mut [f32], n: usize, d: usize, dtype: CacheDtype) -> RowsMut<'a> {
        match dtype {
            CacheDtype::F32 => RowsMut::F32(&mut words[..n]),
            CacheDtype::F16 => RowsMut::F16(&mut bytemuck::cast_slice_mut(words)[..n]),
            CacheDtype::Q8 => {
                let (q, s) = words.split_at_mut(n.div_ceil(4));
                RowsMut::Q8(&mut bytemuck::cast_slice_mut(q)[..n], &mut s[..rows_of(n, d)])
            }
        }
    }

    /// [`kernels::prefetch_lines`] of row `r` of width `d` (and its q8 scale), for writing.
    #[inline]
    pub(crate) fn prefetch_row(&self, r: usize, d: usize) {
        use kernels::{prefetch_lines, Access::Write};
        match self {
            RowsMut::F32(x) => prefetch_lines(&x[r * d..(r + 1) * d], Write),
            RowsMut::F16(x) => prefetch_lines(&x[r * d..(r + 1) * d], Write),
            RowsMut::Q8(x, s) => {
                prefetch_lines(&x[r * d..(r + 1) * d], Write);
                prefetch_lines(&s[r..r + 1], Write);
            }
        }
    }

    /// A read-only view.
    #[inline]
    pub fn as_rows(&self) -> Rows<'_> {
        match self {
            RowsMut::F32(r) => Rows::F32(r),
            RowsMut::F16(r) => Rows::F16(r),
            RowsMut::Q8(r, s) => Rows::Q8(r, s),
        }
    }

    /// Row `r` of width `d` becomes what `fill(c0, out)` writes: columns `[c0, c0 +
    /// out.len())` into `out`, a chunk of the row at a time (each column once, or twice for
    /// a q8 row wider than [`Q8_ROW_BUF`]: once for the scale, once for the values; `fill`
    /// is a pure function of the columns). Slices in and out, so a filler's loop vectorises,
    /// where a call per column did not.
    #[inline]
    pub fn set(&mut self, r: usize, d: usize, mut fill: impl FnMut(usize, &mut [f32])) {
        match self {
            RowsMut::F32(x) => fill(0, &mut x[r * d..(r + 1) * d]),
            RowsMut::F16(x) => {
                // A chunk of columns at a time through the tier's conversion (`vcvtps2ph`
                // where the CPU has it; the same round-to-nearest-even bits either way),
                // half a 128-wide head row per call: at 16 columns the calls' dispatch
                // was most of the conversion's 1% of a step.
                const CHUNK: usize = 64;
                let mut buf = [0f32; CHUNK];
                for (k, out) in x[r * d..(r + 1) * d].chunks_mut(CHUNK).enumerate() {
                    let vals = &mut buf[..out.len()];
                    fill(k * CHUNK, vals);
                    vals.iter_mut().for_each(|v| *v = v.clamp(-F16_MAX, F16_MAX));
                    kernels::narrow_f16(vals, out);
                }
            }
            RowsMut::Q8(x, s) => {
                // The row is read twice (its largest magnitude, then the quantization):
                // computed once into `buf` when it fits, since `fill` may be a whole
                // normalisation (the slots' read rows), else a column at a time each time.
                let mut buf = [0f32; Q8_ROW_BUF];
                if d <= Q8_ROW_BUF {
                    fill(0, &mut buf[..d]);
                    set_q8(&mut x[r * d..(r + 1) * d], &mut s[r], |c| buf[c]);
                } else {
                    set_q8(&mut x[r * d..(r + 1) * d], &mut s[r], |c| {
                        fill(c, &mut buf[..1]);
                        buf[0]
                    });
                }
            }
        }
    }
}

/// The [`RowsMut::set`] filler that copies the row `src`.
#[inline]
pub(crate) fn copied(src: &[f32]) -> impl FnMut(usize, &mut [f32]) + '_ {
    move |c0, out| out.copy_from_slice(&src[c0..c0 + out.len()])
}

impl RowsMut<'_> {
    /// These rows cut into `count` equal parts of whole rows (`count` dividing the rows).
    pub(crate) fn parts(&mut self, count: usize) -> RowsParts<'_> {
        match self {
            RowsMut::F32(x) => RowsParts::F32(Parts::new(x, count)),
            RowsMut::F16(x) => RowsParts::F16(Parts::new(x, count)),
            RowsMut::Q8(x, s) => RowsParts::Q8(Parts::new(x, count), Parts::new(s, count)),
        }
    }
}

/// A slice cut into `count` equal parts that jobs running in parallel take by index, each
/// its own (a layer state's heads, `LayerState::heads`).
pub(crate) struct Parts<'a, T> {
    ptr: *mut T,
    /// Elements of a part.
    len: usize,
    count: usize,
    slice: PhantomData<&'a mut [T]>,
}

// SAFETY: a `Parts` only hands out its parts, through `part`, whose contract keeps each
// one's references unique; handing them to other threads is sending `&mut [T]`.
unsafe impl<T: Send> Sync for Parts<'_, T> {}

impl<'a, T> Parts<'a, T> {
    /// `s` cut into `count` parts of `s.len() / count` elements (a remainder in none).
    pub(crate) fn new(s: &'a mut [T], count: usize) -> Self {
        let count = count.max(1);
        Parts { ptr: s.as_mut_ptr(), len: s.len() / count, count, slice: PhantomData }
    }

    /// Part `i`.
    ///
    /// # Safety
    /// `i < count`, and no other reference to part `i` taken from `self` is alive while
    /// the returned one is.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn part(&self, i: usize) -> &mut [T] {
        debug_assert!(i < self.count);
        // SAFETY: part `i < count` lies within the slice `new` borrowed for `'a`, which
        // outlives `self`; the caller guarantees both.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.add(i * self.len), self.len) }
    }
}

/// [`RowsMut`] cut into [`Parts`] of whole rows.
pub(crate) enum RowsParts<'a> {
    F32(Parts<'a, f32>),
    F16(Parts<'a, f16>),
    /// Values and scales.
    Q8(Parts<'a, i8>, Parts<'a, f32>),
}

impl RowsParts<'_> {
    /// Part `i`'s rows.
    ///
    /// # Safety
    /// As [`Parts::part`].
    #[inline]
    pub(crate) unsafe fn part(&self, i: usize) -> RowsMut<'_> {
        // SAFETY: the caller's promise, for each of the slices a part of rows spans.
        unsafe {
            match self {
                RowsParts::F32(x) => RowsMut::F32(x.part(i)),
                RowsParts::F16(x) => RowsMut::F16(x.part(i)),
                RowsParts::Q8(x, s) => RowsMut::Q8(x.part(i), s.part(i)),
            }
        }
    }
}

/// Widest q8 row [`RowsMut::set`] computes once (512 bytes of stack).
const Q8_ROW_BUF: usize = 128;

/// One q8 row `out` (`[d]`) and its scale from `f(c)`, `c < d`, each read twice.
fn set_q8(out: &mut [i8], scale: &mut f32, mut f: impl FnMut(usize) -> f32) {
    // Largest magnitude at +-127; an infinity saturates at 1e38 (127 steps of f32::MAX /
    // 127 could round past f32::MAX).
    // A compare, not `f32::max` (a libm call on Armv7E-M); the same result, a NaN
    // included (never larger).
    let amax = (0..out.len()).fold(0.0f32, |m, c| {
        let a = f(c).abs();
        if a > m {
            a
        } else {
            m
        }
    });
    let amax = if amax > 1e38 { 1e38 } else { amax };
    *scale = amax / 127.0;
    let inv = if *scale > 0.0 { 127.0 / amax } else { 0.0 };
    out.iter_mut().enumerate().for_each(|(c, o)| *o = round_i8(f(c) * inv));
}

/// The largest finite f16: rows saturate there (an overflow would turn scores into NaN).
const F16_MAX: f32 = 65504.0;

/// `libm::roundf(y) as i8` (ties away from zero, saturating, NaN to 0) without the
/// software rounding: truncating a value of at most 128 is exact, and so is the remainder.
#[inline]
fn round_i8(y: f32) -> i8 {
    let y = y.clamp(-128.0, 127.0);
    let t = y as i32;
    let frac = y - t as f32;
    (t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)) as i8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The [`RowsMut::set`] filler of column values `f(c)`.
    fn by_column(f: impl Fn(usize) -> f32) -> impl FnMut(usize, &mut [f32]) {
        move |c0, out| out.iter_mut().enumerate().for_each(|(j, o)| *o = f(c0 + j))
    }

    #[test]
    fn rows_round_trip_and_saturate() {
        for dtype in [CacheDtype::F32, CacheDtype::F16] {
            let mut words = [0f32; 8];
            let mut rows = RowsMut::from_words(&mut words, 6, 3, dtype);
            let src = [1.5f32, -2.25, 1e6, -1e6, 0.1, f32::NAN];
            rows.set(1, 3, copied(&src[3..]));
            rows.set(0, 3, copied(&src));
            let mut out = [0f32; 3];
            rows.as_rows().get(0, &mut out);
            let big = if dtype == CacheDtype::F16 { 65504.0 } else { 1e6 };
            assert_eq!(out, [1.5, -2.25, big]);
            rows.as_rows().get(1, &mut out);
            assert_eq!(out[0], -big);
            assert!((out[1] - 0.1).abs() < 1e-4 && out[2].is_nan());
            assert_eq!(Rows::from_words(&words, 6, 3, dtype).len(), 6);
            assert_eq!(dtype.words(6, 3) * 4, 2 * dtype.row_bytes(3));
        }
        for dtype in CacheDtype::ALL {
            assert_eq!(CacheDtype::from_name(dtype.name()), Some(dtype));
            assert_eq!(CacheDtype::from_u32(dtype as u32), Some(dtype));
        }
    }

    #[test]
    fn f16_rows_wider_than_a_chunk_narrow_every_column() {
        // 2 rows of 130: two whole chunks of columns and a short one.
        const D: usize = 130;
        let d = D;
        let mut words = [0f32; D];
        assert_eq!(CacheDtype::F16.words(2 * d, d), words.len());
        let mut rows = RowsMut::from_words(&mut words, 2 * d, d, CacheDtype::F16);
        let value = |c: usize| (c as f32 - 60.0) * 0.37;
        rows.set(1, d, by_column(value));
        let mut out = [0f32; D];
        rows.as_rows().get(1, &mut out);
        for (c, &got) in out.iter().enumerate() {
            assert_eq!(got, f16::from_f32(value(c)).to_f32(), "column {c}");
        }
    }

    #[test]
    fn round_i8_is_roundf_then_a_saturating_cast() {
        let below_half = 0.5f32.next_down();
        let special =
            [0.5, -0.5, 1.5, -1.5, 126.5, -127.5, below_half, -below_half, 127.49, 127.5, 128.0, -128.5, 1e30, -1e30];
        let special = special.into_iter().chain([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0, -0.0]);
        // Every 1/64 step over the range and a little beyond, then the special values.
        let sweep = (-8400..=8400).map(|i| i as f32 / 64.0);
        for y in sweep.chain(special) {
            assert_eq!(round_i8(y), libm::roundf(y) as i8, "{y}");
        }
    }

    #[test]
    fn f16_rows_wider_than_a_conversion_chunk_round_every_column() {
        // 75 columns: four whole chunks of 16 and a short one.
        let d = 75;
        let mut words = [0f32; 75];
        let mut rows = RowsMut::from_words(&mut words, 2 * d, d, CacheDtype::F16);
        // Columns 20 and 70 overflow f16, one each way, and saturate.
        let spike = |c: usize| match c {
            20 => 1e6,
            70 => -1e6,
            _ => 0.0,
        };
        let v = |r: usize, c: usize| (r * d + c) as f32 * 0.37 - 9.0 + spike(c);
        rows.set(1, d, by_column(|c| v(1, c)));
        rows.set(0, d, by_column(|c| v(0, c)));
        let mut out = [0f32; 75];
        for r in 0..2 {
            rows.as_rows().get(r, &mut out);
            for (c, &o) in out.iter().enumerate() {
                assert_eq!(o, f16::from_f32(v(r, c).clamp(-F16_MAX, F16_MAX)).to_f32(), "row {r} column {c}");
            }
        }
    }

    /// A q8 row wider than the row buffer (its columns filled one at a time, twice) holds
    /// what a narrow one would: the scale of the whole row's largest magnitude and each
    /// value rounded to it.
    #[test]
    fn q8_rows_wider_than_the_row_buffer_quantize_every_column() {
        const D: usize = Q8_ROW_BUF + 72;
        let mut words = [0f32; D];
        assert!(CacheDtype::Q8.words(2 * D, D) <= words.len());
        let mut rows = RowsMut::from_words(&mut words, 2 * D, D, CacheDtype::Q8);
        // The largest magnitude last, past the buffer.
        let v = |c: usize| if c == D - 1 { -50.0 } else { (c as f32 - 90.0) * 0.31 };
        rows.set(1, D, by_column(v));
        let mut out = [0f32; D];
        rows.as_rows().get(1, &mut out);
        let scale = 50.0f32 / 127.0;
        for (c, &o) in out.iter().enumerate() {
            assert_eq!(o, round_i8(v(c) * (127.0 / 50.0)) as f32 * scale, "column {c}");
        }
    }

    #[test]
    fn q8_rows_are_within_half_a_step_and_saturate() {
        let (n, d) = (4, 5);
        let mut words = [0f32; 9];
        assert_eq!(CacheDtype::Q8.words(n * d, d), 9);
        let mut rows = RowsMut::from_words(&mut words, n * d, d, CacheDtype::Q8);
        let src = [
            [1.5f32, -2.25, 0.1, 0.0, 127.0],
            [0.0; 5],
            [f32::INFINITY, 1.0, -1.0, 0.5, 0.0],
            [-3.0, 3.0, 1e-3, -1e-3, 2.0],
        ];
        for (r, row) in src.iter().enumerate() {
            rows.set(r, d, copied(row));
        }
        let mut out = [0f32; 5];
        for (r, row) in src.iter().enumerate() {
            rows.as_rows().get(r, &mut out);
            let amax = row.iter().fold(0f32, |m, v| m.max(v.abs())).min(1e38);
            for (&o, &v) in out.iter().zip(row) {
                if v.is_finite() {
                    assert!((o - v).abs() <= amax / 127.0 / 2.0 * 1.0001, "row {r}: {v} -> {o}");
                } else {
                    // Saturates: finite, within rounding of the largest f32.
                    assert!((o - 1e38).abs() <= 1e38 / 127.0 / 2.0, "row {r}: {v} -> {o}");
                }
            }
        }
        // Scaled dot products and weighted sums against the widened rows.
        let x = [1.0f32, 2.0, -1.0, 0.5, 0.25];
        let mut widened = [[0f32; 5]; 4];
        for (r, w) in widened.iter_mut().enumerate() {
            rows.as_rows().get(r, w);
        }
        let mut dots = [0f32; 4];
        rows.as_rows().rows(0, 2, d).dots(&x, &mut dots[..2]);
        rows.as_rows().rows(3, 4, d).dots(&x, &mut dots[3..]);
        for r in [0, 1, 3] {
            let want: f32 = widened[r].iter().zip(&x).map(|(a, b)| a * b).sum();
            assert!((dots[r] - want).abs() <= 1e-4 * want.abs().max(1.0), "row {r}: {} vs {want}", dots[r]);
        }
        let p = [0.5f32, 0.25, 0.0, 0.25];
        let mut sum = [0f32; 5];
        rows.as_rows().rows(0, 2, d).weighted_sum(&p[..2], &mut sum);
        rows.as_rows().rows(3, 4, d).weighted_sum(&p[3..], &mut sum);
        for c in 0..d {
            let want = 0.5 * widened[0][c] + 0.25 * widened[1][c] + 0.25 * widened[3][c];
            assert!((sum[c] - want).abs() <= 1e-5, "column {c}: {} vs {want}", sum[c]);
        }
    }
}

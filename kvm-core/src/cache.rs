//! How the rows attention reads are stored: the state's normalised keys and values and the
//! window's keys and values. [`CacheDtype::F32`] keeps the reference's numerics exactly;
//! [`CacheDtype::F16`] halves what every decode step reads from them (and their share of
//! the arena), as llama.cpp's f16 KV cache does. The state's sums, radii and gates stay f32
//! either way, so merges keep accumulating at full precision.

use half::f16;

use crate::kernels::{self, Stored};

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
}

impl CacheDtype {
    /// Every cache dtype.
    pub const ALL: [CacheDtype; 2] = [CacheDtype::F32, CacheDtype::F16];

    /// Parses the on-disk tag.
    pub const fn from_u32(v: u32) -> Option<CacheDtype> {
        match v {
            0 => Some(CacheDtype::F32),
            1 => Some(CacheDtype::F16),
            _ => None,
        }
    }

    /// `"f32"` or `"f16"`.
    pub const fn name(self) -> &'static str {
        match self {
            CacheDtype::F32 => "f32",
            CacheDtype::F16 => "f16",
        }
    }

    /// Parses [`CacheDtype::name`].
    pub fn from_name(s: &str) -> Option<CacheDtype> {
        CacheDtype::ALL.into_iter().find(|c| c.name() == s)
    }

    /// Bytes of one element.
    pub const fn bytes(self) -> usize {
        match self {
            CacheDtype::F32 => 4,
            CacheDtype::F16 => 2,
        }
    }

    /// f32 words of the arena holding `n` elements.
    pub(crate) const fn words(self, n: usize) -> usize {
        match self {
            CacheDtype::F32 => n,
            CacheDtype::F16 => n.div_ceil(2),
        }
    }
}

/// Stored rows, read-only: shareable across threads (heads attend in parallel).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

/// Stored rows, writable.
pub(crate) enum RowsMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
}

impl<'a> Rows<'a> {
    /// The first `n` elements of `dtype` stored in `words` (at least
    /// [`CacheDtype::words`]`(n)` of them).
    pub fn from_words(words: &'a [f32], n: usize, dtype: CacheDtype) -> Rows<'a> {
        match dtype {
            CacheDtype::F32 => Rows::F32(&words[..n]),
            CacheDtype::F16 => Rows::F16(&bytemuck::cast_slice(words)[..n]),
        }
    }

    /// Elements held.
    #[inline]
    pub fn len(self) -> usize {
        match self {
            Rows::F32(r) => r.len(),
            Rows::F16(r) => r.len(),
        }
    }

    /// Rows `[r0, r1)` of width `d`.
    #[inline]
    pub fn rows(self, r0: usize, r1: usize, d: usize) -> Rows<'a> {
        match self {
            Rows::F32(r) => Rows::F32(&r[r0 * d..r1 * d]),
            Rows::F16(r) => Rows::F16(&r[r0 * d..r1 * d]),
        }
    }

    /// `out[i] = row[i] . x` for every row ([`kernels::dots`]).
    #[inline]
    pub fn dots(self, x: &[f32], out: &mut [f32]) {
        match self {
            Rows::F32(r) => kernels::dots(r, x, out),
            Rows::F16(r) => kernels::dots(r, x, out),
        }
    }

    /// `out[i * n + j] = row[j] . xs[i]` for every query of `xs` (`[m, d]`) against these
    /// `n` rows of width `d` ([`kernels::dots_many`]).
    #[inline]
    pub fn dots_many(self, xs: &[f32], d: usize, out: &mut [f32]) {
        match self {
            Rows::F32(r) => kernels::dots_many(r, xs, d, out),
            Rows::F16(r) => kernels::dots_many(r, xs, d, out),
        }
    }

    /// `out += sum_j p[j] * row[j]` ([`kernels::weighted_sum`]).
    #[inline]
    pub fn weighted_sum(self, p: &[f32], out: &mut [f32]) {
        match self {
            Rows::F32(r) => kernels::weighted_sum(p, r, out),
            Rows::F16(r) => kernels::weighted_sum(p, r, out),
        }
    }

    /// Row `r` (of width `out.len()`), widened into `out`.
    pub fn get(self, r: usize, out: &mut [f32]) {
        let d = out.len();
        match self {
            Rows::F32(x) => out.copy_from_slice(&x[r * d..(r + 1) * d]),
            Rows::F16(x) => out.iter_mut().zip(&x[r * d..(r + 1) * d]).for_each(|(o, h)| *o = h.widen()),
        }
    }

    /// `out[c] += row_r[c] * s` (width `out.len()`).
    pub fn add_scaled(self, r: usize, s: f32, out: &mut [f32]) {
        let d = out.len();
        match self {
            Rows::F32(x) => out.iter_mut().zip(&x[r * d..(r + 1) * d]).for_each(|(o, &v)| *o += v * s),
            Rows::F16(x) => out.iter_mut().zip(&x[r * d..(r + 1) * d]).for_each(|(o, h)| *o += h.widen() * s),
        }
    }
}

impl<'a> RowsMut<'a> {
    /// As [`Rows::from_words`], writable.
    pub fn from_words(words: &'a mut [f32], n: usize, dtype: CacheDtype) -> RowsMut<'a> {
        match dtype {
            CacheDtype::F32 => RowsMut::F32(&mut words[..n]),
            CacheDtype::F16 => RowsMut::F16(&mut bytemuck::cast_slice_mut(words)[..n]),
        }
    }

    /// A read-only view.
    #[inline]
    pub fn as_rows(&self) -> Rows<'_> {
        match self {
            RowsMut::F32(r) => Rows::F32(r),
            RowsMut::F16(r) => Rows::F16(r),
        }
    }

    /// Row `r` of width `d` becomes `f(c)` for each column `c`.
    #[inline]
    pub fn set(&mut self, r: usize, d: usize, mut f: impl FnMut(usize) -> f32) {
        match self {
            RowsMut::F32(x) => x[r * d..(r + 1) * d].iter_mut().enumerate().for_each(|(c, o)| *o = f(c)),
            RowsMut::F16(x) => x[r * d..(r + 1) * d].iter_mut().enumerate().for_each(|(c, o)| *o = to_f16(f(c))),
        }
    }
}

/// Round to nearest f16, saturating (an overflow would turn scores into NaN).
#[inline]
fn to_f16(x: f32) -> f16 {
    const MAX: f32 = 65504.0;
    f16::from_f32(x.clamp(-MAX, MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_saturate() {
        for dtype in CacheDtype::ALL {
            let mut words = [0f32; 8];
            let mut rows = RowsMut::from_words(&mut words, 6, dtype);
            let src = [1.5f32, -2.25, 1e6, -1e6, 0.1, f32::NAN];
            rows.set(1, 3, |c| src[3 + c]);
            rows.set(0, 3, |c| src[c]);
            let mut out = [0f32; 3];
            rows.as_rows().get(0, &mut out);
            let big = if dtype == CacheDtype::F16 { 65504.0 } else { 1e6 };
            assert_eq!(out, [1.5, -2.25, big]);
            rows.as_rows().get(1, &mut out);
            assert_eq!(out[0], -big);
            assert!((out[1] - 0.1).abs() < 1e-4 && out[2].is_nan());
            assert_eq!(CacheDtype::from_name(dtype.name()), Some(dtype));
            assert_eq!(CacheDtype::from_u32(dtype as u32), Some(dtype));
            assert_eq!(Rows::from_words(&words, 6, dtype).len(), 6);
            assert_eq!(dtype.words(6) * 4, 6 * dtype.bytes());
        }
    }
}

//! The integer numerics' attention rows (docs/integer.md), beside [`super::Rows`], the
//! float numerics' ones: mantissas of one width ([`RowWidth`]: i16, or i8 for a file
//! exported with `--cache q8`) under one i32 exponent a row, carved from the arena's
//! words.

use crate::fixed::rshr;

/// The mantissas of a session's attention rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowWidth {
    /// i16: the default.
    I16,
    /// i8 (`--cache q8`): each row the i16 one rounded to at most 7 bits.
    I8,
}

impl RowWidth {
    /// The rows of an integer session whose cache dtype is `cache`: i8 for q8, else i16.
    #[inline]
    pub(crate) fn of(cache: crate::cache::CacheDtype) -> RowWidth {
        if cache == crate::cache::CacheDtype::Q8 {
            RowWidth::I8
        } else {
            RowWidth::I16
        }
    }

    /// Bytes of one mantissa.
    #[inline]
    pub(crate) fn bytes(self) -> usize {
        if self == RowWidth::I16 {
            2
        } else {
            1
        }
    }

    /// Words of `rows` rows' `d` mantissas each, all of them side by side (an integer file's
    /// `d` is even, not always a multiple of 4: i8 rows can end in the middle of a word).
    #[inline]
    pub(crate) fn mantissa_words(self, rows: usize, d: usize) -> Option<usize> {
        Some(rows.checked_mul(d)?.checked_mul(self.bytes())?.div_ceil(4))
    }

    /// Words of `rows` rows of `d` mantissas and their exponents.
    #[inline]
    pub(crate) fn words(self, rows: usize, d: usize) -> Option<usize> {
        self.mantissa_words(rows, d)?.checked_add(rows)
    }
}

/// A row's mantissas: `m[c] * 2^(e - FX)` with the row's exponent `e`.
#[derive(Clone, Copy)]
pub(crate) enum Row<'a> {
    I16(&'a [i16]),
    I8(&'a [i8]),
}

/// The mantissas of [`IntRows`].
enum Mantissas<'s> {
    I16(&'s mut [i16]),
    I8(&'s mut [i8]),
}

/// Rows of mantissas with one exponent each: row `r` is `m[r] * 2^(e[r] - FX)`.
pub(crate) struct IntRows<'s> {
    /// `[rows, d]`
    m: Mantissas<'s>,
    /// `[rows]`
    e: &'s mut [i32],
    d: usize,
}

impl<'s> IntRows<'s> {
    /// `rows` rows of width `d` in `words` ([`RowWidth::words`] of them).
    pub(crate) fn carve(words: &'s mut [f32], rows: usize, d: usize, width: RowWidth) -> Self {
        let (m, e) = words.split_at_mut(width.mantissa_words(rows, d).unwrap_or(0));
        let m = match width {
            RowWidth::I16 => Mantissas::I16(bytemuck::cast_slice_mut(m)),
            RowWidth::I8 => Mantissas::I8(bytemuck::cast_slice_mut(m)),
        };
        IntRows { m, e: bytemuck::cast_slice_mut(e), d }
    }

    /// Row `r`'s mantissas and exponent.
    #[inline]
    pub(crate) fn row(&self, r: usize) -> (Row<'_>, i32) {
        let at = r * self.d..(r + 1) * self.d;
        let m = match &self.m {
            Mantissas::I16(m) => Row::I16(&m[at]),
            Mantissas::I8(m) => Row::I8(&m[at]),
        };
        (m, self.e[r])
    }

    /// Stores row `r` as `m * 2^(e - FX)` (`m` of width `d`): as it is, or for i8 rows
    /// rounded by the least shift that brings every mantissa within +-127.
    #[inline]
    pub(crate) fn set(&mut self, r: usize, m: &[i16], e: i32) {
        let at = r * self.d..(r + 1) * self.d;
        match &mut self.m {
            Mantissas::I16(out) => {
                out[at].copy_from_slice(m);
                self.e[r] = e;
            }
            Mantissas::I8(out) => {
                let max = m.iter().fold(0i32, |a, &v| a.max(i32::from(v).abs()));
                let mut k = (32 - max.leading_zeros() as i32 - 7).max(0);
                if rshr(max, k) > 127 {
                    k += 1;
                }
                for (o, &v) in out[at].iter_mut().zip(m) {
                    *o = rshr(i32::from(v), k).clamp(-127, 127) as i8;
                }
                self.e[r] = e + k;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    /// Rows of every even width, i8 ones too where `rows * d` is no multiple of 4: each
    /// row is addressable and keeps what was set.
    #[test]
    fn rows_of_any_even_width_fit_their_words() {
        for width in [RowWidth::I16, RowWidth::I8] {
            for d in [2usize, 4, 6, 10, 32] {
                let rows = 3;
                let mut words = std::vec![0f32; width.words(rows, d).unwrap()];
                let mut r = IntRows::carve(&mut words, rows, d, width);
                let m: std::vec::Vec<i16> = (0..d as i16).map(|i| i * 3 - 20).collect(); // within +-127: i8 rows keep them
                for i in 0..rows {
                    r.set(i, &m, i as i32);
                }
                for i in 0..rows {
                    let (row, e) = r.row(i);
                    let got: std::vec::Vec<i32> = match row {
                        Row::I16(v) => v.iter().map(|&x| i32::from(x)).collect(),
                        Row::I8(v) => v.iter().map(|&x| i32::from(x)).collect(),
                    };
                    let want: std::vec::Vec<i32> = m.iter().map(|&x| i32::from(x)).collect();
                    assert_eq!((got, e), (want, i as i32), "{width:?} d {d} row {i}");
                }
            }
        }
    }
}

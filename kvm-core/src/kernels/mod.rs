//! Matrix x vector kernels over every weight format, in tiers.
//!
//! [`scalar`] is the oracle; SIMD tiers plug over it. The tier in use is chosen at compile
//! time from `target_feature`, and may be switched at run time by a caller that has checked
//! the CPU ([`force_tier`]; the std runtime does so after feature detection).

pub mod scalar;

use crate::error::{Error, Result};
use crate::quant::DType;

/// A row-major weight matrix `[rows, cols]` borrowed from the model blob.
#[derive(Debug, Clone, Copy)]
pub struct Matrix<'a> {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    /// `rows * dtype.row_bytes(cols)` bytes.
    pub data: &'a [u8],
}

impl<'a> Matrix<'a> {
    /// Wraps `data` as a `[rows, cols]` matrix of `dtype`.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] if `data` is not exactly the matrix's size or `cols` is not a
    /// whole number of blocks.
    pub fn new(dtype: DType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self> {
        let row_bytes = dtype.row_bytes(cols).ok_or(Error::OutOfBounds)?;
        if rows.checked_mul(row_bytes) != Some(data.len()) {
            return Err(Error::OutOfBounds);
        }
        Ok(Matrix { dtype, rows, cols, data })
    }

    /// Bytes of one row.
    #[inline]
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    /// Rows `[r0, r1)` as a matrix of their own (used to split work across threads).
    #[inline]
    pub fn row_range(&self, r0: usize, r1: usize) -> Matrix<'a> {
        let rb = self.row_bytes();
        Matrix { dtype: self.dtype, rows: r1 - r0, cols: self.cols, data: &self.data[r0 * rb..r1 * rb] }
    }
}

/// Bytes of activation scratch [`matvec`] needs for an input of `cols` values.
pub const fn act_scratch_len(cols: usize) -> usize {
    scalar::act_scratch_len(cols)
}

/// Bytes of activation scratch [`matmul`] needs for `n` tokens of `cols` values.
pub const fn matmul_scratch_len(cols: usize, n: usize) -> usize {
    act_scratch_len(cols) * n
}

/// `ys[t, r] = sum_c w[r, c] * xs[t, c]` (`xs: [n, cols]`, `ys: [n, rows]`).
pub fn matmul(w: &Matrix<'_>, xs: &[f32], ys: &mut [f32], act: &mut [u8]) {
    for (x, y) in xs.chunks_exact(w.cols).zip(ys.chunks_exact_mut(w.rows)) {
        matvec(w, x, y, act);
    }
}

/// `y[r] = sum_c w[r, c] * x[c]` for every row. `x.len() == w.cols`,
/// `y.len() == w.rows`, `act.len() >= act_scratch_len(w.cols)`.
#[inline]
pub fn matvec(w: &Matrix<'_>, x: &[f32], y: &mut [f32], act: &mut [u8]) {
    scalar::matvec(w, x, y, act)
}

/// Decodes row `row` of `w` into `out` (`out.len() == w.cols`).
#[inline]
pub fn dequant_row(w: &Matrix<'_>, row: usize, out: &mut [f32]) {
    scalar::dequant_row(w, row, out)
}

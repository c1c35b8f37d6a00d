//! Weight tensors as the model blob holds them: [`Vector`] (f32, or an integer file's
//! fixed point, read in place) and
//! [`Matrix`] (any [`DType`], rows of blocks). Both borrow the blob; nothing is copied.

use crate::error::{Error, Result};
use crate::quant::DType;

/// An f32 vector tensor read in place (the blob may be unaligned).
#[derive(Debug, Clone, Copy)]
pub struct Vector<'a>(&'a [u8]);

impl<'a> Vector<'a> {
    /// The vector whose little-endian f32 elements are `bytes` (`4 * len` bytes).
    #[inline]
    pub fn from_le_bytes(bytes: &'a [u8]) -> Self {
        Vector(bytes)
    }

    /// Element `i`.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        let b = &self.0[i * 4..i * 4 + 4];
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// `[from, from + len)` as a vector of its own.
    #[inline]
    pub fn slice(&self, from: usize, len: usize) -> Vector<'a> {
        Vector(&self.0[from * 4..(from + len) * 4])
    }

    /// The elements in order (no bounds check per element, unlike [`Vector::get`]).
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = f32> + 'a {
        self.0.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The elements of an integer file's vector ([`crate::quant::DType::I32`]): fixed
    /// point, [`crate::quant::FX`] fraction bits. Read as words where the vector is
    /// aligned (a model file's always are, in an aligned blob): a core without unaligned
    /// loads would otherwise assemble each from four bytes.
    #[inline]
    pub fn iter_fixed(&self) -> FixedIter<'a> {
        match bytemuck::try_cast_slice::<u8, i32>(self.0) {
            Ok(words) if cfg!(target_endian = "little") => FixedIter::Words(words.iter()),
            _ => FixedIter::Bytes(self.0.chunks_exact(4)),
        }
    }

    /// Element `i` of an integer file's vector ([`Vector::iter_fixed`]).
    #[inline]
    pub fn fixed(&self, i: usize) -> i32 {
        let b = &self.0[i * 4..i * 4 + 4];
        i32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.0.len() / 4
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// [`Vector::iter_fixed`]'s iterator.
#[derive(Debug, Clone)]
pub enum FixedIter<'a> {
    Words(core::slice::Iter<'a, i32>),
    Bytes(core::slice::ChunksExact<'a, u8>),
}

impl Iterator for FixedIter<'_> {
    type Item = i32;

    #[inline]
    fn next(&mut self) -> Option<i32> {
        match self {
            FixedIter::Words(w) => w.next().copied(),
            FixedIter::Bytes(b) => b.next().map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        }
    }
}

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

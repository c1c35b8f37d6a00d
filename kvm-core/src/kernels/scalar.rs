//! The scalar tier: the reference every other tier is tested against.

use super::Matrix;
use crate::quant::{bf16_le, f16_le, BlockQ4_0, BlockQ8_0, DType, QK};

/// Scalar kernels need no activation scratch.
pub const fn act_scratch_len(_cols: usize) -> usize {
    0
}

/// Reference `y = w x`.
pub fn matvec(w: &Matrix<'_>, x: &[f32], y: &mut [f32], _act: &mut [u8]) {
    let rb = w.row_bytes();
    for (r, out) in y.iter_mut().enumerate().take(w.rows) {
        let row = &w.data[r * rb..(r + 1) * rb];
        *out = dot_row(w.dtype, row, x);
    }
}

/// Reference dot product of one encoded row with `x`.
pub fn dot_row(dtype: DType, row: &[u8], x: &[f32]) -> f32 {
    match dtype {
        DType::F32 => row.chunks_exact(4).zip(x).map(|(b, &v)| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * v).sum(),
        DType::F16 => row.chunks_exact(2).zip(x).map(|(b, &v)| f16_le([b[0], b[1]]) * v).sum(),
        DType::BF16 => row.chunks_exact(2).zip(x).map(|(b, &v)| bf16_le([b[0], b[1]]) * v).sum(),
        DType::Q8_0 => {
            let blocks: &[BlockQ8_0] = bytemuck::cast_slice(row);
            blocks
                .iter()
                .zip(x.chunks_exact(QK))
                .map(|(b, xs)| {
                    let s: f32 = b.qs.iter().zip(xs).map(|(&q, &v)| q as f32 * v).sum();
                    f16_le(b.d) * s
                })
                .sum()
        }
        DType::Q4_0 => {
            let blocks: &[BlockQ4_0] = bytemuck::cast_slice(row);
            blocks
                .iter()
                .zip(x.chunks_exact(QK))
                .map(|(b, xs)| {
                    let mut s = 0.0f32;
                    for (i, &q) in b.qs.iter().enumerate() {
                        s += ((q & 15) as i32 - 8) as f32 * xs[i];
                        s += ((q >> 4) as i32 - 8) as f32 * xs[i + QK / 2];
                    }
                    f16_le(b.d) * s
                })
                .sum()
        }
    }
}

/// Reference row decode.
pub fn dequant_row(w: &Matrix<'_>, row: usize, out: &mut [f32]) {
    let rb = w.row_bytes();
    let bytes = &w.data[row * rb..(row + 1) * rb];
    match w.dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_le([b[0], b[1]]);
            }
        }
        DType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16_le([b[0], b[1]]);
            }
        }
        DType::Q8_0 => {
            let blocks: &[BlockQ8_0] = bytemuck::cast_slice(bytes);
            for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
                let d = f16_le(b.d);
                for (o, &q) in o.iter_mut().zip(&b.qs) {
                    *o = d * q as f32;
                }
            }
        }
        DType::Q4_0 => {
            let blocks: &[BlockQ4_0] = bytemuck::cast_slice(bytes);
            for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
                let d = f16_le(b.d);
                for (i, &q) in b.qs.iter().enumerate() {
                    o[i] = d * ((q & 15) as i32 - 8) as f32;
                    o[i + QK / 2] = d * ((q >> 4) as i32 - 8) as f32;
                }
            }
        }
    }
}

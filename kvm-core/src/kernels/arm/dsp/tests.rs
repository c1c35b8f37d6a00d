extern crate std;

use std::vec;
use std::vec::Vec;

use super::*;
use crate::kernels::tests::values;
use crate::kernels::traits::act_scratch_len;
use crate::kernels::walk::run;
use crate::quant::X16;
use crate::tensor::Matrix;

/// Deterministic bytes (xorshift32): any quant byte, so q8 weights -128 and 127 and
/// every nibble occur.
pub(in crate::kernels::arm) fn bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 11) as u8
        })
        .collect()
}

/// A `[rows, cols]` matrix of `dtype` with random quant bytes and finite f16 scales,
/// every fifth one zero and every seventh subnormal.
fn matrix(dtype: DType, rows: usize, cols: usize, seed: u32) -> Vec<u8> {
    let mut m = bytes(dtype.matrix_bytes(rows, cols).unwrap(), seed);
    let (bb, per_group) = (dtype.block_bytes(), dtype.group_rows());
    let scales: Vec<usize> = if per_group == 1 {
        (0..m.len() / bb).map(|b| b * bb).collect()
    } else {
        (0..m.len() / (bb * X16)).flat_map(|g| (0..X16).map(move |r| g * bb * X16 + 2 * r)).collect()
    };
    for (i, at) in scales.into_iter().enumerate() {
        let h = if i % 5 == 4 {
            0x0000
        } else if i % 7 == 6 {
            0x8000 | (i as u16 & 0x3ff)
        } else {
            u16::from_le_bytes([m[at], m[at + 1] & 0x3b])
        };
        m[at..at + 2].copy_from_slice(&h.to_le_bytes());
    }
    m
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn integer_products_give_the_scalar_bits() {
    for dtype in [DType::Q8_0, DType::Q4_0, DType::Q8_0x16, DType::Q4_0x16] {
        let row_counts: &[usize] = if dtype.group_rows() == 1 { &[1, 3, 4, 5, 7, 9] } else { &[16, 32, 48, 80] };
        for &rows in row_counts {
            for cols in [32, 96, 256, 288, 544] {
                for n in [1, 2, 3] {
                    let seed = (rows * 1000 + cols + n) as u32;
                    let data = matrix(dtype, rows, cols, seed);
                    let w = Matrix::new(dtype, rows, cols, &data).unwrap();
                    let mut xs = values(n * cols, seed);
                    if cols > QK {
                        // A zero activation block (scale 0).
                        xs[QK..2 * QK].fill(0.0);
                    }
                    let mut act = vec![0u8; act_scratch_len(cols) * n];
                    let (mut want, mut got) = (vec![f32::NAN; n * rows], vec![f32::NAN; n * rows]);
                    // SAFETY: both tiers' arithmetic is plain Rust on the host.
                    unsafe {
                        run::<scalar::Scalar, 1, 1, 1>(&w, &xs, &mut want, &mut act);
                        run::<Dsp, 1, 4, 1>(&w, &xs, &mut got, &mut act);
                    }
                    assert_eq!(bits(&got), bits(&want), "{dtype:?} {rows}x{cols}, {n} tokens");
                    assert!(want.iter().any(|&y| y != 0.0), "{dtype:?} {rows}x{cols}: all zero");
                }
            }
        }
    }
}

#[test]
fn misaligned_data_runs_the_scalar_kernel() {
    let (rows, cols) = (16, 64);
    for dtype in [DType::Q8_0x16, DType::Q4_0x16] {
        let data = matrix(dtype, rows, cols, 3);
        let mut shifted = vec![0u8; data.len() + 1];
        shifted[1..].copy_from_slice(&data);
        let w = Matrix::new(dtype, rows, cols, &shifted[1..]).unwrap();
        let mut act = vec![0u8; act_scratch_len(cols)];
        let xs = values(cols, 5);
        let (mut want, mut got) = (vec![0.0; rows], vec![0.0; rows]);
        // SAFETY: as above.
        unsafe {
            run::<scalar::Scalar, 1, 1, 1>(&w, &xs, &mut want, &mut act);
            run::<Dsp, 1, 4, 1>(&w, &xs, &mut got, &mut act);
        }
        assert_eq!(bits(&got), bits(&want), "{dtype:?}");
    }
}

#[test]
fn activation_quantizer_gives_the_scalar_bytes() {
    let mut x = values(32 * 9, 7);
    x[32..64].fill(0.0);
    x[64..96].fill(-1e-35);
    for (i, v) in x[96..128].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) + 0.5;
    }
    x[128] = f32::NAN;
    x[160] = f32::INFINITY;
    x[192] = -0.0;
    x[224] = f32::MAX;
    let mut want = vec![0u8; act_scratch_len(x.len())];
    let mut got = vec![0xaa; want.len()];
    scalar::quantize_act(&x, &mut want);
    quantize_act(&x, &mut got);
    assert_eq!(got, want);
}

#[test]
fn emulated_instructions() {
    assert_eq!(op::sxtb16(0x80_7f_01_ff), 0x007f_ffff);
    assert_eq!(op::sxtb16_ror8(0x80_7f_01_ff), 0xff80_0001);
    assert_eq!(op::smlad(0xffff_0002, 0x0003_0004, 10), 10 + 8 - 3);
}

//! The DSP tier's product for the integer numerics (docs/integer.md): i8 rows against an
//! i16 input, four rows a tile, two `smlad`s for four columns of a row. A row's word of
//! four weights spreads into bytes 0, 2 and 1, 3 (`sxtb16`), which meet the input's pairs
//! `(x0, x2)` and `(x1, x3)` (`pkhbt`, `pkhtb`, made once a column quad for the four rows).
//! On Arm the column quads are assembly (the compiler's version kept the row pointers on
//! the stack, about 3.2 instructions a product against this one's 1.6); elsewhere, and
//! for data off a 4-byte boundary, the same sums in Rust over [`super::dsp::op`]'s
//! emulated instructions.
//! Sums wrap in i32 as the scalar tile's, so the bits are the oracle's.

use super::dsp::op;

/// One row of the assembly's column quad: its four weights (post-incremented), then the
/// two products into its sum.
#[cfg(kvm_arm_dsp)]
#[rustfmt::skip]
macro_rules! row {
    ($row:literal, $sum:literal) => {
        concat!(
            "ldr r6, [", $row, "], #4\n",
            "sxtb16 r9, r6\n",
            "smlad ", $sum, ", r9, lr, ", $sum, "\n",
            "sxtb16 r6, r6, ror #8\n",
            "smlad ", $sum, ", r6, r7, ", $sum,
        )
    };
}

/// `acc[r] += sum_{c < n} rows[r][c] * x[c]` (wrapping) for `n` a multiple of 4, every
/// pointer on a 4-byte boundary: the column quads in assembly. Registers: r0-r3 the rows,
/// r4 the input, r5 its end, r8 and r10-r12 the sums, lr and r7 the input's even and odd
/// pairs, r6 and r9 a row's halves (r6 and r7, which no operand may name, saved around).
#[cfg(kvm_arm_dsp)]
#[inline]
fn quads(q: [&[i8]; 4], x: &[i16], n: usize, acc: &mut [i32; 4]) {
    let [r0, r1, r2, r3] = q.map(<[i8]>::as_ptr);
    let (x, end) = (x.as_ptr(), x[n..].as_ptr());
    // SAFETY: each row and `x` hold at least `n` elements (a multiple of 4), read at `[0,
    // n)` only, from 4-byte boundaries (`ldr`, `ldrd`); r6 and r7 are restored and the
    // stack balanced before the block ends.
    unsafe {
        core::arch::asm!(
            "push {{r6, r7}}",
            "cmp r4, r5",
            "beq 2f",
            "1:",
            "ldrd r6, r7, [r4], #8",
            "pkhbt lr, r6, r7, lsl #16",
            "pkhtb r7, r7, r6, asr #16",
            row!("r0", "r8"),
            row!("r1", "r10"),
            row!("r2", "r11"),
            row!("r3", "r12"),
            "cmp r4, r5",
            "bne 1b",
            "2:",
            "pop {{r6, r7}}",
            inout("r0") r0 => _,
            inout("r1") r1 => _,
            inout("r2") r2 => _,
            inout("r3") r3 => _,
            inout("r4") x => _,
            in("r5") end,
            inout("r8") acc[0],
            inout("r10") acc[1],
            inout("r11") acc[2],
            inout("r12") acc[3],
            out("r9") _,
            out("lr") _,
        );
    }
}

/// The DSP tier's integer tile for `walk::matvec_i8`.
#[derive(Debug)]
pub(crate) struct DspInt;

impl crate::kernels::traits::IntKernel for DspInt {
    const LANES: usize = 4;
    // A listed column is a load and a multiply-add (`mla`) a row.
    const SPARSE: bool = true;

    /// Four rows on 4-byte boundaries in the assembly; otherwise (the rows left over, data
    /// off the boundary, a host test) the same sums over the emulated instructions.
    unsafe fn sums<const R: usize>(q: [&[i8]; R], x: &[i16]) -> [i32; R] {
        let mut acc = [0i32; R];
        #[cfg(kvm_arm_dsp)]
        if let Ok(&rows) = <&[&[i8]; 4]>::try_from(&q[..]) {
            if rows.iter().all(|q| q.as_ptr().cast::<u32>().is_aligned()) && x.as_ptr().cast::<u32>().is_aligned() {
                let mut four = [0i32; 4];
                quads(rows, x, x.len(), &mut four);
                return core::array::from_fn(|r| four[r]);
            }
        }
        for (i, xs) in x.chunks_exact(4).enumerate() {
            let pair = |a: i16, b: i16| u32::from(a as u16) | u32::from(b as u16) << 16;
            let (even, odd) = (pair(xs[0], xs[2]), pair(xs[1], xs[3]));
            for (a, q) in acc.iter_mut().zip(q) {
                let w = &q[4 * i..4 * i + 4];
                let w = u32::from_le_bytes([w[0] as u8, w[1] as u8, w[2] as u8, w[3] as u8]);
                *a = op::smlad(op::sxtb16(w), even, *a);
                *a = op::smlad(op::sxtb16_ror8(w), odd, *a);
            }
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::vec;
    use std::vec::Vec;

    use super::*;
    use crate::kernels::arm::dsp::tests::bytes;
    use crate::kernels::scalar::Scalar;
    use crate::kernels::walk::matvec_i8;
    use crate::quant::DType;
    use crate::tensor::Matrix;

    #[test]
    fn gives_the_scalar_bits() {
        for (rows, cols) in [(1, 4), (4, 8), (5, 36), (9, 128), (7, 516), (4, 1036)] {
            let mut data = bytes(DType::I8.matrix_bytes(rows, cols).unwrap(), (rows * cols) as u32);
            let rb = DType::I8.row_bytes(cols).unwrap();
            for (r, row) in data.chunks_exact_mut(rb).enumerate() {
                let m = 0x4000 | ((r as u16 * 977) & 0x3fff);
                row[..4].copy_from_slice(&[m as u8, (m >> 8) as u8, 20 + r as u8, 0]);
            }
            let w = Matrix::new(DType::I8, rows, cols, &data).unwrap();
            let x: Vec<i16> = bytes(2 * cols, 9).chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
            // Dense, and mostly zero (listed columns)
            let sparse: Vec<i16> = x.iter().enumerate().map(|(i, &v)| if i % 3 == 0 { v } else { 0 }).collect();
            for x in [x, sparse] {
                let (mut want, mut got) = (vec![0i32; rows], vec![1i32; rows]);
                // SAFETY: both tiles are plain Rust on the host.
                unsafe {
                    matvec_i8::<Scalar, 4>(&w, &x, 2, &mut want);
                    matvec_i8::<DspInt, 4>(&w, &x, 2, &mut got);
                }
                assert_eq!(got, want, "[{rows}, {cols}]");
            }
        }
    }
}

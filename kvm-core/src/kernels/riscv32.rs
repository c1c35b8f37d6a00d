//! 32-bit RISC-V without vector units (RV32IMC, ESP32-C3 class): the integer numerics'
//! product tile in assembly. The compiler's code for the scalar tier's four-row tile
//! hoists every load of a turn and spills around them (about 4.1 instructions a product);
//! this one spends a load, a multiply and an add a product, plus a load of the input a
//! column and five pointer steps every eight columns. Integer sums are exact, so it gives
//! the oracle's bits.

use super::scalar::dot_i8;
use super::traits::{four_rows, portable_sparse, NonZero};

/// A tile's entry: the four rows' pointers (from a0) in t0-t3, the sums a4-a7 zero.
#[rustfmt::skip]
macro_rules! load_rows {
    () => {
        concat!(
            "lw t0, 0(a0)\n", "lw t1, 4(a0)\n", "lw t2, 8(a0)\n", "lw t3, 12(a0)\n",
            "li a4, 0\n", "li a5, 0\n", "li a6, 0\n", "li a7, 0",
        )
    };
}

/// A tile's exit: the four sums to `out` (a3), return.
#[rustfmt::skip]
macro_rules! store_sums_and_return {
    () => {
        concat!("sw a4, 0(a3)\n", "sw a5, 4(a3)\n", "sw a6, 8(a3)\n", "sw a7, 12(a3)\n", "ret")
    };
}

/// Column `$w` of an eight-column turn (`$x` = its input's byte offset): the input, then
/// its four products into the sums.
#[rustfmt::skip]
macro_rules! col {
    ($w:literal, $x:literal) => {
        concat!(
            "lh t6, ", $x, "(a1)\n",
            "lb a0, ", $w, "(t0)\n",
            "mul a0, a0, t6\n",
            "add a4, a4, a0\n",
            "lb a0, ", $w, "(t1)\n",
            "mul a0, a0, t6\n",
            "add a5, a5, a0\n",
            "lb a0, ", $w, "(t2)\n",
            "mul a0, a0, t6\n",
            "add a6, a6, a0\n",
            "lb a0, ", $w, "(t3)\n",
            "mul a0, a0, t6\n",
            "add a7, a7, a0",
        )
    };
}

core::arch::global_asm!(
    // kvm_rv32_dot4_i8(rows: *const [*const i8; 4], x: *const i16, n: usize, out: *mut [i32; 4])
    //
    // out[r] = sum_{c < n} rows[r][c] * x[c] (wrapping i32), eight columns a turn, then one.
    // Registers: t0-t3 the rows, a1 the input, t5 where the eight-column turns stop (row
    // 0's address), t4 where row 0 ends, t6 the input value, a0 a product, a4-a7 the sums.
    ".pushsection .text.kvm_rv32_dot4_i8,\"ax\",@progbits",
    ".globl kvm_rv32_dot4_i8",
    ".type kvm_rv32_dot4_i8,@function",
    ".p2align 1",
    // Module assembly does not see the target's extensions: M (every RV32 target of the
    // core has it) for `mul`.
    ".option push",
    ".option arch, +m",
    "kvm_rv32_dot4_i8:",
    load_rows!(),
    "    add t4, t0, a2",
    "    andi a2, a2, -8",
    "    add t5, t0, a2",
    "    beq t0, t5, 3f",
    "2:",
    col!("0", "0"),
    col!("1", "2"),
    col!("2", "4"),
    col!("3", "6"),
    col!("4", "8"),
    col!("5", "10"),
    col!("6", "12"),
    col!("7", "14"),
    "    addi t0, t0, 8",
    "    addi t1, t1, 8",
    "    addi t2, t2, 8",
    "    addi t3, t3, 8",
    "    addi a1, a1, 16",
    "    bne t0, t5, 2b",
    // The last n mod 8 columns, one a turn.
    "3:",
    "    beq t0, t4, 5f",
    "4:",
    col!("0", "0"),
    "    addi t0, t0, 1",
    "    addi t1, t1, 1",
    "    addi t2, t2, 1",
    "    addi t3, t3, 1",
    "    addi a1, a1, 2",
    "    bne t0, t4, 4b",
    "5:",
    store_sums_and_return!(),
    ".option pop",
    ".size kvm_rv32_dot4_i8, . - kvm_rv32_dot4_i8",
    ".popsection",
);

/// Row `$row`'s product with the listed column (its byte offset in a2, its value in t6)
/// into sum `$sum`.
#[rustfmt::skip]
macro_rules! listed {
    ($row:literal, $sum:literal) => {
        concat!(
            "add a0, ", $row, ", a2\n",
            "lb a0, 0(a0)\n",
            "mul a0, a0, t6\n",
            "add ", $sum, ", ", $sum, ", a0",
        )
    };
}

core::arch::global_asm!(
    // kvm_rv32_sparse4_i8(rows: *const [*const i8; 4], nz: *const NonZero, n: usize, out: *mut [i32; 4])
    //
    // out[r] = sum over the n >= 1 listed columns (c, v) of rows[r][c] * v (wrapping i32).
    // Registers: t0-t3 the rows, a1 the list, t5 its end, a2 a column, t6 its value, a0 a
    // product, a4-a7 the sums.
    ".pushsection .text.kvm_rv32_sparse4_i8,\"ax\",@progbits",
    ".globl kvm_rv32_sparse4_i8",
    ".type kvm_rv32_sparse4_i8,@function",
    ".p2align 1",
    ".option push",
    ".option arch, +m",
    "kvm_rv32_sparse4_i8:",
    load_rows!(),
    "    slli a2, a2, 2",
    "    add t5, a1, a2",
    "2:",
    "    lhu a2, 0(a1)",
    "    lh t6, 2(a1)",
    listed!("t0", "a4"),
    listed!("t1", "a5"),
    listed!("t2", "a6"),
    listed!("t3", "a7"),
    "    addi a1, a1, 4",
    "    bne a1, t5, 2b",
    store_sums_and_return!(),
    ".option pop",
    ".size kvm_rv32_sparse4_i8, . - kvm_rv32_sparse4_i8",
    ".popsection",
);

extern "C" {
    fn kvm_rv32_dot4_i8(rows: *const [*const i8; 4], x: *const i16, n: usize, out: *mut [i32; 4]);
    fn kvm_rv32_sparse4_i8(rows: *const [*const i8; 4], nz: *const NonZero, n: usize, out: *mut [i32; 4]);
}

/// The RV32 tile for `walk::matvec_i8`.
#[derive(Debug)]
pub(crate) struct Rv32;

impl super::traits::IntKernel for Rv32 {
    const LANES: usize = 1;

    /// Four rows in the assembly; another count (the rows left over) by the scalar dot.
    unsafe fn sums<const R: usize>(q: [&[i8]; R], x: &[i16]) -> [i32; R] {
        // SAFETY: each row holds at least `x.len()` weights (the caller's contract), which
        // the tile reads as `x`; it clobbers only caller-saved registers.
        unsafe { four_rows(kvm_rv32_dot4_i8, q, x, |q| q.map(|q| dot_i8(q, x))) }
    }

    const SPARSE: bool = true;

    /// Four rows over at least one listed column in the assembly; otherwise the portable
    /// loop.
    unsafe fn sparse_sums<const R: usize>(q: [&[i8]; R], nz: &[NonZero]) -> [i32; R] {
        // SAFETY: every row holds a weight at each listed column (the caller's contract);
        // the tile clobbers only caller-saved registers.
        unsafe { four_rows(kvm_rv32_sparse4_i8, q, nz, |q| portable_sparse(q, nz)) }
    }
}

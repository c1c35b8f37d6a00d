//! 32-bit RISC-V without vector units (RV32IMC, ESP32-C3 class): the integer numerics'
//! product tile in assembly. The compiler's code for [`super::scalar`]'s four-row tile
//! hoists every load of a turn and spills around them (about 4.1 instructions a product);
//! this one spends a load, a multiply and an add a product, plus a load of the input a
//! column and five pointer steps every eight columns. Integer sums are exact, so it gives
//! the oracle's bits.

use crate::tensor::Matrix;

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
    "    lw t0, 0(a0)",
    "    lw t1, 4(a0)",
    "    lw t2, 8(a0)",
    "    lw t3, 12(a0)",
    "    li a4, 0",
    "    li a5, 0",
    "    li a6, 0",
    "    li a7, 0",
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
    "    sw a4, 0(a3)",
    "    sw a5, 4(a3)",
    "    sw a6, 8(a3)",
    "    sw a7, 12(a3)",
    "    ret",
    ".option pop",
    ".size kvm_rv32_dot4_i8, . - kvm_rv32_dot4_i8",
    ".popsection",
);

extern "C" {
    fn kvm_rv32_dot4_i8(rows: *const [*const i8; 4], x: *const i16, n: usize, out: *mut [i32; 4]);
}

/// `sum q * x` of four rows against one input, each sum wrapping in i32 (as the scalar
/// tile's).
#[inline]
fn dot4_i8(q: [&[i8]; 4], x: &[i16]) -> [i32; 4] {
    let n = q.iter().fold(x.len(), |n, q| n.min(q.len()));
    let rows = q.map(<[i8]>::as_ptr);
    let mut out = [0i32; 4];
    // SAFETY: each row and `x` hold at least `n` elements, read at `[0, n)` only; `out`
    // is four i32s; the function clobbers only caller-saved registers (a0-a7, t0-t6).
    unsafe { kvm_rv32_dot4_i8(&rows, x.as_ptr(), n, &mut out) };
    out
}

/// [`super::matvec_i8`] with the assembly tile.
pub(crate) fn matvec_i8(w: &Matrix<'_>, x: &[i16], s: i32, y: &mut [i32]) {
    super::scalar::matvec_i8_with(dot4_i8, w, x, s, y);
}

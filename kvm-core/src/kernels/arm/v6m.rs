//! ARMv6-M (Cortex-M0/M0+, RP2040 class; also Armv8-M Baseline): the integer numerics'
//! product tile in assembly. The compiler's code for the scalar tier's four-row
//! tile spills most of its values (Thumb-1 reaches 8 registers in loads and multiplies),
//! about 7 instructions a product; this one keeps the four sums in `r8`-`r11` and spends a
//! load, a multiply and an add a product, plus a load of the input and two index steps a
//! column. Integer sums are exact, so it gives the oracle's bits.

use crate::kernels::scalar::dot_i8;
use crate::kernels::traits::{four_rows, portable_sparse, NonZero};

/// A tile's entry: the AAPCS's r4-r11 saved (r8-r11 through r4-r7), and `out` (r3) kept on
/// the stack under them.
#[rustfmt::skip]
macro_rules! save {
    () => {
        concat!(
            "push {{r4-r7, lr}}\n",
            "mov r4, r8\n", "mov r5, r9\n", "mov r6, r10\n", "mov r7, r11\n",
            "push {{r3-r7}}",
        )
    };
}

/// The four sums (r8-r11) set to zero, through r6.
#[rustfmt::skip]
macro_rules! zero_sums {
    () => {
        concat!("movs r6, #0\n", "mov r8, r6\n", "mov r9, r6\n", "mov r10, r6\n", "mov r11, r6")
    };
}

/// A tile's exit: the four sums to `out`, r4-r11 restored, return.
#[rustfmt::skip]
macro_rules! store_sums_and_return {
    () => {
        concat!(
            "pop {{r3}}\n",
            "mov r4, r8\n", "str r4, [r3, #0]\n",
            "mov r4, r9\n", "str r4, [r3, #4]\n",
            "mov r4, r10\n", "str r4, [r3, #8]\n",
            "mov r4, r11\n", "str r4, [r3, #12]\n",
            "pop {{r4-r7}}\n",
            "mov r8, r4\n", "mov r9, r5\n", "mov r10, r6\n", "mov r11, r7\n",
            "pop {{r4-r7, pc}}",
        )
    };
}

/// One column of the tile: the input `x[c]`, its four products into the sums, then the
/// next column (the last `adds` sets the flags the loops branch on).
#[rustfmt::skip]
macro_rules! col {
    () => {
        concat!(
            "ldrsh r6, [r5, r4]\n",
            "ldrsb r7, [r0, r4]\n",
            "muls r7, r6, r7\n",
            "add r8, r7\n",
            "ldrsb r7, [r1, r4]\n",
            "muls r7, r6, r7\n",
            "add r9, r7\n",
            "ldrsb r7, [r2, r4]\n",
            "muls r7, r6, r7\n",
            "add r10, r7\n",
            "ldrsb r7, [r3, r4]\n",
            "muls r7, r6, r7\n",
            "add r11, r7\n",
            "adds r5, #1\n",
            "adds r4, #1",
        )
    };
}

core::arch::global_asm!(
    // kvm_v6m_dot4_i8(rows: *const [*const i8; 4], x: *const i16, n: usize, out: *mut [i32; 4])
    //
    // out[r] = sum_{c < n} rows[r][c] * x[c] (wrapping i32), four columns a turn, then one.
    // Registers in the loops: r0-r3 the rows (each + n), r4 = c - n (counts up to 0),
    // r5 = x + n + (c - n) (so that [r5, r4] is x + 2c), r6 the input, r7 a product,
    // r8-r11 the sums, r12 where the four-column turns stop.
    ".pushsection .text.kvm_v6m_dot4_i8,\"ax\",%progbits",
    ".thumb",
    ".global kvm_v6m_dot4_i8",
    ".type kvm_v6m_dot4_i8,%function",
    ".p2align 1",
    ".thumb_func",
    "kvm_v6m_dot4_i8:",
    save!(),
    // r12 = -(n mod 4): the four-column turns run while r4 < r12
    "    movs r6, #3",
    "    ands r6, r2",
    "    rsbs r6, r6, #0",
    "    mov r12, r6",
    "    adds r5, r1, r2",
    "    rsbs r4, r2, #0",
    "    ldr r3, [r0, #12]",
    "    adds r3, r3, r2",
    "    ldr r1, [r0, #4]",
    "    adds r1, r1, r2",
    "    ldr r6, [r0, #8]",
    "    adds r6, r6, r2",
    "    ldr r0, [r0, #0]",
    "    adds r0, r0, r2",
    "    mov r2, r6",
    zero_sums!(),
    "    cmp r4, r12",
    "    bge 3f",
    "2:",
    col!(),
    col!(),
    col!(),
    col!(),
    "    cmp r4, r12",
    "    blt 2b",
    // The last n mod 4 columns, one a turn.
    "3:",
    "    cmp r4, #0",
    "    bge 5f",
    "4:",
    col!(),
    "    bne 4b",
    "5:",
    store_sums_and_return!(),
    ".size kvm_v6m_dot4_i8, . - kvm_v6m_dot4_i8",
    ".popsection",
);

core::arch::global_asm!(
    // kvm_v6m_sparse4_i8(rows: *const [*const i8; 4], nz: *const NonZero, n: usize, out: *mut [i32; 4])
    //
    // out[r] = sum over the n >= 1 listed columns (c, v) of rows[r][c] * v (wrapping i32).
    // Registers in the loop: r0-r3 the rows, r4 the list, r12 its end, r6 a column's word
    // and then its value, r7 its column, r5 a product, r8-r11 the sums.
    ".pushsection .text.kvm_v6m_sparse4_i8,\"ax\",%progbits",
    ".thumb",
    ".global kvm_v6m_sparse4_i8",
    ".type kvm_v6m_sparse4_i8,%function",
    ".p2align 1",
    ".thumb_func",
    "kvm_v6m_sparse4_i8:",
    save!(),
    "    lsls r2, r2, #2",
    "    adds r4, r1, r2",
    "    mov r12, r4",
    "    mov r4, r1",
    "    ldr r3, [r0, #12]",
    "    ldr r2, [r0, #8]",
    "    ldr r1, [r0, #4]",
    "    ldr r0, [r0, #0]",
    zero_sums!(),
    "2:",
    "    ldm r4!, {{r6}}",
    "    uxth r7, r6",
    "    asrs r6, r6, #16",
    "    ldrsb r5, [r0, r7]",
    "    muls r5, r6, r5",
    "    add r8, r5",
    "    ldrsb r5, [r1, r7]",
    "    muls r5, r6, r5",
    "    add r9, r5",
    "    ldrsb r5, [r2, r7]",
    "    muls r5, r6, r5",
    "    add r10, r5",
    "    ldrsb r5, [r3, r7]",
    "    muls r5, r6, r5",
    "    add r11, r5",
    "    cmp r4, r12",
    "    bne 2b",
    store_sums_and_return!(),
    ".size kvm_v6m_sparse4_i8, . - kvm_v6m_sparse4_i8",
    ".popsection",
);

extern "C" {
    fn kvm_v6m_dot4_i8(rows: *const [*const i8; 4], x: *const i16, n: usize, out: *mut [i32; 4]);
    fn kvm_v6m_sparse4_i8(rows: *const [*const i8; 4], nz: *const NonZero, n: usize, out: *mut [i32; 4]);
}

/// The ARMv6-M tile for `walk::matvec_i8`.
#[derive(Debug)]
pub(crate) struct V6m;

impl crate::kernels::traits::IntKernel for V6m {
    const LANES: usize = 1;

    /// Four rows in the assembly; another count (the rows left over) by the scalar dot.
    unsafe fn sums<const R: usize>(q: [&[i8]; R], x: &[i16]) -> [i32; R] {
        // SAFETY: each row holds at least `x.len()` weights (the caller's contract), which
        // the tile reads as `x`; it keeps the AAPCS (r4-r11 restored, the stack balanced).
        unsafe { four_rows(kvm_v6m_dot4_i8, q, x, |q| q.map(|q| dot_i8(q, x))) }
    }

    const SPARSE: bool = true;

    /// Four rows over at least one listed column in the assembly; otherwise the portable
    /// loop.
    unsafe fn sparse_sums<const R: usize>(q: [&[i8]; R], nz: &[NonZero]) -> [i32; R] {
        // SAFETY: every row holds a weight at each listed column (the caller's contract);
        // the tile keeps the AAPCS (r4-r11 restored, the stack balanced).
        unsafe { four_rows(kvm_v6m_sparse4_i8, q, nz, |q| portable_sparse(q, nz)) }
    }
}

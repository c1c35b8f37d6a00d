//! RISC-V (`riscv-rt`, machine mode): `mcycle` as the tick counter, the stack painted here
//! (riscv-rt does not), and every exception reported as a hard fault: exit 102.

use semihosting::println;

/// Paints the unused stack below the stack pointer with [`kvm_board_app::stack::PAINT`].
pub fn init() {
    let sp: usize;
    // SAFETY: reads the stack pointer into a register; no memory is touched.
    unsafe { core::arch::asm!("mv {}, sp", out(reg) sp, options(nomem, nostack)) };
    let (bottom, _) = stack_region();
    let mut p = bottom;
    while p + 4 <= sp {
        // SAFETY: `[bottom, sp)` is stack that no frame uses yet (no interrupt is enabled),
        // word-aligned RAM the linker script reserves.
        unsafe { core::ptr::write_volatile(p as *mut u32, kvm_board_app::stack::PAINT) };
        p += 4;
    }
}

/// Processor clock ticks (`mcycle`). On hardware that is CPU cycles; QEMU counts one per
/// instruction under `-icount` (and host time otherwise).
pub fn ticks() -> u64 {
    riscv::register::mcycle::read64()
}

extern "C" {
    static _stack_start: u32;
    /// riscv-rt's start of the `.stack` region (the end of the statics and the heap).
    static __estack: u32;
}

/// The stack region `[bottom, top)`. Only the symbols' addresses are taken.
pub fn stack_region() -> (usize, usize) {
    (&raw const __estack as usize, &raw const _stack_start as usize)
}

#[export_name = "ExceptionHandler"]
fn exception(_frame: &riscv_rt::TrapFrame) -> ! {
    println!(
        "kvm-mcu: hard fault (mcause {}) at pc {:#010x}",
        riscv::register::mcause::read().code(),
        riscv::register::mepc::read()
    );
    semihosting::process::exit(102)
}

//! Cortex-M (`cortex-m-rt`): SysTick as the tick counter (`kvm_board_app::systick`), the
//! stack painted by `cortex-m-rt`'s `paint-stack` at reset, hard faults reported and turned
//! into exit 102.
//! ARMv6-M builds (`thumbv6m`, the an385 board) also trap unaligned accesses.

#[cfg(armv6m)]
use cortex_m::peripheral::SCB;
use cortex_m_rt::{exception, ExceptionFrame};
use semihosting::println;

/// Starts the tick counter (the stack is already painted); on ARMv6-M, also traps
/// unaligned accesses.
pub fn init() {
    let Some(p) = cortex_m::Peripherals::take() else { return };
    #[cfg(armv6m)]
    trap_unaligned(&p.SCB);
    kvm_board_app::systick::start(p.SYST);
}

/// Processor clock ticks since [`init`] (`kvm_board_app::systick`). On hardware that is
/// CPU cycles; in QEMU it follows virtual time, which under `-icount shift=0` advances
/// 1 ns per instruction (see README.md).
pub fn ticks() -> u64 {
    kvm_board_app::systick::ticks()
}

#[exception]
fn SysTick() {
    kvm_board_app::systick::wrapped();
}

/// Sets `SCB.CCR.UNALIGN_TRP` (bit 3), so that an unaligned word or halfword access
/// faults (a usage fault, escalated to the hard fault: exit 102). ARMv6-M code runs on the
/// an385's Cortex-M3, which allows unaligned accesses unless told; a Cortex-M0+ always
/// faults on them (there the bit reads as one and ignores writes), so with the bit set
/// the M3 refuses what an M0+ would.
#[cfg(armv6m)]
fn trap_unaligned(scb: &SCB) {
    const UNALIGN_TRP: u32 = 1 << 3;
    // SAFETY: sets one configuration bit before anything runs that it could affect; the
    // firmware's own accesses are aligned.
    unsafe { scb.ccr.modify(|ccr| ccr | UNALIGN_TRP) };
}

extern "C" {
    static _stack_start: u32;
    static _stack_end: u32;
}

/// The stack region `[bottom, top)`: `link.x` puts it between the end of the statics and
/// the top of RAM. Only the symbols' addresses are taken.
pub fn stack_region() -> (usize, usize) {
    (&raw const _stack_end as usize, &raw const _stack_start as usize)
}

#[exception]
unsafe fn HardFault(frame: &ExceptionFrame) -> ! {
    println!("kvm-mcu: hard fault at pc {:#010x}", frame.pc());
    semihosting::process::exit(102)
}

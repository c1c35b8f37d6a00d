//! Cortex-M (`cortex-m-rt`): SysTick as the tick counter, the stack painted by
//! `cortex-m-rt`'s `paint-stack` at reset, hard faults reported and turned into exit 102.
//! ARMv6-M builds (`thumbv6m`, the an385 board) also trap unaligned accesses.

use core::sync::atomic::{AtomicU32, Ordering};
use cortex_m::peripheral::syst::SystClkSource;
use cortex_m::peripheral::{SCB, SYST};
use cortex_m_rt::{exception, ExceptionFrame};
use semihosting::println;

const RELOAD: u32 = 0x00ff_ffff;
static WRAPS: AtomicU32 = AtomicU32::new(0);

/// Starts the tick counter (the stack is already painted); on ARMv6-M, also traps
/// unaligned accesses.
pub fn init() {
    let Some(p) = cortex_m::Peripherals::take() else { return };
    #[cfg(armv6m)]
    trap_unaligned(&p.SCB);
    let mut syst = p.SYST;
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(RELOAD);
    syst.clear_current();
    syst.enable_interrupt();
    syst.enable_counter();
    // The count reads 0 until the first tick loads RELOAD; wait for it so that the first
    // reading is not a whole period ahead of the next.
    while SYST::get_current() == 0 {}
}

/// Processor clock ticks since [`init`], from SysTick (24 bits) and its wrap interrupt. On
/// hardware that is CPU cycles; in QEMU it follows virtual time, which under
/// `-icount shift=0` advances 1 ns per instruction (see README.md).
pub fn ticks() -> u64 {
    loop {
        let before = WRAPS.load(Ordering::Relaxed);
        let (mut wraps, mut current) = (before, SYST::get_current());
        // Wrapped but the interrupt is not taken yet (QEMU takes it only at the end of a
        // translation block): count that wrap, with a count read after it.
        if SCB::is_pendst_pending() {
            wraps += 1;
            current = SYST::get_current();
        }
        // The interrupt ran in between: start again.
        if WRAPS.load(Ordering::Relaxed) == before {
            return u64::from(wraps) * (u64::from(RELOAD) + 1) + u64::from(RELOAD - current);
        }
    }
}

#[exception]
fn SysTick() {
    // A load and a store, not `fetch_add`: ARMv6-M has no atomic read-modify-write, and
    // none is needed: this handler is the only writer and an exception never preempts
    // itself, so no increment is lost between the two (`ticks` only reads).
    WRAPS.store(WRAPS.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
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

//! Cortex-M (`cortex-m-rt`): SysTick as the tick counter, the stack painted by
//! `cortex-m-rt`'s `paint-stack` at reset, hard faults reported and turned into exit 102.

use core::sync::atomic::{AtomicU32, Ordering};
use cortex_m::peripheral::syst::SystClkSource;
use cortex_m::peripheral::{SCB, SYST};
use cortex_m_rt::{exception, ExceptionFrame};
use semihosting::println;

const RELOAD: u32 = 0x00ff_ffff;
static WRAPS: AtomicU32 = AtomicU32::new(0);

/// Starts the tick counter (the stack is already painted).
pub fn init() {
    let Some(p) = cortex_m::Peripherals::take() else { return };
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
    WRAPS.fetch_add(1, Ordering::Relaxed);
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

//! A 64-bit cycle counter on Cortex-M from SysTick (24 bits, on the processor clock) and its
//! wrap interrupt: the tick counter of the Arm boards. The firmware owns the exception
//! vector and calls [`wrapped`] from its `SysTick` handler.

use core::sync::atomic::{AtomicU32, Ordering};

use cortex_m::peripheral::syst::SystClkSource;
use cortex_m::peripheral::{SCB, SYST};

const RELOAD: u32 = 0x00ff_ffff;
static WRAPS: AtomicU32 = AtomicU32::new(0);

/// Starts SysTick on the processor clock with its wrap interrupt.
pub fn start(mut syst: SYST) {
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(RELOAD);
    syst.clear_current();
    syst.enable_interrupt();
    syst.enable_counter();
    // The count reads 0 until the first tick loads RELOAD; wait for it so that the first
    // reading is not a whole period ahead of the next.
    while SYST::get_current() == 0 {}
}

/// Processor clock ticks since [`start`]: CPU cycles on a chip; in QEMU virtual time,
/// which under `-icount shift=0` advances 1 ns per instruction.
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

/// Counts one wrap: call it from the `SysTick` exception handler, and only there.
pub fn wrapped() {
    // A load and a store, not `fetch_add`: ARMv6-M has no atomic read-modify-write, and
    // none is needed: the handler is the only writer and an exception never preempts
    // itself, so no increment is lost between the two (`ticks` only reads).
    WRAPS.store(WRAPS.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

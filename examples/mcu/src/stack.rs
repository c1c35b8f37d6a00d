//! Stack high-water mark: the stack region is painted with a fixed word at start-up (by
//! `cortex-m-rt`'s `paint-stack` on Arm, by `arch::init` on RISC-V); the deepest word that
//! no longer holds it is how far the stack has reached. Shared by both firmwares.

use crate::arch::stack_region;

pub const PAINT: u32 = 0xcccc_cccc;

/// Bytes between the bottom of the stack region and the top of RAM.
pub fn size() -> usize {
    let (bottom, top) = stack_region();
    top - bottom
}

/// Bytes the stack has reached below its top so far.
pub fn used() -> usize {
    let (mut p, top) = stack_region();
    // Scan up from the bottom of the stack region until the paint is gone.
    while p < top {
        // SAFETY: `[bottom, top)` is the stack region, word-aligned RAM that the
        // linker script reserves; reading it is always defined.
        if unsafe { core::ptr::read_volatile(p as *const u32) } != PAINT {
            break;
        }
        p += 4;
    }
    top - p
}

//! Stack high-water mark: the firmware paints its stack region with [`PAINT`] at start-up
//! (`cortex-m-rt`'s `paint-stack` feature does it on Arm); the deepest word that no longer
//! holds it is how far the stack has reached.

/// The word the stack region is painted with.
pub const PAINT: u32 = 0xcccc_cccc;

/// Bytes the stack has reached below `top` so far, in the painted region `[bottom, top)`.
///
/// # Safety
/// `[bottom, top)` must be word-aligned memory that is always readable (the stack region
/// the linker script reserves).
pub unsafe fn used(bottom: usize, top: usize) -> usize {
    let mut p = bottom;
    // Scan up from the bottom of the stack region until the paint is gone.
    while p < top {
        // SAFETY: the caller vouches that `[bottom, top)` is readable, aligned memory.
        if unsafe { core::ptr::read_volatile(p as *const u32) } != PAINT {
            break;
        }
        p += 4;
    }
    top - p
}

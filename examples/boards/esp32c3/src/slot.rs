//! The model slot (feature `slot`): the flash partition `model` (partitions.csv), mapped into
//! the data bus so `Model::from_bytes` can borrow it in place.
//!
//! The ESP32-C3 reads flash only through its cache, and the cache reaches a flash page only
//! through an entry of its MMU (ESP32-C3 Technical Reference Manual, chapter "System and
//! Memory", External Memory: 64 KiB pages, one 128-entry table shared by the data bus at
//! 0x3C00_0000 and the instruction bus at 0x4200_0000). The ESP-IDF second-stage bootloader
//! invalidates every entry, then maps the app's segments from entry 0 (its read-only data,
//! then its code after it, in the same linear space); esp-hal's memory map keeps both
//! within the first 4 MiB of the buses (its DROM and IROM regions), which is entries 0..64.
//! So the slot's window starts at entry 64, the data-bus address 0x3C40_0000: nothing the
//! linker places can be there, and before writing, each entry is checked to be unused.
//!
//! Not run on a chip or an emulator (none is here); the sequence is ESP-IDF's own for a
//! mapping made by an app (`s_do_mapping` in `components/esp_mm/esp_mmu_map.c`: the cache
//! suspended, the entries written as `mmu_ll_write_entry` does for the ESP32-C3, the
//! range's cache lines invalidated, the cache resumed).

use kvm_board_app::mmu::{MapError, Mmu};

use crate::slot_info::{SLOT_FLASH, SLOT_LEN};

/// The first MMU entry of the slot's window: past the 4 MiB esp-hal's memory map gives the
/// image's read-only data and code.
const FIRST_ENTRY: usize = 64;
/// The MMU table (`DR_REG_MMU_TABLE`): one 32-bit word an entry.
const MMU_TABLE: usize = 0x600C_5000;
/// An entry's bit 8: the entry maps nothing. Bits 0..8 are the flash page number.
const INVALID: u32 = 1 << 8;

/// Maps the slot (every entry checked unused, or already mapping the same page) and returns
/// its bytes on the data bus.
///
/// # Errors
/// [`MapError`] when the partition is not whole pages, falls outside the table or the
/// flash, or an entry of the window maps something else.
pub fn map() -> Result<&'static [u8], MapError> {
    let m = Mmu::ESP32C3.map(SLOT_FLASH, SLOT_LEN, FIRST_ENTRY)?;
    for (entry, page) in m.pages() {
        // SAFETY: `map` bounded `entry` by the table's 128 entries; reading an entry has no
        // side effect.
        let now = unsafe { ((MMU_TABLE + 4 * entry) as *const u32).read_volatile() };
        if now & INVALID == 0 && now as usize != page {
            return Err(MapError::InUse { entry });
        }
    }
    // `map` bounded the page numbers by 256 and the window by the table and by the buses'
    // 8 MiB, so the values fit the entries' 8 bits and `u32`.
    let (first_page, n, vaddr, len) = (m.first_page as u32, m.entries.len(), m.vaddr as u32, m.len as u32);
    // SAFETY: the entries are unused (checked above), so no code or data of the image moves;
    // no interrupt runs while the cache is suspended.
    critical_section::with(|_| unsafe { write_entries(m.entries.start, first_page, n, vaddr, len) });
    // SAFETY: the window now maps the partition, which nothing writes while the firmware
    // runs, for as long as the firmware runs.
    Ok(unsafe { kvm_board_app::slot::at(m.vaddr, m.len) })
}

/// Writes entries `first_entry..first_entry + n` to map flash pages `first_page..` with the
/// cache suspended, then invalidates the window's cache lines (any left from before the
/// mapping) and resumes the cache. In RAM (`#[ram]`: `.rwtext`, never inlined), and it
/// reads nothing from flash: while the cache is suspended, flash cannot be reached. The
/// `Cache_*` functions are the chip's ROM (addresses from esp-rom-sys's `esp32c3.rom.ld`).
///
/// # Safety
/// The entries must be unused, and nothing may run from flash meanwhile (interrupts off).
#[esp_hal::ram]
unsafe fn write_entries(first_entry: usize, first_page: u32, n: usize, vaddr: u32, len: u32) {
    extern "C" {
        fn Cache_Suspend_ICache() -> u32;
        fn Cache_Invalidate_Addr(addr: u32, size: u32) -> i32;
        fn Cache_Resume_ICache(autoload: u32);
    }
    // SAFETY: the caller's contract; the table's words are the entries (a page number, bit 8
    // clear: valid, in flash).
    unsafe {
        let autoload = Cache_Suspend_ICache();
        let mut k = 0;
        while k < n {
            let entry = (MMU_TABLE + 4 * (first_entry + k)) as *mut u32;
            entry.write_volatile(first_page + k as u32);
            k += 1;
        }
        // Always 0 here: the window is on the data bus and whole pages.
        let _ = Cache_Invalidate_Addr(vaddr, len);
        Cache_Resume_ICache(autoload);
    }
}

//! A model slot behind a cache MMU: on a chip that reads flash only through its cache (the
//! ESP32-C3), a flash range is readable once MMU entries map its pages into the data bus.
//! This is the arithmetic of that mapping, apart from the registers: which entries, which
//! flash pages, which virtual address, all bounds checked. The firmware writes the entries.
//!
//! The MMU's shape (the ESP32-C3's: [`Mmu::ESP32C3`]): a table of `entries` entries, entry
//! `i` maps the virtual page `vbase + i * page_len` to one physical flash page, given by its
//! number (`flash address / page_len`), of which the entry holds at most `flash_pages`.

use core::fmt;
use core::ops::Range;

/// A cache MMU's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mmu {
    /// The data bus's first virtual address (entry 0).
    pub vbase: usize,
    /// Bytes a page (and an entry) maps.
    pub page_len: usize,
    /// Entries in the table.
    pub entries: usize,
    /// Flash pages an entry can name (the page number's range).
    pub flash_pages: usize,
}

impl Mmu {
    /// The ESP32-C3's: 128 entries of 64 KiB pages, shared by its data bus (DBUS0 at
    /// 0x3C00_0000) and its instruction bus (0x4200_0000, same entry for the same offset);
    /// an entry's page number has 8 bits (16 MiB of flash). ESP-IDF `soc/ext_mem_defs.h`
    /// (`SOC_MMU_ENTRY_NUM`, `SOC_MMU_DBUS_VADDR_BASE`, `SOC_MMU_VALID_VAL_MASK`).
    pub const ESP32C3: Mmu = Mmu { vbase: 0x3C00_0000, page_len: 0x1_0000, entries: 128, flash_pages: 256 };

    /// The mapping of the flash range `[flash, flash + len)` at entries from `first_entry` on.
    ///
    /// # Errors
    /// [`MapError`]: an empty range, a start or length off a page boundary, entries past the
    /// table's end, or flash pages past what an entry can name.
    pub fn map(&self, flash: usize, len: usize, first_entry: usize) -> Result<Mapping, MapError> {
        let whole = |n: usize| n.is_multiple_of(self.page_len);
        if len == 0 || !whole(flash) || !whole(len) {
            return Err(MapError::Unaligned { flash, len, page_len: self.page_len });
        }
        let pages = len / self.page_len;
        let first_page = flash / self.page_len;
        let entries = first_entry
            ..first_entry.checked_add(pages).filter(|&end| end <= self.entries).ok_or(MapError::PastTable {
                first_entry,
                pages,
                entries: self.entries,
            })?;
        if first_page.checked_add(pages).is_none_or(|end| end > self.flash_pages) {
            return Err(MapError::PastFlash { flash, len, flash_len: self.flash_pages * self.page_len });
        }
        Ok(Mapping { vaddr: self.vbase + first_entry * self.page_len, len, entries, first_page })
    }
}

/// Where a flash range appears once mapped: entry `entries.start + k` holds flash page
/// `first_page + k`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// The range's first byte on the data bus.
    pub vaddr: usize,
    /// Bytes mapped.
    pub len: usize,
    /// The table entries written, in order.
    pub entries: Range<usize>,
    /// The flash page number the first entry holds.
    pub first_page: usize,
}

impl Mapping {
    /// `(entry, flash page number)` for every entry of the mapping.
    pub fn pages(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.entries.clone().zip(self.first_page..)
    }
}

/// Why a flash range cannot be mapped (in words through `Display`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum MapError {
    /// Empty, or not whole pages.
    Unaligned { flash: usize, len: usize, page_len: usize },
    /// More entries than the table has from `first_entry`.
    PastTable { first_entry: usize, pages: usize, entries: usize },
    /// Flash beyond what an entry can address.
    PastFlash { flash: usize, len: usize, flash_len: usize },
    /// An entry the mapping needs already maps another page (the boot loader's, or the
    /// image's own): the slot's window would hide it.
    InUse { entry: usize },
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MapError::Unaligned { flash, len, page_len } => {
                write!(f, "the model slot ({len} bytes at flash {flash:#x}) is not whole {page_len}-byte MMU pages")
            }
            MapError::PastTable { first_entry, pages, entries } => {
                write!(f, "the model slot needs MMU entries {first_entry}..{} of {entries}", first_entry + pages)
            }
            MapError::PastFlash { flash, len, flash_len } => {
                write!(
                    f,
                    "the model slot ({len} bytes at flash {flash:#x}) ends past the {flash_len} bytes the MMU maps"
                )
            }
            MapError::InUse { entry } => write!(f, "MMU entry {entry}, needed for the model slot, is in use"),
        }
    }
}

impl core::error::Error for MapError {}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;
    use std::vec::Vec;

    use super::*;

    const C3: Mmu = Mmu::ESP32C3;

    #[test]
    fn the_esp32c3_slot_maps_at_its_window() {
        // 2 MiB of flash from 0x20_0000 at entry 64: 0x3C40_0000, entries 64..96.
        let m = C3.map(0x20_0000, 0x20_0000, 64).unwrap();
        assert_eq!(m.vaddr, 0x3C40_0000);
        assert_eq!(m.entries, 64..96);
        assert_eq!(m.first_page, 0x20);
        let pages: Vec<_> = m.pages().collect();
        assert_eq!(pages.len(), 32);
        assert_eq!(pages[0], (64, 0x20));
        assert_eq!(pages[31], (95, 0x3F));
    }

    #[test]
    fn ranges_off_page_boundaries_are_refused() {
        for (flash, len) in [(0x20_0000, 0), (0x20_0100, 0x1_0000), (0x20_0000, 0x1_0001)] {
            assert_eq!(C3.map(flash, len, 64), Err(MapError::Unaligned { flash, len, page_len: 0x1_0000 }));
        }
    }

    #[test]
    fn the_table_and_the_flash_bound_the_mapping() {
        // The last entry is 127: 2 pages from 127 do not fit; 1 does.
        assert_eq!(C3.map(0, 0x2_0000, 127), Err(MapError::PastTable { first_entry: 127, pages: 2, entries: 128 }));
        assert_eq!(C3.map(0, 0x1_0000, 127).unwrap().vaddr, 0x3C7F_0000);
        assert!(matches!(C3.map(0, 0x1_0000, usize::MAX), Err(MapError::PastTable { .. })));
        // 16 MiB of flash is addressable; a page past it is not.
        assert_eq!(C3.map(0xFF_0000, 0x1_0000, 0).unwrap().first_page, 0xFF);
        assert_eq!(
            C3.map(0xFF_0000, 0x2_0000, 0),
            Err(MapError::PastFlash { flash: 0xFF_0000, len: 0x2_0000, flash_len: 0x100_0000 })
        );
        assert!(matches!(C3.map(usize::MAX - 0xFFFF, 0x1_0000, 0), Err(MapError::PastFlash { .. })));
    }

    #[test]
    fn refusals_read_as_words() {
        let e = C3.map(0x20_0000, 0x1_0000, 128).unwrap_err();
        assert_eq!(e.to_string(), "the model slot needs MMU entries 128..129 of 128");
        assert_eq!(MapError::InUse { entry: 64 }.to_string(), "MMU entry 64, needed for the model slot, is in use");
    }
}

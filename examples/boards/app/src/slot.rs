//! A model flashed apart from the firmware, at a fixed address: the model slot. A user swaps
//! models without rebuilding (`picotool load`, `espflash write-bin`, a debugger) and the
//! firmware says in words when the slot holds none or a bad one.

use core::fmt;

use kvm_core::format::{Header, HEADER_LEN};

/// Why the model slot gives no model. `at` is the slot's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum SlotError {
    /// The slot's first bytes read as erased flash (all 0xFF) or empty memory (all 0x00).
    Empty { at: usize, fill: u8 },
    /// The header declares a file longer than the slot.
    TooLong { at: usize, declared: u64, slot_len: usize },
    /// The bytes there are not a model the core accepts.
    Bad { at: usize, error: kvm_core::Error },
}

impl fmt::Display for SlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SlotError::Empty { at, fill: 0xff } => write!(f, "no model at {at:#010x}: the slot is erased (0xFF)"),
            SlotError::Empty { at, fill } => write!(f, "no model at {at:#010x}: the slot is blank ({fill:#04x})"),
            SlotError::TooLong { at, declared, slot_len } => {
                write!(f, "bad model at {at:#010x}: its header declares {declared} bytes, the slot holds {slot_len}")
            }
            SlotError::Bad { at, error } => write!(f, "bad model at {at:#010x}: {error}"),
        }
    }
}

impl core::error::Error for SlotError {}

/// The model file at the start of `slot`: as many bytes as its header declares, bounded by
/// the slot. Only the header's front is checked here (magic, version, byte order, header
/// CRC); validate the returned bytes with `Model::from_bytes` ([`crate::validate`]) and map
/// its error with [`SlotError::bad`]. Reads nothing outside `slot`.
///
/// # Errors
/// [`SlotError::Empty`] for erased or zeroed memory, [`SlotError::TooLong`] when the file
/// does not fit the slot, [`SlotError::Bad`] when the header's front is wrong.
pub fn read(slot: &'static [u8]) -> Result<&'static [u8], SlotError> {
    let at = slot.as_ptr() as usize;
    let head = slot.get(..HEADER_LEN).unwrap_or(slot);
    if let Some(&fill @ (0x00 | 0xff)) = head.first() {
        if head.iter().all(|&b| b == fill) {
            return Err(SlotError::Empty { at, fill });
        }
    }
    let declared = Header::stated_file_len(head).map_err(|error| SlotError::Bad { at, error })?;
    usize::try_from(declared).ok().and_then(|len| slot.get(..len)).ok_or(SlotError::TooLong {
        at,
        declared,
        slot_len: slot.len(),
    })
}

impl SlotError {
    /// The slot at `slot` holds bytes the core refused with `error`.
    pub fn bad(slot: &[u8], error: kvm_core::Error) -> SlotError {
        SlotError::Bad { at: slot.as_ptr() as usize, error }
    }
}

/// The slot `[addr, addr + len)` as bytes.
///
/// # Safety
/// The range must be memory that is always readable (flash, or RAM a loader filled) and
/// that nothing writes while the firmware runs.
pub unsafe fn at(addr: usize, len: usize) -> &'static [u8] {
    // SAFETY: the caller vouches for the range.
    unsafe { core::slice::from_raw_parts(addr as *const u8, len) }
}

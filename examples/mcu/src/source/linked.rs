//! The default build's model and memory: the model file linked into flash, the arena and
//! the sampler scratch in statics sized at build time.

use kvm_core::Model;
use semihosting::println;

use crate::model_info::{ARENA_LEN, MODEL_LEN};
use crate::{Fail, Semihosting};

/// A value on a 64-byte boundary: tensor data is 64-aligned within the model file, and the
/// arena must start on [`kvm_core::state::ARENA_ALIGN`].
#[repr(C, align(64))]
struct Aligned<T: ?Sized>(T);

const _: () = assert!(core::mem::align_of::<Aligned<u8>>() == kvm_core::state::ARENA_ALIGN);

/// The model file, in flash, decoded in place (never copied to RAM); in the board's
/// `.kvm_model` region where its memory map has one (see build.rs).
#[cfg_attr(model_section, link_section = ".kvm_model")]
static MODEL: Aligned<[u8; MODEL_LEN]> = Aligned(*include_bytes!(env!("KVM_MCU_MODEL_PATH")));

/// The session arena (`.bss`).
static mut ARENA: Aligned<[u8; ARENA_LEN]> = Aligned([0; ARENA_LEN]);
/// The sampler's scratch (`.bss`).

/// The linked model, validated, with the arena and sampler scratch it was built for.
/// Call once.
pub fn open(board: &mut Semihosting) -> Result<(Model<'static>, &'static mut [u8]), Fail> {
    let arena = &raw mut ARENA;
    // SAFETY: called once, from the entry, and nothing else names these statics, so these
    // are the only references to them.
    let arena = unsafe { &mut (*arena).0 };
    let blob: &'static [u8] = &MODEL.0;
    println!(
        "kvm-mcu: model {} bytes at {:#010x} (flash), arena {} bytes at {:#010x}",
        blob.len(),
        blob.as_ptr() as usize,
        arena.len(),
        arena.as_ptr() as usize
    );
    let model = kvm_board_app::validate(board, blob)?;
    let arena = kvm_board_app::fit(&model, arena)?;
    Ok((model, arena))
}

//! The `heap` build's model and memory: a model file found in the board's model slot
//! (written apart from the firmware), the attention cache from the command line, and the
//! arena allocated from an `embedded-alloc` heap, sized from the
//! model (`Model::arena_len`, what the C API's `kvm_arena_size` reports).

use core::alloc::Layout;
use core::mem::MaybeUninit;

use embedded_alloc::LlffHeap;
use kvm_core::cache::CacheDtype;
use kvm_core::state::ARENA_ALIGN;
use kvm_core::Model;
use semihosting::println;

use crate::model_info::HEAP_LEN;
use crate::{Fail, Semihosting};

#[global_allocator]
static HEAP: LlffHeap = LlffHeap::empty();

/// The heap's memory (`.bss`).
static mut HEAP_MEM: [MaybeUninit<u8>; HEAP_LEN] = [MaybeUninit::uninit(); HEAP_LEN];

extern "C" {
    /// The model slot, `[_kvm_model_slot, + _kvm_model_slot_len)` (the board's memory map);
    /// only the symbols' addresses are taken.
    static _kvm_model_slot: u8;
    static _kvm_model_slot_len: u8;
}

/// Bytes of the command line the firmware reads.
const ARGS_LEN: usize = 128;

/// The model in the slot, validated and set to the command line's cache, with an arena
/// for it from the heap. Call once.
pub fn open(board: &mut Semihosting) -> Result<(Model<'static>, &'static mut [u8]), Fail> {
    let (start, len) = (&raw const _kvm_model_slot as usize, &raw const _kvm_model_slot_len as usize);
    // SAFETY: the memory map makes the model slot readable memory (RAM or flash) that
    // nothing writes while the firmware runs.
    let slot = unsafe { kvm_board_app::slot::at(start, len) };
    let cache = cache_arg()?;
    let model = kvm_board_app::find_model(board, slot).map_err(kvm_board_app::Fail::from)?;
    let blob = model.blob();
    let model = match cache {
        Some(c) => model.with_cache(c)?,
        None => model,
    };
    // SAFETY: called once, from the entry, before anything allocates; HEAP_MEM is named
    // nowhere else.
    unsafe { HEAP.init((&raw mut HEAP_MEM) as usize, HEAP_LEN) };

    let arena_len = model.arena_len();
    let need = arena_len;
    let full = Fail::HeapFull { need, heap: HEAP_LEN };
    let layout = Layout::from_size_align(arena_len, ARENA_ALIGN).map_err(|_| full)?;
    // SAFETY: `layout` has a non-zero size (a session's arena holds at least its counters).
    let arena = unsafe { alloc::alloc::alloc_zeroed(layout) };
    if arena.is_null() {
        return Err(Fail::HeapFull { need, heap: HEAP_LEN });
    }
    // SAFETY: `arena` is `arena_len` zeroed bytes, allocated here and never freed.
    let arena: &'static mut [u8] = unsafe { core::slice::from_raw_parts_mut(arena, arena_len) };

    println!(
        "kvm-mcu: model {} bytes at {:#010x} (model slot), cache {}, arena {} bytes at {:#010x} (heap of {} bytes)",
        blob.len(),
        blob.as_ptr() as usize,
        model.cache().name(),
        arena.len(),
        arena.as_ptr() as usize,
        HEAP_LEN
    );
    Ok((model, arena))
}

/// `--cache C` from the semihosting command line (the program name first), if given.
fn cache_arg() -> Result<Option<CacheDtype>, Fail> {
    let Ok(args) = semihosting::experimental::env::args::<ARGS_LEN>() else { return Ok(None) };
    let mut args = (&args).skip(1);
    match (args.next(), args.next(), args.next()) {
        (None, ..) => Ok(None),
        (Some(Ok("--cache")), Some(Ok(name)), None) => CacheDtype::from_name(name).map(Some).ok_or(Fail::Usage),
        _ => Err(Fail::Usage),
    }
}

//! Heap arenas with the alignment sessions need.

use kvm_core::state::ARENA_ALIGN;

/// A zeroed, [`ARENA_ALIGN`]-aligned byte buffer of an exact length.
#[derive(Debug)]
pub struct Arena {
    buf: Vec<Block>,
    len: usize,
}

#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Block([u8; ARENA_ALIGN]);

const _: () = assert!(core::mem::align_of::<Block>() == ARENA_ALIGN);

impl Arena {
    /// A buffer of exactly `len` bytes.
    pub fn new(len: usize) -> Self {
        Arena { buf: vec![Block([0; ARENA_ALIGN]); len.div_ceil(ARENA_ALIGN)], len }
    }

    /// The buffer, `len` bytes, 64-byte aligned.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        let all: &mut [u8] = bytemuck_blocks(&mut self.buf);
        &mut all[..len]
    }
}

fn bytemuck_blocks(b: &mut [Block]) -> &mut [u8] {
    // SAFETY: `Block` is a plain byte array with no padding; any bytes are valid.
    unsafe { core::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<u8>(), b.len() * ARENA_ALIGN) }
}

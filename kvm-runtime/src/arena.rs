//! Memory the runtime sizes from a model file: session arenas and the buffers of a batch,
//! the logits and the sampler. All of it comes from [`zeroed`], the one allocation path
//! that can fail: a file whose config asks for more memory than the process may have (a
//! huge state, `ulimit -v`) gets [`Error::OutOfMemory`], never an abort.

use std::alloc::Layout;

use bytemuck::Zeroable;
use kvm_core::state::ARENA_ALIGN;
use kvm_core::Error;

/// A zeroed, [`ARENA_ALIGN`]-aligned byte buffer of an exact length.
#[derive(Debug)]
pub struct Arena {
    buf: Vec<Block>,
    len: usize,
}

#[derive(Debug, Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(64))]
struct Block([u8; ARENA_ALIGN]);

const _: () = assert!(core::mem::align_of::<Block>() == ARENA_ALIGN);

impl Arena {
    /// A buffer of exactly `len` bytes.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the system refuses the memory.
    pub fn try_new(len: usize) -> Result<Self, Error> {
        Ok(Arena { buf: zeroed(len.div_ceil(ARENA_ALIGN))?, len })
    }

    /// [`Arena::try_new`] for tests and benches, whose arenas are small.
    ///
    /// # Panics
    /// When the system refuses the memory.
    pub fn new(len: usize) -> Self {
        Arena::try_new(len).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The buffer, `len` bytes, 64-byte aligned.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut bytemuck::cast_slice_mut::<Block, u8>(&mut self.buf)[..len]
    }
}

/// `len` zeroed values of `T` (`bytemuck::Zeroable`: all-zero bytes are a valid `T`), or
/// [`Error::OutOfMemory`] when the system refuses them.
/// Zeroed by the allocator (`calloc`), so pages of a large buffer that are never written
/// are never touched.
///
/// # Errors
/// [`Error::OutOfMemory`] (also when the size overflows).
pub fn zeroed<T: Zeroable>(len: usize) -> Result<Vec<T>, Error> {
    let oom = Error::OutOfMemory { bytes: len.saturating_mul(size_of::<T>()) };
    let layout = Layout::array::<T>(len).map_err(|_| oom)?;
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the layout's size is not zero.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(oom);
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `[T; len]` (`T`'s
    // alignment, `len * size_of::<T>()` bytes), and its zero bytes are `len` valid `T`s.
    Ok(unsafe { Vec::from_raw_parts(ptr.cast::<T>(), len, len) })
}

#[cfg(test)]
mod tests {
    use kvm_core::sampler::Candidate;

    use super::*;

    #[test]
    fn memory_the_system_refuses_is_an_error() {
        assert_eq!(zeroed::<f32>(usize::MAX / 2).unwrap_err(), Error::OutOfMemory { bytes: usize::MAX });
        assert!(matches!(Arena::try_new(isize::MAX as usize - 63), Err(Error::OutOfMemory { .. })));
        let v = zeroed::<Candidate>(1000).unwrap();
        assert!(v.iter().all(|c| *c == Candidate::EMPTY) && v.capacity() == 1000);
        let mut a = Arena::try_new(100).unwrap();
        assert_eq!(a.bytes_mut().len(), 100);
        assert_eq!(a.bytes_mut().as_ptr() as usize % ARENA_ALIGN, 0);
        assert!(zeroed::<u8>(0).unwrap().is_empty());
    }
}

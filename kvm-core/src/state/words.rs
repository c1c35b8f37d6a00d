//! The arena's unit: words of 4 bytes in 64-byte-aligned parts, and how parts are cut.

/// Required alignment of the arena's first byte.
pub const ARENA_ALIGN: usize = 64;

/// Words per alignment unit.
pub(crate) const UNIT: usize = ARENA_ALIGN / 4;

/// Parts of a layer's state ([`crate::state::Layout`]).
pub(crate) const LAYER_PARTS: usize = 12;

/// `n` words rounded up to whole units.
#[inline]
pub(crate) const fn pad(n: usize) -> usize {
    n.div_ceil(UNIT) * UNIT
}

/// Splits `n` words (padded to whole units) off the front of `buf`.
#[inline]
pub(crate) fn take<'s>(buf: &mut &'s mut [f32], n: usize) -> &'s mut [f32] {
    let b = core::mem::take(buf);
    let (head, tail) = b.split_at_mut(pad(n));
    *buf = tail;
    &mut head[..n]
}

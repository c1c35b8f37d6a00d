//! The arena's unit: words of 4 bytes in 64-byte-aligned parts, how parts are cut, and
//! what a numerics tells [`crate::state::Layout`] about its parts ([`ArenaWords`]).

use crate::cache::SlotReads;
use crate::config::Config;

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

/// What a session's numerics takes of the arena, which [`crate::state::Layout`] asks it
/// for: the float numerics' (`arena.rs`) or the integer numerics' (`arena_int.rs`).
pub(crate) trait ArenaWords {
    /// Words of each part of a KVM layer's state and of an alternate layer's, for a
    /// session of `cfg` holding `state_len` slots, its slot reads where `reads` says
    /// (`None` on overflow).
    fn layer_words(&self, cfg: &Config, state_len: usize, reads: SlotReads) -> Option<[[usize; LAYER_PARTS]; 2]>;

    /// Words of a step's scratch.
    fn scratch_words(&self, cfg: &Config, state_len: usize, reads: SlotReads) -> Option<usize>;
}

//! Session state inside the caller's arena.

/// Required alignment of the arena.
pub const ARENA_ALIGN: usize = 64;

/// A decoding session.
#[derive(Debug)]
pub struct Session<'m, 'a> {
    pub model: crate::Model<'m>,
    pub arena: &'a mut [u8],
}

//! The weights view and the forward pass.

/// A validated model borrowed from its blob.
#[derive(Debug, Clone, Copy)]
pub struct Model<'a> {
    pub blob: &'a [u8],
}

//! The integer numerics (docs/integer.md), for files exported with `--numerics int`
//! (`flags::INT_NUMERICS`), on [`crate::fixed`]'s arithmetic: `ops` (products, rows,
//! norms) -> `head` (a head's state and attention). The forward pass's integer operations
//! are `forward/int.rs`'s.

pub(crate) mod head;
pub(crate) mod ops;

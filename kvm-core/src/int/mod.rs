//! The integer numerics (docs/integer.md): every operation of a step in integers, for
//! files exported with `--numerics int` (`flags::INT_NUMERICS`), on [`crate::fixed`]'s
//! arithmetic: `ops` (products, rows, norms) -> `head` (a head's state and attention) ->
//! `forward` (the step).

pub(crate) mod forward;
pub(crate) mod head;
pub(crate) mod ops;

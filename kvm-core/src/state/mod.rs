//! A session's decode state and its updates (spec §3), in the caller's arena, in the order
//! a step uses them: `arena` (the layout and the views carved from it) -> `plan` (what
//! this token does to the state) -> `means` (the compressed state: initial appends,
//! folds, merges) -> `attend` (the window ring and attention reads).
//!
//! Nothing here knows the model file: weights come in as [`crate::tensor`] views and
//! splittable work goes through [`crate::exec::Exec`].

pub(crate) mod arena;
pub(crate) mod attend;
pub(crate) mod means;
pub(crate) mod plan;

pub(crate) use arena::{Acts, LayerState, Scratch};
pub use arena::{Layout, ARENA_ALIGN};
pub(crate) use attend::HeadReader;
pub(crate) use means::HeadState;
pub use plan::{bswa_begin, growth_stops, state_slots, Phase};
pub(crate) use plan::{coverage_at, Counters, Plan, Segment, SEGMENT_LEN};

//! A session's decode state and its updates (spec §3), in the caller's arena, in the order
//! a step uses them: `words` (the arena's unit) -> `arena_int` (an integer session's parts)
//! -> `arena` (the layout and the views carved from it) -> `plan` (what this token does to
//! the state) -> `fold` (a head's writes, a token's and a fold's, written once over the
//! numerics) -> `update` (their float arithmetic: initial slots, window pushes, folds) ->
//! `attend` (every read: attention over the slots and the window) -> `schedule` (step 7 of
//! a layer over a batch: runs, segments, the heads' jobs).
//!
//! Nothing here knows the model file: weights come in as [`crate::tensor`] views and
//! splittable work goes through [`crate::exec::Exec`].

pub(crate) mod arena;
pub(crate) mod arena_int;
pub(crate) mod attend;
pub(crate) mod fold;
pub(crate) mod plan;
pub(crate) mod schedule;
pub(crate) mod update;
pub(crate) mod words;

pub(crate) use arena::{Acts, LayerState, Scratch};
pub use arena::{Layout, ARENA_ALIGN};
pub(crate) use attend::ring_runs;
pub use plan::{bswa_begin, growth_stops, state_slots, Phase};
pub(crate) use plan::{coverage_at, Counters};
pub(crate) use schedule::LayerStep;

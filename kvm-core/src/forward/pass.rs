//! One forward pass's context: what every step reads ([`Pass`]), the arena's parts it
//! writes ([`Work`]), and how its per-token rows are spread through [`Exec::pieces`].

use crate::exec::Exec;
use crate::math::{layer_norm, Rope};
use crate::model::Model;
use crate::state::{Acts, Counters, Layout, Phase, Scratch};
use crate::tensor::Vector;

/// What every step of one forward pass reads.
pub(crate) struct Pass<'p, 'm> {
    pub(super) model: &'p Model<'m>,
    /// The RoPE tables' frequencies: KVM layers', alternate layers' (spec §5).
    pub(super) rope: &'p Rope,
    pub(super) alt_rope: &'p Rope,
    /// The session's arena.
    pub(super) lay: &'p Layout,
    /// The counters before the batch.
    pub(super) at: Counters,
    pub(super) phase: Phase,
    /// Who runs the splittable work.
    pub(super) exec: &'p dyn Exec,
}

impl<'p, 'm> Pass<'p, 'm> {
    /// A pass of `model` over a session laid out by `lay`, at counters `at`, whose
    /// splittable work `exec` runs.
    #[inline]
    pub(crate) fn new(
        model: &'p Model<'m>,
        (rope, alt_rope): (&'p Rope, &'p Rope),
        lay: &'p Layout,
        at: Counters,
        phase: Phase,
        exec: &'p dyn Exec,
    ) -> Self {
        Pass { model, rope, alt_rope, lay, at, phase, exec }
    }
}

/// The parts of the arena (and of the caller's batch buffer) one forward pass writes.
pub(crate) struct Work<'w, 's> {
    /// Every layer's state ([`Layout::carve_layer`]).
    pub(super) layers: &'w mut [f32],
    /// One layer's slot reads when they are recomputed, else empty.
    pub(super) reads: &'w mut [f32],
    pub(super) s: &'w mut Scratch<'s>,
    /// The batch's activations.
    pub(super) x: &'w mut Acts<'s>,
}

impl<'w, 's> Work<'w, 's> {
    /// The layers' state `layers` (slot reads in `reads`), the step's scratch `s` and the
    /// batch's activations `x`.
    #[inline]
    pub(crate) fn new(
        layers: &'w mut [f32],
        reads: &'w mut [f32],
        s: &'w mut Scratch<'s>,
        x: &'w mut Acts<'s>,
    ) -> Self {
        Work { layers, reads, s, x }
    }
}

/// Token rows per piece of the per-token work spread through [`Exec::pieces`] (norms,
/// RoPE): a batch's rows split across threads, a single token's run in place.
pub(super) const ROWS_PER_PIECE: usize = 8;

impl Pass<'_, '_> {
    /// `out[i] = LN(x[i])` for every `width`-wide row.
    pub(super) fn rows_layer_norm(&self, x: &[f32], out: &mut [f32], width: usize, w: Vector<'_>, b: Vector<'_>) {
        self.exec.pieces(out, ROWS_PER_PIECE * width, &|p, piece| {
            let x = &x[p * ROWS_PER_PIECE * width..];
            for (xr, or) in x.chunks_exact(width).zip(piece.chunks_exact_mut(width)) {
                layer_norm(xr, w, b, or);
            }
        });
    }
}

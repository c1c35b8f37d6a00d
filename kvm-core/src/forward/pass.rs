//! One forward pass's context: what every step reads ([`Pass`]), and how its per-token
//! rows are spread through [`Exec::pieces`].

use crate::exec::Exec;
use crate::math::{layer_norm, Rope};
use crate::model::Model;
use crate::state::{Counters, Layout, Phase};
use crate::tensor::Vector;

/// What every step of one forward pass reads.
pub(crate) struct Pass<'p, 'm> {
    pub(crate) model: &'p Model<'m>,
    /// The RoPE tables' frequencies: KVM layers', alternate layers' (spec §5).
    pub(super) rope: &'p Rope,
    pub(super) alt_rope: &'p Rope,
    /// The session's arena.
    pub(crate) lay: &'p Layout,
    /// The counters before the batch.
    pub(crate) at: Counters,
    pub(crate) phase: Phase,
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

    /// This pass from counters `at` (the integer numerics' next token).
    #[inline]
    pub(crate) fn at(&self, at: Counters) -> Self {
        Pass { at, ..*self }
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

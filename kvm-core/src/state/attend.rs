//! The window ring and attention reads: a token's key and value enter the ring, and a
//! head's query attends over the state slots and the window tokens of its [`Plan`].

use crate::config::Config;
use crate::kernels;
use crate::math;
use crate::state::arena::{slot_index, LayerState};
use crate::state::means::HeadState;
use crate::state::plan::Plan;

impl HeadState<'_, '_> {
    /// Stores the new token's key, value and merge gate in the window ring.
    pub fn push_window(&mut self, t: usize, k: &[f32], v: &[f32], m: f32) {
        let (dk, dv) = (self.dk(), self.dv());
        let ri = self.ring(t);
        self.st.wk.set(ri, dk, |c| k[c]);
        self.st.wv.set(ri, dv, |c| v[c]);
        self.st.wm[ri] = m;
    }
}

/// A head's read-only view of one layer's state: what attention needs, shareable across
/// threads so heads can attend in parallel.
pub(crate) struct HeadReader<'l, 's> {
    st: &'l LayerState<'s>,
    h: usize,
    cfg: &'l Config,
    /// Slots the arena holds.
    state_len: usize,
}

impl<'l, 's> HeadReader<'l, 's> {
    /// Head `h` of layer state `st`, a session of at most `state_len` slots.
    #[inline]
    pub(crate) fn new(st: &'l LayerState<'s>, h: usize, cfg: &'l Config, state_len: usize) -> Self {
        HeadReader { st, h, cfg, state_len }
    }

    /// Attention of one head's query `q` (post LN_q, post RoPE) over the state slots the
    /// token's `plan` leaves (when it reads the state) and window tokens
    /// `[window_begin, t]`; writes `out` (`d_v`).
    pub fn attend(&self, q: &[f32], plan: &Plan, temps: (f32, f32), scores: &mut [f32], out: &mut [f32]) {
        let (dk, dv) = (self.cfg.d_qk as usize, self.cfg.d_v as usize);
        let scale = 1.0 / libm::sqrtf(dk as f32);
        let (front_temp, state_temp) = temps;
        let n_state = if plan.read_state { plan.slots_after } else { 0 };
        let n_window = plan.t + 1 - plan.window_begin;
        let scores = &mut scores[..n_state + n_window];
        let (state_scores, window_scores) = scores.split_at_mut(n_state);
        let state = slot_index(self.h, self.state_len, 0);
        let (nk, nv) = (self.st.nk.as_rows(), self.st.nv.as_rows());
        let (nk, nv) = (nk.rows(state, state + n_state, dk), nv.rows(state, state + n_state, dv));
        let (wk, wv) = (self.st.wk.as_rows(), self.st.wv.as_rows());
        nk.dots(q, state_scores);
        for x in state_scores.iter_mut() {
            *x = *x * state_temp * scale;
        }
        let spans = ring_spans(self.cfg, self.h, plan.window_begin, plan.t + 1);
        let mut at = 0;
        for span in spans.clone() {
            let part = &mut window_scores[at..at + span.len()];
            wk.rows(span.start, span.end, dk).dots(q, part);
            for x in part.iter_mut() {
                *x = *x * front_temp * scale;
            }
            at += span.len();
        }
        let max = kernels::max(scores);
        kernels::exp_sub(scores, max);
        let sum = math::sum(scores);
        for x in scores.iter_mut() {
            *x /= sum;
        }
        out.fill(0.0);
        let (state_scores, window_scores) = scores.split_at(n_state);
        nv.weighted_sum(state_scores, out);
        let mut at = 0;
        for span in spans {
            wv.rows(span.start, span.end, dv).weighted_sum(&window_scores[at..at + span.len()], out);
            at += span.len();
        }
    }
}

/// Head `h`'s window entries for positions `[begin, end)` (at most `window_len` of them) as
/// at most two runs of ring indices (the ring may wrap).
fn ring_spans(cfg: &Config, h: usize, begin: usize, end: usize) -> [core::ops::Range<usize>; 2] {
    let w = cfg.window_len();
    let (first, len) = (begin % w, end - begin);
    let head = len.min(w - first);
    let base = h * w;
    [base + first..base + first + head, base..base + len - head]
}

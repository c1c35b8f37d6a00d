//! A head's attention reads (spec §2 "Attn" step 7): its query attends over the state
//! slots and the window tokens of its [`Plan`]. The writes are [`crate::state::update`]'s.
//! A read's story ([`read`]: scores, softmax, weighted sum of values, run by run) is
//! written once over [`ReadArith`], whose float impls are here and whose integer one is
//! `int/head.rs`'s; a sliding-window layer's head reads so too, with no state part.

use crate::config::Config;
use crate::kernels;
use crate::math;
use crate::state::arena::{slot_index, LayerState};
use crate::state::plan::Plan;

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
        let state = slot_index(self.h, self.state_len, 0);
        let reads = Reads {
            state: state..state + self.state_read(plan),
            window: ring_spans(self.cfg, self.h, plan.window_begin, plan.t + 1),
        };
        let (front_temp, state_temp) = temps;
        let mut arith = FloatRead {
            q,
            keys: [self.st.nk.as_rows(), self.st.wk.as_rows()],
            values: [self.st.nv.as_rows(), self.st.wv.as_rows()],
            temps: Some([state_temp, front_temp]),
            scale: 1.0 / libm::sqrtf(dk as f32),
            dims: (dk, dv),
        };
        read(&mut arith, &reads, scores, out);
    }

    /// [`HeadReader::attend`] of the `m = plans.len()` queries `qs` (`[m, d_qk]`) of one
    /// segment ([`crate::state::Segment`]): tokens of one chunk, which read the same state
    /// slots and window tokens from the same first one, each up to its own. Every key is
    /// read once for all the queries ([`kernels::dots_many`]); each query's scores, and
    /// so its `outs` row (`[m, d_v]`), are the bits `attend` gives. `scratch` holds
    /// `2 * m * (n_state + n_window)` values of the last query's reads.
    pub fn attend_many(&self, qs: &[f32], plans: &[Plan], temps: (f32, f32), scratch: &mut [f32], outs: &mut [f32]) {
        let (dk, dv, m) = (self.cfg.d_qk as usize, self.cfg.d_v as usize, plans.len());
        let Some(last) = plans.last() else { return };
        let n_state = self.state_read(last);
        let len = n_state + last.t + 1 - last.window_begin;
        let (scores, dots) = scratch[..2 * m * len].split_at_mut(m * len);
        // Each run of keys against every query, `[m, run]`, into each query's row.
        let mut spread = |rows: crate::cache::Rows<'_>, n: usize, at: usize| {
            rows.dots_many(qs, dk, &mut dots[..m * n]);
            for (row, d) in scores.chunks_exact_mut(len).zip(dots.chunks_exact(n.max(1))) {
                row[at..at + n].copy_from_slice(&d[..n]);
            }
        };
        if n_state > 0 {
            spread(self.state_rows(n_state).0, n_state, 0);
        }
        let mut at = n_state;
        for span in ring_spans(self.cfg, self.h, last.window_begin, last.t + 1) {
            if !span.is_empty() {
                spread(self.st.wk.as_rows().rows(span.start, span.end, dk), span.len(), at);
            }
            at += span.len();
        }
        // Each query's softmax, then the values: the rows every query reads (the first
        // query's) for all the queries at once, each query's later rows on its own, in
        // the order `finish` adds them.
        let read = |plan: &Plan| n_state + plan.t + 1 - plan.window_begin;
        for (plan, row) in plans.iter().zip(scores.chunks_exact_mut(len)) {
            debug_assert_eq!((self.state_read(plan), plan.window_begin), (n_state, last.window_begin));
            self.softmax(plan, temps, &mut row[..read(plan)]);
        }
        let outs = &mut outs[..m * dv];
        outs.fill(0.0);
        let common = read(&plans[0]);
        self.value_runs(last, 0..common, |rows, at| rows.weighted_sum_many(&scores[at..], len, dv, outs));
        for ((plan, row), out) in plans.iter().zip(scores.chunks_exact(len)).zip(outs.chunks_exact_mut(dv)) {
            self.value_runs(plan, common..read(plan), |rows, at| {
                rows.weighted_sum(&row[at..at + rows.len() / dv], out)
            });
        }
    }

    /// Calls `f(rows, at)` for the value rows of score positions `range` of a token of
    /// `plan` (the state's, then the window's from `window_begin`), a run at a time, `at`
    /// being the run's first position.
    fn value_runs(
        &self,
        plan: &Plan,
        range: core::ops::Range<usize>,
        mut f: impl FnMut(crate::cache::Rows<'_>, usize),
    ) {
        let (dv, n_state) = (self.cfg.d_v as usize, self.state_read(plan));
        let mut run = |at: usize, rows: crate::cache::Rows<'_>| {
            let (lo, hi) = (range.start.max(at), range.end.min(at + rows.len() / dv));
            if lo < hi {
                f(rows.rows(lo - at, hi - at, dv), lo);
            }
        };
        run(0, self.state_rows(n_state).1);
        let mut at = n_state;
        for span in ring_spans(self.cfg, self.h, plan.window_begin, plan.t + 1) {
            run(at, self.st.wv.as_rows().rows(span.start, span.end, dv));
            at += span.len();
        }
    }

    /// State slots a token of `plan` reads.
    #[inline]
    fn state_read(&self, plan: &Plan) -> usize {
        if plan.read_state {
            plan.slots_after
        } else {
            0
        }
    }

    /// The head's first `n` state slots' keys and read values.
    #[inline]
    fn state_rows(&self, n: usize) -> (crate::cache::Rows<'_>, crate::cache::Rows<'_>) {
        let (dk, dv) = (self.cfg.d_qk as usize, self.cfg.d_v as usize);
        let state = slot_index(self.h, self.state_len, 0);
        (self.st.nk.as_rows().rows(state, state + n, dk), self.st.nv.as_rows().rows(state, state + n, dv))
    }

    /// `scores` (the state's, then the window's) scaled by `1 / sqrt(d_qk)` and the head's
    /// temperatures, then their softmax.
    fn softmax(&self, plan: &Plan, temps: (f32, f32), scores: &mut [f32]) {
        let n_state = self.state_read(plan);
        let scale = 1.0 / libm::sqrtf(self.cfg.d_qk as f32);
        let temps = Some([temps.1, temps.0]);
        let (state_scores, window_scores) = scores.split_at_mut(n_state);
        scale_scores(temps, scale, Part::State, state_scores);
        scale_scores(temps, scale, Part::Window, window_scores);
        softmax_scaled(scores);
    }
}

/// The softmax of scores already scaled, in place: `exp(x - max) / sum` (every mixer's
/// attention normalises so, in this order).
pub(crate) fn softmax_scaled(scores: &mut [f32]) {
    let max = kernels::max(scores);
    kernels::exp_sub(scores, max);
    let sum = math::sum(scores);
    for x in scores.iter_mut() {
        *x /= sum;
    }
}

/// The entries for positions `[begin, end)` (at most `len` of them) of a ring of `len`
/// entries, position `j` at `j % len`, as at most two runs of ring indices, oldest first
/// (the ring may wrap).
pub(crate) fn ring_runs(len: usize, begin: usize, end: usize) -> [core::ops::Range<usize>; 2] {
    let (first, n) = (begin % len, end - begin);
    let head = n.min(len - first);
    [first..first + head, 0..n - head]
}

/// Head `h`'s window entries for positions `[begin, end)` (at most `window_len` of them) as
/// at most two runs of ring indices (the ring may wrap).
pub(crate) fn ring_spans(cfg: &Config, h: usize, begin: usize, end: usize) -> [core::ops::Range<usize>; 2] {
    let w = cfg.window_len();
    let base = h * w;
    ring_runs(w, begin, end).map(|r| base + r.start..base + r.end)
}

/// The part of a layer's rows a read's run lies in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// The state slots' read rows (`nk`, `nv`).
    State = 0,
    /// The window's ring (`wk`, `wv`).
    Window = 1,
}

/// The rows one query reads, in the order of its scores: its state slots' rows, then its
/// window's ring rows (oldest first, at most two runs: [`ring_runs`] walks a wrapped ring
/// with one division, so a core without a divider makes one library call a read).
pub(crate) struct Reads {
    pub state: core::ops::Range<usize>,
    pub window: [core::ops::Range<usize>; 2],
}

impl Reads {
    /// Keys (and values) read.
    #[inline]
    fn len(&self) -> usize {
        self.state.len() + self.window[0].len() + self.window[1].len()
    }

    /// The nonempty runs, each with its part and its first score position.
    pub(crate) fn runs(&self) -> impl Iterator<Item = (Part, core::ops::Range<usize>, usize)> + '_ {
        let all = [(Part::State, &self.state), (Part::Window, &self.window[0]), (Part::Window, &self.window[1])];
        let mut at = 0;
        all.into_iter().filter_map(move |(part, rows)| {
            let run = (part, rows.clone(), at);
            at += rows.len();
            (!rows.is_empty()).then_some(run)
        })
    }
}

/// The arithmetic of a read, for one query: what differs between the float numerics
/// (f32 scores and weights) and the integer one (docs/integer.md: fixed point scores,
/// Q15 weights, rows with exponents). `Num` is a score, a weight and an output element.
pub(crate) trait ReadArith {
    type Num: Copy;
    /// `out[i]` = the query's score against key `rows.start + i` of `part`: its dot
    /// product times the part's multiplier (`temperature / sqrt(d_qk)`).
    fn scores(&self, part: Part, rows: core::ops::Range<usize>, out: &mut [Self::Num]);
    /// The scores' softmax in place: each score becomes its value's weight.
    fn softmax(&mut self, scores: &mut [Self::Num]);
    /// Starts `out` (`d_v`) as the empty sum of the rows `reads` names.
    fn begin_sum(&mut self, reads: &Reads, out: &mut [Self::Num]);
    /// `out += sum_i weights[i] * value rows.start + i` of `part`.
    fn accumulate(&self, part: Part, rows: core::ops::Range<usize>, weights: &[Self::Num], out: &mut [Self::Num]);
    /// Ends the sum: `out` in the numerics' activations.
    fn end_sum(&self, out: &mut [Self::Num]);
}

/// A read (spec §2 "Attn" step 7, §5's plain attention): `out = sum_j softmax(s)_j v_j`
/// over the keys and values `reads` names, `s_j` the query's scores; `scores` holds at
/// least `reads`' rows.
pub(crate) fn read<A: ReadArith>(arith: &mut A, reads: &Reads, scores: &mut [A::Num], out: &mut [A::Num]) {
    let scores = &mut scores[..reads.len()];
    // 1. a score for every key: the state's, then the window's, a run at a time
    for (part, rows, at) in reads.runs() {
        let n = rows.len();
        arith.scores(part, rows, &mut scores[at..at + n]);
    }
    // 2. the weights: the scores' softmax
    arith.softmax(scores);
    // 3. out = the values weighted, a run at a time in the same order
    arith.begin_sum(reads, out);
    for (part, rows, at) in reads.runs() {
        let n = rows.len();
        arith.accumulate(part, rows, &scores[at..at + n], out);
    }
    arith.end_sum(out);
}

/// The float numerics' arithmetic of a read: stored rows of any cache dtype
/// ([`crate::cache::Rows`]), each part's keys and values indexed by [`Part`].
pub(crate) struct FloatRead<'a> {
    /// The query, `[d_qk]`.
    pub q: &'a [f32],
    pub keys: [crate::cache::Rows<'a>; 2],
    pub values: [crate::cache::Rows<'a>; 2],
    /// Each part's temperature (a KVM head's), else none (a sliding-window head's).
    pub temps: Option<[f32; 2]>,
    /// `1 / sqrt(d_qk)`.
    pub scale: f32,
    /// `(d_qk, d_v)`.
    pub dims: (usize, usize),
}

impl ReadArith for FloatRead<'_> {
    type Num = f32;

    /// The dot products, then [`scale_scores`].
    fn scores(&self, part: Part, rows: core::ops::Range<usize>, out: &mut [f32]) {
        self.keys[part as usize].rows(rows.start, rows.end, self.dims.0).dots(self.q, out);
        scale_scores(self.temps, self.scale, part, out);
    }

    fn softmax(&mut self, scores: &mut [f32]) {
        softmax_scaled(scores);
    }

    fn begin_sum(&mut self, _: &Reads, out: &mut [f32]) {
        out.fill(0.0);
    }

    fn accumulate(&self, part: Part, rows: core::ops::Range<usize>, weights: &[f32], out: &mut [f32]) {
        self.values[part as usize].rows(rows.start, rows.end, self.dims.1).weighted_sum(weights, out);
    }

    fn end_sum(&self, _: &mut [f32]) {}
}

/// Dot products of `part` times their multiplier: `x * temp * scale` (in that order) with a
/// KVM head's `temps` (indexed by [`Part`]), `x * scale` without (a sliding-window head's).
fn scale_scores(temps: Option<[f32; 2]>, scale: f32, part: Part, out: &mut [f32]) {
    match temps {
        Some(temps) => out.iter_mut().for_each(|x| *x = *x * temps[part as usize] * scale),
        None => out.iter_mut().for_each(|x| *x *= scale),
    }
}

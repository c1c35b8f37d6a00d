//! How step 7 of a layer's attention (spec §2 "Attn", the state updates of spec §3) is
//! split across a batch: run by run (a run: the batch's tokens of one chunk), one job a
//! run with the heads in parallel, each on its own rows of the state. A segment
//! ([`Segment`]) at a time, a head updates its state token by token (initial appends,
//! window pushes), then attends the segment's queries over its state and window (each key
//! and value read once for them). A fold comes only at a chunk's first token, the first of
//! a run: every head's before the run's job, each spread through [`Exec`]. Within a chunk
//! no update touches what an earlier token reads: a push overwrites a ring entry older
//! than the chunk's window, and initial appends fill slots no earlier token reads.

use crate::cache::SlotReads;
use crate::config::Config;
use crate::exec::Exec;
use crate::state::arena::{Acts, LayerState, Layout, Scratch};
use crate::state::attend::HeadReader;
use crate::state::plan::{Counters, Phase, Segment, SEGMENT_LEN};
use crate::state::update::HeadState;
use crate::tensor::Vector;

/// One layer's step 7 over a batch: what it takes besides the layer's state and the
/// batch's rows.
#[derive(Clone, Copy)]
pub(crate) struct LayerStep<'w> {
    cfg: &'w Config,
    /// Slots the arena holds.
    state_len: usize,
    reads: SlotReads,
    /// The counters before the batch.
    at: Counters,
    phase: Phase,
    /// `LN_s_k`'s weight and bias, `[d_qk]` each.
    ln_sk: (Vector<'w>, Vector<'w>),
    /// The heads' window and state temperatures, `[n_heads]` each, when the model has them.
    temps: Option<(Vector<'w>, Vector<'w>)>,
}

/// The tokens `[i0, i0 + len)` of a batch that fall in one chunk, `first` their first
/// segment.
struct Run<'r> {
    first: &'r Segment,
    i0: usize,
    len: usize,
}

impl<'w> LayerStep<'w> {
    /// The step of a layer of `cfg` whose state `lay` lays out, for a batch from counters
    /// `at` entering as `phase`, with the layer's `ln_sk` and (when the model has them)
    /// head temperatures.
    #[inline]
    pub(crate) fn new(
        cfg: &'w Config,
        lay: &Layout,
        at: Counters,
        phase: Phase,
        ln_sk: (Vector<'w>, Vector<'w>),
        temps: Option<(Vector<'w>, Vector<'w>)>,
    ) -> Self {
        LayerStep { cfg, state_len: lay.state_len, reads: lay.reads, at, phase, ln_sk, temps }
    }

    /// Head `h` of layer state `st`, for its updates.
    #[inline]
    fn head<'l, 's>(&'l self, st: &'l mut LayerState<'s>, h: usize) -> HeadState<'l, 's> {
        HeadState::new(st, h, self.cfg, self.state_len, self.ln_sk)
    }

    /// Head `h`'s window and state temperatures.
    #[inline]
    fn temps(&self, h: usize) -> (f32, f32) {
        self.temps.map_or((1.0, 1.0), |(front, state)| (front.get(h), state.get(h)))
    }

    /// What comes before the layer's products: its slot reads, when the arena does not keep
    /// them (what stored ones would hold, from the same sums), and a prefetch of the state
    /// rows the first token writes, fetched while the products run. Returns the first
    /// segment of the batch's `n` tokens.
    pub(crate) fn begin(&self, st: &mut LayerState<'_>, n: usize) -> Segment {
        let (h_n, at) = (self.cfg.n_heads as usize, self.at);
        if self.reads == SlotReads::Recomputed {
            for h in 0..h_n {
                self.head(st, h).refresh(0, at.slots);
            }
        }
        let first = Segment::new(self.cfg, self.state_len, at, self.phase, n);
        let plan = first.plans()[0];
        for h in 0..h_n {
            self.head(st, h).prefetch_writes(plan.t, plan.initial);
        }
        first
    }

    /// Step 7 of the `x.n` tokens of `x` (`x.q`, `x.k` post LN and RoPE, `x.v`, `x.mg`),
    /// `first` their first segment ([`LayerStep::begin`]'s): every head's updates of `st`
    /// and attention, token by token, the heads' outputs concatenated into `x.v`'s rows.
    pub(crate) fn run(
        &self,
        st: &mut LayerState<'_>,
        mut first: Segment,
        x: &mut Acts<'_>,
        s: &mut Scratch<'_>,
        exec: &dyn Exec,
    ) {
        let (h_n, chunk) = (self.cfg.n_heads as usize, self.cfg.chunk_len as usize);
        let (mut i0, mut at) = (0, self.at);
        loop {
            let plan = first.plans()[0];
            if let Some(b) = plan.fold_begin {
                for h in 0..h_n {
                    self.head(st, h).fold(b, plan.slots_before, plan.slots_after, &mut s.fold, exec);
                }
            }
            let run = Run { first: &first, i0, len: (x.n - i0).min(chunk - plan.t % chunk) };
            self.attend_run(st, &run, x, s, exec);
            i0 += run.len;
            if i0 == x.n {
                return;
            }
            at = at.after(self.cfg, self.state_len, run.len);
            first = Segment::new(self.cfg, self.state_len, at, self.phase, x.n - i0);
        }
    }

    /// Calls `f(i, segment)` for every segment of `run` in order, `i` the batch index of
    /// the segment's first token. (The plans depend on the counters alone: every head
    /// works them out alike.)
    #[inline]
    fn segments(&self, run: &Run<'_>, mut f: impl FnMut(usize, &Segment)) {
        let end = run.i0 + run.len;
        let (mut i, mut segment) = (run.i0, run.first);
        let mut next;
        loop {
            f(i, segment);
            i += segment.plans().len();
            if i == end {
                return;
            }
            next = Segment::new(self.cfg, self.state_len, segment.next(), self.phase, end - i);
            segment = &next;
        }
    }

    /// One run's updates and attention: o, `[n_heads, len, d_v]` into `x.att`'s rows of
    /// the run, then concatenated into `x.v`'s.
    fn attend_run(
        &self,
        st: &mut LayerState<'_>,
        run: &Run<'_>,
        x: &mut Acts<'_>,
        s: &mut Scratch<'_>,
        exec: &dyn Exec,
    ) {
        let cfg = self.cfg;
        let (h_n, dk, dv) = (cfg.n_heads as usize, cfg.d_qk as usize, cfg.d_v as usize);
        let (qd, vd) = (cfg.q_dim(), cfg.v_dim());
        let (i0, len) = (run.i0, run.len);
        let (q, k, v, mg) = (&*x.q, &*x.k, &*x.v, &*x.mg);
        let o = &mut x.att[i0 * vd..(i0 + len) * vd];
        // Several queries of a segment read each key once (a batch's scratch holds them).
        let many = len > 1 && !x.scores.is_empty();
        let scratch: &mut [f32] = if many { x.scores } else { s.scores };
        let scratch_len = scratch.len() / h_n;
        // Token i's key, value and merge gate of head h.
        let kvm = |i: usize, h: usize| {
            (&k[i * qd + h * dk..i * qd + (h + 1) * dk], &v[i * vd + h * dv..i * vd + (h + 1) * dv], mg[i * h_n + h])
        };
        // A lone token's updates (a decode step) come first, on this thread: in the heads'
        // jobs they cost a one-core step 0.4-0.6% more instructions (scripts/mcu-bench.sh).
        if len == 1 {
            for h in 0..h_n {
                self.head(st, h).update(&run.first.plans()[0], kvm(i0, h));
            }
        }
        let heads = st.heads(h_n);
        exec.heads(o, len * dv, scratch, scratch_len, &|h, out, scratch| {
            // SAFETY: `Exec::heads` runs this once for each head `h < h_n` (`o` holds
            // `h_n` heads' outputs).
            let mut own = unsafe { heads.head(h) };
            let query = |i: usize| &q[i * qd + h * dk..i * qd + (h + 1) * dk];
            let temps = self.temps(h);
            self.segments(run, |i, segment| {
                let plans = segment.plans();
                let seg = plans.len();
                // The segment's updates (head h's own state is head 0 of `own`), then its
                // queries, which read no later token's.
                if len > 1 {
                    let mut hs = self.head(&mut own, 0);
                    for (i, plan) in (i..).zip(plans) {
                        debug_assert!(plan.fold_begin.is_none() || i == i0, "a fold inside a run");
                        hs.update(plan, kvm(i, h));
                    }
                }
                let reader = HeadReader::new(&own, 0, cfg, self.state_len);
                let out = &mut out[(i - i0) * dv..(i - i0 + seg) * dv];
                if many && seg > 1 {
                    // qs: [seg, d_qk], this head's queries
                    let (qs, scratch) = scratch.split_at_mut(SEGMENT_LEN * dk);
                    for (i, row) in (i..i + seg).zip(qs.chunks_exact_mut(dk)) {
                        row.copy_from_slice(query(i));
                    }
                    reader.attend_many(&qs[..seg * dk], plans, temps, scratch, out);
                } else {
                    for ((i, plan), out) in (i..).zip(plans).zip(out.chunks_exact_mut(dv)) {
                        reader.attend(query(i), plan, temps, scratch, out);
                    }
                }
            });
        });
        // concat o_h: [len, n_heads * d_v] into v's rows of the run, which the pushes
        // consumed
        for (h, o) in x.att[i0 * vd..(i0 + len) * vd].chunks_exact(len * dv).enumerate() {
            for (j, o) in o.chunks_exact(dv).enumerate() {
                x.v[(i0 + j) * vd + h * dv..(i0 + j) * vd + (h + 1) * dv].copy_from_slice(o);
            }
        }
    }
}

//! A head's state updates (spec §3), every write to a layer's state: initial appends,
//! window pushes, folds of a chunk leaving the window (novelty, appends, winner-take-all
//! merges), and what reads of a slot see. The reads are [`crate::state::attend`]'s.

use crate::cache::{copied, Rows};
use crate::config::{flags, Config};
use crate::exec::Exec;
use crate::kernels;
use crate::math::{layer_norm_inplace, ln_apply, ln_stats, norm};
use crate::quant::round_bf16;
use crate::state::arena::{ring_index, slot_index, FoldScratch, LayerState};
use crate::state::fold::{self, mark_least, touched, FoldHead, HeadWrites, MERGED};
use crate::state::plan::Plan;
use crate::tensor::Vector;

/// A head's view of one layer's state, for its updates.
pub(crate) struct HeadState<'l, 's> {
    st: &'l mut LayerState<'s>,
    h: usize,
    cfg: &'l Config,
    /// Slots the arena holds.
    state_len: usize,
    /// `LN_s_k`'s weight and bias, `[d_qk]` each.
    ln_sk: (Vector<'l>, Vector<'l>),
}

impl<'l, 's> HeadState<'l, 's> {
    /// Head `h` of layer state `st`, a session of at most `state_len` slots.
    #[inline]
    pub(crate) fn new(
        st: &'l mut LayerState<'s>,
        h: usize,
        cfg: &'l Config,
        state_len: usize,
        ln_sk: (Vector<'l>, Vector<'l>),
    ) -> Self {
        HeadState { st, h, cfg, state_len, ln_sk }
    }
}

impl HeadState<'_, '_> {
    #[inline]
    fn dk(&self) -> usize {
        self.cfg.d_qk as usize
    }
    #[inline]
    fn dv(&self) -> usize {
        self.cfg.d_v as usize
    }
    #[inline]
    fn slot(&self, s: usize) -> usize {
        slot_index(self.h, self.state_len, s)
    }
    #[inline]
    fn ring(&self, j: usize) -> usize {
        ring_index(self.cfg, self.h, j)
    }

    /// A token's updates ([`fold::update`], `plan` the token's) of key `k`, value `v` and
    /// merge gate `m`.
    #[inline]
    pub(crate) fn update(&mut self, plan: &Plan, tok: (&[f32], &[f32], f32)) {
        fold::update(self, plan, tok);
    }

    /// Recomputes what reads of slots `[from, to)` see.
    pub(crate) fn refresh(&mut self, from: usize, to: usize) {
        for s in from..to {
            self.refresh_slot(s, true);
        }
    }

    /// Recomputes what reads of slot `s` see: the value (`bf16(sv / max(|sv|, 1e-12) * r)`
    /// with vlens, else `sv / r`) and, with `key`, `nk = LN_s_k(sk)` (a slot whose key sum
    /// did not change keeps its key).
    fn refresh_slot(&mut self, s: usize, key: bool) {
        let (dk, dv) = (self.dk(), self.dv());
        let i = self.slot(s);
        let st = &mut *self.st;
        if key {
            let (w, b) = self.ln_sk;
            let sk = &st.sk[i * dk..(i + 1) * dk];
            let stats = ln_stats(sk);
            st.nk.set(i, dk, |c0, out| {
                let n = out.len();
                ln_apply(&sk[c0..c0 + n], stats, w.slice(c0, n), b.slice(c0, n), out);
            });
        }
        let sv = &st.sv[i * dv..(i + 1) * dv];
        let r = st.r[i];
        if self.cfg.has(flags::VLENS) {
            let len = norm(sv).max(1e-12);
            st.nv.set(i, dv, |c0, out| out.iter_mut().zip(&sv[c0..]).for_each(|(o, &x)| *o = round_bf16(x / len * r)));
        } else {
            st.nv.set(i, dv, |c0, out| out.iter_mut().zip(&sv[c0..]).for_each(|(o, &x)| *o = x / r));
        }
    }

    /// Folds window chunk `[b, b + chunk_len)` into the state ([`fold::fold`]), its
    /// similarities spread through `exec`.
    pub fn fold(
        &mut self,
        b: usize,
        slots_before: usize,
        slots_after: usize,
        fs: &mut FoldScratch<'_>,
        exec: &dyn Exec,
    ) {
        let cfg = self.cfg;
        fold::fold(cfg, &mut Folding { head: self, fs, exec }, b, slots_before, slots_after);
    }

    /// Prefetches what [`HeadState::update`] of token `t` will write (to slot `initial`,
    /// if any, and the window ring), so their stores find the lines
    /// in cache: those rows were last touched many steps ago.
    pub fn prefetch_writes(&self, t: usize, initial: Option<usize>) {
        let (dk, dv) = (self.dk(), self.dv());
        let st = &*self.st;
        if let Some(s) = initial {
            let i = self.slot(s);
            kernels::prefetch_lines(&st.sk[i * dk..(i + 1) * dk], kernels::Access::Write);
            kernels::prefetch_lines(&st.sv[i * dv..(i + 1) * dv], kernels::Access::Write);
            st.nk.prefetch_row(i, dk);
            st.nv.prefetch_row(i, dv);
        }
        let ri = self.ring(t);
        st.wk.prefetch_row(ri, dk);
        st.wv.prefetch_row(ri, dv);
    }
}

/// A float head's token writes: `k` post-RoPE, `v`, gate `m`.
impl HeadWrites for HeadState<'_, '_> {
    type Token<'t> = (&'t [f32], &'t [f32], f32);

    fn store_initial(&mut self, s: usize, (k, v, _): Self::Token<'_>) {
        let (i, dk, dv) = (self.slot(s), self.dk(), self.dv());
        let vlens = self.cfg.has(flags::VLENS);
        let st = &mut *self.st;
        let sk = &mut st.sk[i * dk..(i + 1) * dk];
        sk.copy_from_slice(k);
        prepare_key(self.cfg, self.ln_sk, sk);
        st.sv[i * dv..(i + 1) * dv].copy_from_slice(v);
        st.r[i] = if vlens { norm(v) } else { 1.0 };
    }

    /// Times 1 where not gated, as the reference does.
    fn gate_slot(&mut self, s: usize, (_, _, m): Self::Token<'_>, gated: bool) {
        let (i, dk, dv) = (self.slot(s), self.dk(), self.dv());
        let gate = if gated { m } else { 1.0 };
        self.st.sk[i * dk..(i + 1) * dk].iter_mut().for_each(|o| *o *= gate);
        self.st.sv[i * dv..(i + 1) * dv].iter_mut().for_each(|o| *o *= gate);
    }

    fn refresh_initial(&mut self, s: usize) {
        self.refresh(s, s + 1);
    }

    fn push_window(&mut self, t: usize, (k, v, m): Self::Token<'_>) {
        let (dk, dv) = (self.dk(), self.dv());
        let ri = self.ring(t);
        self.st.wk.set(ri, dk, copied(k));
        self.st.wv.set(ri, dv, copied(v));
        self.st.wm[ri] = m;
    }
}

/// A float head's fold ([`FoldHead`]): its state, the fold's scratch, and the threads
/// its key preparation and similarities may take.
struct Folding<'f, 'l, 's, 'x> {
    head: &'f mut HeadState<'l, 's>,
    fs: &'f mut FoldScratch<'x>,
    exec: &'f dyn Exec,
}

impl Folding<'_, '_, '_, '_> {
    /// `(d_qk, d_v, chunk_len)`.
    #[inline]
    fn dims(&self) -> (usize, usize, usize) {
        (self.head.dk(), self.head.dv(), self.head.cfg.chunk_len as usize)
    }
}

impl FoldHead for Folding<'_, '_, '_, '_> {
    /// In pieces of [`SIM_PIECE`] tokens (threads may take them).
    fn prepare_keys(&mut self, b: usize) {
        let (dk, _, c) = self.dims();
        let hd = &*self.head;
        let (cfg, h, ln_sk, wk) = (hd.cfg, hd.h, hd.ln_sk, hd.st.wk.as_rows());
        self.exec.pieces(&mut self.fs.pk[..c * dk], SIM_PIECE * dk, &|p, piece| {
            for (j, pk) in piece.chunks_exact_mut(dk).enumerate() {
                wk.get(ring_index(cfg, h, b + p * SIM_PIECE + j), pk);
                prepare_key(cfg, ln_sk, pk);
            }
        });
    }

    fn mark_novel(&mut self, slots: usize, n: usize) {
        let (dk, _, c) = self.dims();
        let hd = &*self.head;
        // Similarities go to `dsk`, free until the merges sum into it.
        let nk = hd.st.nk.as_rows().rows(hd.slot(0), hd.slot(slots), dk);
        let fs = &mut *self.fs;
        let novelty = &mut fs.novelty[..c];
        similarities(self.exec, dk, nk, &fs.pk[..c * dk], fs.dsk, |i, sims| {
            novelty[i] = sims.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        });
        mark_least_novel(&fs.novelty[..c], n, &mut fs.index[..c]);
    }

    /// The bits in the novelty buffer, free once the appends are chosen.
    fn flags(&mut self) -> (&mut [u32], &mut [u32]) {
        let c = self.dims().2;
        (&mut self.fs.index[..c], bytemuck::cast_slice_mut(&mut self.fs.novelty[..c]))
    }

    fn append(&mut self, b: usize, i: usize, s: usize, gated: (bool, bool)) {
        let (dk, dv, _) = self.dims();
        let hd = &mut *self.head;
        let (ri, si, vlens) = (hd.ring(b + i), hd.slot(s), hd.cfg.has(flags::VLENS));
        let st = &mut *hd.st;
        let m = st.wm[ri];
        let gate = |g: bool| if g { m } else { 1.0 };
        let sk = &mut st.sk[si * dk..(si + 1) * dk];
        sk.copy_from_slice(&self.fs.pk[i * dk..(i + 1) * dk]);
        let sv = &mut st.sv[si * dv..(si + 1) * dv];
        st.wv.as_rows().get(ri, sv);
        store_slot(sk, sv, &mut st.r[si], (gate(gated.0), gate(gated.1)), vlens);
    }

    fn gate_key(&mut self, b: usize, i: usize) {
        let dk = self.dims().0;
        let m = self.head.st.wm[self.head.ring(b + i)];
        self.fs.pk[i * dk..(i + 1) * dk].iter_mut().for_each(|x| *x *= m);
    }

    /// Similarities in `dsk`, still free; the first highest wins, NaNs and -inf never.
    fn merge_targets(&mut self, from: usize, to: usize, fallback: usize) {
        let (dk, _, c) = self.dims();
        let hd = &*self.head;
        let nk = hd.st.nk.as_rows().rows(hd.slot(from), hd.slot(to), dk);
        let fs = &mut *self.fs;
        let index = &mut fs.index[..c];
        similarities(self.exec, dk, nk, &fs.pk[..c * dk], fs.dsk, |i, sims| {
            if index[i] == 0 {
                let best = kernels::argmax(sims).map_or(fallback, |s| from + s);
                index[i] = MERGED | best as u32;
            }
        });
    }

    /// The merged keys and values summed per slot in `dsk`, `dsv` first (in token order),
    /// then added to the sums of the slots that take them.
    fn merge_sums(&mut self, b: usize, slots: usize, gate_values: bool) {
        let (dk, dv, c) = self.dims();
        let (hd, fs) = (&mut *self.head, &mut *self.fs);
        let bits: &[u32] = bytemuck::cast_slice(&fs.novelty[..c]);
        for s in (0..slots).filter(|&s| touched(bits, slots, s)) {
            fs.dsk[s * dk..(s + 1) * dk].fill(0.0);
            fs.dsv[s * dv..(s + 1) * dv].fill(0.0);
        }
        for i in (0..c).filter(|&i| fs.index[i] & MERGED != 0) {
            let best = (fs.index[i] & !MERGED) as usize;
            let ri = hd.ring(b + i);
            let vm = if gate_values { hd.st.wm[ri] } else { 1.0 };
            for (o, &g) in fs.dsk[best * dk..(best + 1) * dk].iter_mut().zip(&fs.pk[i * dk..(i + 1) * dk]) {
                *o += g;
            }
            hd.st.wv.as_rows().add_scaled(ri, vm, &mut fs.dsv[best * dv..(best + 1) * dv]);
        }
        for s in (0..slots).filter(|&s| touched(bits, slots, s)) {
            let si = hd.slot(s);
            for (o, &d) in hd.st.sk[si * dk..(si + 1) * dk].iter_mut().zip(&fs.dsk[s * dk..(s + 1) * dk]) {
                *o += d;
            }
            for (o, &d) in hd.st.sv[si * dv..(si + 1) * dv].iter_mut().zip(&fs.dsv[s * dv..(s + 1) * dv]) {
                *o += d;
            }
        }
    }

    fn count(&mut self, s: usize) {
        let si = self.head.slot(s);
        self.head.st.r[si] += 1.0;
    }

    fn refresh_slot(&mut self, s: usize, key: bool) {
        self.head.refresh_slot(s, key);
    }
}

/// `pk <- LN_s_k(pk with dims [0, rope_dim) zeroed)` (spec §3 "State keys are prepared"):
/// `pk` holds a key on entry.
fn prepare_key(cfg: &Config, (w, b): (Vector<'_>, Vector<'_>), pk: &mut [f32]) {
    pk[..cfg.rope_dim as usize].fill(0.0);
    layer_norm_inplace(pk, w, b);
}

/// Sets `flags[i]` to 1 for the `n` tokens of least `novelty` (`0 < n < novelty.len()`;
/// ties: lower token first; a total order, NaN included, so exactly `n` are marked) and
/// to 0 for the others.
fn mark_least_novel(novelty: &[f32], n: usize, flags: &mut [u32]) {
    mark_least(n, flags, |a, b| novelty[a].total_cmp(&novelty[b]));
}

/// Tokens per piece of a fold's parallel work (key preparation, [`similarities`]).
const SIM_PIECE: usize = 16;

/// Hands `each(i, sims_i)`, in query order, the dot products ([`kernels::dots_many`]) of query
/// `i` of `queries` (`[m, d]`) with every row of `keys` (`[s, d]`, `s` possibly 0),
/// computed in blocks of queries that fit `scratch` (at least `s` floats), each block's
/// pieces in parallel through `exec`.
fn similarities(
    exec: &dyn Exec,
    d: usize,
    keys: Rows<'_>,
    queries: &[f32],
    scratch: &mut [f32],
    mut each: impl FnMut(usize, &[f32]),
) {
    let (s, m) = (keys.len() / d, queries.len() / d);
    if s == 0 {
        (0..m).for_each(|i| each(i, &[]));
        return;
    }
    let block = (scratch.len() / s).clamp(1, m.max(1));
    for q0 in (0..m).step_by(block) {
        let out = &mut scratch[..block.min(m - q0) * s];
        exec.pieces(out, SIM_PIECE * s, &|p, piece| {
            let q = q0 + p * SIM_PIECE;
            keys.dots_many(&queries[q * d..(q + piece.len() / s) * d], d, piece);
        });
        for (j, row) in out.chunks_exact(s).enumerate() {
            each(q0 + j, row);
        }
    }
}

/// An appended token's slot: `sk = pk * key_gate`, `sv = v * value_gate` (`sk` and `sv`
/// hold `pk` and `v` on entry), `r = |v * value_gate|` (vlens) or 1.
fn store_slot(sk: &mut [f32], sv: &mut [f32], r: &mut f32, (key_gate, value_gate): (f32, f32), vlens: bool) {
    for o in sk.iter_mut() {
        *o *= key_gate;
    }
    for o in sv.iter_mut() {
        *o *= value_gate;
    }
    *r = if vlens { norm(sv) } else { 1.0 };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::Pcg32;

    #[test]
    fn the_least_novel_are_the_tokens_with_fewer_lesser_ones_than_appended() {
        let mut rng = Pcg32::new(3);
        for round in 0..400 {
            let c = 2 + rng.next_u32() as usize % 300;
            // Ties on a coarse grid, and NaN and infinities now and then.
            let novelty: [f32; 301] = core::array::from_fn(|_| match rng.next_u32() % 50 {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                2 => f32::INFINITY,
                v => (v % 7) as f32 * 0.25 - 0.5,
            });
            let novelty = &novelty[..c];
            let n = 1 + rng.next_u32() as usize % (c - 1);
            let mut flags = [7u32; 301];
            mark_least_novel(novelty, n, &mut flags[..c]);
            for (i, &mine) in novelty.iter().enumerate() {
                let below =
                    novelty.iter().enumerate().filter(|&(j, x)| x.total_cmp(&mine).then(j.cmp(&i)).is_lt()).count();
                assert_eq!(flags[i], (below < n) as u32, "round {round}, token {i} of {c}, {n} appended");
            }
        }
    }
}

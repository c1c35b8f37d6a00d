//! One head of a layer in the integer numerics (docs/integer.md): the KVM state's writes
//! (initial appends, window pushes, folds: novelty, appends, winner-take-all merges) and
//! reads, a sliding-window layer's ring, and attention over rows. Spec §3 and §5, in
//! integers.

use crate::cache::int::{IntRows, Row};
use crate::config::{flags, Config};
use crate::fixed::{exp_neg, isqrt, mul_fx, mul_wide, sat32, shr32, shr_round, FX, ONE};
use crate::int::ops::{dot_row, layer_norm, norm, to_row};
use crate::state::arena_int::IntLayer;
use crate::state::attend::{read, ring_runs, ring_spans, Part, ReadArith, Reads};
use crate::state::fold::{self, mark_least, FoldHead, HeadWrites, MERGED};
use crate::state::plan::Plan;
use crate::tensor::Vector;
use core::ops::Range;

/// The scratch a head's work uses ([`crate::state::arena_int::IntScratch`]'s parts).
pub(crate) struct HeadScratch<'a> {
    /// A head's scores, then its weights: `[state_len + ring]`.
    pub scores: &'a mut [i32],
    /// A row's mantissas: `[max(d_qk, d_v)]`.
    pub row: &'a mut [i16],
    /// A wide vector: `[max(d_qk, d_v)]`.
    pub wide: &'a mut [i32],
    /// A fold's prepared keys, `[chunk_len, d_qk]`, novelty `[chunk_len]` and flags.
    pub pk: &'a mut [i32],
    pub novelty: &'a mut [i64],
    pub index: &'a mut [u32],
}

/// Head `h` of a KVM layer's state.
pub(crate) struct KvmHead<'l, 's> {
    pub st: &'l mut IntLayer<'s>,
    pub h: usize,
    pub cfg: &'l Config,
    /// Slots the arena holds.
    pub state_len: usize,
    /// `LN_s_k`'s weight and bias.
    pub ln_sk: (Vector<'l>, Vector<'l>),
}

/// A row in fixed point: `out[c] = m[c] * 2^e`.
fn widen(m: Row<'_>, e: i32, out: &mut [i32]) {
    let put = |o: &mut i32, v: i32| *o = shr32(i64::from(v), -e);
    match m {
        Row::I16(m) => out.iter_mut().zip(m).for_each(|(o, &v)| put(o, i32::from(v))),
        Row::I8(m) => out.iter_mut().zip(m).for_each(|(o, &v)| put(o, i32::from(v))),
    }
}

/// `x * g` for every element (fixed point).
fn gate(x: &mut [i32], g: i32) {
    if g != ONE {
        x.iter_mut().for_each(|v| *v = mul_fx(*v, g));
    }
}

/// `acc += add`: the slot sum `acc` (`acc[c] * 2^(e - FX)`) takes `add` (fixed point,
/// rounded to the sum's exponent); when a sum reaches 2^30 every element halves and `e`
/// grows, as a float's exponent would.
fn add_into(acc: &mut [i32], e: &mut i32, add: &[i32]) {
    let sum = |a: i32, b: i32, e: i32| i64::from(a) + shr_round(i64::from(b), e);
    let max = acc.iter().zip(add).fold(0u64, |m, (&a, &b)| m.max(sum(a, b, *e).unsigned_abs()));
    let k = (64 - max.leading_zeros() as i32 - 30).max(0);
    let e0 = *e;
    for (a, &b) in acc.iter_mut().zip(add) {
        *a = shr32(sum(*a, b, e0), k);
    }
    *e += k;
}

/// A similarity `dot * 2^e` of two rows (`e` their exponents' sum), comparable across rows.
#[inline]
fn similarity(dot: i32, e: i32) -> i64 {
    shr_round(i64::from(dot), -e)
}

impl KvmHead<'_, '_> {
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
        self.h * self.state_len + s
    }
    #[inline]
    fn ring(&self, j: usize) -> usize {
        self.h * self.cfg.window_len() + j % self.cfg.window_len()
    }

    /// `pk <- LN_s_k(pk with dims [0, rope_dim) zeroed)`: `pk` holds a key on entry.
    fn prepare_key(&self, pk: &mut [i32]) {
        pk[..self.cfg.rope_dim as usize].fill(0);
        layer_norm(pk, 0, self.ln_sk.0, self.ln_sk.1);
    }

    /// A token's updates ([`fold::update`], `plan` the token's) of key `k`, value `v`
    /// (fixed point) and merge gate `m`.
    pub(crate) fn update(&mut self, plan: &Plan, k: &[i32], v: &[i32], m: i32, s: &mut HeadScratch<'_>) {
        fold::update(&mut Work { head: self, s }, plan, (k, v, m));
    }

    /// Recomputes what reads of slot `s` see: with `key`, `nk = LN_s_k(sk)`; and the value
    /// (`sv / |sv| * r` with vlens, else `sv / r`).
    pub(crate) fn refresh(&mut self, slot: usize, key: bool, s: &mut HeadScratch<'_>) {
        let (i, dk, dv) = (self.slot(slot), self.dk(), self.dv());
        let [r, e_k, e_v] = [self.st.sr[3 * i], self.st.sr[3 * i + 1], self.st.sr[3 * i + 2]];
        if key {
            let w = &mut s.wide[..dk];
            w.copy_from_slice(&self.st.sk[i * dk..(i + 1) * dk]);
            layer_norm(w, e_k, self.ln_sk.0, self.ln_sk.1);
            push(&mut self.st.nk, i, w, &mut s.row[..dk]);
        }
        // The value sum as a row of mantissas `M` of norm below 2^15.
        let row = &mut s.row[..dv];
        let e_m = to_row(&self.st.sv[i * dv..(i + 1) * dv], e_v, row);
        // The row a read sees, in place of `M`.
        let e_out = if self.cfg.has(flags::VLENS) {
            // M / |M| * r: r cut to 14 bits (r' * 2^e_out), then M * r' / |M|
            let n2: u64 = row.iter().map(|&x| (i64::from(x) * i64::from(x)) as u64).sum();
            let nrm = isqrt(n2 << 32).max(1); // |M| * 2^16
            let er = (64 - u64::from(r.unsigned_abs()).leading_zeros() as i32 - 14).max(-16);
            let r14 = shr_round(i64::from(r), er);
            let g = ((r14 << 46) / nrm as i64).min(i64::from(i32::MAX)); // r' * 2^30 / |M|
            for x in row.iter_mut() {
                *x = sat32(shr_round(i64::from(*x) * g, 30)).clamp(-32768, 32767) as i16;
            }
            er
        } else {
            // r is the fold count (at least 1)
            let count = i64::from(r.max(1));
            for x in row.iter_mut() {
                *x = crate::fixed::div_round(i64::from(*x), count) as i16;
            }
            e_m
        };
        self.st.nv.set(i, row, e_out);
    }

    /// The best similarity of row `(m, e)` to slots `[from, to)`'s keys, and the first
    /// slot that has it (`None` for no slots).
    fn best_slot(&self, m: &[i16], e: i32, from: usize, to: usize) -> Option<(i64, usize)> {
        let mut best: Option<(i64, usize)> = None;
        for s in from..to {
            let (k, e_k) = self.st.nk.row(self.slot(s));
            let sim = similarity(dot_row(m, k), e + e_k);
            if best.is_none_or(|(b, _)| sim > b) {
                best = Some((sim, s));
            }
        }
        best
    }

    /// Folds window chunk `[b, b + chunk_len)` into the state ([`fold::fold`]).
    pub(crate) fn fold(&mut self, b: usize, slots_before: usize, slots_after: usize, s: &mut HeadScratch<'_>) {
        let cfg = self.cfg;
        fold::fold(cfg, &mut Work { head: self, s }, b, slots_before, slots_after);
    }

    /// Attention of query `q` (fixed point, post LN_q and RoPE) over the state slots
    /// `plan` reads and window tokens `[window_begin, t]`, into `out` (fixed point); `a`
    /// is `(window, state)`'s score multipliers (`temp / sqrt(d_qk)`, fixed point).
    pub(crate) fn attend(&self, q: &[i32], plan: &Plan, a: (i32, i32), s: &mut HeadScratch<'_>, out: &mut [i32]) {
        let n_state = if plan.read_state { plan.slots_after } else { 0 };
        let reads = Reads {
            state: self.slot(0)..self.slot(n_state),
            window: ring_spans(self.cfg, self.h, plan.window_begin, plan.t + 1),
        };
        let row = &mut s.row[..self.dk()];
        let e_q = to_row(q, 0, row);
        let mut arith = IntRead {
            q: (row, e_q),
            keys: [&self.st.nk, &self.st.wk],
            values: [&self.st.nv, &self.st.wv],
            mult: [a.1, a.0],
            e_max: 0,
        };
        read(&mut arith, &reads, s.scores, out);
    }
}

/// An integer head's writes ([`HeadWrites`], [`FoldHead`]): its state and the head's
/// scratch. In a fold, a merged token joins its slot's sums at once, in token order, each
/// sum rounded to the slot's exponent as it grows.
struct Work<'f, 'l, 's, 'x> {
    head: &'f mut KvmHead<'l, 's>,
    s: &'f mut HeadScratch<'x>,
}

impl Work<'_, '_, '_, '_> {
    /// `(d_qk, d_v, chunk_len)`.
    #[inline]
    fn dims(&self) -> (usize, usize, usize) {
        (self.head.dk(), self.head.dv(), self.head.cfg.chunk_len as usize)
    }

    /// The slot of highest similarity of `[from, to)` to prepared key `i`.
    fn best_slot(&mut self, i: usize, from: usize, to: usize) -> Option<(i64, usize)> {
        let dk = self.dims().0;
        let row = &mut self.s.row[..dk];
        let e = to_row(&self.s.pk[i * dk..(i + 1) * dk], 0, row);
        self.head.best_slot(row, e, from, to)
    }
}

impl HeadWrites for Work<'_, '_, '_, '_> {
    type Token<'t> = (&'t [i32], &'t [i32], i32);

    /// Exponents start at 0.
    fn store_initial(&mut self, slot: usize, (k, v, _): Self::Token<'_>) {
        let (dk, dv, _) = self.dims();
        let hd = &mut *self.head;
        let (i, vlens) = (hd.slot(slot), hd.cfg.has(flags::VLENS));
        let pk = &mut self.s.wide[..dk];
        pk.copy_from_slice(k);
        hd.prepare_key(pk);
        hd.st.sk[i * dk..(i + 1) * dk].copy_from_slice(pk);
        hd.st.sv[i * dv..(i + 1) * dv].copy_from_slice(v);
        let r = if vlens { norm(v) } else { 1 };
        hd.st.sr[3 * i..3 * i + 3].copy_from_slice(&[r, 0, 0]);
    }

    fn gate_slot(&mut self, slot: usize, (_, _, m): Self::Token<'_>, gated: bool) {
        let (dk, dv, _) = self.dims();
        let (i, g) = (self.head.slot(slot), if gated { m } else { ONE });
        gate(&mut self.head.st.sk[i * dk..(i + 1) * dk], g);
        gate(&mut self.head.st.sv[i * dv..(i + 1) * dv], g);
    }

    fn refresh_initial(&mut self, slot: usize) {
        self.head.refresh(slot, true, self.s);
    }

    fn push_window(&mut self, t: usize, (k, v, m): Self::Token<'_>) {
        let ri = self.head.ring(t);
        push(&mut self.head.st.wk, ri, k, &mut self.s.row[..k.len()]);
        push(&mut self.head.st.wv, ri, v, &mut self.s.row[..v.len()]);
        self.head.st.wm[ri] = m;
    }
}

impl FoldHead for Work<'_, '_, '_, '_> {
    fn prepare_keys(&mut self, b: usize) {
        let (dk, _, c) = self.dims();
        for i in 0..c {
            let (m, e) = self.head.st.wk.row(self.head.ring(b + i));
            let pk = &mut self.s.pk[i * dk..(i + 1) * dk];
            widen(m, e, pk);
            self.head.prepare_key(pk);
        }
    }

    fn mark_novel(&mut self, slots: usize, n: usize) {
        let c = self.dims().2;
        for i in 0..c {
            self.s.novelty[i] = self.best_slot(i, 0, slots).map_or(i64::MIN, |(sim, _)| sim);
        }
        let novelty = &self.s.novelty[..c];
        mark_least(n, &mut self.s.index[..c], |a, b| novelty[a].cmp(&novelty[b]));
    }

    /// The bits in the novelty buffer, free once the appends are chosen.
    fn flags(&mut self) -> (&mut [u32], &mut [u32]) {
        let c = self.dims().2;
        (&mut self.s.index[..c], bytemuck::cast_slice_mut(&mut self.s.novelty[..c]))
    }

    fn append(&mut self, b: usize, i: usize, slot: usize, gated: (bool, bool)) {
        let (dk, dv, _) = self.dims();
        let hd = &mut *self.head;
        let (ri, si, vlens) = (hd.ring(b + i), hd.slot(slot), hd.cfg.has(flags::VLENS));
        let m = hd.st.wm[ri];
        let g = |x: bool| if x { m } else { ONE };
        let sk = &mut hd.st.sk[si * dk..(si + 1) * dk];
        sk.copy_from_slice(&self.s.pk[i * dk..(i + 1) * dk]);
        gate(sk, g(gated.0));
        let (vm, ve) = hd.st.wv.row(ri);
        let sv = &mut hd.st.sv[si * dv..(si + 1) * dv];
        widen(vm, ve, sv);
        gate(sv, g(gated.1));
        let r = if vlens { norm(sv) } else { 1 };
        hd.st.sr[3 * si..3 * si + 3].copy_from_slice(&[r, 0, 0]);
    }

    fn gate_key(&mut self, b: usize, i: usize) {
        let dk = self.dims().0;
        gate(&mut self.s.pk[i * dk..(i + 1) * dk], self.head.st.wm[self.head.ring(b + i)]);
    }

    fn merge_targets(&mut self, from: usize, to: usize, fallback: usize) {
        for i in 0..self.dims().2 {
            if self.s.index[i] == 0 {
                let best = self.best_slot(i, from, to).map_or(fallback, |(_, s)| s);
                self.s.index[i] = MERGED | best as u32;
            }
        }
    }

    fn merge_sums(&mut self, b: usize, _slots: usize, gate_values: bool) {
        let (dk, dv, c) = self.dims();
        let (hd, s) = (&mut *self.head, &mut *self.s);
        for i in (0..c).filter(|&i| s.index[i] & MERGED != 0) {
            let si = hd.slot((s.index[i] & !MERGED) as usize);
            let ri = hd.ring(b + i);
            let mut e_k = hd.st.sr[3 * si + 1];
            add_into(&mut hd.st.sk[si * dk..(si + 1) * dk], &mut e_k, &s.pk[i * dk..(i + 1) * dk]);
            hd.st.sr[3 * si + 1] = e_k;
            let gv = &mut s.wide[..dv];
            let (vm, ve) = hd.st.wv.row(ri);
            widen(vm, ve, gv);
            if gate_values {
                gate(gv, hd.st.wm[ri]);
            }
            let mut e_v = hd.st.sr[3 * si + 2];
            add_into(&mut hd.st.sv[si * dv..(si + 1) * dv], &mut e_v, gv);
            hd.st.sr[3 * si + 2] = e_v;
        }
    }

    fn count(&mut self, slot: usize) {
        let i = self.head.slot(slot);
        self.head.st.sr[3 * i] = self.head.st.sr[3 * i].saturating_add(1);
    }

    fn refresh_slot(&mut self, slot: usize, key: bool) {
        self.head.refresh(slot, key, self.s);
    }
}

/// The integer numerics' arithmetic of a read (docs/integer.md, "Attention"): the query
/// as a row `(m, e)`, each part's key and value rows and score multiplier, indexed by
/// [`Part`]; `e_max` the largest exponent of the values read.
struct IntRead<'r, 's> {
    q: (&'r [i16], i32),
    keys: [&'r IntRows<'s>; 2],
    values: [&'r IntRows<'s>; 2],
    mult: [i32; 2],
    e_max: i32,
}

impl ReadArith for IntRead<'_, '_> {
    type Num = i32;

    /// `dot * 2^(e_q + e_k - 2 FX) * mult`, fixed point.
    fn scores(&self, part: Part, rows: Range<usize>, out: &mut [i32]) {
        let (keys, mult) = (self.keys[part as usize], self.mult[part as usize]);
        for (r, sc) in rows.zip(out) {
            let (k, e_k) = keys.row(r);
            let dot = mul_wide(dot_row(self.q.0, k), mult);
            *sc = shr32(dot, 2 * FX as i32 - self.q.1 - e_k);
        }
    }

    /// `p_j = exp(s_j - max)` in Q15, then the weights `P_j = floor(p_j * 2^15 / sum p)`
    /// (by one reciprocal), which sum to at most 2^15.
    fn softmax(&mut self, scores: &mut [i32]) {
        let max = scores.iter().copied().max().unwrap_or(0);
        let mut sum = 0u64;
        for sc in scores.iter_mut() {
            let p = exp_neg(sat32(i64::from(max) - i64::from(*sc)));
            *sc = p;
            sum += p as u64;
        }
        let g = (1u64 << 47) / sum.max(1);
        // floor(p * g / 2^32) from g's halves in u32 arithmetic (p <= 2^15, g < 2^32).
        let (gh, gl) = ((g >> 16) as u32, (g & 0xFFFF) as u32);
        for sc in scores.iter_mut() {
            let p = *sc as u32;
            *sc = ((p * gh + ((p * gl) >> 16)) >> 16) as i32;
        }
    }

    /// The sum is kept at the largest exponent of the values read.
    fn begin_sum(&mut self, reads: &Reads, out: &mut [i32]) {
        let mut e_max = None;
        for (part, rows, _) in reads.runs() {
            let values = self.values[part as usize];
            e_max = rows.map(|r| Some(values.row(r).1)).fold(e_max, Option::max);
        }
        self.e_max = e_max.unwrap_or(0);
        out.fill(0);
    }

    /// Each weight shifted to the largest exponent (zero past 31 bits), the products summed
    /// exactly, two rows a turn: one load and store of each sum for two products.
    fn accumulate(&self, part: Part, rows: Range<usize>, weights: &[i32], out: &mut [i32]) {
        let values = self.values[part as usize];
        let weighted = |i: usize| {
            let (v, e) = values.row(rows.start + i);
            let shift = self.e_max - e;
            (if shift >= 31 { 0 } else { weights[i] >> shift }, v)
        };
        for k in 0..weights.len() / 2 {
            let ((w0, v0), (w1, v1)) = (weighted(2 * k), weighted(2 * k + 1));
            match (v0, v1) {
                (Row::I16(v0), Row::I16(v1)) => add_pair(out, (w0, v0), (w1, v1)),
                (Row::I8(v0), Row::I8(v1)) => add_pair(out, (w0, v0), (w1, v1)),
                (v0, v1) => {
                    add_row(out, w0, v0);
                    add_row(out, w1, v1);
                }
            }
        }
        if weights.len() % 2 == 1 {
            let (w, v) = weighted(weights.len() - 1);
            add_row(out, w, v);
        }
    }

    /// `sum real = acc * 2^-15 * 2^(e_max - FX)`: in fixed point `acc * 2^(e_max - 15)`.
    fn end_sum(&self, out: &mut [i32]) {
        for a in out.iter_mut() {
            *a = shr32(i64::from(*a), 15 - self.e_max);
        }
    }
}

/// `acc += w0 v0 + w1 v1` (exact in i32: docs/integer.md bounds the sum below 2^31).
#[inline]
fn add_pair<T: Copy + Into<i32>>(acc: &mut [i32], (w0, v0): (i32, &[T]), (w1, v1): (i32, &[T])) {
    for ((a, &x0), &x1) in acc.iter_mut().zip(v0).zip(v1) {
        *a = a.wrapping_add(w0 * x0.into()).wrapping_add(w1 * x1.into());
    }
}

/// `acc += w v` for a row of either width.
fn add_row(acc: &mut [i32], w: i32, v: Row<'_>) {
    let add = |a: &mut i32, x: i32| *a = a.wrapping_add(w * x);
    match v {
        Row::I16(v) => acc.iter_mut().zip(v).for_each(|(a, &x)| add(a, i32::from(x))),
        Row::I8(v) => acc.iter_mut().zip(v).for_each(|(a, &x)| add(a, i32::from(x))),
    }
}

/// Stores `x` (fixed point) as row `r` of `rows`, through `tmp` (its mantissas).
fn push(rows: &mut IntRows<'_>, r: usize, x: &[i32], tmp: &mut [i16]) {
    let e = to_row(x, 0, tmp);
    rows.set(r, tmp, e);
}

/// A sliding-window layer's head (spec §5): its ring of the last `Wa` keys and values.
pub(crate) struct SwaHead<'l, 's> {
    pub st: &'l mut IntLayer<'s>,
    pub h: usize,
    pub window: usize,
}

impl SwaHead<'_, '_> {
    #[inline]
    fn ring(&self, j: usize) -> usize {
        self.h * self.window + j % self.window
    }

    /// Pushes token `t`'s key and value, then attends `q` over tokens `[t + 1 - Wa, t]`
    /// (from 0), scores times `mult` (`1 / sqrt(d_qk)`), into `out`.
    pub(crate) fn step(
        &mut self,
        t: usize,
        (q, k, v): (&[i32], &[i32], &[i32]),
        mult: i32,
        s: &mut HeadScratch<'_>,
        out: &mut [i32],
    ) {
        let ri = self.ring(t);
        push(&mut self.st.wk, ri, k, &mut s.row[..k.len()]);
        push(&mut self.st.wv, ri, v, &mut s.row[..v.len()]);
        let begin = (t + 1).saturating_sub(self.window);
        let base = self.h * self.window;
        let reads =
            Reads { state: 0..0, window: ring_runs(self.window, begin, t + 1).map(|r| base + r.start..base + r.end) };
        let row = &mut s.row[..q.len()];
        let e_q = to_row(q, 0, row);
        let (wk, wv) = (&self.st.wk, &self.st.wv);
        let mut arith = IntRead { q: (row, e_q), keys: [wk; 2], values: [wv; 2], mult: [mult; 2], e_max: 0 };
        read(&mut arith, &reads, s.scores, out);
    }
}

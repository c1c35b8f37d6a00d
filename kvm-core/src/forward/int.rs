//! The integer numerics' operations ([`Numerics`] for [`IntActs`], docs/integer.md): one
//! token's fixed-point activations, integer attention rows with their scales, on
//! [`crate::fixed`]'s arithmetic and [`crate::int`]'s rows, norms and heads. No float
//! operation but a tap's and the logits' last conversion.

use crate::cache::SlotReads;
use crate::config::flags;
use crate::exec::Exec;
use crate::fixed::{fixed_of, isqrt, mul_fx, one_plus_elu, shr32, sigmoid, tanh, FX, ONE};
use crate::format::Role;
use crate::forward::numerics::Numerics;
use crate::forward::pass::Pass;
use crate::forward::{Logits, Tap, TapFn};
use crate::int::head::{HeadScratch, KvmHead, SwaHead};
use crate::int::ops::{dequant_row, layer_norm, matvec, relu_sq_input, to_input};
use crate::math::Rope;
use crate::state::arena_int::{IntLayer, IntScratch};
use crate::state::plan::{Counters, Plan};
use crate::tensor::{Matrix, Vector};

/// `round(2^64 / (2 pi))`: a frequency in radians per token to turns per token, 2^-64.
const TURNS_64: u128 = 2_935_890_503_282_001_226;

/// The phase increment (turns per token, 2^-64 units) of a RoPE frequency `f` (radians
/// per token, an f32 in `[0, 1]`), from its bits alone.
#[inline]
fn phase_step(f: f32) -> u64 {
    let bits = f.to_bits();
    let exp = (bits >> 23 & 0xFF) as i32;
    if exp == 0 || bits >> 31 != 0 {
        return 0;
    }
    let mant = u128::from(bits & 0x7F_FFFF | 0x80_0000);
    // f = mant * 2^(exp - 150)
    let k = 150 - exp;
    if !(0..128).contains(&k) {
        return 0;
    }
    ((mant * TURNS_64) >> k) as u64
}

/// `[cos..., sin...]` (Q15) of position `t` for the `half` pairs of `rope`.
fn rope_tables(rope: &Rope, half: usize, t: usize, out: &mut [i32]) {
    let (cos, sin) = out.split_at_mut(half);
    for j in 0..half {
        let p = (t as u64).wrapping_mul(phase_step(rope.freq(j)));
        (cos[j], sin[j]) = crate::fixed::cos_sin((p >> 32) as u32);
    }
}

/// Rotates dims `[0, 2 half)` of a head row (fixed point) by the tables (Q15).
fn rope_apply(x: &mut [i32], tables: &[i32], half: usize) {
    let (cos, sin) = tables.split_at(half);
    for j in 0..half {
        let (a, b) = (i64::from(x[2 * j]), i64::from(x[2 * j + 1]));
        let (c, s) = (i64::from(cos[j]), i64::from(sin[j]));
        x[2 * j] = shr32(c * a + s * b, 15);
        x[2 * j + 1] = shr32(c * b - s * a, 15);
    }
}

/// `cur += mix * (prev - cur)`, then `prev <- cur` as it was; with `first`, the previous
/// token is the token itself.
fn token_shift(cur: &mut [i32], prev: &mut [i32], mix: Vector<'_>, first: bool) {
    for ((c, p), mix) in cur.iter_mut().zip(prev.iter_mut()).zip(mix.iter_fixed()) {
        let x = *c;
        let before = if first { x } else { *p };
        *c = x.saturating_add(mul_fx(mix, before.saturating_sub(x)));
        *p = x;
    }
}

/// `y += s * x` (fixed point; `s` of one is a plain sum).
fn axpy(y: &mut [i32], s: i32, x: &[i32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = y.saturating_add(if s == ONE { x } else { mul_fx(s, x) });
    }
}

/// `tap(at, x)` with `x` (fixed point) as f32s, through `buf` (free scratch as long as
/// `x`); nothing without a tap, so that a step without one does no float operation.
fn tap_fixed(tap: &mut Option<&mut TapFn<'_>>, at: Tap, x: &[i32], buf: &mut [i32]) {
    if let Some(tap) = tap {
        for (b, &v) in buf.iter_mut().zip(x) {
            *b = (v as f32 * (1.0 / ONE as f32)).to_bits() as i32;
        }
        tap(at, bytemuck::cast_slice(&buf[..x.len()]));
    }
}

/// `1 / sqrt(d)` in fixed point.
fn inv_sqrt(d: usize) -> i32 {
    let r = isqrt((d as u64) << 32).max(1); // sqrt(d) * 2^16
    ((1u64 << 32) / r) as i32
}

/// An integer pass's activations: one token's, its step scratch and its plan.
pub(crate) struct IntActs<'w, 's> {
    s: &'w mut IntScratch<'s>,
    /// What the token does to every KVM layer's state.
    plan: Plan,
}

impl<'w, 's> IntActs<'w, 's> {
    /// One token's pass, in scratch `s`, that `plan` says.
    #[inline]
    pub(crate) fn new(s: &'w mut IntScratch<'s>, plan: Plan) -> Self {
        IntActs { s, plan }
    }
}

/// Weights of one piece of an integer product spread through [`Exec::pieces`]: a small
/// matrix (each of tiny-kjv's) is one piece, so a board's one thread makes one call, and a
/// large one's rows are split among a pool's threads, in tiles of 8 rows (the sums are
/// exact, so every split gives the same bits).
const PIECE_WEIGHTS: usize = 1 << 16;

/// `y = w x` for an input `x` of exponent `s`, its rows spread through `exec`.
fn matvec_rows(exec: &dyn Exec, w: &Matrix<'_>, x: &[i16], s: i32, y: &mut [i32]) {
    if w.rows * w.cols <= PIECE_WEIGHTS {
        return matvec(w, x, s, y);
    }
    let rows = (PIECE_WEIGHTS / w.cols.max(1)).next_multiple_of(8).max(8);
    let n = y.len().min(w.rows);
    let y = &mut y[..n];
    exec.pieces(bytemuck::cast_slice_mut(y), rows, &|i, part| {
        let r0 = i * rows;
        matvec(&w.row_range(r0, r0 + part.len()), x, s, bytemuck::cast_slice_mut(part));
    });
}

/// `y = w x` for layer `l`'s matrix `role`, `x` fixed point (as a product input in
/// `x16`).
fn product(pass: &Pass<'_, '_>, (role, l): (Role, usize), x: &[i32], x16: &mut [i16], y: &mut [i32]) {
    let w = pass.model.matrix(role, l);
    let s = to_input(x, &mut x16[..x.len()]);
    matvec_rows(pass.exec, &w, &x16[..x.len()], s, y);
}

/// What a layer's heads read (the token's q, k, v and merge gates), write (their outputs)
/// and work in: the parts of an integer step's scratch.
struct Heads<'a> {
    q: &'a [i32],
    k: &'a [i32],
    v: &'a [i32],
    mg: &'a [i32],
    o: &'a mut [i32],
    hs: HeadScratch<'a>,
}

impl<'a> Heads<'a> {
    /// The heads' parts of `s`.
    #[inline]
    fn of(s: &'a mut IntScratch<'_>) -> Self {
        let hs =
            HeadScratch { scores: s.scores, row: s.qrow, wide: s.wide, pk: s.pk, novelty: s.novelty, index: s.index };
        Heads { q: s.q, k: s.k, v: s.v, mg: s.mg, o: s.o, hs }
    }

    /// Head `h`'s query, key and value (`d_qk`, `d_qk`, `d_v`), its output row and the
    /// scratch it works in.
    #[inline]
    fn head(&mut self, h: usize, (dk, dv): (usize, usize)) -> ([&'a [i32]; 3], &mut [i32], &mut HeadScratch<'a>) {
        let (q, k, v) = (&self.q[h * dk..(h + 1) * dk], &self.k[h * dk..(h + 1) * dk], &self.v[h * dv..(h + 1) * dv]);
        ([q, k, v], &mut self.o[h * dv..(h + 1) * dv], &mut self.hs)
    }
}

/// Layer `l`'s `LN_s_k` weight and bias.
fn ln_sk<'m>(pass: &Pass<'_, 'm>, l: usize) -> (Vector<'m>, Vector<'m>) {
    (pass.model.vector(Role::LnSkW, l), pass.model.vector(Role::LnSkB, l))
}

/// Head `h` of a KVM layer's state `st`, `LN_s_k` the layer's.
fn kvm_head<'l, 's>(
    pass: &'l Pass<'_, '_>,
    ln_sk: (Vector<'l>, Vector<'l>),
    st: &'l mut IntLayer<'s>,
    h: usize,
) -> KvmHead<'l, 's> {
    KvmHead { st, h, cfg: pass.model.config(), state_len: pass.lay.state_len, ln_sk }
}

impl Numerics for IntActs<'_, '_> {
    type Layer<'l> = IntLayer<'l>;
    type Begun = ();

    fn layer<'l>(pass: &Pass<'_, '_>, layers: &'l mut [f32], reads: &'l mut [f32], l: usize) -> IntLayer<'l> {
        let (lay, cfg) = (pass.lay, pass.model.config());
        let (words, sizes) = lay.layer_words(layers, l);
        let reads = (lay.reads == SlotReads::Recomputed).then_some(reads);
        IntLayer::carve(words, reads, sizes, cfg, (lay.state_len, lay.int_rows()), cfg.is_alt(l))
    }

    fn embed(&mut self, pass: &Pass<'_, '_>, tokens: &[u32]) {
        let (model, cfg, s) = (pass.model, pass.model.config(), &mut *self.s);
        debug_assert_eq!(tokens.len(), 1, "an integer pass is one token's");
        let token = tokens.first().map_or(0, |&t| t as usize);
        dequant_row(&model.matrix(Role::TokEmbed, 0), token, s.x);
        layer_norm(s.x, 0, model.vector(Role::LnEmbW, 0), model.vector(Role::LnEmbB, 0));
        let (half, alt_half) = (cfg.rope_dim as usize / 2, cfg.alt_rope_dim as usize / 2);
        rope_tables(pass.rope, half, self.plan.t, s.rope);
        rope_tables(pass.alt_rope, alt_half, self.plan.t, s.alt_rope);
    }

    #[inline]
    fn tap(&mut self, _pass: &Pass<'_, '_>, tap: &mut Option<&mut TapFn<'_>>, at: Tap) {
        tap_fixed(tap, at, self.s.x, self.s.a);
    }

    /// Never: fixed-point values saturate.
    #[inline]
    fn non_finite(&self) -> bool {
        false
    }

    #[inline]
    fn norm(&mut self, _pass: &Pass<'_, '_>, w: Vector<'_>, b: Vector<'_>) {
        self.s.a.copy_from_slice(self.s.x);
        layer_norm(self.s.a, 0, w, b);
    }

    fn first_kvm_value(&mut self, pass: &Pass<'_, '_>, k: usize) {
        let s = &mut *self.s;
        product(pass, (Role::Wv, k), s.a, s.x16, s.v_first_kvm);
    }

    fn project(&mut self, pass: &Pass<'_, '_>, l: usize, merge_gate: bool) {
        let (model, cfg, s) = (pass.model, pass.model.config(), &mut *self.s);
        // One product input for every matrix that reads a
        let x16 = &mut s.x16[..cfg.d_model as usize];
        let sh = to_input(s.a, x16);
        let exec = pass.exec;
        matvec_rows(exec, &model.matrix(Role::Wq, l), x16, sh, s.q);
        matvec_rows(exec, &model.matrix(Role::Wk, l), x16, sh, s.k);
        matvec_rows(exec, &model.matrix(Role::Wv, l), x16, sh, s.v);
        if cfg.has(flags::VALUE_RESIDUAL) {
            matvec_rows(exec, &model.matrix(Role::VGate1, l), x16, sh, s.vg_lo);
        }
        if merge_gate {
            matvec_rows(exec, &model.matrix(Role::MergeGate, l), x16, sh, s.mg);
        }
    }

    fn value_residual(&mut self, pass: &Pass<'_, '_>, l: usize) {
        let (model, cfg, s) = (pass.model, pass.model.config(), &mut *self.s);
        if l == 0 {
            s.v_first.copy_from_slice(s.v);
        }
        product(pass, (Role::VGate2, l), s.vg_lo, s.x16, s.vg);
        let own = !cfg.is_hybrid() || cfg.is_alt(l) || cfg.has(flags::ALT_SHARE_V0);
        let v_first: &[i32] = if own { s.v_first } else { s.v_first_kvm };
        for (((v, &vf), &z), g0) in
            s.v.iter_mut().zip(v_first).zip(s.vg.iter()).zip(model.vector(Role::VGate0, l).iter_fixed())
        {
            let g = sigmoid(z.saturating_add(g0));
            *v = v.saturating_add(mul_fx(vf.saturating_sub(*v), g));
        }
    }

    fn shift(&mut self, pass: &Pass<'_, '_>, l: usize, st: &mut IntLayer<'_>) {
        let (model, s) = (pass.model, &mut *self.s);
        let first = self.plan.t == 0;
        token_shift(s.q, st.prev_q, model.vector(Role::ShiftQ, l), first);
        token_shift(s.k, st.prev_k, model.vector(Role::ShiftK, l), first);
        token_shift(s.v, st.prev_v, model.vector(Role::ShiftV, l), first);
    }

    fn norm_rope(&mut self, pass: &Pass<'_, '_>, l: usize) {
        let (model, cfg, s) = (pass.model, pass.model.config(), &mut *self.s);
        let dk = cfg.d_qk as usize;
        let (lnq, lnk) = ((Role::LnQW, Role::LnQB), (Role::LnKW, Role::LnKB));
        let (half, tables) = if cfg.is_alt(l) {
            (cfg.alt_rope_dim as usize / 2, &*s.alt_rope)
        } else {
            (cfg.rope_dim as usize / 2, &*s.rope)
        };
        for (rows, (w, b)) in [(&mut *s.q, lnq), (&mut *s.k, lnk)] {
            for head in rows.chunks_exact_mut(dk) {
                layer_norm(head, 0, model.vector(w, l), model.vector(b, l));
                rope_apply(head, tables, half);
            }
        }
    }

    fn merge_gates(&mut self, on: bool) {
        if on {
            self.s.mg.iter_mut().for_each(|m| *m = one_plus_elu(*m));
        } else {
            self.s.mg.fill(ONE);
        }
    }

    /// Recomputed slot reads: every slot's rows from its sums, before the updates.
    fn kvm_begin(&mut self, pass: &Pass<'_, '_>, l: usize, st: &mut IntLayer<'_>) {
        if pass.lay.reads == SlotReads::Recomputed {
            let hs = &mut Heads::of(self.s).hs;
            let ln_sk = ln_sk(pass, l);
            for h in 0..pass.model.config().n_heads as usize {
                let mut head = kvm_head(pass, ln_sk, st, h);
                (0..self.plan.slots_before).for_each(|slot| head.refresh(slot, true, hs));
            }
        }
    }

    fn kvm_heads(&mut self, pass: &Pass<'_, '_>, l: usize, st: &mut IntLayer<'_>, _: ()) {
        let (model, cfg, plan) = (pass.model, pass.model.config(), &self.plan);
        let (h_n, dk, dv) = (cfg.n_heads as usize, cfg.d_qk as usize, cfg.d_v as usize);
        let scale = inv_sqrt(dk);
        let temps =
            cfg.has(flags::HEAD_TEMPS).then(|| (model.vector(Role::FrontTemp, l), model.vector(Role::StateTemp, l)));
        let mut heads = Heads::of(self.s);
        let ln_sk = ln_sk(pass, l);
        for h in 0..h_n {
            let mg = heads.mg[h];
            let ([q, k, v], out, hs) = heads.head(h, (dk, dv));
            let mut head = kvm_head(pass, ln_sk, st, h);
            if let Some(b) = plan.fold_begin {
                head.fold(b, plan.slots_before, plan.slots_after, hs);
            }
            head.update(plan, k, v, mg, hs);
            let a = temps.map_or((scale, scale), |(f, st)| (mul_fx(scale, f.fixed(h)), mul_fx(scale, st.fixed(h))));
            head.attend(q, plan, a, hs, out);
        }
    }

    fn swa_heads(&mut self, pass: &Pass<'_, '_>, _l: usize, st: &mut IntLayer<'_>) {
        let cfg = pass.model.config();
        let (h_n, dk, dv) = (cfg.n_heads as usize, cfg.d_qk as usize, cfg.d_v as usize);
        let scale = inv_sqrt(dk);
        let mut heads = Heads::of(self.s);
        for h in 0..h_n {
            let ([q, k, v], out, hs) = heads.head(h, (dk, dv));
            let mut head = SwaHead { st: &mut *st, h, window: cfg.alt_window as usize };
            head.step(self.plan.t, (q, k, v), scale, hs, out);
        }
    }

    fn output(&mut self, pass: &Pass<'_, '_>, l: usize) {
        let s = &mut *self.s;
        product(pass, (Role::Wo, l), s.o, s.x16, s.a);
    }

    #[inline]
    fn residual(&mut self, pass: &Pass<'_, '_>) {
        axpy(self.s.x, fixed_of(pass.model.config().residual_scale), self.s.a);
    }

    fn shift_ffn(&mut self, pass: &Pass<'_, '_>, l: usize, st: &mut IntLayer<'_>) {
        token_shift(self.s.a, st.prev_m, pass.model.vector(Role::ShiftFfn, l), false);
    }

    fn up(&mut self, pass: &Pass<'_, '_>, l: usize) {
        let s = &mut *self.s;
        product(pass, (Role::WUp, l), s.a, s.x16, s.ff);
    }

    fn down(&mut self, pass: &Pass<'_, '_>, l: usize) {
        let s = &mut *self.s;
        // relu(h)^2 as the product's input
        let x16 = &mut s.x16[..s.ff.len()];
        let sq = relu_sq_input(s.ff, x16);
        matvec_rows(pass.exec, &pass.model.matrix(Role::WDown, l), x16, sq, s.a);
    }

    /// In fixed point, then the f32 of each logit (exact up to 24 bits).
    fn head(&mut self, pass: &Pass<'_, '_>, logits: Logits<'_>) {
        let (model, cfg, s) = (pass.model, pass.model.config(), &mut *self.s);
        let vocab = cfg.vocab_len as usize;
        let out = match logits {
            Logits::None => return,
            Logits::Last => &mut s.logits[..vocab],
            Logits::All(out) => &mut out[..vocab],
        };
        s.a.copy_from_slice(s.x);
        layer_norm(s.a, 0, model.vector(Role::LnHeadW, 0), model.vector(Role::LnHeadB, 0));
        let z: &mut [i32] = bytemuck::cast_slice_mut(out);
        product(pass, (Role::LmHead, 0), s.a, s.x16, z);
        let cap = fixed_of(cfg.logit_softcap);
        if cap > 0 {
            let inv_cap = ((1i64 << (2 * FX)) / i64::from(cap)) as i32;
            z.iter_mut().for_each(|z| *z = mul_fx(cap, tanh(mul_fx(*z, inv_cap))));
        }
        for v in z.iter_mut() {
            *v = (*v as f32 * (1.0 / ONE as f32)).to_bits() as i32;
        }
    }

    #[inline]
    fn after(&self, _pass: &Pass<'_, '_>) -> Counters {
        self.plan.next()
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::exec::Serial;
    use crate::quant::{quantize_matrix, DType};
    use std::vec;
    use std::vec::Vec;

    /// A product whose rows are spread in pieces (4,096 columns: 16 rows a piece, so five
    /// pieces of 16 and one of 4) gives the bits of the product in one call.
    #[test]
    fn a_product_split_by_rows_gives_the_whole_products_bits() {
        let (rows, cols) = (84, 4096);
        assert!(rows > PIECE_WEIGHTS / cols, "one piece would test nothing");
        let src: Vec<f32> = (0..rows * cols).map(|i| (i * 7919 % 1001) as f32 / 500.0 - 1.0).collect();
        let mut data = vec![0u8; DType::I8.matrix_bytes(rows, cols).unwrap()];
        quantize_matrix(DType::I8, cols, &src, &mut data).unwrap();
        let w = Matrix::new(DType::I8, rows, cols, &data).unwrap();
        let x: Vec<i16> = (0..cols).map(|c| (c * 31 % 2001) as i16 - 1000).collect();
        for s in [0, 5] {
            let mut whole = vec![0i32; rows];
            matvec(&w, &x, s, &mut whole);
            let mut split = vec![0i32; rows];
            matvec_rows(&Serial, &w, &x, s, &mut split);
            assert_eq!(split, whole, "s = {s}");
        }
    }
}

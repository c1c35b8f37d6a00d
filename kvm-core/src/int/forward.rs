//! The forward pass of spec §2 in the integer numerics (docs/integer.md), one token at a
//! time: embedding, then per layer its mixer's attention (a KVM layer's over its means
//! state, or an alternate layer's over its ring) and the MLP, then the head. The same
//! steps as [`crate::forward`], each a comment.

use crate::cache::SlotReads;
use crate::config::flags;
use crate::fixed::{fixed_of, isqrt, mul_fx, one_plus_elu, shr32, sigmoid, tanh, FX, ONE};
use crate::format::Role;
use crate::forward::{Tap, TapFn};
use crate::int::head::{HeadScratch, KvmHead, SwaHead};
use crate::int::ops::{dequant_row, layer_norm, matvec, relu_sq_input, to_input};
use crate::math::Rope;
use crate::model::Model;
use crate::state::arena_int::{IntLayer, IntScratch};
use crate::state::plan::{Counters, Phase, Plan};
use crate::state::Layout;
use crate::tensor::Vector;

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

/// The pieces of one integer step.
pub(crate) struct IntPass<'p, 'm> {
    pub model: &'p Model<'m>,
    pub rope: &'p Rope,
    pub alt_rope: &'p Rope,
    pub lay: &'p Layout,
    pub at: Counters,
    pub phase: Phase,
}

impl IntPass<'_, '_> {
    /// `y = w x` for layer `l`'s matrix `role`, `x` fixed point (as a product input in
    /// `x16`).
    fn product(&self, role: Role, l: usize, x: &[i32], x16: &mut [i16], y: &mut [i32]) {
        let w = self.model.matrix(role, l);
        let s = to_input(x, &mut x16[..x.len()]);
        matvec(&w, &x16[..x.len()], s, y);
    }

    /// Feeds token `token` (at `self.at.pos`) through the network, updating every layer
    /// in `layers`; with `logits`, the token's logits (f32 of the fixed-point values) go
    /// to `s.logits`.
    /// `reads` holds one layer's slot read rows where they are recomputed (else empty).
    pub(crate) fn step(
        &self,
        token: u32,
        (layers, reads): (&mut [f32], &mut [f32]),
        s: &mut IntScratch<'_>,
        logits: bool,
        tap: &mut Option<&mut TapFn<'_>>,
    ) -> Counters {
        let (model, cfg) = (self.model, self.model.config());
        let t = self.at.pos;
        let plan = Plan::new(cfg, self.lay.state_len, self.at, self.phase);

        // x0 = LN_emb(wte[token]): [d_model]; the RoPE tables of position t
        dequant_row(&model.matrix(Role::TokEmbed, 0), token as usize, s.x);
        layer_norm(s.x, 0, model.vector(Role::LnEmbW, 0), model.vector(Role::LnEmbB, 0));
        tap_fixed(tap, Tap::Embed, s.x, s.a);
        let (half, alt_half) = (cfg.rope_dim as usize / 2, cfg.alt_rope_dim as usize / 2);
        rope_tables(self.rope, half, t, s.rope);
        rope_tables(self.alt_rope, alt_half, t, s.alt_rope);
        // A hybrid's KVM layers' v_first = c_v(LN_attn(x0)) of the first KVM layer
        if cfg.is_hybrid() && cfg.has(flags::VALUE_RESIDUAL) && !cfg.has(flags::ALT_SHARE_V0) {
            let k = cfg.first_kvm_layer();
            s.a.copy_from_slice(s.x);
            layer_norm(s.a, 0, model.vector(Role::LnAttnW, k), model.vector(Role::LnAttnB, k));
            self.product(Role::Wv, k, s.a, s.x16, s.v_first_kvm);
        }

        for l in 0..cfg.n_layers as usize {
            let (words, sizes) = self.lay.layer_words(layers, l);
            let reads = (self.lay.reads == SlotReads::Recomputed).then_some(&mut *reads);
            let rows = (self.lay.state_len, self.lay.int_rows());
            let mut st = IntLayer::carve(words, reads, sizes, cfg, rows, cfg.is_alt(l));
            // x = x + residual_scale * Attn(LN_attn(x))
            s.a.copy_from_slice(s.x);
            layer_norm(s.a, 0, model.vector(Role::LnAttnW, l), model.vector(Role::LnAttnB, l));
            self.attention(l, &plan, &mut st, s);
            let rs = fixed_of(cfg.residual_scale);
            axpy(s.x, rs, s.a);
            // x = x + residual_scale * MLP(LN_mlp(x))
            s.a.copy_from_slice(s.x);
            layer_norm(s.a, 0, model.vector(Role::LnMlpW, l), model.vector(Role::LnMlpB, l));
            self.mlp(l, &mut st, s);
            axpy(s.x, rs, s.a);
            tap_fixed(tap, Tap::Block(l), s.x, s.a);
        }

        // logits = lm_head(LN_head(x)): [vocab_len], optionally soft-capped; the f32 of
        // each fixed-point logit (exact up to 24 bits)
        if logits {
            s.a.copy_from_slice(s.x);
            layer_norm(s.a, 0, model.vector(Role::LnHeadW, 0), model.vector(Role::LnHeadB, 0));
            let vocab = cfg.vocab_len as usize;
            let z: &mut [i32] = bytemuck::cast_slice_mut(&mut s.logits[..vocab]);
            self.product(Role::LmHead, 0, s.a, s.x16, z);
            let cap = fixed_of(cfg.logit_softcap);
            if cap > 0 {
                let inv_cap = ((1i64 << (2 * FX)) / i64::from(cap)) as i32;
                z.iter_mut().for_each(|z| *z = mul_fx(cap, tanh(mul_fx(*z, inv_cap))));
            }
            for v in s.logits[..vocab].iter_mut() {
                *v = v.to_bits() as i32 as f32 * (1.0 / ONE as f32);
            }
        }
        plan.next()
    }

    /// `s.a <- Attn(s.a)` for layer `l` (spec §2 "Attn"; §5 for an alternate layer).
    fn attention(&self, l: usize, plan: &Plan, st: &mut IntLayer<'_>, s: &mut IntScratch<'_>) {
        let (model, cfg) = (self.model, self.model.config());
        let (dk, alt) = (cfg.d_qk as usize, cfg.is_alt(l));
        let merge_gate = !alt && (cfg.has(flags::MERGE_GATE_KEYS) || cfg.has(flags::MERGE_GATE_VALUES));
        // 1.-2. q = c_q a, k = c_k a, v = c_v a (+ value residual), merge gate logits
        self.products(l, merge_gate, s);
        // 3. token shift of q, k, v towards the previous token's (itself at t = 0)
        if cfg.has(flags::TOKENSHIFT_ATT) {
            let first = self.at.pos == 0;
            token_shift(s.q, st.prev_q, model.vector(Role::ShiftQ, l), first);
            token_shift(s.k, st.prev_k, model.vector(Role::ShiftK, l), first);
            token_shift(s.v, st.prev_v, model.vector(Role::ShiftV, l), first);
        }
        // 4.-5. per-head LN_q / LN_k, then partial RoPE at the token's position
        let (lnq, lnk) = ((Role::LnQW, Role::LnQB), (Role::LnKW, Role::LnKB));
        let (half, tables) =
            if alt { (cfg.alt_rope_dim as usize / 2, &*s.alt_rope) } else { (cfg.rope_dim as usize / 2, &*s.rope) };
        for (rows, (w, b)) in [(&mut *s.q, lnq), (&mut *s.k, lnk)] {
            for head in rows.chunks_exact_mut(dk) {
                layer_norm(head, 0, model.vector(w, l), model.vector(b, l));
                rope_apply(head, tables, half);
            }
        }
        // 6. merge gate m_h = 1 + elu(key_weighting a): [n_heads]
        if merge_gate {
            s.mg.iter_mut().for_each(|m| *m = one_plus_elu(*m));
        } else {
            s.mg.fill(ONE);
        }
        // 7. per head: the state updates, then o_h = attention of q_h over the head's
        //    state slots and window (an alternate layer's: over its ring)
        self.heads(l, plan, st, s);
        // Attn = c_proj(concat o_h)
        self.product(Role::Wo, l, s.o, s.x16, s.a);
    }

    /// Steps 1-2 of layer `l`'s attention: `s.q`, `s.k`, `s.v` (after the value residual,
    /// when the model has one) and, with `merge_gate`, the merge gates' logits `s.mg`, all
    /// from `s.a`.
    fn products(&self, l: usize, merge_gate: bool, s: &mut IntScratch<'_>) {
        let (model, cfg) = (self.model, self.model.config());
        let alt = cfg.is_alt(l);
        // 1. q = c_q a, k = c_k a, v = c_v a; v_gate1 a; key_weighting a
        let x16 = &mut s.x16[..cfg.d_model as usize];
        let sh = to_input(s.a, x16);
        matvec(&model.matrix(Role::Wq, l), x16, sh, s.q);
        matvec(&model.matrix(Role::Wk, l), x16, sh, s.k);
        matvec(&model.matrix(Role::Wv, l), x16, sh, s.v);
        let vres = cfg.has(flags::VALUE_RESIDUAL);
        if vres {
            matvec(&model.matrix(Role::VGate1, l), x16, sh, s.vg_lo);
        }
        if merge_gate {
            matvec(&model.matrix(Role::MergeGate, l), x16, sh, s.mg);
        }
        // 2. value residual: v += (v_first - v) * sigmoid(v_gate0 + v_gate2(v_gate1 a))
        if vres {
            if l == 0 {
                s.v_first.copy_from_slice(s.v);
            }
            self.product(Role::VGate2, l, s.vg_lo, s.x16, s.vg);
            let own = !cfg.is_hybrid() || alt || cfg.has(flags::ALT_SHARE_V0);
            let v_first: &[i32] = if own { s.v_first } else { s.v_first_kvm };
            for (((v, &vf), &z), g0) in
                s.v.iter_mut().zip(v_first).zip(s.vg.iter()).zip(model.vector(Role::VGate0, l).iter_fixed())
            {
                let g = sigmoid(z.saturating_add(g0));
                *v = v.saturating_add(mul_fx(vf.saturating_sub(*v), g));
            }
        }
    }

    /// Step 7 of layer `l`'s attention: per head, the state updates, then `o_h`, the
    /// attention of `q_h` over the head's state slots and window (an alternate layer's:
    /// over its ring), into `s.o`.
    fn heads(&self, l: usize, plan: &Plan, st: &mut IntLayer<'_>, s: &mut IntScratch<'_>) {
        let (model, cfg) = (self.model, self.model.config());
        let (h_n, dk, dv) = (cfg.n_heads as usize, cfg.d_qk as usize, cfg.d_v as usize);
        let alt = cfg.is_alt(l);
        let scale = inv_sqrt(dk);
        let mut hs =
            HeadScratch { scores: s.scores, row: s.qrow, wide: s.wide, pk: s.pk, novelty: s.novelty, index: s.index };
        let temps =
            cfg.has(flags::HEAD_TEMPS).then(|| (model.vector(Role::FrontTemp, l), model.vector(Role::StateTemp, l)));
        let ln_sk = (model.vector(Role::LnSkW, l), model.vector(Role::LnSkB, l));
        // Recomputed slot reads: every slot's rows from its sums, before the updates
        if !alt && self.lay.reads == SlotReads::Recomputed {
            for h in 0..h_n {
                let mut head = KvmHead { st: &mut *st, h, cfg, state_len: self.lay.state_len, ln_sk };
                (0..plan.slots_before).for_each(|slot| head.refresh(slot, true, &mut hs));
            }
        }
        for h in 0..h_n {
            let q = &s.q[h * dk..(h + 1) * dk];
            let (k, v) = (&s.k[h * dk..(h + 1) * dk], &s.v[h * dv..(h + 1) * dv]);
            let out = &mut s.o[h * dv..(h + 1) * dv];
            if alt {
                let mut head = SwaHead { st: &mut *st, h, window: cfg.alt_window as usize };
                head.step(plan.t, (q, k, v), scale, &mut hs, out);
                continue;
            }
            let mut head = KvmHead { st: &mut *st, h, cfg, state_len: self.lay.state_len, ln_sk };
            if let Some(b) = plan.fold_begin {
                head.fold(b, plan.slots_before, plan.slots_after, &mut hs);
            }
            head.update(plan, k, v, s.mg[h], &mut hs);
            let a = temps.map_or((scale, scale), |(f, st)| (mul_fx(scale, f.fixed(h)), mul_fx(scale, st.fixed(h))));
            head.attend(q, plan, a, &mut hs, out);
        }
    }

    /// `s.a <- MLP(s.a)` for layer `l`: `c_proj(relu(c_fc m)^2)`, `m` token-shifted
    /// towards the previous token's LN_mlp output (zero at t = 0).
    fn mlp(&self, l: usize, st: &mut IntLayer<'_>, s: &mut IntScratch<'_>) {
        let model = self.model;
        if model.config().has(flags::TOKENSHIFT_FFN) {
            token_shift(s.a, st.prev_m, model.vector(Role::ShiftFfn, l), false);
        }
        self.product(Role::WUp, l, s.a, s.x16, s.ff);
        // relu(h)^2 as the next product's input
        let x16 = &mut s.x16[..s.ff.len()];
        let sq = relu_sq_input(s.ff, x16);
        matvec(&model.matrix(Role::WDown, l), x16, sq, s.a);
    }
}

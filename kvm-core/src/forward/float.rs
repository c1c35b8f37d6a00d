//! The float numerics' operations ([`Numerics`] for [`FloatActs`]): `f32` activations of
//! a batch of tokens, attention rows in the cache dtype; the products through the pass's
//! [`crate::exec::Exec`], the per-token rows spread through its pieces, step 7 through
//! [`LayerStep`].

use crate::cache::copied;
use crate::config::flags;
use crate::format::Role;
use crate::forward::attn::{self, layer_inputs};
use crate::forward::numerics::Numerics;
use crate::forward::pass::Pass;
use crate::forward::{Logits, Tap, TapFn};
use crate::kernels;
use crate::math::{all_finite, axpy, elu, layer_norm, layer_norm_inplace, token_shift};
use crate::state::attend::{read, FloatRead, Reads};
use crate::state::plan::Segment;
use crate::state::{ring_runs, Acts, Counters, LayerState, LayerStep, Scratch};
use crate::tensor::Vector;

/// A float pass's activations (`[n, ...]` rows, one a token) and its step scratch.
pub(crate) struct FloatActs<'w, 's> {
    x: &'w mut Acts<'s>,
    s: &'w mut Scratch<'s>,
}

impl<'w, 's> FloatActs<'w, 's> {
    /// The batch's activations `x` and the step's scratch `s`.
    #[inline]
    pub(crate) fn new(x: &'w mut Acts<'s>, s: &'w mut Scratch<'s>) -> Self {
        FloatActs { x, s }
    }
}

/// Layer `l`'s step 7 over the pass's tokens.
fn layer_step<'p>(pass: &Pass<'p, '_>, l: usize) -> LayerStep<'p> {
    let model = pass.model;
    let cfg = model.config();
    let ln_sk = (model.vector(Role::LnSkW, l), model.vector(Role::LnSkB, l));
    let temps =
        cfg.has(flags::HEAD_TEMPS).then(|| (model.vector(Role::FrontTemp, l), model.vector(Role::StateTemp, l)));
    LayerStep::new(cfg, pass.lay, pass.at, pass.phase, ln_sk, temps)
}

impl Numerics for FloatActs<'_, '_> {
    type Layer<'l> = LayerState<'l>;
    type Begun = Segment;

    #[inline]
    fn layer<'l>(pass: &Pass<'_, '_>, layers: &'l mut [f32], reads: &'l mut [f32], l: usize) -> LayerState<'l> {
        pass.lay.carve_layer(layers, reads, l)
    }

    fn embed(&mut self, pass: &Pass<'_, '_>, tokens: &[u32]) {
        let (model, at, x) = (pass.model, pass.at, &mut *self.x);
        let cfg = model.config();
        let (d, half, ah) = (cfg.d_model as usize, cfg.rope_dim as usize / 2, cfg.alt_rope_dim as usize / 2);
        let (ln_w, ln_b) = (model.vector(Role::LnEmbW, 0), model.vector(Role::LnEmbB, 0));
        for (i, &token) in tokens.iter().enumerate() {
            let row = &mut x.x[i * d..(i + 1) * d];
            kernels::dequant_row(&model.matrix(Role::TokEmbed, 0), token as usize, row);
            layer_norm_inplace(row, ln_w, ln_b);
            pass.rope.tables(at.pos + i, &mut x.cos[i * half..(i + 1) * half], &mut x.sin[i * half..(i + 1) * half]);
            let (cos, sin) = (&mut x.alt_cos[i * ah..(i + 1) * ah], &mut x.alt_sin[i * ah..(i + 1) * ah]);
            pass.alt_rope.tables(at.pos + i, cos, sin);
        }
    }

    #[inline]
    fn tap(&mut self, pass: &Pass<'_, '_>, tap: &mut Option<&mut TapFn<'_>>, at: Tap) {
        if let Some(tap) = tap {
            let d = pass.model.config().d_model as usize;
            self.x.x.chunks_exact(d).for_each(|row| tap(at, row));
        }
    }

    #[inline]
    fn non_finite(&self) -> bool {
        !all_finite(self.x.x)
    }

    #[inline]
    fn norm(&mut self, pass: &Pass<'_, '_>, w: Vector<'_>, b: Vector<'_>) {
        let d = pass.model.config().d_model as usize;
        pass.rows_layer_norm(self.x.x, self.x.a, d, w, b);
    }

    fn first_kvm_value(&mut self, pass: &Pass<'_, '_>, k: usize) {
        let x = &mut *self.x;
        pass.exec.matmul(&pass.model.matrix(Role::Wv, k), x.a, x.v_first_kvm, x.act);
    }

    #[inline]
    fn project(&mut self, pass: &Pass<'_, '_>, l: usize, merge_gate: bool) {
        attn::project(pass, l, self.x, merge_gate);
    }

    #[inline]
    fn value_residual(&mut self, pass: &Pass<'_, '_>, l: usize) {
        attn::value_residual(pass, l, self.x);
    }

    #[inline]
    fn shift(&mut self, pass: &Pass<'_, '_>, l: usize, st: &mut LayerState<'_>) {
        attn::shift(pass, l, st, self.x);
    }

    #[inline]
    fn norm_rope(&mut self, pass: &Pass<'_, '_>, l: usize) {
        attn::norm_rope(pass, l, self.x);
    }

    fn merge_gates(&mut self, on: bool) {
        if on {
            for m in self.x.mg.iter_mut() {
                *m = 1.0 + elu(*m);
            }
        } else {
            self.x.mg.fill(1.0);
        }
    }

    #[inline]
    fn kvm_begin(&mut self, pass: &Pass<'_, '_>, l: usize, st: &mut LayerState<'_>) -> Segment {
        layer_step(pass, l).begin(st, self.x.n)
    }

    #[inline]
    fn kvm_heads(&mut self, pass: &Pass<'_, '_>, l: usize, st: &mut LayerState<'_>, first: Segment) {
        layer_step(pass, l).run(st, first, self.x, self.s, pass.exec);
    }

    fn swa_heads(&mut self, pass: &Pass<'_, '_>, _l: usize, st: &mut LayerState<'_>) {
        let cfg = pass.model.config();
        let (x, s) = (&mut *self.x, &mut *self.s);
        let (nh, dk, dv, wa) = (cfg.n_heads as usize, cfg.d_qk as usize, cfg.d_v as usize, cfg.alt_window as usize);
        let (qd, vd, n, pos) = (cfg.q_dim(), cfg.v_dim(), x.n, pass.at.pos);
        let scale = 1.0 / libm::sqrtf(dk as f32);
        let (q, k, v) = (&*x.q, &*x.k, &*x.v);
        let heads = st.heads(nh);
        // [n_heads, n, d_v] into x.att, the heads' jobs in parallel, each with its own
        // scores ([Wa])
        pass.exec.heads(&mut x.att[..nh * n * dv], n * dv, &mut s.scores[..nh * wa], wa, &|h, out, scores| {
            // SAFETY: `Exec::heads` runs this once for each head `h < nh`. Head h's ring is
            // the ring of a one-head layer: position j at j % Wa.
            let mut own = unsafe { heads.head(h) };
            for (i, out) in out.chunks_exact_mut(dv).enumerate() {
                let t = pos + i;
                let begin = (t + 1).saturating_sub(wa);
                own.wk.set(t % wa, dk, copied(&k[i * qd + h * dk..][..dk]));
                own.wv.set(t % wa, dv, copied(&v[i * vd + h * dv..][..dv]));
                let reads = Reads { state: 0..0, window: ring_runs(wa, begin, t + 1) };
                let (keys, values) = (own.wk.as_rows(), own.wv.as_rows());
                let q = &q[i * qd + h * dk..i * qd + (h + 1) * dk];
                let mut arith =
                    FloatRead { q, keys: [keys; 2], values: [values; 2], temps: None, scale, dims: (dk, dv) };
                read(&mut arith, &reads, scores, out);
            }
        });
        // concat o_h: [n, n_heads * d_v] into v's rows, which the pushes consumed
        for (h, o) in x.att[..nh * n * dv].chunks_exact(n * dv).enumerate() {
            for (i, o) in o.chunks_exact(dv).enumerate() {
                x.v[i * vd + h * dv..i * vd + (h + 1) * dv].copy_from_slice(o);
            }
        }
    }

    #[inline]
    fn output(&mut self, pass: &Pass<'_, '_>, l: usize) {
        attn::output(pass, l, self.x);
    }

    #[inline]
    fn residual(&mut self, pass: &Pass<'_, '_>) {
        axpy(self.x.x, pass.model.config().residual_scale, self.x.a);
    }

    fn shift_ffn(&mut self, pass: &Pass<'_, '_>, l: usize, st: &mut LayerState<'_>) {
        let model = pass.model;
        let (d, mix) = (model.config().d_model as usize, model.vector(Role::ShiftFfn, l));
        for row in self.x.a.chunks_exact_mut(d) {
            token_shift(row, st.prev_m, mix, false);
        }
    }

    fn up(&mut self, pass: &Pass<'_, '_>, l: usize) {
        let (model, x) = (pass.model, &mut *self.x);
        pass.exec.matmul(&model.matrix(Role::WUp, l), x.a, x.ff, x.act);
        pass.exec.upcoming(&[model.matrix(Role::WDown, l)]);
    }

    fn down(&mut self, pass: &Pass<'_, '_>, l: usize) {
        let (model, x) = (pass.model, &mut *self.x);
        for h in x.ff.iter_mut() {
            // relu(h)^2 by a compare: `f32::max` is a libm call on single-precision FPUs, and
            // the square makes -0.0 and a NaN (both sent to 0 here) give `max`'s bits.
            let r = if *h > 0.0 { *h } else { 0.0 };
            *h = r * r;
        }
        pass.exec.matmul(&model.matrix(Role::WDown, l), x.ff, x.a, x.act);
        // The next layer's first products (or the head's), while the residual adds.
        if l + 1 < model.config().n_layers as usize {
            pass.exec.upcoming(&layer_inputs(model, l + 1));
        } else {
            pass.exec.upcoming(&[model.matrix(Role::LmHead, 0)]);
        }
    }

    fn head(&mut self, pass: &Pass<'_, '_>, logits: Logits<'_>) {
        let (model, exec, x) = (pass.model, pass.exec, &mut *self.x);
        let cfg = model.config();
        let d = cfg.d_model as usize;
        let (ln_w, ln_b) = (model.vector(Role::LnHeadW, 0), model.vector(Role::LnHeadB, 0));
        let lm_head = model.matrix(Role::LmHead, 0);
        let out: &mut [f32] = match logits {
            Logits::None => &mut [],
            Logits::Last => {
                let last = (x.n - 1) * d;
                layer_norm(&x.x[last..last + d], ln_w, ln_b, &mut x.a[..d]);
                exec.matmul(&lm_head, &x.a[..d], self.s.logits, x.act);
                self.s.logits
            }
            Logits::All(out) => {
                pass.rows_layer_norm(x.x, x.a, d, ln_w, ln_b);
                exec.matmul(&lm_head, x.a, out, x.act);
                out
            }
        };
        // The next step's (or batch's) first products, while the caller samples.
        exec.upcoming(&layer_inputs(model, 0));
        let cap = cfg.logit_softcap;
        if cap != 0.0 {
            for z in out.iter_mut() {
                *z = cap * libm::tanhf(*z / cap);
            }
        }
    }

    #[inline]
    fn after(&self, pass: &Pass<'_, '_>) -> Counters {
        pass.at.after(pass.model.config(), pass.lay.state_len, self.x.n)
    }
}

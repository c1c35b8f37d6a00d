//! The float numerics' steps of spec §2 "Attn" that every mixer's attention shares
//! ([`super::float`] answers [`super::Numerics`] with them): the products of the block
//! input (step 1), the value residual (2), the token shift (3), per-head LN_q / LN_k and
//! RoPE (4-5), and the output projection `c_proj`, over a batch's rows.

use crate::config::flags;
use crate::exec::Product;
use crate::format::Role;
use crate::forward::pass::{Pass, ROWS_PER_PIECE};
use crate::kernels;
use crate::math::{layer_norm_inplace, rope_apply, token_shift};
use crate::model::Model;
use crate::state::{Acts, LayerState};
use crate::tensor::Matrix;

/// The products of layer `l`'s first job (step 1): `c_q`, `c_k`, `c_v`, and the value
/// residual's `v_gate1` and the merge gate's `key_weighting` (empty matrices when the
/// model has none).
pub(super) fn layer_inputs<'m>(model: &Model<'m>, l: usize) -> [Matrix<'m>; 5] {
    [Role::Wq, Role::Wk, Role::Wv, Role::VGate1, Role::MergeGate].map(|role| model.matrix(role, l))
}

/// Step 1: `x.q = c_q a`, `x.k = c_k a`, `x.v = c_v a`, and, in the same job, the value
/// residual's `x.vg_lo = v_gate1 a` (when the model has one) and `x.mg = key_weighting
/// a` (with `merge_gate`).
pub(super) fn project(pass: &Pass<'_, '_>, l: usize, x: &mut Acts<'_>, merge_gate: bool) {
    let (model, exec) = (pass.model, pass.exec);
    let value_residual = model.config().has(flags::VALUE_RESIDUAL);
    let mut products: [Product<'_, '_>; 5] = Default::default();
    let mut n = 0;
    let outputs = [
        (true, &mut *x.q),
        (true, &mut *x.k),
        (true, &mut *x.v),
        (value_residual, &mut *x.vg_lo),
        (merge_gate, &mut *x.mg),
    ];
    for (w, (on, y)) in layer_inputs(model, l).into_iter().zip(outputs) {
        if on {
            products[n] = Product { w, y };
            n += 1;
        }
    }
    exec.matmuls(x.a, &mut products[..n], x.act);
    exec.upcoming(&[model.matrix(Role::Wo, l), model.matrix(Role::WUp, l)]);
}

/// Step 2: `v += (v_first - v) * sigmoid(v_gate0 + v_gate2(v_gate1 a))`, `v_first` being
/// the plain value projection of the first layer of the same kind (spec §5): layer 0's,
/// or in a hybrid the first KVM layer's for KVM layers, unless `alt_share_v0`.
pub(super) fn value_residual(pass: &Pass<'_, '_>, l: usize, x: &mut Acts<'_>) {
    let (model, cfg) = (pass.model, pass.model.config());
    if l == 0 {
        x.v_first.copy_from_slice(x.v);
    }
    pass.exec.matmul(&model.matrix(Role::VGate2, l), x.vg_lo, x.vg, x.act);
    // sigmoid(z) = 1 / (1 + e^-z), the exponentials with the SIMD kernel
    let g0 = model.vector(Role::VGate0, l);
    for row in x.vg.chunks_exact_mut(model.config().v_dim()) {
        for (vg, g) in row.iter_mut().zip(g0.iter()) {
            *vg = -(g + *vg);
        }
    }
    kernels::exp_sub(x.vg, 0.0);
    let own = !cfg.is_hybrid() || cfg.is_alt(l) || cfg.has(flags::ALT_SHARE_V0);
    let v_first: &[f32] = if own { x.v_first } else { x.v_first_kvm };
    for ((v, &vf), &e) in x.v.iter_mut().zip(v_first.iter()).zip(x.vg.iter()) {
        *v += (vf - *v) * (1.0 / (1.0 + e));
    }
}

/// Step 3: each token's q, k, v shifted towards the previous token's (itself at t = 0),
/// the last token's kept in `st` for the next batch.
pub(super) fn shift(pass: &Pass<'_, '_>, l: usize, st: &mut LayerState<'_>, x: &mut Acts<'_>) {
    let (model, cfg) = (pass.model, pass.model.config());
    let (qd, vd) = (cfg.q_dim(), cfg.v_dim());
    let (sq, sk, sv) = (model.vector(Role::ShiftQ, l), model.vector(Role::ShiftK, l), model.vector(Role::ShiftV, l));
    for i in 0..x.n {
        let first = pass.at.pos + i == 0;
        token_shift(&mut x.q[i * qd..(i + 1) * qd], st.prev_q, sq, first);
        token_shift(&mut x.k[i * qd..(i + 1) * qd], st.prev_k, sk, first);
        token_shift(&mut x.v[i * vd..(i + 1) * vd], st.prev_v, sv, first);
    }
}

/// Steps 4-5: per-head `LN_q` / `LN_k` of `x.q` and `x.k`, then partial RoPE at each
/// token's position (the tables in `x.cos`, `x.sin`; an alternate layer's in `x.alt_cos`,
/// `x.alt_sin`, spec §5).
pub(super) fn norm_rope(pass: &Pass<'_, '_>, l: usize, x: &mut Acts<'_>) {
    let (model, cfg) = (pass.model, pass.model.config());
    let (dk, qd) = (cfg.d_qk as usize, cfg.q_dim());
    let (lnq_w, lnq_b) = (model.vector(Role::LnQW, l), model.vector(Role::LnQB, l));
    let (lnk_w, lnk_b) = (model.vector(Role::LnKW, l), model.vector(Role::LnKB, l));
    let (half, cos, sin) = if cfg.is_alt(l) {
        (cfg.alt_rope_dim as usize / 2, &*x.alt_cos, &*x.alt_sin)
    } else {
        (cfg.rope_dim as usize / 2, &*x.cos, &*x.sin)
    };
    for (rows, w, b) in [(&mut *x.q, lnq_w, lnq_b), (&mut *x.k, lnk_w, lnk_b)] {
        pass.exec.pieces(rows, ROWS_PER_PIECE * qd, &|p, piece| {
            for (j, row) in piece.chunks_exact_mut(qd).enumerate() {
                let i = p * ROWS_PER_PIECE + j;
                let (cos, sin) = (&cos[i * half..(i + 1) * half], &sin[i * half..(i + 1) * half]);
                for head in row.chunks_exact_mut(dk) {
                    layer_norm_inplace(head, w, b);
                    rope_apply(head, cos, sin);
                }
            }
        });
    }
}

/// `x.a = c_proj(concat o_h)`, the heads' outputs side by side in `x.v`'s rows.
pub(super) fn output(pass: &Pass<'_, '_>, l: usize, x: &mut Acts<'_>) {
    let model = pass.model;
    pass.exec.matmul(&model.matrix(Role::Wo, l), x.v, x.a, x.act);
    pass.exec.upcoming(&[model.matrix(Role::WUp, l), model.matrix(Role::WDown, l)]);
}

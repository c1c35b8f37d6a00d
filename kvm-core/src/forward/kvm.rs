//! The KVM mixer (spec §2 "Attn", §3): a KVM layer's attention, each head's query over
//! its compressed means state and its window; step 7's schedule is
//! [`crate::state::LayerStep`]'s.

use crate::config::flags;
use crate::format::Role;
use crate::forward::attn;
use crate::forward::pass::Pass;
use crate::math::elu;
use crate::state::{Acts, LayerState, LayerStep, Scratch};

/// `x.a <- Attn(x.a)` for KVM layer `l`, every token of the batch in order.
pub(super) fn attention(pass: &Pass<'_, '_>, l: usize, st: &mut LayerState<'_>, x: &mut Acts<'_>, s: &mut Scratch<'_>) {
    let (model, cfg) = (pass.model, pass.model.config());
    let ln_sk = (model.vector(Role::LnSkW, l), model.vector(Role::LnSkB, l));
    let temps =
        cfg.has(flags::HEAD_TEMPS).then(|| (model.vector(Role::FrontTemp, l), model.vector(Role::StateTemp, l)));
    let step = LayerStep::new(cfg, pass.lay, pass.at, pass.phase, ln_sk, temps);
    let merge_gate = cfg.has(flags::MERGE_GATE_KEYS) || cfg.has(flags::MERGE_GATE_VALUES);

    // The slot reads (when the arena does not keep them) and the state rows the first
    // token writes in step 7, fetched while the products run.
    let first = step.begin(st, x.n);
    // 1. q = c_q a, k = c_k a: [n, n_heads * d_qk]; v = c_v a: [n, n_heads * d_v]; the
    //    value residual's v_gate1 a and the merge gate's key_weighting a: [n, n_heads]
    attn::project(pass, l, x, merge_gate);
    // 2. value residual: v += (v_first - v) * sigmoid(v_gate0 + v_gate2(v_gate1 a))
    if cfg.has(flags::VALUE_RESIDUAL) {
        attn::value_residual(pass, l, x);
    }
    // 3. token shift of q, k, v towards the previous token's (itself at t = 0)
    if cfg.has(flags::TOKENSHIFT_ATT) {
        attn::shift(pass, l, st, x);
    }
    // 4.-5. per-head LN_q / LN_k, then partial RoPE at each token's position
    attn::norm_rope(pass, l, x);
    // 6. merge gate m_h = 1 + elu(key_weighting a): [n, n_heads]
    if merge_gate {
        for m in x.mg.iter_mut() {
            *m = 1.0 + elu(*m);
        }
    } else {
        x.mg.fill(1.0);
    }
    // 7. per token and head: the state updates, then o_h = attention of q_h over the
    //    head's state slots and window, [n, n_heads * d_v] into v's rows
    step.run(st, first, x, s, pass.exec);
    // Attn = c_proj(concat o_h)
    attn::output(pass, l, x);
}

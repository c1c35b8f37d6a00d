//! The KVM mixer (spec §2 "Attn", §3): a KVM layer's attention, each head's query over
//! its compressed means state and its window; step 7's schedule is the numerics' (the
//! float one's [`crate::state::LayerStep`]).

use crate::config::flags;
use crate::forward::numerics::Numerics;
use crate::forward::pass::Pass;

/// `a <- Attn(a)` for KVM layer `l`, every token of the pass in order.
pub(super) fn attention<N: Numerics>(pass: &Pass<'_, '_>, l: usize, st: &mut N::Layer<'_>, x: &mut N) {
    let cfg = pass.model.config();
    let merge_gate = cfg.has(flags::MERGE_GATE_KEYS) || cfg.has(flags::MERGE_GATE_VALUES);

    // The slot reads (when the arena does not keep them) and what step 7 fetches early,
    // before the products
    let begun = x.kvm_begin(pass, l, st);
    // 1. q = c_q a, k = c_k a: [n, n_heads * d_qk]; v = c_v a: [n, n_heads * d_v]; the
    //    value residual's v_gate1 a: [n, d_vgate]; the merge gate's key_weighting a:
    //    [n, n_heads]
    x.project(pass, l, merge_gate);
    // 2. value residual: v += (v_first - v) * sigmoid(v_gate0 + v_gate2(v_gate1 a))
    if cfg.has(flags::VALUE_RESIDUAL) {
        x.value_residual(pass, l);
    }
    // 3. token shift of q, k, v towards the previous token's (itself at t = 0)
    if cfg.has(flags::TOKENSHIFT_ATT) {
        x.shift(pass, l, st);
    }
    // 4.-5. per-head LN_q / LN_k, then partial RoPE at each token's position
    x.norm_rope(pass, l);
    // 6. merge gate m_h = 1 + elu(key_weighting a): [n, n_heads]
    x.merge_gates(merge_gate);
    // 7. per token and head: the state updates, then o_h = attention of q_h over the
    //    head's state slots and window, [n, n_heads * d_v] into v's rows
    x.kvm_heads(pass, l, st, begun);
    // Attn = c_proj(concat o_h)
    x.output(pass, l);
}

//! The sliding-window mixer of a hybrid stack's alternate layers (spec §5): steps 1-5 of
//! §2 as a KVM layer's, then each head's plain causal softmax attention over its last `Wa`
//! tokens, the current one included, whose keys and values it keeps in a ring.

use crate::config::flags;
use crate::forward::numerics::Numerics;
use crate::forward::pass::Pass;

/// `a <- Attn(a)` for alternate layer `l`, every head's tokens of the pass in order (so a
/// batch gives the bits of single steps).
pub(super) fn attention<N: Numerics>(pass: &Pass<'_, '_>, l: usize, st: &mut N::Layer<'_>, x: &mut N) {
    let cfg = pass.model.config();
    // 1. q = c_q a, k = c_k a: [n, n_heads * d_qk]; v = c_v a: [n, n_heads * d_v]; the
    //    value residual's v_gate1 a
    x.project(pass, l, false);
    // 2. value residual, v_first the first alternate layer's (layer 0's)
    if cfg.has(flags::VALUE_RESIDUAL) {
        x.value_residual(pass, l);
    }
    // 3. token shift of q, k, v towards the previous token's (itself at t = 0)
    if cfg.has(flags::TOKENSHIFT_ATT) {
        x.shift(pass, l, st);
    }
    // 4.-5. per-head LN_q / LN_k, then RoPE of alt_rope_dim dims (alt_rope_theta)
    x.norm_rope(pass, l);
    // Per head, each token in order: its k, v into the head's ring, then o_h = softmax(q
    // k_j / sqrt(d_qk)) v_j over the ring's tokens [max(0, t - Wa + 1), t]: [n, n_heads *
    // d_v] into v's rows
    x.swa_heads(pass, l, st);
    // Attn = c_proj(concat o_h)
    x.output(pass, l);
}

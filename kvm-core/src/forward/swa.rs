//! The sliding-window mixer of a hybrid stack's alternate layers (spec §5): steps 1-5 of
//! §2 as a KVM layer's, then each head's plain causal softmax attention over its last `Wa`
//! tokens, the current one included, whose keys and values it keeps in a ring.

use crate::config::flags;
use crate::forward::attn;
use crate::forward::pass::Pass;
use crate::state::attend::{read, FloatRead, Reads};
use crate::state::{ring_runs, Acts, LayerState, Scratch};

/// `x.a <- Attn(x.a)` for alternate layer `l`, every head's tokens of the batch in order
/// (so a batch gives the bits of single steps).
pub(super) fn attention(pass: &Pass<'_, '_>, l: usize, st: &mut LayerState<'_>, x: &mut Acts<'_>, s: &mut Scratch<'_>) {
    let cfg = pass.model.config();
    // 1. q = c_q a, k = c_k a: [n, n_heads * d_qk]; v = c_v a: [n, n_heads * d_v]; the
    //    value residual's v_gate1 a
    attn::project(pass, l, x, false);
    // 2. value residual, v_first the first alternate layer's (layer 0's)
    if cfg.has(flags::VALUE_RESIDUAL) {
        attn::value_residual(pass, l, x);
    }
    // 3. token shift of q, k, v towards the previous token's (itself at t = 0)
    if cfg.has(flags::TOKENSHIFT_ATT) {
        attn::shift(pass, l, st, x);
    }
    // 4.-5. per-head LN_q / LN_k, then RoPE of alt_rope_dim dims (alt_rope_theta)
    attn::norm_rope(pass, l, x);
    // Per head, each token in order: its k, v into the head's ring, then o_h = softmax(q
    // k_j / sqrt(d_qk)) v_j over the ring's tokens [max(0, t - Wa + 1), t]: [n_heads, n,
    // d_v] into x.att, the heads' jobs in parallel, each with its own scores ([Wa])
    let (nh, dk, dv, wa) = (cfg.n_heads as usize, cfg.d_qk as usize, cfg.d_v as usize, cfg.alt_window as usize);
    let (qd, vd, n, pos) = (cfg.q_dim(), cfg.v_dim(), x.n, pass.at.pos);
    let scale = 1.0 / libm::sqrtf(dk as f32);
    let (q, k, v) = (&*x.q, &*x.k, &*x.v);
    let heads = st.heads(nh);
    pass.exec.heads(&mut x.att[..nh * n * dv], n * dv, &mut s.scores[..nh * wa], wa, &|h, out, scores| {
        // SAFETY: `Exec::heads` runs this once for each head `h < nh`. Head h's ring is
        // the ring of a one-head layer: position j at j % Wa.
        let mut own = unsafe { heads.head(h) };
        for (i, out) in out.chunks_exact_mut(dv).enumerate() {
            let t = pos + i;
            let begin = (t + 1).saturating_sub(wa);
            own.wk.set(t % wa, dk, |c| k[i * qd + h * dk + c]);
            own.wv.set(t % wa, dv, |c| v[i * vd + h * dv + c]);
            let reads = Reads { state: 0..0, window: ring_runs(wa, begin, t + 1) };
            let (keys, values) = (own.wk.as_rows(), own.wv.as_rows());
            let q = &q[i * qd + h * dk..i * qd + (h + 1) * dk];
            let mut arith = FloatRead { q, keys: [keys; 2], values: [values; 2], temps: None, scale, dims: (dk, dv) };
            read(&mut arith, &reads, scores, out);
        }
    });
    // concat o_h: [n, n_heads * d_v] into v's rows, which the pushes consumed
    for (h, o) in x.att[..nh * n * dv].chunks_exact(n * dv).enumerate() {
        for (i, o) in o.chunks_exact(dv).enumerate() {
            x.v[i * vd + h * dv..i * vd + (h + 1) * dv].copy_from_slice(o);
        }
    }
    // Attn = c_proj(concat o_h)
    attn::output(pass, l, x);
}

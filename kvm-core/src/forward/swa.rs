//! The sliding-window mixer of a hybrid stack's alternate layers (spec §5): steps 1-5 of
//! §2 as a KVM layer's, then each head's plain causal softmax attention over its last `Wa`
//! tokens, the current one included, whose keys and values it keeps in a ring.

use crate::config::flags;
use crate::forward::attn;
use crate::forward::pass::Pass;
use crate::kernels;
use crate::math;
use crate::state::{Acts, LayerState, Scratch};

/// `x.a <- Attn(x.a)` for alternate layer `l`, every token of the batch in order (so a
/// batch gives the bits of single steps).
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
    // Per token and head: k, v into the ring, then o_h = softmax(q k_j / sqrt(d_qk)) v_j
    // over the ring's tokens [max(0, t - Wa + 1), t], into v's rows: [n, n_heads * d_v]
    let (nh, dk, dv, wa) = (cfg.n_heads as usize, cfg.d_qk as usize, cfg.d_v as usize, cfg.alt_window as usize);
    let scale = 1.0 / libm::sqrtf(dk as f32);
    for i in 0..x.n {
        let t = pass.at.pos + i;
        let begin = (t + 1).saturating_sub(wa);
        for h in 0..nh {
            // Head h of token i in the [n, n_heads * d] rows.
            let (kr, vr) = ((i * nh + h) * dk..(i * nh + h + 1) * dk, (i * nh + h) * dv..(i * nh + h + 1) * dv);
            let ri = h * wa + t % wa;
            st.wk.set(ri, dk, |c| x.k[kr.start + c]);
            st.wv.set(ri, dv, |c| x.v[vr.start + c]);
            let scores = &mut s.scores[..t + 1 - begin];
            let spans = ring_spans(wa, h, begin, t + 1);
            let mut at = 0;
            for span in spans.clone() {
                st.wk.as_rows().rows(span.start, span.end, dk).dots(&x.q[kr.clone()], &mut scores[at..at + span.len()]);
                at += span.len();
            }
            for z in scores.iter_mut() {
                *z *= scale;
            }
            let max = kernels::max(scores);
            kernels::exp_sub(scores, max);
            let sum = math::sum(scores);
            for z in scores.iter_mut() {
                *z /= sum;
            }
            let out = &mut x.v[vr];
            out.fill(0.0);
            let mut at = 0;
            for span in spans {
                let n = span.len();
                st.wv.as_rows().rows(span.start, span.end, dv).weighted_sum(&scores[at..at + n], out);
                at += n;
            }
        }
    }
    // Attn = c_proj(concat o_h)
    attn::output(pass, l, x);
}

/// Head `h`'s ring entries of positions `[begin, end)` (at most `wa` of them) as at most
/// two runs of ring indices, oldest first (the ring may wrap).
fn ring_spans(wa: usize, h: usize, begin: usize, end: usize) -> [core::ops::Range<usize>; 2] {
    let (first, len) = (begin % wa, end - begin);
    let head = len.min(wa - first);
    let base = h * wa;
    [base + first..base + first + head, base..base + len - head]
}

//! The forward pass (spec §2): embedding, then per layer its mixer's attention (`mixer`:
//! a KVM layer's, `kvm`, over the state of spec §3 through [`crate::state`], or a hybrid
//! stack's alternate layer's, `swa`, spec §5) and the MLP,
//! then the head. One batch of tokens at a time; every step reads like the
//! spec, a comment each.

mod attn;
mod kvm;
mod mixer;
mod pass;
mod swa;

pub(crate) use pass::{Pass, Work};

use crate::config::flags;
use crate::error::Origin;
use crate::format::Role;
use crate::forward::attn::layer_inputs;
use crate::forward::mixer::Mixer;
use crate::kernels;
use crate::math::{all_finite, axpy, layer_norm, layer_norm_inplace, token_shift};
use crate::state::{Acts, Counters, LayerState};

/// An observation point of the forward pass, for tests and debugging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tap {
    /// `LN_emb(wte[token])`, `[d_model]`.
    Embed,
    /// The residual stream after block `i`, `[d_model]`.
    Block(usize),
}

/// A tap's callback: each [`Tap`] point's values.
pub(crate) type TapFn<'t> = dyn FnMut(Tap, &[f32]) + 't;

/// Which logits a forward pass computes.
#[derive(Debug)]
pub enum Logits<'o> {
    /// None (prompt tokens whose predictions nobody reads).
    None,
    /// The last token's, into the session ([`crate::Session::logits`]).
    Last,
    /// Every token's, `[n, vocab_len]`, into the caller's buffer.
    All(&'o mut [f32]),
}

/// Runs `tokens` through the network as one batch, updating the session state token by
/// token exactly as single steps would (spec §2-3); returns the counters after them and
/// the first stage whose output held a NaN or an infinity (if any did before the head).
pub(crate) fn forward(
    pass: &Pass<'_, '_>,
    work: Work<'_, '_>,
    tokens: &[u32],
    logits: Logits<'_>,
    tap: &mut dyn FnMut(Tap, &[f32]),
) -> (Counters, Option<Origin>) {
    let (model, exec, at) = (pass.model, pass.exec, pass.at);
    let Work { layers, reads, s, x } = work;
    let cfg = model.config();
    let d = cfg.d_model as usize;

    // x0 = LN_emb(wte[token]): [n, d_model]; each token's RoPE tables: [n, rope_dim / 2]
    embed(pass, tokens, x, tap);
    // A hybrid's KVM layers' v_first = c_v(LN_attn(x0)) of the first KVM layer (spec §5):
    // [n, n_heads * d_v]
    if cfg.is_hybrid() && cfg.has(flags::VALUE_RESIDUAL) && !cfg.has(flags::ALT_SHARE_V0) {
        let k = cfg.first_kvm_layer();
        pass.rows_layer_norm(x.x, x.a, d, model.vector(Role::LnAttnW, k), model.vector(Role::LnAttnB, k));
        exec.matmul(&model.matrix(Role::Wv, k), x.a, x.v_first_kvm, x.act);
    }

    // Where a NaN or an infinity first appears, looked for only when logits are asked for
    // (the only time the caller hears of one).
    let watch = !matches!(logits, Logits::None);
    let mut origin = (watch && !all_finite(x.x)).then_some(Origin::Embedding);

    for l in 0..cfg.n_layers as usize {
        let st = &mut pass.lay.carve_layer(layers, reads, l);
        // x = x + residual_scale * Attn(LN_attn(x))
        pass.rows_layer_norm(x.x, x.a, d, model.vector(Role::LnAttnW, l), model.vector(Role::LnAttnB, l));
        Mixer::of(cfg, l).attention(pass, l, st, x, s);
        axpy(x.x, cfg.residual_scale, x.a);
        // x = x + residual_scale * MLP(LN_mlp(x))
        pass.rows_layer_norm(x.x, x.a, d, model.vector(Role::LnMlpW, l), model.vector(Role::LnMlpB, l));
        mlp(pass, l, st, x);
        if l + 1 < cfg.n_layers as usize {
            exec.upcoming(&layer_inputs(model, l + 1));
        } else {
            exec.upcoming(&[model.matrix(Role::LmHead, 0)]);
        }
        axpy(x.x, cfg.residual_scale, x.a);
        for row in x.x.chunks_exact(d) {
            tap(Tap::Block(l), row);
        }
        if watch && origin.is_none() && !all_finite(x.x) {
            origin = Some(Origin::Block(l as u32));
        }
    }

    // logits = lm_head(LN_head(x)): [n or 1, vocab_len], optionally soft-capped
    let (ln_w, ln_b) = (model.vector(Role::LnHeadW, 0), model.vector(Role::LnHeadB, 0));
    let lm_head = model.matrix(Role::LmHead, 0);
    let out: &mut [f32] = match logits {
        Logits::None => &mut [],
        Logits::Last => {
            let last = (x.n - 1) * d;
            layer_norm(&x.x[last..last + d], ln_w, ln_b, &mut x.a[..d]);
            exec.matmul(&lm_head, &x.a[..d], s.logits, x.act);
            s.logits
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
    // The counters after the batch: every KVM layer's state made the same steps.
    (at.after(cfg, pass.lay.state_len, x.n), origin)
}

/// `x.x <- LN_emb(wte[token])` of each token, `[n, d_model]`, and its position's RoPE
/// tables, both kinds' (`[n, rope_dim / 2]`, `[n, alt_rope_dim / 2]`).
fn embed(pass: &Pass<'_, '_>, tokens: &[u32], x: &mut Acts<'_>, tap: &mut dyn FnMut(Tap, &[f32])) {
    let (model, at) = (pass.model, pass.at);
    let cfg = model.config();
    let (d, half, ah) = (cfg.d_model as usize, cfg.rope_dim as usize / 2, cfg.alt_rope_dim as usize / 2);
    let (ln_w, ln_b) = (model.vector(Role::LnEmbW, 0), model.vector(Role::LnEmbB, 0));
    for (i, &token) in tokens.iter().enumerate() {
        let row = &mut x.x[i * d..(i + 1) * d];
        kernels::dequant_row(&model.matrix(Role::TokEmbed, 0), token as usize, row);
        layer_norm_inplace(row, ln_w, ln_b);
        tap(Tap::Embed, row);
        pass.rope.tables(at.pos + i, &mut x.cos[i * half..(i + 1) * half], &mut x.sin[i * half..(i + 1) * half]);
        let (cos, sin) = (&mut x.alt_cos[i * ah..(i + 1) * ah], &mut x.alt_sin[i * ah..(i + 1) * ah]);
        pass.alt_rope.tables(at.pos + i, cos, sin);
    }
}

/// `x.a <- MLP(x.a)` for layer `l`: `c_proj(relu(c_fc m)^2)`, `m` token-shifted towards
/// the previous token's LN_mlp output (zero at t = 0).
fn mlp(pass: &Pass<'_, '_>, l: usize, st: &mut LayerState<'_>, x: &mut Acts<'_>) {
    let (model, exec) = (pass.model, pass.exec);
    let d = model.config().d_model as usize;
    if model.config().has(flags::TOKENSHIFT_FFN) {
        let mix = model.vector(Role::ShiftFfn, l);
        for row in x.a.chunks_exact_mut(d) {
            token_shift(row, st.prev_m, mix, false);
        }
    }
    exec.matmul(&model.matrix(Role::WUp, l), x.a, x.ff, x.act);
    exec.upcoming(&[model.matrix(Role::WDown, l)]);
    for h in x.ff.iter_mut() {
        // relu(h)^2 by a compare: `f32::max` is a libm call on single-precision FPUs, and
        // the square makes -0.0 and a NaN (both sent to 0 here) give `max`'s bits.
        let r = if *h > 0.0 { *h } else { 0.0 };
        *h = r * r;
    }
    exec.matmul(&model.matrix(Role::WDown, l), x.ff, x.a, x.act);
}

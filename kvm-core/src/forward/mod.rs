//! The forward pass (spec §2): embedding, then per layer its mixer's attention (`mixer`:
//! a KVM layer's, `kvm`, over the state of spec §3 through [`crate::state`], or a hybrid
//! stack's alternate layer's, `swa`, spec §5) and the MLP, then the head. Every step
//! reads like the spec, a comment each, written once for both numerics: each calls a
//! `Numerics` operation, the float numerics' (`float`, a batch of tokens at a time) or
//! the integer one's (`int`, docs/integer.md, one token at a time).

mod attn;
mod float;
mod int;
mod kvm;
mod mixer;
mod numerics;
mod pass;
mod swa;

pub(crate) use float::FloatActs;
pub(crate) use int::IntActs;
pub(crate) use numerics::Numerics;
pub(crate) use pass::Pass;

use crate::config::flags;
use crate::error::Origin;
use crate::format::Role;
use crate::forward::mixer::Mixer;
use crate::state::Counters;

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

impl Logits<'_> {
    /// The same request, borrowing this one's buffer.
    #[inline]
    pub(crate) fn reborrow(&mut self) -> Logits<'_> {
        match self {
            Logits::None => Logits::None,
            Logits::Last => Logits::Last,
            Logits::All(out) => Logits::All(out),
        }
    }
}

/// Runs `tokens` through the network as one batch in the numerics of `x`, updating the
/// session state token by token exactly as single steps would (spec §2-3); `layers` is
/// the arena's layers region and `reads` one layer's recomputed slot reads (else empty).
/// Returns the counters after the tokens and the first stage whose output held a NaN or
/// an infinity (if any did before the head).
pub(crate) fn forward<N: Numerics>(
    pass: &Pass<'_, '_>,
    (layers, reads): (&mut [f32], &mut [f32]),
    x: &mut N,
    tokens: &[u32],
    logits: Logits<'_>,
    tap: &mut Option<&mut TapFn<'_>>,
) -> (Counters, Option<Origin>) {
    let model = pass.model;
    let cfg = model.config();
    let ln = |w: Role, b: Role, l: usize| (model.vector(w, l), model.vector(b, l));

    // x0 = LN_emb(wte[token]): [n, d_model]; each token's RoPE tables: [n, rope_dim / 2]
    x.embed(pass, tokens);
    x.tap(pass, tap, Tap::Embed);
    // A hybrid's KVM layers' v_first = c_v(LN_attn(x0)) of the first KVM layer (spec §5):
    // [n, n_heads * d_v]
    if cfg.is_hybrid() && cfg.has(flags::VALUE_RESIDUAL) && !cfg.has(flags::ALT_SHARE_V0) {
        let k = cfg.first_kvm_layer();
        let (w, b) = ln(Role::LnAttnW, Role::LnAttnB, k);
        x.norm(pass, w, b);
        x.first_kvm_value(pass, k);
    }

    // Where a NaN or an infinity first appears, looked for only when logits are asked for
    // (the only time the caller hears of one).
    let watch = !matches!(logits, Logits::None);
    let mut origin = None;
    x.watch(watch, &mut origin, Origin::Embedding);

    for l in 0..cfg.n_layers as usize {
        let st = &mut N::layer(pass, layers, reads, l);
        // x = x + residual_scale * Attn(LN_attn(x))
        let (w, b) = ln(Role::LnAttnW, Role::LnAttnB, l);
        x.norm(pass, w, b);
        Mixer::of(cfg, l).attention(pass, l, st, x);
        x.residual(pass);
        // x = x + residual_scale * MLP(LN_mlp(x))
        let (w, b) = ln(Role::LnMlpW, Role::LnMlpB, l);
        x.norm(pass, w, b);
        mlp(pass, l, st, x);
        x.residual(pass);
        x.tap(pass, tap, Tap::Block(l));
        x.watch(watch, &mut origin, Origin::Block(l as u32));
    }

    // logits = lm_head(LN_head(x)): [n or 1, vocab_len], optionally soft-capped
    x.head(pass, logits);
    // The counters after the batch: every KVM layer's state made the same steps.
    (x.after(pass), origin)
}

/// `a <- MLP(a)` for layer `l`: `c_proj(relu(c_fc m)^2)`, `m` token-shifted towards the
/// previous token's LN_mlp output (zero at t = 0).
fn mlp<N: Numerics>(pass: &Pass<'_, '_>, l: usize, st: &mut N::Layer<'_>, x: &mut N) {
    if pass.model.config().has(flags::TOKENSHIFT_FFN) {
        x.shift_ffn(pass, l, st);
    }
    // h = c_fc m: [n, d_ff]
    x.up(pass, l);
    // a = c_proj(relu(h)^2): [n, d_model]
    x.down(pass, l);
}

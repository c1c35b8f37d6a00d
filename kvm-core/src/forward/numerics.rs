//! [`Numerics`]: the operations of a forward pass whose arithmetic differs between the
//! float numerics (`f32` activations, attention rows in the cache dtype, [`super::float`])
//! and the integer one (fixed-point activations, integer rows with their scales,
//! [`super::int`], docs/integer.md). [`super::forward`], the mixers and the MLP say the
//! spec's steps once and call these for each; as in TFLite Micro, the two numerics split
//! only inside an operation.

use crate::error::Origin;
use crate::forward::pass::Pass;
use crate::forward::{Logits, Tap, TapFn};
use crate::state::Counters;
use crate::tensor::Vector;

/// A pass's activations in one numerics, and its operations on them. `x` is the residual
/// stream, `a` a block's input and output; `q`, `k`, `v` (`v` then the heads' outputs),
/// the merge gates `mg` and the MLP's hidden `ff` are a block's; every operation works on
/// all of the pass's tokens (the float numerics' batch, the integer one's one token).
pub(crate) trait Numerics {
    /// One layer's state in this numerics' arena.
    type Layer<'s>;
    /// What a KVM layer's step 7 keeps from before the layer's products
    /// ([`Numerics::kvm_begin`]).
    type Begun;

    /// Layer `l`'s state, carved from the layers' region `layers` (its slot reads from
    /// `reads` where they are recomputed).
    fn layer<'s>(pass: &Pass<'_, '_>, layers: &'s mut [f32], reads: &'s mut [f32], l: usize) -> Self::Layer<'s>;

    /// `x <- LN_emb(wte[token])` of each token, and its position's RoPE tables (both
    /// kinds').
    fn embed(&mut self, pass: &Pass<'_, '_>, tokens: &[u32]);

    /// `tap(at, x)` of each token's residual stream (f32 values), when there is a tap.
    fn tap(&mut self, pass: &Pass<'_, '_>, tap: &mut Option<&mut TapFn<'_>>, at: Tap);

    /// Where a NaN or an infinity could first appear: `false` while every value of `x`
    /// is finite (always, in fixed point).
    fn non_finite(&self) -> bool;

    /// `a <- LN(x)` of each token, LayerNorm weight `w` and bias `b`.
    fn norm(&mut self, pass: &Pass<'_, '_>, w: Vector<'_>, b: Vector<'_>);

    /// A hybrid's KVM layers' `v_first = c_v a` of layer `k` (spec §5).
    fn first_kvm_value(&mut self, pass: &Pass<'_, '_>, k: usize);

    /// Step 1 of layer `l`'s attention: `q = c_q a`, `k = c_k a`, `v = c_v a`, the value
    /// residual's `v_gate1 a` (when the model has one) and, with `merge_gate`, the merge
    /// gates' logits `key_weighting a`.
    fn project(&mut self, pass: &Pass<'_, '_>, l: usize, merge_gate: bool);

    /// Step 2: `v += (v_first - v) * sigmoid(v_gate0 + v_gate2(v_gate1 a))`, `v_first` the
    /// plain value projection of the first layer of the same kind (spec §5): layer 0's,
    /// or in a hybrid the first KVM layer's for KVM layers, unless `alt_share_v0`.
    fn value_residual(&mut self, pass: &Pass<'_, '_>, l: usize);

    /// Step 3: each token's q, k, v shifted towards the previous token's (itself at t =
    /// 0), the last token's kept in `st`.
    fn shift(&mut self, pass: &Pass<'_, '_>, l: usize, st: &mut Self::Layer<'_>);

    /// Steps 4-5: per-head `LN_q` / `LN_k` of q and k, then partial RoPE at each token's
    /// position (an alternate layer's tables, spec §5).
    fn norm_rope(&mut self, pass: &Pass<'_, '_>, l: usize);

    /// Step 6: `mg = 1 + elu(mg)` with `on`, else every gate one.
    fn merge_gates(&mut self, on: bool);

    /// What comes before KVM layer `l`'s products: its slot reads when the arena does not
    /// keep them (what stored ones would hold, from the same sums), and whatever step 7
    /// fetches early.
    fn kvm_begin(&mut self, pass: &Pass<'_, '_>, l: usize, st: &mut Self::Layer<'_>) -> Self::Begun;

    /// Step 7 of KVM layer `l`: per token and head the state updates, then `o_h`, the
    /// attention of `q_h` over the head's state slots and window, into v's rows.
    fn kvm_heads(&mut self, pass: &Pass<'_, '_>, l: usize, st: &mut Self::Layer<'_>, begun: Self::Begun);

    /// Alternate layer `l`'s heads (spec §5): per head and token its key and value into
    /// the head's ring, then `o_h`, softmax attention over the ring's last `Wa` tokens,
    /// into v's rows.
    fn swa_heads(&mut self, pass: &Pass<'_, '_>, l: usize, st: &mut Self::Layer<'_>);

    /// `a = c_proj(concat o_h)` of layer `l`.
    fn output(&mut self, pass: &Pass<'_, '_>, l: usize);

    /// `x += residual_scale * a`.
    fn residual(&mut self, pass: &Pass<'_, '_>);

    /// The MLP's token shift: `a` towards the previous token's LN_mlp output (zero at t =
    /// 0), the last token's kept in `st`.
    fn shift_ffn(&mut self, pass: &Pass<'_, '_>, l: usize, st: &mut Self::Layer<'_>);

    /// `ff = c_fc a` of layer `l`.
    fn up(&mut self, pass: &Pass<'_, '_>, l: usize);

    /// `a = c_proj(relu(ff)^2)` of layer `l`.
    fn down(&mut self, pass: &Pass<'_, '_>, l: usize);

    /// `logits = lm_head(LN_head(x))` of the tokens `logits` asks for (soft-capped when
    /// the model caps), as f32.
    fn head(&mut self, pass: &Pass<'_, '_>, logits: Logits<'_>);

    /// The counters after the pass's tokens.
    fn after(&self, pass: &Pass<'_, '_>) -> Counters;

    /// The first stage `origin` names if [`Numerics::non_finite`] says so now.
    #[inline]
    fn watch(&self, watch: bool, origin: &mut Option<Origin>, at: Origin) {
        if watch && origin.is_none() && self.non_finite() {
            *origin = Some(at);
        }
    }
}

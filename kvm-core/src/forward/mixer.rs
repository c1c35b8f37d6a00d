//! A layer's token mixer (spec §2 "Attn"): one shape for every kind of layer, chosen per
//! layer, each kind in a file of its own ([`super::kvm`], [`super::swa`]); the steps they
//! share are [`super::attn`]'s.

use crate::config::Config;
use crate::forward::numerics::Numerics;
use crate::forward::pass::Pass;
use crate::forward::{kvm, swa};

/// What mixes a layer's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mixer {
    /// Attention over the layer's compressed means state and its window (spec §3).
    Kvm,
    /// A hybrid stack's alternate layer: softmax attention over its last `Wa` tokens
    /// (spec §5).
    Swa,
}

impl Mixer {
    /// Layer `l`'s mixer: a hybrid stack's alternate layers are sliding-window ones.
    #[inline]
    pub(super) fn of(cfg: &Config, l: usize) -> Mixer {
        if cfg.is_alt(l) {
            Mixer::Swa
        } else {
            Mixer::Kvm
        }
    }

    /// `a <- Attn(a)` for layer `l`, every token of the pass in order, `st` the layer's
    /// state.
    #[inline]
    pub(super) fn attention<N: Numerics>(self, pass: &Pass<'_, '_>, l: usize, st: &mut N::Layer<'_>, x: &mut N) {
        match self {
            Mixer::Kvm => kvm::attention(pass, l, st, x),
            Mixer::Swa => swa::attention(pass, l, st, x),
        }
    }
}

//! A layer's token mixer (spec §2 "Attn"): one shape for every kind of layer, chosen per
//! layer, each kind in a file of its own ([`super::kvm`]); the steps they share are
//! [`super::attn`]'s.

use crate::config::Config;
use crate::forward::kvm;
use crate::forward::pass::Pass;
use crate::state::{Acts, LayerState, Scratch};

/// What mixes a layer's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mixer {
    /// Attention over the layer's compressed means state and its window (spec §3).
    Kvm,
}

impl Mixer {
    /// Layer `l`'s mixer. Every layer of a model is a KVM layer until hybrid stacks (spec
    /// §5, issue #38) bring their sliding-window layers here.
    #[inline]
    pub(super) fn of(_cfg: &Config, _l: usize) -> Mixer {
        Mixer::Kvm
    }

    /// `x.a <- Attn(x.a)` for layer `l`, every token of the batch in order, `st` the
    /// layer's state.
    #[inline]
    pub(super) fn attention(
        self,
        pass: &Pass<'_, '_>,
        l: usize,
        st: &mut LayerState<'_>,
        x: &mut Acts<'_>,
        s: &mut Scratch<'_>,
    ) {
        match self {
            Mixer::Kvm => kvm::attention(pass, l, st, x, s),
        }
    }
}

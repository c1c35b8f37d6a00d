//! A head's writes (spec §3), written once for both numerics: a token's [`update`] (an
//! initial-state token's slot, then its window push) and a [`fold`] (the chunk leaving the
//! window has its keys prepared, its most novel tokens become new slots, the others join
//! their nearest non-sink slot, and the slots whose sums changed are refreshed). The parts
//! whose arithmetic differs (a prepared key, a similarity, a sum, a stored row) are
//! [`HeadWrites`]' and [`FoldHead`]'s: [`crate::state::update`]'s over floats,
//! `crate::int::head`'s over integer rows and sums, each in the order that keeps its bits.

use crate::config::{flags, Config};
use crate::state::plan::Plan;

/// A token's writes to one head's state in one numerics: the steps of [`update`].
pub(crate) trait HeadWrites {
    /// A token's key (post LN_k and RoPE), value and merge gate, as the numerics holds
    /// them.
    type Token<'t>: Copy;

    /// Slot `s` takes the token: its prepared key (`LN_s_k`, rope dims zeroed) and its
    /// value as the sums, its radius `|v|` (vlens) or a fold count of 1.
    fn store_initial(&mut self, s: usize, tok: Self::Token<'_>);

    /// Slot `s`'s sums times the token's merge gate where `gated`.
    fn gate_slot(&mut self, s: usize, tok: Self::Token<'_>, gated: bool);

    /// Recomputes what reads of slot `s` see, its key included.
    fn refresh_initial(&mut self, s: usize);

    /// The token's key, value and merge gate into the ring entry of window position `t`.
    fn push_window(&mut self, t: usize, tok: Self::Token<'_>);
}

/// A token's writes (`plan` the token's): an initial-state token's slot (its sums, gated
/// when the model gates initial appends; the radius the ungated `|v|`), then its window
/// push.
#[inline]
pub(crate) fn update<H: HeadWrites>(h: &mut H, plan: &Plan, tok: H::Token<'_>) {
    if let Some(s) = plan.initial {
        h.store_initial(s, tok);
        h.gate_slot(s, tok, plan.gate_initial);
        h.refresh_initial(s);
    }
    h.push_window(plan.t, tok);
}

/// A merged token's flag in a fold's `index` (the slot it joins in the low bits).
pub(crate) const MERGED: u32 = 1 << 31;

/// One head's state and a fold's scratch, in one numerics: the steps of [`fold`].
pub(crate) trait FoldHead {
    /// `pk_j = LN_s_k(k_j with dims [0, rope_dim) zeroed)` of the `chunk_len` tokens
    /// leaving from window position `b`: `[chunk_len, d_qk]`.
    fn prepare_keys(&mut self, b: usize);

    /// Each prepared key's novelty (its best similarity to slots `[0, slots)`), then
    /// `mark_least(n, index, ...)` by it: the `n` least novel tokens (ties: lower token
    /// first) flagged 1 in `index`, the others 0.
    fn mark_novel(&mut self, slots: usize, n: usize);

    /// The fold's flags: `index` (`[chunk_len]`: 1 appended, 0 merged, then `MERGED |
    /// slot`) and words of bits for the slots taking merges ([`mark_touched`]).
    fn flags(&mut self) -> (&mut [u32], &mut [u32]);

    /// Appends leaving token `i` (window position `b + i`) as slot `s`: its prepared key
    /// and its value, each times the token's merge gate where `gated` says (keys, values).
    fn append(&mut self, b: usize, i: usize, s: usize, gated: (bool, bool));

    /// Token `i`'s prepared key times its merge gate: the gated key `gk` it merges with.
    fn gate_key(&mut self, b: usize, i: usize);

    /// `index[i] = MERGED | s` for every merged token (`index[i] == 0`), `s` the first
    /// slot of `[from, to)` of highest similarity to its key, or `fallback` for none.
    fn merge_targets(&mut self, from: usize, to: usize, fallback: usize);

    /// Adds every merged token's key and value (times its merge gate with
    /// `gate_values`) into its slot's sums, for slots `[0, slots)`.
    fn merge_sums(&mut self, b: usize, slots: usize, gate_values: bool);

    /// One more fold in slot `s`'s count (a model without vlens).
    fn count(&mut self, s: usize);

    /// Recomputes what reads of slot `s` see; its key too with `key`.
    fn refresh_slot(&mut self, s: usize, key: bool);
}

/// Folds window chunk `[b, b + chunk_len)` into head `h`'s state: the `slots_after -
/// slots_before` most novel tokens (lowest best similarity to the current slots) become
/// new slots, the rest merge into their nearest non-sink slot.
pub(crate) fn fold(cfg: &Config, h: &mut impl FoldHead, b: usize, slots_before: usize, slots_after: usize) {
    let c = cfg.chunk_len as usize;
    let gate_keys = cfg.has(flags::MERGE_GATE_KEYS);
    let gate_values = cfg.has(flags::MERGE_GATE_VALUES);

    // pk_j = LN_s_k(k_j, rope dims zeroed) of every leaving token: [chunk_len, d_qk]
    h.prepare_keys(b);

    // Novelty: a token's best similarity to the current slots; the n_append lowest
    // (ties: lower token first) are appended.
    let n_append = slots_after - slots_before;
    if n_append == 0 || n_append == c {
        h.flags().0[..c].fill((n_append == c) as u32);
    } else {
        h.mark_novel(slots_before, n_append);
    }

    // Appends, in token order; gated copies when the model gates appends (each kind
    // gated only if the model gates it).
    let gated = cfg.has(flags::GATE_APPENDS);
    let mut s = slots_before;
    for i in 0..c {
        if h.flags().0[i] != 0 {
            h.append(b, i, s, (gated && gate_keys, gated && gate_values));
            s += 1;
        }
    }
    (slots_before..slots_after).for_each(|s| h.refresh_slot(s, true));

    // Merges: every other token joins argmax_{s >= sink} gk . LN_s_k(sk[s]) (ties:
    // lowest slot; with every slot a sink, a growable state's early fold whose sink_len
    // is not yet exceeded, the last), all decided against the post-append state, then
    // summed in.
    let protected = (cfg.sink_len as usize).min(slots_after);
    for i in 0..c {
        if gate_keys && h.flags().0[i] == 0 {
            h.gate_key(b, i);
        }
    }
    h.merge_targets(protected, slots_after, protected.min(slots_after - 1));
    let (index, bits) = h.flags();
    if !mark_touched(&index[..c], bits, slots_after) {
        return;
    }
    h.merge_sums(b, slots_after, gate_values);

    // The reads of the slots that took merges change; and the reference's broadcast
    // quirk: every slot's count grows once per fold (so every slot's value changes).
    let vlens = cfg.has(flags::VLENS);
    for s in 0..slots_after {
        let hit = touched(h.flags().1, slots_after, s);
        if !vlens {
            h.count(s);
        }
        if hit || !vlens {
            h.refresh_slot(s, hit);
        }
    }
}

/// Marks in `bits` the slots of `[0, slots)` that `index`'s merged tokens join (a state
/// of more slots than `bits` holds counts every slot as taking one); returns whether any
/// token merges.
pub(crate) fn mark_touched(index: &[u32], bits: &mut [u32], slots: usize) -> bool {
    let every = slots > 32 * bits.len();
    bits.fill(0);
    let mut merges = false;
    for &ix in index.iter().filter(|&&ix| ix & MERGED != 0) {
        let s = (ix & !MERGED) as usize;
        if !every {
            bits[s / 32] |= 1 << (s % 32);
        }
        merges = true;
    }
    merges
}

/// Whether slot `s` of `[0, slots)` takes a merge ([`mark_touched`]'s `bits`).
#[inline]
pub(crate) fn touched(bits: &[u32], slots: usize, s: usize) -> bool {
    slots > 32 * bits.len() || bits[s / 32] >> (s % 32) & 1 != 0
}

/// Sets `flags[i]` (`i < flags.len()`) to 1 for the `n` least tokens by `cmp` (`0 < n <
/// flags.len()`; ties: lower token first) and to 0 for the others. A selection over token
/// indices held in `flags` itself finds the `n`-th of them, then every token is compared
/// with it: linear, where counting each token's lesser ones was quadratic in the chunk
/// length.
pub(crate) fn mark_least(n: usize, flags: &mut [u32], cmp: impl Fn(usize, usize) -> core::cmp::Ordering) {
    let order = |a: &u32, b: &u32| cmp(*a as usize, *b as usize).then(a.cmp(b));
    for (i, x) in (0u32..).zip(flags.iter_mut()) {
        *x = i;
    }
    flags.select_nth_unstable_by(n - 1, order);
    let cut = flags[n - 1];
    for (i, flag) in (0u32..).zip(flags.iter_mut()) {
        *flag = order(&i, &cut).is_le() as u32;
    }
}

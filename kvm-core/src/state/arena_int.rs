//! The arena of an integer-numerics session (docs/integer.md): its layers' parts in the
//! order of [`crate::state::Layout`]'s, sized in words of integers, and its scratch.
//!
//! ```text
//! per KVM layer  sk [n_heads, state_len, d_qk]  i32   key sums (mantissas)
//!                sv [n_heads, state_len, d_v]   i32   value sums (mantissas)
//!                sr [n_heads, state_len, 3]     i32   radius (fx) or fold count, key and value sum exponents
//!                nk, nv [n_heads * state_len]   rows  the rows a read of a slot sees
//!                wk, wv [n_heads * window_len]  rows  window keys (post LN_k and RoPE), values: a ring
//!                wm [n_heads, window_len]       i32   window merge gates (fx), a ring
//!                prev_q, prev_k, prev_v, prev_m i32   token-shift carries (fx)
//! per alternate  wk, wv [n_heads * alt_window]  rows  its last Wa keys and values, a ring
//! layer          prev_q, prev_k, prev_v, prev_m i32
//! ```
//!
//! A `rows` part holds its rows' mantissas, i16 two a word (or i8 four a word, for a file
//! exported with `--cache q8`), then one i32 exponent per row ([`IntRows`]). With
//! [`SlotReads::Recomputed`] a KVM layer's nk and nv are not in its state: one layer's
//! worth sits at the end of the scratch, refreshed when each layer's attention begins.

use crate::cache::int::{IntRows, RowWidth};
use crate::cache::SlotReads;
use crate::config::Config;
use crate::state::words::{pad, take, ArenaWords, LAYER_PARTS};

/// The integer numerics' arena: attention rows of this width.
impl ArenaWords for RowWidth {
    fn layer_words(&self, cfg: &Config, state_len: usize, reads: SlotReads) -> Option<[[usize; LAYER_PARTS]; 2]> {
        layer_words(cfg, state_len, *self, reads).map(|(kvm, alt)| [kvm, alt])
    }

    fn scratch_words(&self, cfg: &Config, state_len: usize, reads: SlotReads) -> Option<usize> {
        scratch_words(cfg, state_len, *self, reads)
    }
}

/// The words of each part of a KVM layer's state and of an alternate layer's: rows of
/// `width`, and no nk or nv where `reads` recomputes them.
fn layer_words(
    cfg: &Config,
    state_len: usize,
    width: RowWidth,
    reads: SlotReads,
) -> Option<([usize; LAYER_PARTS], [usize; LAYER_PARTS])> {
    let h = cfg.n_heads as usize;
    let (dk, dv, d) = (cfg.d_qk as usize, cfg.d_v as usize, cfg.d_model as usize);
    let (hs, hw) = (h.checked_mul(state_len)?, h.checked_mul(cfg.window_len())?);
    let (qd, vd) = (cfg.q_dim(), cfg.v_dim());
    let stored = |n: Option<usize>| if reads == SlotReads::Recomputed { Some(0) } else { n };
    let kvm = [
        hs.checked_mul(dk)?,
        hs.checked_mul(dv)?,
        hs.checked_mul(3)?,
        stored(width.words(hs, dk))?,
        stored(width.words(hs, dv))?,
        width.words(hw, dk)?,
        width.words(hw, dv)?,
        hw,
        qd,
        qd,
        vd,
        d,
    ];
    let ha = h.checked_mul(if cfg.is_hybrid() { cfg.alt_window as usize } else { 0 })?;
    let alt = [0, 0, 0, 0, 0, width.words(ha, dk)?, width.words(ha, dv)?, 0, qd, qd, vd, d];
    Some((kvm, alt))
}

/// Words of one layer's nk and nv where they are recomputed (else none).
fn read_words(cfg: &Config, state_len: usize, width: RowWidth, reads: SlotReads) -> Option<[usize; 2]> {
    if reads == SlotReads::Stored {
        return Some([0, 0]);
    }
    let hs = (cfg.n_heads as usize).checked_mul(state_len)?;
    Some([width.words(hs, cfg.d_qk as usize)?, width.words(hs, cfg.d_v as usize)?])
}

/// One layer's state in an integer session (an alternate layer's has empty sums and
/// slots).
pub(crate) struct IntLayer<'s> {
    pub sk: &'s mut [i32],
    pub sv: &'s mut [i32],
    /// `[n_heads, state_len, 3]`: radius (fx) or fold count, `sk`'s exponent, `sv`'s.
    pub sr: &'s mut [i32],
    pub nk: IntRows<'s>,
    pub nv: IntRows<'s>,
    pub wk: IntRows<'s>,
    pub wv: IntRows<'s>,
    pub wm: &'s mut [i32],
    pub prev_q: &'s mut [i32],
    pub prev_k: &'s mut [i32],
    pub prev_v: &'s mut [i32],
    pub prev_m: &'s mut [i32],
}

impl<'s> IntLayer<'s> {
    /// The layer of `cfg` whose parts are `words` long, carved from `buf`; an alternate
    /// layer (`alt`) rings `alt_window` tokens, a KVM layer `window_len` and holds
    /// `state_len` slots.
    /// `reads` is where a KVM layer's nk and nv are when they are recomputed (one layer's
    /// worth of scratch), else `None` (they are in `buf`).
    pub(crate) fn carve(
        mut buf: &'s mut [f32],
        reads: Option<&'s mut [f32]>,
        words: &[usize; LAYER_PARTS],
        cfg: &Config,
        (state_len, width): (usize, RowWidth),
        alt: bool,
    ) -> Self {
        let h = cfg.n_heads as usize;
        let (dk, dv) = (cfg.d_qk as usize, cfg.d_v as usize);
        let ring = h * if alt { cfg.alt_window as usize } else { cfg.window_len() };
        let slots = if alt { 0 } else { h * state_len };
        let mut ints = |i: usize| -> &'s mut [i32] { bytemuck::cast_slice_mut(take(&mut buf, words[i])) };
        let (sk, sv, sr) = (ints(0), ints(1), ints(2));
        let rows = |buf: &mut &'s mut [f32], n: usize, d: usize| {
            let len = width.words(n, d).unwrap_or(0);
            IntRows::carve(take(buf, len), n, d, width)
        };
        let (nk, nv) = match reads {
            Some(mut reads) if !alt => (rows(&mut reads, slots, dk), rows(&mut reads, slots, dv)),
            _ => (rows(&mut buf, slots, dk), rows(&mut buf, slots, dv)),
        };
        let wk = rows(&mut buf, ring, dk);
        let wv = rows(&mut buf, ring, dv);
        let mut ints = |i: usize| -> &'s mut [i32] { bytemuck::cast_slice_mut(take(&mut buf, words[i])) };
        IntLayer {
            sk,
            sv,
            sr,
            nk,
            nv,
            wk,
            wv,
            wm: ints(7),
            prev_q: ints(8),
            prev_k: ints(9),
            prev_v: ints(10),
            prev_m: ints(11),
        }
    }
}

/// Widths of the scratch parts of an integer step, in order.
fn scratch_parts(cfg: &Config, state_len: usize) -> Option<[usize; SCRATCH_PARTS]> {
    let (d, dk, dv, h) = (cfg.d_model as usize, cfg.d_qk as usize, cfg.d_v as usize, cfg.n_heads as usize);
    let (qd, vd, c) = (cfg.q_dim(), cfg.v_dim(), cfg.chunk_len as usize);
    let widest = d.max(cfg.d_vgate as usize).max(vd).max(cfg.d_ff as usize);
    let ring = cfg.window_len().max(if cfg.is_hybrid() { cfg.alt_window as usize } else { 0 });
    let reads = state_len.checked_add(ring)?;
    Some([
        cfg.vocab_len as usize, // logits (f32), first: see `Session::logits`
        d,                      // x: residual stream
        d,                      // a: block input / output
        qd,                     // q
        qd,                     // k
        vd,                     // v
        vd,                     // v_first
        vd,                     // v_first of a hybrid's KVM layers
        cfg.d_vgate as usize,   // value-gate LoRA hidden
        vd,                     // value gate
        h,                      // merge gates
        vd,                     // attention output
        cfg.d_ff as usize,      // MLP hidden
        widest / 2 + 1,         // a product's i16 input
        reads,                  // a head's scores, then weights
        dk.max(dv) / 2 + 1,     // a query's row
        dk.max(dv),             // a wide row (i32)
        c.checked_mul(dk)?,     // a fold's prepared keys
        c.checked_mul(2)?,      // its novelty scores (i64)
        c,                      // its appended / merged flags
        cfg.rope_dim as usize,  // RoPE cos, sin (Q15)
        cfg.alt_rope_dim as usize,
    ])
}

const SCRATCH_PARTS: usize = 22;

/// Words of an integer step's scratch: its parts, then one layer's recomputed nk and nv
/// (none where they are stored).
fn scratch_words(cfg: &Config, state_len: usize, width: RowWidth, reads: SlotReads) -> Option<usize> {
    let parts = scratch_parts(cfg, state_len)?;
    let [nk, nv] = read_words(cfg, state_len, width, reads)?;
    parts.iter().chain(&[nk, nv]).try_fold(0usize, |acc, &n| acc.checked_add(pad(n)))
}

/// An integer step's scratch, carved from the arena's.
pub(crate) struct IntScratch<'s> {
    pub logits: &'s mut [f32],
    pub x: &'s mut [i32],
    pub a: &'s mut [i32],
    pub q: &'s mut [i32],
    pub k: &'s mut [i32],
    pub v: &'s mut [i32],
    pub v_first: &'s mut [i32],
    pub v_first_kvm: &'s mut [i32],
    pub vg_lo: &'s mut [i32],
    pub vg: &'s mut [i32],
    pub mg: &'s mut [i32],
    pub o: &'s mut [i32],
    pub ff: &'s mut [i32],
    pub x16: &'s mut [i16],
    pub scores: &'s mut [i32],
    pub qrow: &'s mut [i16],
    pub wide: &'s mut [i32],
    pub pk: &'s mut [i32],
    pub novelty: &'s mut [i64],
    pub index: &'s mut [u32],
    pub rope: &'s mut [i32],
    pub alt_rope: &'s mut [i32],
}

impl<'s> IntScratch<'s> {
    /// The scratch of a session of `cfg` holding `state_len` slots, from `buf`
    /// ([`scratch_words`] long), and the rest of `buf`: the recomputed reads' rows.
    pub(crate) fn carve(mut buf: &'s mut [f32], cfg: &Config, state_len: usize) -> (Self, &'s mut [f32]) {
        let parts = scratch_parts(cfg, state_len).unwrap_or([0; SCRATCH_PARTS]);
        let mut i = 0;
        let mut next = || {
            i += 1;
            take(&mut buf, parts[i - 1])
        };
        let logits = next();
        let mut int = || -> &'s mut [i32] { bytemuck::cast_slice_mut(next()) };
        let (x, a, q, k, v, v_first, v_first_kvm) = (int(), int(), int(), int(), int(), int(), int());
        let (vg_lo, vg, mg, o, ff) = (int(), int(), int(), int(), int());
        let x16: &mut [i16] = bytemuck::cast_slice_mut(next());
        let scores: &mut [i32] = bytemuck::cast_slice_mut(next());
        let qrow: &mut [i16] = bytemuck::cast_slice_mut(next());
        let wide: &mut [i32] = bytemuck::cast_slice_mut(next());
        let pk: &mut [i32] = bytemuck::cast_slice_mut(next());
        let novelty: &mut [i64] = bytemuck::cast_slice_mut(next());
        let index: &mut [u32] = bytemuck::cast_slice_mut(next());
        let rope: &mut [i32] = bytemuck::cast_slice_mut(next());
        let alt_rope: &mut [i32] = bytemuck::cast_slice_mut(next());
        let scratch = IntScratch {
            logits,
            x,
            a,
            q,
            k,
            v,
            v_first,
            v_first_kvm,
            vg_lo,
            vg,
            mg,
            o,
            ff,
            x16,
            scores,
            qrow,
            wide,
            pk,
            novelty,
            index,
            rope,
            alt_rope,
        };
        (scratch, buf)
    }
}

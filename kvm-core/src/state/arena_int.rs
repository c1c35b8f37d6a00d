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
//! A `rows` part holds its rows' i16 mantissas, two a word, then one i32 exponent per row
//! ([`IntRows`]).

use crate::config::Config;
use crate::state::words::{pad, take, LAYER_PARTS};

/// Words of `rows` rows of `d` i16 mantissas (`d` even) and their exponents.
#[inline]
fn rows_words(rows: usize, d: usize) -> Option<usize> {
    rows.checked_mul(d / 2 + 1)
}

/// The words of each part of a KVM layer's state and of an alternate layer's, and their
/// row widths (1: sized in words), for [`crate::state::Layout`].
pub(crate) fn layer_words(cfg: &Config, state_len: usize) -> Option<([usize; LAYER_PARTS], [usize; LAYER_PARTS])> {
    let h = cfg.n_heads as usize;
    let (dk, dv, d) = (cfg.d_qk as usize, cfg.d_v as usize, cfg.d_model as usize);
    let (hs, hw) = (h.checked_mul(state_len)?, h.checked_mul(cfg.window_len())?);
    let (qd, vd) = (cfg.q_dim(), cfg.v_dim());
    let kvm = [
        hs.checked_mul(dk)?,
        hs.checked_mul(dv)?,
        hs.checked_mul(3)?,
        rows_words(hs, dk)?,
        rows_words(hs, dv)?,
        rows_words(hw, dk)?,
        rows_words(hw, dv)?,
        hw,
        qd,
        qd,
        vd,
        d,
    ];
    let ha = h.checked_mul(if cfg.is_hybrid() { cfg.alt_window as usize } else { 0 })?;
    let alt = [0, 0, 0, 0, 0, rows_words(ha, dk)?, rows_words(ha, dv)?, 0, qd, qd, vd, d];
    Some((kvm, alt))
}

/// Rows of i16 mantissas with one exponent each: row `r` is `m[r] * 2^(e[r] - FX)`.
pub(crate) struct IntRows<'s> {
    /// `[rows, d]`
    pub m: &'s mut [i16],
    /// `[rows]`
    pub e: &'s mut [i32],
    pub d: usize,
}

impl<'s> IntRows<'s> {
    /// `rows` rows of width `d` in `words` ([`rows_words`] of them).
    fn carve(words: &'s mut [f32], rows: usize, d: usize) -> Self {
        let (m, e) = words.split_at_mut(rows * d / 2);
        IntRows { m: bytemuck::cast_slice_mut(m), e: bytemuck::cast_slice_mut(e), d }
    }

    /// Row `r`'s mantissas and exponent.
    #[inline]
    pub(crate) fn row(&self, r: usize) -> (&[i16], i32) {
        (&self.m[r * self.d..(r + 1) * self.d], self.e[r])
    }

    /// Row `r`'s mantissas and exponent, to write.
    #[inline]
    pub(crate) fn row_mut(&mut self, r: usize) -> (&mut [i16], &mut i32) {
        (&mut self.m[r * self.d..(r + 1) * self.d], &mut self.e[r])
    }
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
    pub(crate) fn carve(
        mut buf: &'s mut [f32],
        words: &[usize; LAYER_PARTS],
        cfg: &Config,
        state_len: usize,
        alt: bool,
    ) -> Self {
        let h = cfg.n_heads as usize;
        let (dk, dv) = (cfg.d_qk as usize, cfg.d_v as usize);
        let ring = h * if alt { cfg.alt_window as usize } else { cfg.window_len() };
        let slots = if alt { 0 } else { h * state_len };
        let mut ints = |i: usize| -> &'s mut [i32] { bytemuck::cast_slice_mut(take(&mut buf, words[i])) };
        let (sk, sv, sr) = (ints(0), ints(1), ints(2));
        let rows = |buf: &mut &'s mut [f32], i: usize, n: usize, d: usize| IntRows::carve(take(buf, words[i]), n, d);
        let nk = rows(&mut buf, 3, slots, dk);
        let nv = rows(&mut buf, 4, slots, dv);
        let wk = rows(&mut buf, 5, ring, dk);
        let wv = rows(&mut buf, 6, ring, dv);
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

/// Words of an integer step's scratch.
pub(crate) fn scratch_words(cfg: &Config, state_len: usize) -> Option<usize> {
    scratch_parts(cfg, state_len)?.iter().try_fold(0usize, |acc, &n| acc.checked_add(pad(n)))
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
    /// ([`scratch_words`] long).
    pub(crate) fn carve(mut buf: &'s mut [f32], cfg: &Config, state_len: usize) -> Self {
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
        IntScratch {
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
        }
    }
}

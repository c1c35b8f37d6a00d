//! The arena's layout: how one caller-provided buffer holds a session's whole state and
//! the scratch of a step, and the views carved from it.
//!
//! The arena is one `[f32]` carved, in a fixed order, into:
//!
//! ```text
//! counters   [16]                       pos, slots, coverage, layout stamp, model identity, flags
//! per layer  sk [n_heads, state_len, d_qk]    key sums
//!            sv [n_heads, state_len, d_v]     value sums
//!            r  [n_heads, state_len]          read radius (vlens) or fold count
//!            nk [n_heads, state_len, d_qk]    LN_s_k(sk), refreshed when sk changes  (*)
//!            nv [n_heads, state_len, d_v]     the value a read sees, likewise         (*)
//!            wk [n_heads, window_len, d_qk]   window keys (post LN_k, post RoPE), a ring (*)
//!            wv [n_heads, window_len, d_v]    window values, a ring                   (*)
//!            wm [n_heads, window_len]         window merge gates, a ring
//!            prev_q, prev_k [n_heads * d_qk], prev_v [n_heads * d_v], prev_m [d_model]
//!                                             token-shift carries
//! scratch    logits of the last token, a step's scores and fold scratch, then one token's
//!            activations and kernel scratch
//! ```
//!
//! A hybrid stack's alternate layer (spec §5) keeps only its ring and the carries, in the
//! same order: `wk [n_heads, alt_window, d_qk]`, `wv [n_heads, alt_window, d_v]` (its last
//! `Wa` keys and values, post LN_k and RoPE), prev_q, prev_k, prev_v, prev_m.
//!
//! (*) stored as the layout's [`CacheDtype`] (f32; f16 in half the words; q8: the i8 values,
//! then one f32 scale per row); the rest is f32. With [`SlotReads::Recomputed`] nk and nv
//! leave the layers: one layer's pair sits in the scratch (`reads`), recomputed from the
//! sums when each layer's attention begins.
//!
//! Everything before `scratch` is the session's state: [`crate::Session::snapshot`] copies
//! it and nothing else. The scratch begins with the logits of the last token, so
//! [`crate::Session::snapshot_with_logits`] is the state and the `[vocab_len]` words after
//! it, in one copy; the counters' flags word says whether those logits are the current
//! position's (FORMAT.md, "Session snapshots"). Every region starts on a 64-byte boundary.

use crate::cache::int::RowWidth;
use crate::cache::{CacheDtype, Parts, Rows, RowsMut, RowsParts, SlotReads};
use crate::config::{flags, Config};
use crate::error::{ConfigField, Error, Result};
use crate::kernels;
use crate::state::plan::SEGMENT_LEN;
pub use crate::state::words::ARENA_ALIGN;
use crate::state::words::{pad, take, ArenaWords, LAYER_PARTS, UNIT};

/// f32s of the counters block.
pub(crate) const COUNTERS: usize = UNIT;

/// Sizes of one session's arena for a config and a state capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// State slots the arena holds.
    pub state_len: usize,
    /// How the rows attention reads are stored.
    pub cache: CacheDtype,
    /// Where the slots' read rows (nk, nv) live.
    pub reads: SlotReads,
    /// f32s of one KVM layer's state.
    layer_len: usize,
    /// f32s of one alternate layer's state (0 without alternate layers).
    alt_len: usize,
    /// Alternate layers every this many (0: none), as [`Config::alt_layer_every`].
    alt_every: usize,
    /// f32s of the per-step scratch.
    scratch_len: usize,
    n_layers: usize,
    /// Words of each part of a KVM layer's state, as the numerics sizes them
    /// ([`ArenaWords::layer_words`]).
    layer_words: [usize; LAYER_PARTS],
    /// Words of each part of an alternate layer's state.
    alt_words: [usize; LAYER_PARTS],
    /// The float numerics' parts: what a float session carves its state and scratch by.
    floats: Floats,
    /// An integer-numerics session's ([`crate::int`]): its parts carve themselves from
    /// the words above, and its scratch is its own.
    int: bool,
}

const STEP_PARTS: usize = 8;
const ROW_PARTS: usize = 16;

/// The float numerics' arena for a config and capacity: the elements of its state's
/// parts (attention rows stored as the cache dtype, the rest f32), its step scratch and
/// its activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Floats {
    cache: CacheDtype,
    reads: SlotReads,
    /// Elements of each part of a KVM layer's state ([`Floats::LAYER_CACHED`] ones of
    /// `cache`).
    layer_sizes: [usize; LAYER_PARTS],
    /// Elements of each part of an alternate layer's state: the ring (wk, wv) and the
    /// carries.
    alt_sizes: [usize; LAYER_PARTS],
    /// Row width of each part (1 for the ones not stored as `cache`).
    part_widths: [usize; LAYER_PARTS],
    step_sizes: [usize; STEP_PARTS],
    /// Widths of the per-token activation rows.
    row_widths: [usize; ROW_PARTS],
    /// The widest input a matrix kernel sees.
    widest_input: usize,
    /// f32s a batch of several tokens keeps for its segments' attention scores
    /// ([`Acts::scores`]).
    segment_scores: usize,
}

impl Floats {
    /// The parts of a layer's state that [`SlotReads::Recomputed`] moves to the scratch:
    /// nk, nv.
    const SLOT_READS: [usize; 2] = [3, 4];

    /// The parts of a layer's state stored as the cache dtype: nk, nv, wk, wv.
    const LAYER_CACHED: [bool; LAYER_PARTS] =
        [false, false, false, true, true, true, true, false, false, false, false, false];

    /// The float parts of a session of `cfg` holding `s` slots (`None` on overflow).
    fn new(cfg: &Config, s: usize, cache: CacheDtype, reads: SlotReads) -> Option<Floats> {
        let h = cfg.n_heads as usize;
        let (dk, dv, d) = (cfg.d_qk as usize, cfg.d_v as usize, cfg.d_model as usize);
        let (w, c, qd, vd) = (cfg.window_len(), cfg.chunk_len as usize, cfg.q_dim(), cfg.v_dim());
        let (hs, hw) = (h.checked_mul(s)?, h.checked_mul(w)?);
        let wa = if cfg.is_hybrid() { cfg.alt_window as usize } else { 0 };
        let ha = h.checked_mul(wa)?;
        let (sk, sv, wk, wv) = (hs.checked_mul(dk)?, hs.checked_mul(dv)?, hw.checked_mul(dk)?, hw.checked_mul(dv)?);
        let mut f = Floats {
            cache,
            reads,
            layer_sizes: [sk, sv, hs, sk, sv, wk, wv, hw, qd, qd, vd, d],
            alt_sizes: [0, 0, 0, 0, 0, ha.checked_mul(dk)?, ha.checked_mul(dv)?, 0, qd, qd, vd, d],
            // Row widths of the cached parts (nk, nv, wk, wv).
            part_widths: [1, 1, 1, dk, dv, dk, dv, 1, 1, 1, 1, 1],
            step_sizes: [0; STEP_PARTS],
            row_widths: row_widths(cfg),
            widest_input: d.max(cfg.d_vgate as usize).max(vd).max(cfg.d_ff as usize),
            segment_scores: 0,
        };
        let slot_rows = match reads {
            SlotReads::Recomputed => Self::SLOT_READS.iter().map(|&i| pad(f.part_words(i, f.layer_sizes[i]))).sum(),
            SlotReads::Stored => 0,
        };
        let reach = s.checked_add(w)?;
        f.step_sizes = [
            cfg.vocab_len as usize,        // logits of the last token (first: see `Session::logits`)
            h.checked_mul(reach.max(wa))?, // attention scores, per head
            c.checked_mul(dk)?,            // prepared overflow keys
            c,                             // novelty scores
            c,                             // appended flags (u32)
            s.checked_mul(dk)?,            // merged key deltas
            s.checked_mul(dv)?,            // merged value deltas
            slot_rows,                     // one layer's nk and nv (words)
        ];
        // Per head: a segment's queries (`[SEGMENT_LEN, dk]`), their scores and their dot
        // products as the kernels write them (`[SEGMENT_LEN, s + w]` each).
        let per_head = (2 * SEGMENT_LEN).checked_mul(reach)?.checked_add(SEGMENT_LEN.checked_mul(dk)?)?;
        f.segment_scores = h.checked_mul(per_head)?;
        Some(f)
    }

    /// f32 words of part `i` of a layer's state, `n` elements in rows of its width.
    #[inline]
    fn part_words(&self, i: usize, n: usize) -> usize {
        if Self::LAYER_CACHED[i] {
            self.cache.words(n, self.part_widths[i])
        } else {
            n
        }
    }

    /// f32s of the activations of `n` tokens processed together.
    fn acts_len(&self, n: usize) -> Option<usize> {
        let rows = self.row_widths.iter().try_fold(0usize, |acc, &w| acc.checked_add(pad(w.checked_mul(n)?)))?;
        let rows = rows.checked_add(pad(self.segment_scores_len(n)))?;
        rows.checked_add(pad(kernels::matmul_scratch_len(self.widest_input, n).div_ceil(4)))
    }

    /// f32s of [`Acts::scores`] for `n` tokens: none for one, whose attention has the
    /// step scratch's scores.
    fn segment_scores_len(&self, n: usize) -> usize {
        if n < 2 {
            0
        } else {
            self.segment_scores
        }
    }
}

impl ArenaWords for Floats {
    /// No nk or nv in a KVM layer's state where they are recomputed.
    fn layer_words(&self, _: &Config, _: usize, _: SlotReads) -> Option<[[usize; LAYER_PARTS]; 2]> {
        let recomputed = |i: usize| self.reads == SlotReads::Recomputed && Self::SLOT_READS.contains(&i);
        let kvm = core::array::from_fn(|i| if recomputed(i) { 0 } else { self.part_words(i, self.layer_sizes[i]) });
        Some([kvm, core::array::from_fn(|i| self.part_words(i, self.alt_sizes[i]))])
    }

    /// The step's parts, then one token's activations.
    fn scratch_words(&self, _: &Config, _: usize, _: SlotReads) -> Option<usize> {
        let step = self.step_sizes.iter().try_fold(0usize, |acc, &n| acc.checked_add(pad(n)))?;
        step.checked_add(self.acts_len(1)?)
    }
}

/// Widths of a float step's per-token activation rows ([`Acts`], in order).
fn row_widths(cfg: &Config) -> [usize; ROW_PARTS] {
    let (d, vd, half, alt_half) =
        (cfg.d_model as usize, cfg.v_dim(), cfg.rope_dim as usize / 2, cfg.alt_rope_dim as usize / 2);
    [
        d,                                    // x: residual stream
        d,                                    // a: block input / output
        cfg.q_dim(),                          // q
        cfg.q_dim(),                          // k
        vd,                                   // v
        vd,                                   // v_first
        cfg.d_vgate as usize,                 // value-gate LoRA hidden
        vd,                                   // value gate
        cfg.n_heads as usize,                 // merge gates
        vd,                                   // attention output
        cfg.d_ff as usize,                    // MLP hidden
        half,                                 // RoPE cos
        half,                                 // RoPE sin
        alt_half,                             // alternate layers' RoPE cos
        alt_half,                             // alternate layers' RoPE sin
        if cfg.is_hybrid() { vd } else { 0 }, // KVM layers' v_first in a hybrid
    ]
}

impl Layout {
    /// The layout of a session of `cfg` holding at most `state_len` slots, its attention
    /// rows stored as `cache`, the slots' read rows where `reads` says.
    ///
    /// # Errors
    /// [`Error::BadConfig`] (`StateCapacity`) if `state_len` is below `chunk_len` (the
    /// first chunk always enters the state whole) or above the model's
    /// [`Config::natural_state_len`]; [`Error::BadConfig`] if the arena size overflows,
    /// or (`CacheDtype`) for an f16 cache of an integer file.
    pub fn new(cfg: &Config, state_len: usize, cache: CacheDtype, reads: SlotReads) -> Result<Layout> {
        let too_big = Error::BadConfig(ConfigField::StateCapacity);
        if state_len < cfg.chunk_len as usize || state_len > cfg.natural_state_len() {
            return Err(too_big);
        }
        let floats = Floats::new(cfg, state_len, cache, reads).ok_or(too_big)?;
        let int = cfg.has(flags::INT_NUMERICS);
        // An integer session's rows are i16, or i8 for the q8 cache (no f16).
        if int && cache == CacheDtype::F16 {
            return Err(Error::BadConfig(ConfigField::CacheDtype));
        }
        let rows = RowWidth::of(cache);
        // The session's numerics says what each part and its scratch take.
        let numerics: &dyn ArenaWords = if int { &rows } else { &floats };
        let [layer_words, alt_words] = numerics.layer_words(cfg, state_len, reads).ok_or(too_big)?;
        let sum = |words: &[usize]| words.iter().try_fold(0usize, |acc, &n| acc.checked_add(pad(n))).ok_or(too_big);
        let n_layers = cfg.n_layers as usize;
        let lay = Layout {
            state_len,
            cache,
            reads,
            layer_len: sum(&layer_words)?,
            alt_len: sum(&alt_words)?,
            alt_every: if cfg.is_hybrid() { cfg.alt_layer_every as usize } else { 0 },
            scratch_len: numerics.scratch_words(cfg, state_len, reads).ok_or(too_big)?,
            n_layers,
            layer_words,
            alt_words,
            floats,
            int,
        };
        let mul = |a: usize, b: usize| a.checked_mul(b).ok_or(too_big);
        let n_alt = cfg.alt_before(n_layers);
        let layers = mul(lay.layer_len, n_layers - n_alt)?.checked_add(mul(lay.alt_len, n_alt)?).ok_or(too_big)?;
        let total = layers.checked_add(lay.scratch_len + COUNTERS).ok_or(too_big)?;
        mul(total, 4)?;
        Ok(lay)
    }

    /// f32s of the activations of `n` tokens processed together (the `batch` of
    /// [`crate::Session::step_batch`]); 0 for an integer session, which runs a batch
    /// token by token in its own scratch.
    pub fn acts_len(&self, n: usize) -> Option<usize> {
        if self.int {
            return Some(0);
        }
        self.floats.acts_len(n)
    }

    /// Alternate layers among layers `[0, l)`.
    #[inline]
    fn alt_before(&self, l: usize) -> usize {
        if self.alt_every >= 2 {
            l.div_ceil(self.alt_every)
        } else {
            0
        }
    }

    /// Whether layer `l` is an alternate layer.
    #[inline]
    fn is_alt(&self, l: usize) -> bool {
        self.alt_every >= 2 && l.is_multiple_of(self.alt_every)
    }

    /// Where layer `l`'s state starts in the layers region, and its f32s.
    #[inline]
    fn layer_span(&self, l: usize) -> (usize, usize) {
        let alts = self.alt_before(l);
        let at = (l - alts) * self.layer_len + alts * self.alt_len;
        (at, if self.is_alt(l) { self.alt_len } else { self.layer_len })
    }

    /// f32s of the persistent part (counters + every layer's state).
    #[inline]
    pub(crate) fn state_floats(&self) -> usize {
        COUNTERS + self.layer_span(self.n_layers).0
    }

    /// Exact arena bytes.
    #[inline]
    pub fn arena_len(&self) -> usize {
        (self.state_floats() + self.scratch_len) * 4
    }

    /// Layer `l`'s state within the layers region (every layer's, in order), its slot
    /// reads in `reads` (the scratch's, [`ArenaParts::reads`]) when they are recomputed.
    pub(crate) fn carve_layer<'s>(&self, layers: &'s mut [f32], reads: &'s mut [f32], l: usize) -> LayerState<'s> {
        let (at, len) = self.layer_span(l);
        let f = &self.floats;
        let sizes = if self.is_alt(l) { &f.alt_sizes } else { &f.layer_sizes };
        LayerState::carve(&mut layers[at..at + len], reads, f, sizes)
    }

    /// An integer session's attention rows: i8 for the q8 cache, else i16.
    #[inline]
    pub(crate) fn int_rows(&self) -> RowWidth {
        RowWidth::of(self.cache)
    }

    /// Whether this is an integer-numerics session's layout.
    #[inline]
    pub fn is_int(&self) -> bool {
        self.int
    }

    /// Layer `l`'s words within the layers region and the words of each of its parts,
    /// in order, each padded to 64 bytes (an integer session carves them itself).
    pub(crate) fn layer_words<'s>(&self, layers: &'s mut [f32], l: usize) -> (&'s mut [f32], &[usize; LAYER_PARTS]) {
        let (at, len) = self.layer_span(l);
        let words = if self.is_alt(l) { &self.alt_words } else { &self.layer_words };
        (&mut layers[at..at + len], words)
    }

    /// The arena's counters, layers and scratch (`[arena_len / 4]`).
    pub(crate) fn regions<'s>(&self, arena: &'s mut [f32]) -> (&'s mut [f32], &'s mut [f32], &'s mut [f32]) {
        let (counters, rest) = arena.split_at_mut(COUNTERS);
        let (layers, scratch) = rest.split_at_mut(self.state_floats() - COUNTERS);
        (counters, layers, scratch)
    }

    /// Cuts the whole arena (`[arena_len / 4]`) for one forward pass.
    pub(crate) fn split<'s>(&self, arena: &'s mut [f32]) -> ArenaParts<'s> {
        let (counters, rest) = arena.split_at_mut(COUNTERS);
        let (layers, scratch) = rest.split_at_mut(self.state_floats() - COUNTERS);
        let sizes = &self.floats.step_sizes;
        let step_len = sizes.iter().map(|&n| pad(n)).sum();
        let (step, acts) = scratch.split_at_mut(step_len);
        let (step, reads) = step.split_at_mut(step_len - sizes[STEP_PARTS - 1]);
        ArenaParts { counters, layers, reads, scratch: Scratch::carve(step, sizes), acts }
    }

    /// Read-only views of layer `l`'s state sums, radii and window rings in `arena`
    /// (`l < n_layers`).
    pub(crate) fn layer_parts<'s>(&self, arena: &'s [f32], l: usize) -> LayerParts<'s> {
        let (f, alt) = (&self.floats, self.is_alt(l));
        let (z, words) = if alt { (&f.alt_sizes, &self.alt_words) } else { (&f.layer_sizes, &self.layer_words) };
        let (widths, cache) = (&f.part_widths, self.cache);
        let mut off = COUNTERS + self.layer_span(l).0;
        let mut next = |i: usize| {
            let words = words[i];
            let s = &arena[off..off + words];
            off += pad(words);
            s
        };
        let (sk, sv, r) = (next(0), next(1), next(2));
        let (_nk, _nv) = (next(3), next(4));
        let wk = Rows::from_words(next(5), z[5], widths[5], cache);
        let wv = Rows::from_words(next(6), z[6], widths[6], cache);
        LayerParts { sk, sv, r, wk, wv }
    }

    /// Bytes of a [`crate::Session::snapshot`].
    #[inline]
    pub fn snapshot_len(&self) -> usize {
        self.state_floats() * 4
    }
}

/// The arena of [`Layout::split`].
pub(crate) struct ArenaParts<'s> {
    /// `[COUNTERS]`, the words the session keeps its counters in.
    pub counters: &'s mut [f32],
    /// `[n_layers * layer_len]`, every layer's state ([`Layout::carve_layer`]).
    pub layers: &'s mut [f32],
    /// One layer's nk and nv with [`SlotReads::Recomputed`], else empty.
    pub reads: &'s mut [f32],
    pub scratch: Scratch<'s>,
    /// The rest: one token's activations ([`Acts::carve`] with `n = 1`).
    pub acts: &'s mut [f32],
}

/// Layer state for inspection ([`Layout::layer_parts`]).
pub(crate) struct LayerParts<'s> {
    /// `[n_heads, state_len, d_qk]`
    pub sk: &'s [f32],
    /// `[n_heads, state_len, d_v]`
    pub sv: &'s [f32],
    /// `[n_heads, state_len]`
    pub r: &'s [f32],
    /// `[n_heads, window_len, d_qk]`
    pub wk: Rows<'s>,
    /// `[n_heads, window_len, d_v]`
    pub wv: Rows<'s>,
}

/// One layer's state, carved from the arena.
pub(crate) struct LayerState<'s> {
    pub sk: &'s mut [f32],
    pub sv: &'s mut [f32],
    pub r: &'s mut [f32],
    pub nk: RowsMut<'s>,
    pub nv: RowsMut<'s>,
    pub wk: RowsMut<'s>,
    pub wv: RowsMut<'s>,
    pub wm: &'s mut [f32],
    pub prev_q: &'s mut [f32],
    pub prev_k: &'s mut [f32],
    pub prev_v: &'s mut [f32],
    pub prev_m: &'s mut [f32],
}

impl<'s> LayerState<'s> {
    /// The state of a layer whose parts have `z` elements each.
    fn carve(mut buf: &'s mut [f32], mut reads: &'s mut [f32], lay: &Floats, z: &[usize; LAYER_PARTS]) -> Self {
        let rows = |buf: &mut &'s mut [f32], i: usize| {
            let (d, words) = (lay.part_widths[i], lay.part_words(i, z[i]));
            RowsMut::from_words(take(buf, words), z[i], d, lay.cache)
        };
        let (sk, sv, r) = (take(&mut buf, z[0]), take(&mut buf, z[1]), take(&mut buf, z[2]));
        let home = if lay.reads == SlotReads::Recomputed { &mut reads } else { &mut buf };
        let (nk, nv) = (rows(home, 3), rows(home, 4));
        LayerState {
            sk,
            sv,
            r,
            nk,
            nv,
            wk: rows(&mut buf, 5),
            wv: rows(&mut buf, 6),
            wm: take(&mut buf, z[7]),
            prev_q: take(&mut buf, z[8]),
            prev_k: take(&mut buf, z[9]),
            prev_v: take(&mut buf, z[10]),
            prev_m: take(&mut buf, z[11]),
        }
    }
}

impl LayerState<'_> {
    /// This state cut into its `n_heads` heads' ([`LayerHeads::head`]).
    pub(crate) fn heads(&mut self, n_heads: usize) -> LayerHeads<'_> {
        LayerHeads {
            sk: Parts::new(self.sk, n_heads),
            sv: Parts::new(self.sv, n_heads),
            r: Parts::new(self.r, n_heads),
            nk: self.nk.parts(n_heads),
            nv: self.nv.parts(n_heads),
            wk: self.wk.parts(n_heads),
            wv: self.wv.parts(n_heads),
            wm: Parts::new(self.wm, n_heads),
        }
    }
}

/// One layer's state cut by head, for the heads' jobs that run in parallel: each head's
/// slots, window ring and gates, which no other head's updates or reads touch.
pub(crate) struct LayerHeads<'a> {
    sk: Parts<'a, f32>,
    sv: Parts<'a, f32>,
    r: Parts<'a, f32>,
    nk: RowsParts<'a>,
    nv: RowsParts<'a>,
    wk: RowsParts<'a>,
    wv: RowsParts<'a>,
    wm: Parts<'a, f32>,
}

impl LayerHeads<'_> {
    /// Head `h`'s state as the one head of a one-head layer (its slot `s` at index `s`,
    /// its ring entry of position `j` at `j % window_len`), without the token-shift rows.
    ///
    /// # Safety
    /// `h < n_heads`, and no other view of head `h` from `self` is alive while the
    /// returned one is.
    #[inline]
    pub(crate) unsafe fn head(&self, h: usize) -> LayerState<'_> {
        // SAFETY: the caller's promise, for every part of head `h`.
        unsafe {
            LayerState {
                sk: self.sk.part(h),
                sv: self.sv.part(h),
                r: self.r.part(h),
                nk: self.nk.part(h),
                nv: self.nv.part(h),
                wk: self.wk.part(h),
                wv: self.wv.part(h),
                wm: self.wm.part(h),
                prev_q: &mut [],
                prev_k: &mut [],
                prev_v: &mut [],
                prev_m: &mut [],
            }
        }
    }
}

/// Scratch of one step that does not grow with the number of tokens.
pub(crate) struct Scratch<'s> {
    /// `[vocab_len]`
    pub logits: &'s mut [f32],
    /// `[n_heads, max(state_len + window_len, alt_window)]`
    pub scores: &'s mut [f32],
    pub fold: FoldScratch<'s>,
}

/// Scratch of one fold.
pub(crate) struct FoldScratch<'s> {
    /// `[chunk_len, d_qk]` prepared keys of the leaving chunk.
    pub pk: &'s mut [f32],
    /// `[chunk_len]` novelty scores.
    pub novelty: &'s mut [f32],
    /// `[chunk_len]` 1 where the token is appended, 0 where merged.
    pub index: &'s mut [u32],
    /// `[state_len, d_qk]` summed merged keys.
    pub dsk: &'s mut [f32],
    /// `[state_len, d_v]` summed merged values.
    pub dsv: &'s mut [f32],
}

impl<'s> Scratch<'s> {
    fn carve(mut buf: &'s mut [f32], sizes: &[usize; STEP_PARTS]) -> Self {
        // Without the slot reads, which `Layout::split` hands out apart.
        let z = &sizes[..STEP_PARTS - 1];
        Scratch {
            logits: take(&mut buf, z[0]),
            scores: take(&mut buf, z[1]),
            fold: FoldScratch {
                pk: take(&mut buf, z[2]),
                novelty: take(&mut buf, z[3]),
                index: bytemuck::cast_slice_mut(take(&mut buf, z[4])),
                dsk: take(&mut buf, z[5]),
                dsv: take(&mut buf, z[6]),
            },
        }
    }
}

/// Activations of `n` tokens processed together, one row per token.
pub(crate) struct Acts<'s> {
    pub n: usize,
    /// `[n, d_model]` residual stream.
    pub x: &'s mut [f32],
    /// `[n, d_model]` block input, then block output.
    pub a: &'s mut [f32],
    /// `[n, n_heads * d_qk]`
    pub q: &'s mut [f32],
    pub k: &'s mut [f32],
    /// `[n, n_heads * d_v]` values, then attention's heads' outputs side by side
    pub v: &'s mut [f32],
    pub v_first: &'s mut [f32],
    /// `[n, d_vgate]`
    pub vg_lo: &'s mut [f32],
    /// `[n, n_heads * d_v]`
    pub vg: &'s mut [f32],
    /// `[n, n_heads]`
    pub mg: &'s mut [f32],
    /// Each run's heads' attention outputs, `[n_heads, run, d_v]` in its `[run, n_heads *
    /// d_v]` rows
    pub att: &'s mut [f32],
    /// `[n, d_ff]`
    pub ff: &'s mut [f32],
    /// `[n, rope_dim / 2]` bf16-rounded RoPE tables of each token's position.
    pub cos: &'s mut [f32],
    pub sin: &'s mut [f32],
    /// `[n, alt_rope_dim / 2]` the alternate layers' tables (empty without them).
    pub alt_cos: &'s mut [f32],
    pub alt_sin: &'s mut [f32],
    /// `[n, n_heads * d_v]` in a hybrid (else empty): the KVM layers' `v_first`, the first
    /// KVM layer's `c_v(LN_attn(x0))` (spec §5); `v_first` is then the alternate layers'.
    pub v_first_kvm: &'s mut [f32],
    /// `[n_heads, SEGMENT_LEN * (d_qk + 2 * (state_len + window_len))]` for several tokens,
    /// else empty: each head's queries of a segment, their attention scores and their dot
    /// products as the kernels write them (`HeadReader::attend_many`).
    pub scores: &'s mut [f32],
    /// Kernel scratch (quantized activations).
    pub act: &'s mut [u8],
}

impl<'s> Acts<'s> {
    pub(crate) fn carve(mut buf: &'s mut [f32], lay: &Layout, n: usize) -> Self {
        let lay = &lay.floats;
        let z = lay.row_widths.map(|w| w * n);
        Acts {
            n,
            x: take(&mut buf, z[0]),
            a: take(&mut buf, z[1]),
            q: take(&mut buf, z[2]),
            k: take(&mut buf, z[3]),
            v: take(&mut buf, z[4]),
            v_first: take(&mut buf, z[5]),
            vg_lo: take(&mut buf, z[6]),
            vg: take(&mut buf, z[7]),
            mg: take(&mut buf, z[8]),
            att: take(&mut buf, z[9]),
            ff: take(&mut buf, z[10]),
            cos: take(&mut buf, z[11]),
            sin: take(&mut buf, z[12]),
            alt_cos: take(&mut buf, z[13]),
            alt_sin: take(&mut buf, z[14]),
            v_first_kvm: take(&mut buf, z[15]),
            scores: take(&mut buf, lay.segment_scores_len(n)),
            act: bytemuck::cast_slice_mut(take(&mut buf, kernels::matmul_scratch_len(lay.widest_input, n).div_ceil(4))),
        }
    }
}

/// Index of head `h`'s slot `s` in `[n_heads, state_len]` arrays.
#[inline]
pub(crate) fn slot_index(h: usize, state_len: usize, s: usize) -> usize {
    h * state_len + s
}

/// Index of head `h`'s window entry for position `j` in `[n_heads, window_len]` rings.
#[inline]
pub(crate) fn ring_index(cfg: &Config, h: usize, j: usize) -> usize {
    h * cfg.window_len() + j % cfg.window_len()
}

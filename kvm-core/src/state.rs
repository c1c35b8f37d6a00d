//! Session state inside the caller's arena: the arena layout, the block sliding window,
//! the compressed means state and its updates (spec §3), and the [`Session`] handle.
//!
//! The arena is one `[f32]` carved, in a fixed order, into:
//!
//! ```text
//! counters   [16]                       pos, slots, coverage, layout stamp, model identity
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
//! scratch    activations of one step, fold scratch, kernel scratch, logits
//! ```
//!
//! (*) stored as the layout's [`CacheDtype`] (f32; f16 in half the words; q8: the i8 values,
//! then one f32 scale per row); the rest is f32.
//!
//! Everything before `scratch` is the session's state: [`Session::snapshot`] copies it
//! and nothing else. Every region starts on a 64-byte boundary.

use crate::cache::{CacheDtype, Rows, RowsMut};
use crate::config::{flags, Config, StateBudget};
use crate::error::{Error, Result};
use crate::kernels;
use crate::math::{self, layer_norm_inplace, ln_stats, norm};
use crate::model::Exec;
use crate::model::{self, Logits, Model, Serial, Tap, Vector};
use crate::quant::round_bf16;

/// Required alignment of the arena's first byte.
pub const ARENA_ALIGN: usize = 64;

/// f32s per alignment unit.
const UNIT: usize = ARENA_ALIGN / 4;
/// f32s of the counters block.
const COUNTERS: usize = UNIT;
/// Marks a live arena (`"KVMS"`).
const STAMP: u32 = 0x534D_564B;

#[inline]
const fn pad(n: usize) -> usize {
    n.div_ceil(UNIT) * UNIT
}

/// Sizes of one session's arena for a config and a state capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// State slots the arena holds.
    pub state_len: usize,
    /// How the rows attention reads are stored.
    pub cache: CacheDtype,
    /// f32s of one layer's state.
    layer_len: usize,
    /// f32s of the per-step scratch.
    scratch_len: usize,
    n_layers: usize,
    /// Elements of each part of a layer's state ([`Layout::LAYER_CACHED`] ones of `cache`).
    layer_sizes: [usize; LAYER_PARTS],
    /// Row width of each part (1 for the ones not stored as `cache`).
    part_widths: [usize; LAYER_PARTS],
    step_sizes: [usize; STEP_PARTS],
    /// Widths of the per-token activation rows.
    row_widths: [usize; ROW_PARTS],
    /// The widest input a matrix kernel sees.
    widest_input: usize,
}

const LAYER_PARTS: usize = 12;
const STEP_PARTS: usize = 7;
const ROW_PARTS: usize = 13;

impl Layout {
    /// The parts of a layer's state stored as the cache dtype: nk, nv, wk, wv.
    const LAYER_CACHED: [bool; LAYER_PARTS] =
        [false, false, false, true, true, true, true, false, false, false, false, false];

    /// The layout of a session of `cfg` holding at most `state_len` slots, its attention
    /// rows stored as `cache`.
    ///
    /// # Errors
    /// [`Error::BadConfig`] (`StateCapacity`) if `state_len` is below `chunk_len` (the
    /// first chunk always enters the state whole) or above the model's
    /// [`Config::natural_state_len`]; [`Error::BadConfig`] if the arena size overflows.
    pub fn new(cfg: &Config, state_len: usize, cache: CacheDtype) -> Result<Layout> {
        use crate::error::ConfigField;
        let too_big = Error::BadConfig(ConfigField::StateCapacity);
        if state_len < cfg.chunk_len as usize || state_len > cfg.natural_state_len() {
            return Err(too_big);
        }
        let h = cfg.n_heads as usize;
        let (dk, dv, d) = (cfg.d_qk as usize, cfg.d_v as usize, cfg.d_model as usize);
        let (s, w, c) = (state_len, cfg.window_len(), cfg.chunk_len as usize);
        let mul = |a: usize, b: usize| a.checked_mul(b).ok_or(too_big);
        let layer_sizes = [
            mul(mul(h, s)?, dk)?,
            mul(mul(h, s)?, dv)?,
            mul(h, s)?,
            mul(mul(h, s)?, dk)?,
            mul(mul(h, s)?, dv)?,
            mul(mul(h, w)?, dk)?,
            mul(mul(h, w)?, dv)?,
            mul(h, w)?,
            cfg.q_dim(),
            cfg.q_dim(),
            cfg.v_dim(),
            d,
        ];
        let step_sizes = [
            cfg.vocab_len as usize,                    // logits of the last token
            mul(h, s.checked_add(w).ok_or(too_big)?)?, // attention scores, per head
            mul(c, dk)?,                               // prepared overflow keys
            c,                                         // novelty scores
            c,                                         // appended flags (u32)
            mul(s, dk)?,                               // merged key deltas
            mul(s, dv)?,                               // merged value deltas
        ];
        let row_widths = [
            d,                         // x: residual stream
            d,                         // a: block input / output
            cfg.q_dim(),               // q
            cfg.q_dim(),               // k
            cfg.v_dim(),               // v
            cfg.v_dim(),               // v_first
            cfg.d_vgate as usize,      // value-gate LoRA hidden
            cfg.v_dim(),               // value gate
            h,                         // merge gates
            cfg.v_dim(),               // attention output
            cfg.d_ff as usize,         // MLP hidden
            cfg.rope_dim as usize / 2, // RoPE cos
            cfg.rope_dim as usize / 2, // RoPE sin
        ];
        let widest_input = d.max(cfg.d_vgate as usize).max(cfg.v_dim()).max(cfg.d_ff as usize);
        let sum = |sizes: &[usize]| sizes.iter().try_fold(0usize, |acc, &n| acc.checked_add(pad(n)));
        // Row widths of the cached parts (nk, nv, wk, wv).
        let part_widths = [1, 1, 1, dk, dv, dk, dv, 1, 1, 1, 1, 1];
        let layer_words =
            core::array::from_fn::<_, LAYER_PARTS, _>(|i| Self::part_words(cache, &part_widths, i, layer_sizes[i]));
        let layer_len = sum(&layer_words).ok_or(too_big)?;
        let step_len = sum(&step_sizes).ok_or(too_big)?;
        let n_layers = cfg.n_layers as usize;
        let mut lay = Layout {
            state_len,
            cache,
            layer_len,
            scratch_len: 0,
            n_layers,
            layer_sizes,
            part_widths,
            step_sizes,
            row_widths,
            widest_input,
        };
        lay.scratch_len = step_len.checked_add(lay.acts_len(1).ok_or(too_big)?).ok_or(too_big)?;
        let total = mul(layer_len, n_layers)?.checked_add(lay.scratch_len + COUNTERS).ok_or(too_big)?;
        mul(total, 4)?;
        Ok(lay)
    }

    /// f32 words of part `i` of a layer's state, `n` elements in rows of `width[i]`.
    #[inline]
    fn part_words(cache: CacheDtype, width: &[usize; LAYER_PARTS], i: usize, n: usize) -> usize {
        if Self::LAYER_CACHED[i] {
            cache.words(n, width[i])
        } else {
            n
        }
    }

    /// f32s of the activations of `n` tokens processed together (the `batch` of
    /// [`Session::step_batch`]).
    pub fn acts_len(&self, n: usize) -> Option<usize> {
        let rows = self.row_widths.iter().try_fold(0usize, |acc, &w| acc.checked_add(pad(w.checked_mul(n)?)))?;
        rows.checked_add(pad(kernels::matmul_scratch_len(self.widest_input, n).div_ceil(4)))
    }

    /// f32s of the persistent part (counters + every layer's state).
    #[inline]
    fn state_floats(&self) -> usize {
        COUNTERS + self.layer_len * self.n_layers
    }

    /// Exact arena bytes.
    #[inline]
    pub fn arena_len(&self) -> usize {
        (self.state_floats() + self.scratch_len) * 4
    }

    /// Layer `l`'s state within the layers region (`[n_layers * layer_len]`).
    pub(crate) fn carve_layer<'s>(&self, layers: &'s mut [f32], l: usize) -> LayerState<'s> {
        LayerState::carve(&mut layers[l * self.layer_len..(l + 1) * self.layer_len], self)
    }

    /// Bytes of a [`Session::snapshot`].
    #[inline]
    pub fn snapshot_len(&self) -> usize {
        self.state_floats() * 4
    }
}

/// [`Error::NonFiniteLogits`] for the first of `rows` (`[n, vocab]`, the logits of the
/// tokens at positions `pos..pos + n`) that holds a NaN or an infinity.
fn check_finite(rows: &[f32], vocab: usize, pos: usize) -> Result<()> {
    const EXP: u32 = 0x7F80_0000;
    // One branch-free pass (it vectorises); the row is looked for only once it fails.
    let bad = rows.iter().fold(false, |acc, x| acc | (x.to_bits() & EXP == EXP));
    if !bad {
        return Ok(());
    }
    let row = rows.chunks(vocab.max(1)).position(|r| r.iter().any(|x| !x.is_finite())).unwrap_or(0);
    Err(Error::NonFiniteLogits { pos: (pos + row) as u32 })
}

/// Splits `n` f32s (padded) off the front of `buf`.
#[inline]
fn take<'s>(buf: &mut &'s mut [f32], n: usize) -> &'s mut [f32] {
    let b = core::mem::take(buf);
    let (head, tail) = b.split_at_mut(pad(n));
    *buf = tail;
    &mut head[..n]
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
    fn carve(mut buf: &'s mut [f32], lay: &Layout) -> Self {
        let z = &lay.layer_sizes;
        let rows = |buf: &mut &'s mut [f32], i: usize| {
            let (d, words) = (lay.part_widths[i], Layout::part_words(lay.cache, &lay.part_widths, i, z[i]));
            RowsMut::from_words(take(buf, words), z[i], d, lay.cache)
        };
        LayerState {
            sk: take(&mut buf, z[0]),
            sv: take(&mut buf, z[1]),
            r: take(&mut buf, z[2]),
            nk: rows(&mut buf, 3),
            nv: rows(&mut buf, 4),
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

/// Scratch of one step that does not grow with the number of tokens.
pub(crate) struct Scratch<'s> {
    /// `[vocab_len]`
    pub logits: &'s mut [f32],
    /// `[state_len + window_len]`
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
    fn carve(mut buf: &'s mut [f32], lay: &Layout) -> Self {
        let z = &lay.step_sizes;
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
    /// `[n, n_heads * d_v]`
    pub v: &'s mut [f32],
    pub v_first: &'s mut [f32],
    /// `[n, d_vgate]`
    pub vg_lo: &'s mut [f32],
    /// `[n, n_heads * d_v]`
    pub vg: &'s mut [f32],
    /// `[n, n_heads]`
    pub mg: &'s mut [f32],
    /// `[n, n_heads * d_v]`
    pub att: &'s mut [f32],
    /// `[n, d_ff]`
    pub ff: &'s mut [f32],
    /// `[n, rope_dim / 2]` bf16-rounded RoPE tables of each token's position.
    pub cos: &'s mut [f32],
    pub sin: &'s mut [f32],
    /// Kernel scratch (quantized activations).
    pub act: &'s mut [u8],
}

impl<'s> Acts<'s> {
    pub(crate) fn carve(mut buf: &'s mut [f32], lay: &Layout, n: usize) -> Self {
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
            act: bytemuck::cast_slice_mut(take(&mut buf, kernels::matmul_scratch_len(lay.widest_input, n).div_ceil(4))),
        }
    }
}

/// Where the sequence is: the counters shared by every layer and head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counters {
    /// Tokens seen.
    pub pos: usize,
    /// Live state slots.
    pub slots: usize,
    /// The state covers tokens `[0, coverage)`.
    pub coverage: usize,
}

/// How a token enters the session: prompt tokens gate the initial state when the model
/// says so (`kvm_apply_merge_gate_to_initial_state`); the reference's decode path never
/// does, and kvm reproduces both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Phase {
    Prefill,
    Decode,
}

/// What the means state does during one step (the same for every layer and head).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// Absolute position of the new token.
    pub t: usize,
    /// Slots the arena holds.
    pub state_len: usize,
    /// `Some(slot)`: the token is copied straight into the initial state.
    pub initial: Option<usize>,
    /// Whether the initial copy is gated.
    pub gate_initial: bool,
    /// `Some(b)`: chunk `[b, b + chunk_len)` leaves the window and is folded first.
    pub fold_begin: Option<usize>,
    /// Slots before and after this step's update.
    pub slots_before: usize,
    pub slots_after: usize,
    /// The token attends to window tokens `[window_begin, t]`.
    pub window_begin: usize,
    /// Whether the state is read (`n > window_len`).
    pub read_state: bool,
    pub coverage_after: usize,
}

/// The first window token a step with `n` tokens seen attends to (spec §3):
/// `bswa_begin(n) = max(0, ceil(n / C) * C - W)`.
#[inline]
pub fn bswa_begin(cfg: &Config, n: usize) -> usize {
    let c = cfg.chunk_len as usize;
    (n.div_ceil(c) * c).saturating_sub(cfg.window_len())
}

impl Plan {
    pub(crate) fn new(cfg: &Config, state_len: usize, at: Counters, phase: Phase) -> Plan {
        let c = cfg.chunk_len as usize;
        let t = at.pos;
        let n = t + 1;
        let window_begin = bswa_begin(cfg, n);
        let coverage_after = n.min(c).max(window_begin);
        let mut plan = Plan {
            t,
            state_len,
            initial: None,
            gate_initial: phase == Phase::Prefill && cfg.has(flags::GATE_INITIAL_STATE),
            fold_begin: None,
            slots_before: at.slots,
            slots_after: at.slots,
            window_begin,
            read_state: n > cfg.window_len(),
            coverage_after,
        };
        if t < c {
            plan.initial = Some(at.slots);
            plan.slots_after = at.slots + 1;
        } else if coverage_after > at.coverage {
            let b = at.coverage;
            plan.fold_begin = Some(b);
            let target = target_slots(cfg, state_len, b + cfg.window_len(), b + c, at.slots);
            plan.slots_after = at.slots + (target - at.slots).min(c);
        }
        plan
    }
}

impl Plan {
    /// The counters after this step.
    pub(crate) fn next(&self) -> Counters {
        Counters { pos: self.t + 1, slots: self.slots_after, coverage: self.coverage_after }
    }
}

/// The state size a fold grows to (spec §3 "Target size"), capped by the arena.
fn target_slots(cfg: &Config, state_len: usize, ctx: usize, avail: usize, cur: usize) -> usize {
    let round_down = |x: f64| -> i64 {
        let x = if x > 0.0 { libm::floor(x) as i64 } else { 0 };
        x / cfg.state_round_down as i64 * cfg.state_round_down as i64
    };
    let min_len = cfg.state_min_len as i64;
    let want = match cfg.budget {
        StateBudget::Fixed => min_len,
        StateBudget::PowerLaw { factor, exponent } => round_down(factor * libm::pow(ctx as f64, exponent)).max(min_len),
        StateBudget::Saturation { n } => round_down(n * ctx as f64 / (n + ctx as f64)).max(min_len),
    };
    let cap = avail.min(cfg.chunk_len as usize * cfg.max_state_chunks as usize).min(state_len);
    let want = if want < 0 { 0 } else { (want as u64).min(cap as u64) as usize };
    want.max(cur)
}

/// A head's view of one layer's state.
pub(crate) struct HeadState<'l, 's> {
    pub st: &'l mut LayerState<'s>,
    pub h: usize,
    pub cfg: &'l Config,
    pub state_len: usize,
    pub ln_sk: (Vector<'l>, Vector<'l>),
}

impl HeadState<'_, '_> {
    #[inline]
    fn dk(&self) -> usize {
        self.cfg.d_qk as usize
    }
    #[inline]
    fn dv(&self) -> usize {
        self.cfg.d_v as usize
    }
    #[inline]
    fn slot(&self, s: usize) -> usize {
        slot_index(self.h, self.state_len, s)
    }
    #[inline]
    fn ring(&self, j: usize) -> usize {
        ring_index(self.cfg, self.h, j)
    }

    /// Recomputes what reads of slots `[from, to)` see.
    fn refresh(&mut self, from: usize, to: usize) {
        for s in from..to {
            self.refresh_slot(s, true);
        }
    }

    /// Recomputes what reads of slot `s` see: the value (`bf16(sv / max(|sv|, 1e-12) * r)`
    /// with vlens, else `sv / r`) and, with `key`, `nk = LN_s_k(sk)` (a slot whose key sum
    /// did not change keeps its key).
    fn refresh_slot(&mut self, s: usize, key: bool) {
        let (dk, dv) = (self.dk(), self.dv());
        let i = self.slot(s);
        let st = &mut *self.st;
        if key {
            let (w, b) = self.ln_sk;
            let sk = &st.sk[i * dk..(i + 1) * dk];
            let (mean, inv) = ln_stats(sk);
            st.nk.set(i, dk, |c| (sk[c] - mean) * inv * w.get(c) + b.get(c));
        }
        let sv = &st.sv[i * dv..(i + 1) * dv];
        let r = st.r[i];
        if self.cfg.has(flags::VLENS) {
            let len = norm(sv).max(1e-12);
            st.nv.set(i, dv, |c| round_bf16(sv[c] / len * r));
        } else {
            st.nv.set(i, dv, |c| sv[c] / r);
        }
    }

    /// Copies the new token (`k` post-RoPE, `v`, gate `m`) into initial-state slot `s`;
    /// the radius is the ungated `|v|` even when the copy is gated.
    pub fn initial_append(&mut self, s: usize, k: &[f32], v: &[f32], m: f32, gated: bool, pk: &mut [f32]) {
        pk.copy_from_slice(k);
        prepare_key(self.cfg, self.ln_sk, pk);
        let (i, dk, dv) = (self.slot(s), self.dk(), self.dv());
        let vlens = self.cfg.has(flags::VLENS);
        let st = &mut *self.st;
        let sv = &mut st.sv[i * dv..(i + 1) * dv];
        sv.copy_from_slice(v);
        let gate = if gated { m } else { 1.0 };
        store_slot(&mut st.sk[i * dk..(i + 1) * dk], sv, &mut st.r[i], pk, (gate, gate), vlens, false);
        self.refresh(s, s + 1);
    }

    /// Folds window chunk `[b, b + chunk_len)` into the state: the `slots_after -
    /// slots_before` most novel tokens (lowest best similarity to
    /// the current slots) become new slots, the rest merge into their nearest non-sink slot
    /// (spec §3 "Overflow update").
    pub fn fold(
        &mut self,
        b: usize,
        slots_before: usize,
        slots_after: usize,
        fs: &mut FoldScratch<'_>,
        exec: &dyn Exec,
    ) {
        let (dk, dv) = (self.dk(), self.dv());
        let c = self.cfg.chunk_len as usize;
        let gate_keys = self.cfg.has(flags::MERGE_GATE_KEYS);
        let gate_values = self.cfg.has(flags::MERGE_GATE_VALUES);
        let gate_appends = self.cfg.has(flags::GATE_APPENDS);

        // pk_j = LN_s_k(k_j, rope dims zeroed) of every leaving token: [chunk_len, d_qk],
        // in pieces of SIM_PIECE tokens (threads may take them).
        let (cfg, h, ln_sk, wk) = (self.cfg, self.h, self.ln_sk, self.st.wk.as_rows());
        exec.pieces(&mut fs.pk[..c * dk], SIM_PIECE * dk, &|p, piece| {
            for (j, pk) in piece.chunks_exact_mut(dk).enumerate() {
                wk.get(ring_index(cfg, h, b + p * SIM_PIECE + j), pk);
                prepare_key(cfg, ln_sk, pk);
            }
        });

        // Novelty: a token's best similarity to the current slots; the n_append lowest
        // (ties: lower token first) are appended.
        let n_append = slots_after - slots_before;
        let appended = &mut fs.index[..c];
        if n_append == 0 || n_append == c {
            appended.fill((n_append == c) as u32);
        } else {
            // Similarities go to `dsk`, free until the merges sum into it.
            let nk = self.st.nk.as_rows().rows(self.slot(0), self.slot(slots_before), dk);
            let novelty = &mut fs.novelty[..c];
            similarities(exec, dk, nk, &fs.pk[..c * dk], fs.dsk, |i, sims| {
                novelty[i] = sims.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            });
            mark_least_novel(&fs.novelty[..c], n_append, appended);
        }

        // Appends, in token order; gated copies when the model gates appends.
        let mut s = slots_before;
        for i in 0..c {
            if fs.index[i] == 0 {
                continue;
            }
            // The gated copies gk, gv when appends are gated: each kind gated only if the
            // model gates it.
            let ri = self.ring(b + i);
            let m = self.st.wm[ri];
            let gate = |kind_gated: bool| if gate_appends && kind_gated { m } else { 1.0 };
            let gates = (gate(gate_keys), gate(gate_values));
            let si = self.slot(s);
            let vlens = self.cfg.has(flags::VLENS);
            let st = &mut *self.st;
            let sv = &mut st.sv[si * dv..(si + 1) * dv];
            st.wv.as_rows().get(ri, sv);
            store_slot(
                &mut st.sk[si * dk..(si + 1) * dk],
                sv,
                &mut st.r[si],
                &fs.pk[i * dk..(i + 1) * dk],
                gates,
                vlens,
                true,
            );
            s += 1;
        }
        self.refresh(slots_before, slots_after);

        // Merges: every other token joins argmax_{s >= sink} gk . LN_s_k(sk[s]) (ties:
        // lowest slot), all decided against the post-append snapshot (similarities in
        // `dsk`, still free), then summed in. A merged token's `index` becomes
        // `MERGED | slot`; its `pk` row becomes the gated key `gk`.
        const MERGED: u32 = 1 << 31;
        let protected = (self.cfg.sink_len as usize).min(slots_after);
        for i in 0..c {
            if fs.index[i] == 0 && gate_keys {
                let m = self.st.wm[self.ring(b + i)];
                fs.pk[i * dk..(i + 1) * dk].iter_mut().for_each(|x| *x *= m);
            }
        }
        let nk = self.st.nk.as_rows().rows(self.slot(protected), self.slot(slots_after), dk);
        let index = &mut fs.index[..c];
        similarities(exec, dk, nk, &fs.pk[..c * dk], fs.dsk, |i, sims| {
            if index[i] != 0 {
                return;
            }
            // With every slot a sink (a growable state's early fold whose sink_len is not
            // yet exceeded; the reference asserts there) the last slot takes the token.
            let mut best = protected.min(slots_after - 1);
            let mut best_score = f32::NEG_INFINITY;
            for (s, &score) in sims.iter().enumerate() {
                if score > best_score {
                    best_score = score;
                    best = protected + s;
                }
            }
            index[i] = MERGED | best as u32;
        });
        // The slots taking merges, a bit each in the novelty buffer (free now): only their
        // sums change. (A state of more than 32 slots per chunk token, which the bits
        // cannot hold, counts every slot as taking one.)
        let bits: &mut [u32] = bytemuck::cast_slice_mut(&mut fs.novelty[..c]);
        let every = slots_after > 32 * bits.len();
        bits.fill(0);
        let mut merges = false;
        for &ix in fs.index[..c].iter().filter(|&&ix| ix & MERGED != 0) {
            let s = (ix & !MERGED) as usize;
            if !every {
                bits[s / 32] |= 1 << (s % 32);
            }
            merges = true;
        }
        let touched = |s: usize| every || bits[s / 32] >> (s % 32) & 1 != 0;
        for s in (0..slots_after).filter(|&s| touched(s)) {
            fs.dsk[s * dk..(s + 1) * dk].fill(0.0);
            fs.dsv[s * dv..(s + 1) * dv].fill(0.0);
        }
        for i in 0..c {
            if fs.index[i] & MERGED == 0 {
                continue;
            }
            let best = (fs.index[i] & !MERGED) as usize;
            let ri = self.ring(b + i);
            let vm = if gate_values { self.st.wm[ri] } else { 1.0 };
            for (o, &g) in fs.dsk[best * dk..(best + 1) * dk].iter_mut().zip(&fs.pk[i * dk..(i + 1) * dk]) {
                *o += g;
            }
            self.st.wv.as_rows().add_scaled(ri, vm, &mut fs.dsv[best * dv..(best + 1) * dv]);
        }
        if merges {
            let vlens = self.cfg.has(flags::VLENS);
            for s in 0..slots_after {
                let hit = touched(s);
                let si = self.slot(s);
                let st = &mut *self.st;
                if hit {
                    for (o, &d) in st.sk[si * dk..(si + 1) * dk].iter_mut().zip(&fs.dsk[s * dk..(s + 1) * dk]) {
                        *o += d;
                    }
                    for (o, &d) in st.sv[si * dv..(si + 1) * dv].iter_mut().zip(&fs.dsv[s * dv..(s + 1) * dv]) {
                        *o += d;
                    }
                }
                // The reference's broadcast quirk: every slot's count grows once per fold
                // (so every slot's value changes, with or without merges).
                if !vlens {
                    st.r[si] += 1.0;
                }
                if hit || !vlens {
                    self.refresh_slot(s, hit);
                }
            }
        }
    }

    /// Prefetches what [`HeadState::initial_append`] to slot `initial` (if any) and
    /// [`HeadState::push_window`] of token `t` will write, so their stores find the lines
    /// in cache: those rows were last touched many steps ago.
    pub fn prefetch_writes(&self, t: usize, initial: Option<usize>) {
        let (dk, dv) = (self.dk(), self.dv());
        let st = &*self.st;
        if let Some(s) = initial {
            let i = self.slot(s);
            kernels::prefetch_lines(&st.sk[i * dk..(i + 1) * dk], kernels::Access::Write);
            kernels::prefetch_lines(&st.sv[i * dv..(i + 1) * dv], kernels::Access::Write);
            st.nk.prefetch_row(i, dk);
            st.nv.prefetch_row(i, dv);
        }
        let ri = self.ring(t);
        st.wk.prefetch_row(ri, dk);
        st.wv.prefetch_row(ri, dv);
    }

    /// Stores the new token's key, value and merge gate in the window ring.
    pub fn push_window(&mut self, t: usize, k: &[f32], v: &[f32], m: f32) {
        let (dk, dv) = (self.dk(), self.dv());
        let ri = self.ring(t);
        self.st.wk.set(ri, dk, |c| k[c]);
        self.st.wv.set(ri, dv, |c| v[c]);
        self.st.wm[ri] = m;
    }
}

/// A head's read-only view of one layer's state: what attention needs, shareable across
/// threads so heads can attend in parallel.
pub(crate) struct HeadReader<'l, 's> {
    pub st: &'l LayerState<'s>,
    pub h: usize,
    pub cfg: &'l Config,
    pub state_len: usize,
}

/// `pk <- LN_s_k(pk with dims [0, rope_dim) zeroed)` (spec §3 "State keys are prepared"):
/// `pk` holds a key on entry.
fn prepare_key(cfg: &Config, (w, b): (Vector<'_>, Vector<'_>), pk: &mut [f32]) {
    pk[..cfg.rope_dim as usize].fill(0.0);
    layer_norm_inplace(pk, w, b);
}

/// Index of head `h`'s slot `s` in `[n_heads, state_len]` arrays.
#[inline]
fn slot_index(h: usize, state_len: usize, s: usize) -> usize {
    h * state_len + s
}

/// Index of head `h`'s window entry for position `j` in `[n_heads, window_len]` rings.
#[inline]
fn ring_index(cfg: &Config, h: usize, j: usize) -> usize {
    h * cfg.window_len() + j % cfg.window_len()
}

impl HeadReader<'_, '_> {
    /// Attention of one head's query `q` (post LN_q, post RoPE) over the state (when
    /// `read_state`) and window tokens `[window_begin, t]`; writes `out` (`d_v`).
    pub fn attend(&self, q: &[f32], plan: &Plan, slots: usize, temps: (f32, f32), scores: &mut [f32], out: &mut [f32]) {
        let (dk, dv) = (self.cfg.d_qk as usize, self.cfg.d_v as usize);
        let scale = 1.0 / libm::sqrtf(dk as f32);
        let (front_temp, state_temp) = temps;
        let n_state = if plan.read_state { slots } else { 0 };
        let n_window = plan.t + 1 - plan.window_begin;
        let scores = &mut scores[..n_state + n_window];
        let (state_scores, window_scores) = scores.split_at_mut(n_state);
        let state = slot_index(self.h, self.state_len, 0);
        let (nk, nv) = (self.st.nk.as_rows(), self.st.nv.as_rows());
        let (nk, nv) = (nk.rows(state, state + n_state, dk), nv.rows(state, state + n_state, dv));
        let (wk, wv) = (self.st.wk.as_rows(), self.st.wv.as_rows());
        nk.dots(q, state_scores);
        for x in state_scores.iter_mut() {
            *x = *x * state_temp * scale;
        }
        let spans = ring_spans(self.cfg, self.h, plan.window_begin, plan.t + 1);
        let mut at = 0;
        for span in spans.clone() {
            let part = &mut window_scores[at..at + span.len()];
            wk.rows(span.start, span.end, dk).dots(q, part);
            for x in part.iter_mut() {
                *x = *x * front_temp * scale;
            }
            at += span.len();
        }
        let max = kernels::max(scores);
        kernels::exp_sub(scores, max);
        let sum = math::sum(scores);
        for x in scores.iter_mut() {
            *x /= sum;
        }
        out.fill(0.0);
        let (state_scores, window_scores) = scores.split_at(n_state);
        nv.weighted_sum(state_scores, out);
        let mut at = 0;
        for span in spans {
            wv.rows(span.start, span.end, dv).weighted_sum(&window_scores[at..at + span.len()], out);
            at += span.len();
        }
    }
}

/// Head `h`'s window entries for positions `[begin, end)` (at most `window_len` of them) as
/// at most two runs of ring indices (the ring may wrap).
fn ring_spans(cfg: &Config, h: usize, begin: usize, end: usize) -> [core::ops::Range<usize>; 2] {
    let w = cfg.window_len();
    let (first, len) = (begin % w, end - begin);
    let head = len.min(w - first);
    let base = h * w;
    [base + first..base + first + head, base..base + len - head]
}

/// Sets `flags[i]` to 1 for the `n` tokens of least `novelty` (`0 < n < novelty.len()`;
/// ties: lower token first; a total order, NaN included, so exactly `n` are marked) and
/// to 0 for the others. A selection over token indices held in `flags` itself finds the
/// `n`-th of them, then every token is compared with it: linear, where counting each
/// token's lesser ones was quadratic in the chunk length.
fn mark_least_novel(novelty: &[f32], n: usize, flags: &mut [u32]) {
    let order = |a: &u32, b: &u32| novelty[*a as usize].total_cmp(&novelty[*b as usize]).then(a.cmp(b));
    for (i, x) in (0u32..).zip(flags.iter_mut()) {
        *x = i;
    }
    flags.select_nth_unstable_by(n - 1, order);
    let cut = flags[n - 1];
    for (i, flag) in (0u32..).zip(flags.iter_mut()) {
        *flag = order(&i, &cut).is_le() as u32;
    }
}

/// Tokens per piece of a fold's parallel work (key preparation, [`similarities`]).
const SIM_PIECE: usize = 16;

/// Hands `each(i, sims_i)`, in query order, the dot products ([`kernels::dots_many`]) of query
/// `i` of `queries` (`[m, d]`) with every row of `keys` (`[s, d]`, `s` possibly 0),
/// computed in blocks of queries that fit `scratch` (at least `s` floats), each block's
/// pieces in parallel through `exec`.
fn similarities(
    exec: &dyn Exec,
    d: usize,
    keys: Rows<'_>,
    queries: &[f32],
    scratch: &mut [f32],
    mut each: impl FnMut(usize, &[f32]),
) {
    let (s, m) = (keys.len() / d, queries.len() / d);
    if s == 0 {
        (0..m).for_each(|i| each(i, &[]));
        return;
    }
    let block = (scratch.len() / s).clamp(1, m.max(1));
    for q0 in (0..m).step_by(block) {
        let out = &mut scratch[..block.min(m - q0) * s];
        exec.pieces(out, SIM_PIECE * s, &|p, piece| {
            let q = q0 + p * SIM_PIECE;
            keys.dots_many(&queries[q * d..(q + piece.len() / s) * d], d, piece);
        });
        for (j, row) in out.chunks_exact(s).enumerate() {
            each(q0 + j, row);
        }
    }
}

/// `sk = pk * key_gate`, `sv = v * value_gate` (`sv` holds `v` on entry), `r = |v|` or
/// `|v * value_gate|` (vlens) or 1.
fn store_slot(
    sk: &mut [f32],
    sv: &mut [f32],
    r: &mut f32,
    pk: &[f32],
    (key_gate, value_gate): (f32, f32),
    vlens: bool,
    gated_radius: bool,
) {
    let ungated = if vlens && !gated_radius { norm(sv) } else { 0.0 };
    for (o, &x) in sk.iter_mut().zip(pk) {
        *o = x * key_gate;
    }
    for o in sv.iter_mut() {
        *o *= value_gate;
    }
    *r = match (vlens, gated_radius) {
        (false, _) => 1.0,
        (true, true) => norm(sv),
        (true, false) => ungated,
    };
}

/// A decoding session: the model's weights (borrowed) and all of its state, in the
/// caller's arena. Decoding allocates nothing.
#[derive(Debug)]
pub struct Session<'m, 'a> {
    model: Model<'m>,
    layout: Layout,
    /// `[layout.arena_len() / 4]`, see the module docs.
    arena: &'a mut [f32],
}

/// Indices of the counters block.
mod counter {
    pub const STAMP: usize = 0;
    pub const POS: usize = 1;
    pub const SLOTS: usize = 2;
    pub const COVERAGE: usize = 3;
    pub const STATE_LEN: usize = 4;
    pub const ARENA_LEN: usize = 5;
    /// [`crate::Model::identity`]: a snapshot restores only into the model it came from.
    pub const MODEL: usize = 6;
}

impl<'m, 'a> Session<'m, 'a> {
    /// Creates a session of `model` at its default state capacity inside `arena`, which
    /// must be exactly [`Model::arena_len`] bytes and [`ARENA_ALIGN`]-aligned.
    ///
    /// # Errors
    /// [`Error::ArenaSize`], [`Error::ArenaMisaligned`].
    pub fn new(model: Model<'m>, arena: &'a mut [u8]) -> Result<Self> {
        let state_len = model.header().state_capacity as usize;
        Self::with_state_len(model, arena, state_len)
    }

    /// As [`Session::new`] with at most `state_len` state slots (growable models follow
    /// the reference exactly until the state reaches `state_len`, then keep merging
    /// without growing); `arena` must be [`Model::arena_len_for`]`(state_len)` bytes.
    ///
    /// # Errors
    /// [`Error::BadConfig`] for a capacity out of range, [`Error::ArenaSize`],
    /// [`Error::ArenaMisaligned`].
    pub fn with_state_len(model: Model<'m>, arena: &'a mut [u8], state_len: usize) -> Result<Self> {
        let layout = Layout::new(model.config(), state_len, model.cache())?;
        if arena.len() != layout.arena_len() {
            return Err(Error::ArenaSize { expected: layout.arena_len(), got: arena.len() });
        }
        let arena: &mut [f32] = bytemuck::try_cast_slice_mut(arena).map_err(|_| Error::ArenaMisaligned)?;
        if !(arena.as_ptr() as usize).is_multiple_of(ARENA_ALIGN) {
            return Err(Error::ArenaMisaligned);
        }
        let mut session = Session { model, layout, arena };
        session.reset();
        Ok(session)
    }

    /// Forgets every token: the session is as new.
    pub fn reset(&mut self) {
        let state = self.layout.state_floats();
        self.arena[..state].fill(0.0);
        let c: &mut [u32] = bytemuck::cast_slice_mut(&mut self.arena[..COUNTERS]);
        c[counter::STAMP] = STAMP;
        c[counter::STATE_LEN] = self.layout.state_len as u32;
        c[counter::ARENA_LEN] = self.layout.arena_len() as u32;
        c[counter::MODEL] = self.model.identity();
    }

    /// The model this session decodes.
    #[inline]
    pub fn model(&self) -> &Model<'m> {
        &self.model
    }

    /// The arena layout.
    #[inline]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn counters(&self) -> Counters {
        let c: &[u32] = bytemuck::cast_slice(&self.arena[..COUNTERS]);
        Counters {
            pos: c[counter::POS] as usize,
            slots: c[counter::SLOTS] as usize,
            coverage: c[counter::COVERAGE] as usize,
        }
    }

    /// Tokens seen so far.
    #[inline]
    pub fn pos(&self) -> usize {
        self.counters().pos
    }

    /// Live state slots (the same in every layer and head).
    #[inline]
    pub fn state_slots(&self) -> usize {
        self.counters().slots
    }

    /// Feeds one token. `phase` matters only for models that gate their initial state
    /// (see [`Phase`]); with `want_logits` the token's logits are left in
    /// [`Session::logits`].
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`]; [`Error::InvalidArgument`] once the position counter
    /// would overflow (after 2^32 - 1 tokens); [`Error::NonFiniteLogits`] when logits were
    /// asked for and hold a NaN or an infinity (the step was taken).
    pub fn step(&mut self, token: u32, phase: Phase, want_logits: bool) -> Result<()> {
        self.step_tapped(token, phase, want_logits, &mut |_, _| {})
    }

    /// [`Session::step`], calling `tap` at every [`Tap`] point.
    ///
    /// # Errors
    /// As [`Session::step`].
    pub fn step_tapped(
        &mut self,
        token: u32,
        phase: Phase,
        want_logits: bool,
        tap: &mut dyn FnMut(Tap, &[f32]),
    ) -> Result<()> {
        let logits = if want_logits { Logits::Last } else { Logits::None };
        self.run(&[token], phase, None, logits, &Serial, tap)
    }

    /// Feeds `tokens` as one batch: every matrix product runs over all of them at once,
    /// so each weight is read once per batch instead of once per token, while the state
    /// is updated token by token exactly as [`Session::step`] would. `batch` is scratch
    /// of at least [`Layout::acts_len`]`(tokens.len())` f32s; `exec` runs the products
    /// (the std runtime passes a thread pool).
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] for a short `batch` or `Logits::All` buffer;
    /// [`Error::InvalidArgument`] for no tokens; as [`Session::step`]. Nothing is
    /// consumed on error, but for [`Error::NonFiniteLogits`]: the batch was fed.
    pub fn step_batch(
        &mut self,
        tokens: &[u32],
        phase: Phase,
        batch: &mut [f32],
        exec: &dyn Exec,
        logits: Logits<'_>,
    ) -> Result<()> {
        self.run(tokens, phase, Some(batch), logits, exec, &mut |_, _| {})
    }

    fn run(
        &mut self,
        tokens: &[u32],
        phase: Phase,
        batch: Option<&mut [f32]>,
        logits: Logits<'_>,
        exec: &dyn Exec,
        tap: &mut dyn FnMut(Tap, &[f32]),
    ) -> Result<()> {
        let vocab_len = self.model.config().vocab_len;
        if tokens.is_empty() {
            return Err(Error::InvalidArgument);
        }
        if let Some(&token) = tokens.iter().find(|&&t| t >= vocab_len) {
            return Err(Error::TokenOutOfRange { token, vocab_len });
        }
        if let Logits::All(out) = &logits {
            let needed = tokens.len() * vocab_len as usize;
            if out.len() < needed {
                return Err(Error::BufferTooSmall { needed });
            }
        }
        let at = self.counters();
        if at.pos.checked_add(tokens.len()).is_none_or(|end| end > u32::MAX as usize) {
            return Err(Error::InvalidArgument);
        }
        let lay = self.layout;
        let (head, rest) = self.arena.split_at_mut(COUNTERS);
        let (layers, scratch) = rest.split_at_mut(lay.state_floats() - COUNTERS);
        let step_len = lay.step_sizes.iter().map(|&n| pad(n)).sum();
        let (step, arena_acts) = scratch.split_at_mut(step_len);
        let mut s = Scratch::carve(step, &lay);
        let mut acts = match batch {
            None => Acts::carve(arena_acts, &lay, tokens.len().min(1)),
            Some(buf) => {
                let needed = lay.acts_len(tokens.len()).unwrap_or(usize::MAX);
                if buf.len() < needed {
                    return Err(Error::BufferTooSmall { needed });
                }
                Acts::carve(buf, &lay, tokens.len())
            }
        };
        if acts.n != tokens.len() {
            return Err(Error::BufferTooSmall { needed: lay.acts_len(tokens.len()).unwrap_or(usize::MAX) });
        }
        let mut logits = logits;
        let asked = match &mut logits {
            Logits::None => Logits::None,
            Logits::Last => Logits::Last,
            Logits::All(out) => Logits::All(out),
        };
        let next = model::forward(&self.model, &lay, layers, &mut s, &mut acts, at, tokens, phase, asked, exec, tap);
        let c: &mut [u32] = bytemuck::cast_slice_mut(head);
        c[counter::POS] = next.pos as u32;
        c[counter::SLOTS] = next.slots as u32;
        c[counter::COVERAGE] = next.coverage as u32;
        let vocab = vocab_len as usize;
        match logits {
            Logits::None => Ok(()),
            Logits::Last => check_finite(self.logits(), vocab, at.pos + tokens.len() - 1),
            Logits::All(out) => check_finite(&out[..tokens.len() * vocab], vocab, at.pos),
        }
    }

    /// The logits of the last step run with `want_logits`, `[vocab_len]`.
    pub fn logits(&self) -> &[f32] {
        let start = self.layout.state_floats();
        &self.arena[start..start + self.model.config().vocab_len as usize]
    }

    /// Feeds one generated token and returns its logits.
    ///
    /// # Errors
    /// As [`Session::step`].
    pub fn decode(&mut self, token: u32) -> Result<&[f32]> {
        self.step(token, Phase::Decode, true)?;
        Ok(self.logits())
    }

    /// [`Session::decode`] with the matrix products run by `exec` (a thread pool).
    ///
    /// # Errors
    /// As [`Session::step`].
    pub fn decode_with(&mut self, token: u32, exec: &dyn Exec) -> Result<&[f32]> {
        self.run(&[token], Phase::Decode, None, Logits::Last, exec, &mut |_, _| {})?;
        Ok(self.logits())
    }

    /// Feeds a prompt and returns the logits after its last token.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty prompt; as [`Session::step`] (tokens
    /// before the bad one have been consumed).
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        let (last, head) = tokens.split_last().ok_or(Error::InvalidArgument)?;
        for &t in head {
            self.step(t, Phase::Prefill, false)?;
        }
        self.step(*last, Phase::Prefill, true)?;
        Ok(self.logits())
    }

    /// Bytes [`Session::snapshot`] writes.
    #[inline]
    pub fn snapshot_len(&self) -> usize {
        self.layout.snapshot_len()
    }

    /// Copies the session's whole state (constant size) into `out`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `out` is shorter than [`Session::snapshot_len`].
    pub fn snapshot(&self, out: &mut [u8]) -> Result<usize> {
        let n = self.snapshot_len();
        let out = out.get_mut(..n).ok_or(Error::BufferTooSmall { needed: n })?;
        out.copy_from_slice(bytemuck::cast_slice(&self.arena[..n / 4]));
        Ok(n)
    }

    /// Restores a [`Session::snapshot`] of a session of the same model and layout;
    /// decoding then continues bit-exactly as it would have from the snapshot.
    ///
    /// # Errors
    /// [`Error::BadSnapshot`] if `snap` has the wrong length or layout stamp, or comes
    /// from another model (another header: config, tensor table or tokenizer).
    pub fn restore(&mut self, snap: &[u8]) -> Result<()> {
        let n = self.snapshot_len();
        if snap.len() != n || snap.len() < COUNTERS * 4 {
            return Err(Error::BadSnapshot);
        }
        let word = |i: usize| u32::from_le_bytes([snap[i * 4], snap[i * 4 + 1], snap[i * 4 + 2], snap[i * 4 + 3]]);
        let (pos, slots, coverage) = (word(counter::POS), word(counter::SLOTS), word(counter::COVERAGE));
        // Counters a session could have reached; anything else could index past the state.
        let chunk = self.model.config().chunk_len;
        if word(counter::STAMP) != STAMP
            || word(counter::STATE_LEN) as usize != self.layout.state_len
            || word(counter::ARENA_LEN) as usize != self.layout.arena_len() as u32 as usize
            || word(counter::MODEL) != self.model.identity()
            || slots as usize > self.layout.state_len
            || slots > pos
            || coverage > pos
            || slots < pos.min(chunk)
        {
            return Err(Error::BadSnapshot);
        }
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut self.arena[..n / 4]);
        dst.copy_from_slice(snap);
        Ok(())
    }

    /// A read-only view of layer `l`'s state, for inspection and tests.
    pub fn layer_view(&self, l: usize) -> Option<LayerView<'_>> {
        let cfg = self.model.config();
        if l >= cfg.n_layers as usize {
            return None;
        }
        let at = self.counters();
        let start = COUNTERS + l * self.layout.layer_len;
        let (z, widths, cache) = (&self.layout.layer_sizes, &self.layout.part_widths, self.layout.cache);
        let mut off = start;
        let mut next = |i: usize| {
            let words = Layout::part_words(cache, widths, i, z[i]);
            let s = &self.arena[off..off + words];
            off += pad(words);
            s
        };
        let (sk, sv, r) = (next(0), next(1), next(2));
        let (_nk, _nv) = (next(3), next(4));
        let (wk, wv) =
            (Rows::from_words(next(5), z[5], widths[5], cache), Rows::from_words(next(6), z[6], widths[6], cache));
        Some(LayerView {
            cfg: *cfg,
            state_len: self.layout.state_len,
            slots: at.slots,
            pos: at.pos,
            coverage: at.coverage,
            window_begin: bswa_begin(cfg, at.pos),
            sk,
            sv,
            r,
            wk,
            wv,
        })
    }
}

/// Read-only view of one layer's state (see [`Session::layer_view`]).
#[derive(Debug)]
pub struct LayerView<'s> {
    cfg: Config,
    state_len: usize,
    /// Live slots.
    pub slots: usize,
    /// Tokens seen.
    pub pos: usize,
    /// The state covers `[0, coverage)`.
    pub coverage: usize,
    /// The window holds `[window_begin, pos)`.
    pub window_begin: usize,
    sk: &'s [f32],
    sv: &'s [f32],
    r: &'s [f32],
    wk: Rows<'s>,
    wv: Rows<'s>,
}

impl LayerView<'_> {
    /// Key sum of head `h`, slot `s` (`[d_qk]`).
    pub fn state_key(&self, h: usize, s: usize) -> &[f32] {
        let dk = self.cfg.d_qk as usize;
        &self.sk[(h * self.state_len + s) * dk..][..dk]
    }
    /// Value sum of head `h`, slot `s` (`[d_v]`).
    pub fn state_value(&self, h: usize, s: usize) -> &[f32] {
        let dv = self.cfg.d_v as usize;
        &self.sv[(h * self.state_len + s) * dv..][..dv]
    }
    /// Read radius (or fold count) of head `h`, slot `s`.
    pub fn state_radius(&self, h: usize, s: usize) -> f32 {
        self.r[h * self.state_len + s]
    }
    /// Key of window token `j` (absolute position, in `[window_begin, pos)`) of head `h`
    /// into `out` (`[d_qk]`), as stored (f16 caches widen).
    pub fn window_key(&self, h: usize, j: usize, out: &mut [f32]) {
        self.wk.get(ring_index(&self.cfg, h, j), out);
    }
    /// Value of window token `j` of head `h` into `out` (`[d_v]`).
    pub fn window_value(&self, h: usize, j: usize, out: &mut [f32]) {
        self.wv.get(ring_index(&self.cfg, h, j), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::Pcg32;

    #[test]
    fn the_least_novel_are_the_tokens_with_fewer_lesser_ones_than_appended() {
        let mut rng = Pcg32::new(3);
        for round in 0..400 {
            let c = 2 + rng.next_u32() as usize % 300;
            // Ties on a coarse grid, and NaN and infinities now and then.
            let novelty: [f32; 301] = core::array::from_fn(|_| match rng.next_u32() % 50 {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                2 => f32::INFINITY,
                v => (v % 7) as f32 * 0.25 - 0.5,
            });
            let novelty = &novelty[..c];
            let n = 1 + rng.next_u32() as usize % (c - 1);
            let mut flags = [7u32; 301];
            mark_least_novel(novelty, n, &mut flags[..c]);
            for (i, &mine) in novelty.iter().enumerate() {
                let below =
                    novelty.iter().enumerate().filter(|&(j, x)| x.total_cmp(&mine).then(j.cmp(&i)).is_lt()).count();
                assert_eq!(flags[i], (below < n) as u32, "round {round}, token {i} of {c}, {n} appended");
            }
        }
    }
}

//! The weights view ([`Model`]) and the forward pass of one token (spec §2).

use crate::config::{flags, Config};
use crate::error::{Error, Result};
use crate::format::{self, Header, Role, TensorEntry, ENTRY_LEN, HEADER_LEN, N_GLOBAL_ROLES};
use crate::kernels::{self, Matrix};
use crate::math::{elu, layer_norm, layer_norm_inplace, rope_apply, rope_tables, sigmoid};
use crate::state::{Counters, HeadState, LayerState, Layout, Phase, Plan, Scratch};

/// Per-layer roles in canonical order.
const LAYER_ROLES: usize = 26;

/// A validated model borrowed from its blob. Copying it copies a few words, not weights.
#[derive(Debug, Clone, Copy)]
pub struct Model<'a> {
    blob: &'a [u8],
    header: Header,
    /// Position of each per-layer role within a layer's run of table entries.
    layer_slot: [u8; LAYER_ROLES],
    /// Table entries per layer.
    per_layer: usize,
}

/// An f32 vector tensor read in place (the blob may be unaligned).
#[derive(Debug, Clone, Copy)]
pub struct Vector<'a>(&'a [u8]);

impl<'a> Vector<'a> {
    /// Element `i`.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        let b = &self.0[i * 4..i * 4 + 4];
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// `[from, from + len)` as a vector of its own.
    #[inline]
    pub fn slice(&self, from: usize, len: usize) -> Vector<'a> {
        Vector(&self.0[from * 4..(from + len) * 4])
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.0.len() / 4
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'a> Model<'a> {
    /// Validates `blob` completely (header, config, tensor table, shapes, bounds,
    /// alignment, every checksum, tokenizer, arena size) and borrows it.
    ///
    /// No input makes this panic or read out of bounds; a blob that passes is safe to
    /// decode with.
    ///
    /// # Errors
    /// The first problem found, as a format, config or checksum [`Error`].
    pub fn from_bytes(blob: &'a [u8]) -> Result<Self> {
        Self::load(blob, true)
    }

    /// As [`Model::from_bytes`] but skips the tensor-data checksums (everything else,
    /// bounds included, is still checked): for trusted images in flash, where a CRC over
    /// every weight at boot costs time.
    ///
    /// # Errors
    /// As [`Model::from_bytes`], minus [`Error::Checksum`] of tensor data.
    pub fn from_bytes_trusted(blob: &'a [u8]) -> Result<Self> {
        Self::load(blob, false)
    }

    fn load(blob: &'a [u8], check_data: bool) -> Result<Self> {
        let header = Header::parse(blob)?;
        let cfg = &header.config;
        cfg.validate()?;
        let table_end = header.table_offset.checked_add(header.table_len).ok_or(Error::OutOfBounds)?;
        if header.table_offset < HEADER_LEN as u64 || header.tokenizer_offset < table_end {
            return Err(Error::OutOfBounds);
        }
        format::validate_sections(blob, &header, check_data)?;
        crate::tokenizer::validate_section(header.tokenizer_kind, tokenizer_bytes(blob, &header), cfg.vocab_len)?;
        let layout = Layout::new(cfg, header.state_capacity as usize)?;
        if layout.arena_len() as u64 != header.arena_len {
            return Err(Error::BadConfig(crate::error::ConfigField::StateCapacity));
        }
        let mut layer_slot = [u8::MAX; LAYER_ROLES];
        let mut per_layer = 0;
        for (i, role) in Role::ALL[N_GLOBAL_ROLES..].iter().enumerate() {
            if role.shape(cfg).is_some() {
                layer_slot[i] = per_layer as u8;
                per_layer += 1;
            }
        }
        Ok(Model { blob, header, layer_slot, per_layer })
    }

    /// The model's hyper-parameters.
    #[inline]
    pub fn config(&self) -> &Config {
        &self.header.config
    }

    /// The decoded file header.
    #[inline]
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The blob the model borrows.
    #[inline]
    pub fn blob(&self) -> &'a [u8] {
        self.blob
    }

    /// Exact arena bytes of a session at the file's default state capacity.
    #[inline]
    pub fn arena_len(&self) -> usize {
        self.header.arena_len as usize
    }

    /// Exact arena bytes of a session holding at most `state_len` slots.
    ///
    /// # Errors
    /// [`Error::BadConfig`] if `state_len` is outside `[chunk_len, natural_state_len]`.
    pub fn arena_len_for(&self, state_len: usize) -> Result<usize> {
        Ok(Layout::new(self.config(), state_len)?.arena_len())
    }

    /// The raw tokenizer section.
    #[inline]
    pub fn tokenizer_section(&self) -> &'a [u8] {
        tokenizer_bytes(self.blob, &self.header)
    }

    /// Every tensor table entry, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorEntry> + 'a {
        let table = &self.blob[self.header.table_offset as usize..][..self.header.table_len as usize];
        table.chunks_exact(ENTRY_LEN).filter_map(|e| TensorEntry::parse(e).ok())
    }

    /// The entry of `(role, layer)`; the role must exist under this config.
    fn entry(&self, role: Role, layer: usize) -> TensorEntry {
        let index = if role.is_layer() {
            let pos = Role::ALL[N_GLOBAL_ROLES..].iter().position(|&r| r == role).unwrap_or(0);
            N_GLOBAL_ROLES + layer * self.per_layer + self.layer_slot[pos] as usize
        } else {
            role as usize
        };
        let at = self.header.table_offset as usize + index * ENTRY_LEN;
        // Validated at load: the entry exists and parses.
        TensorEntry::parse(&self.blob[at..at + ENTRY_LEN]).unwrap_or(EMPTY)
    }

    fn data(&self, e: &TensorEntry) -> &'a [u8] {
        &self.blob[e.offset as usize..(e.offset + e.len) as usize]
    }

    /// Weight matrix `(role, layer)`.
    #[inline]
    pub fn matrix(&self, role: Role, layer: usize) -> Matrix<'a> {
        let e = self.entry(role, layer);
        Matrix { dtype: e.dtype, rows: e.rows as usize, cols: e.cols as usize, data: self.data(&e) }
    }

    /// f32 vector `(role, layer)`.
    #[inline]
    pub fn vector(&self, role: Role, layer: usize) -> Vector<'a> {
        Vector(self.data(&self.entry(role, layer)))
    }
}

const EMPTY: TensorEntry = TensorEntry {
    role: Role::TokEmbed,
    layer: 0,
    dtype: crate::quant::DType::F32,
    rows: 0,
    cols: 0,
    offset: 0,
    len: 0,
    crc: 0,
};

fn tokenizer_bytes<'a>(blob: &'a [u8], h: &Header) -> &'a [u8] {
    let start = h.tokenizer_offset as usize;
    blob.get(start..start.saturating_add(h.tokenizer_len as usize)).unwrap_or(&[])
}

/// An observation point of the forward pass, for tests and debugging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tap {
    /// `LN_emb(wte[token])`, `[d_model]`.
    Embed,
    /// The residual stream after block `i`, `[d_model]`.
    Block(usize),
}

/// Runs one token through the network, updating the session state; leaves logits in
/// `s.logits` when `want_logits`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    model: &Model<'_>,
    lay: &Layout,
    layers: &mut [f32],
    s: &mut Scratch<'_>,
    at: Counters,
    token: u32,
    phase: Phase,
    want_logits: bool,
    tap: &mut dyn FnMut(Tap, &[f32]),
) -> Counters {
    let cfg = model.config();
    let plan = Plan::new(cfg, lay.state_len, at, phase);

    // x0 = LN_emb(wte[token])
    kernels::dequant_row(&model.matrix(Role::TokEmbed, 0), token as usize, s.x);
    layer_norm_inplace(s.x, model.vector(Role::LnEmbW, 0), model.vector(Role::LnEmbB, 0));
    tap(Tap::Embed, s.x);
    rope_tables(plan.t, cfg.rope_theta, s.cos, s.sin);

    for l in 0..cfg.n_layers as usize {
        let st = &mut lay.carve_layer(layers, l);
        // x = x + residual_scale * Attn(LN_attn(x))
        layer_norm(s.x, model.vector(Role::LnAttnW, l), model.vector(Role::LnAttnB, l), s.a);
        attention(model, l, st, s, &plan);
        crate::math::axpy(s.x, cfg.residual_scale, s.a);
        // x = x + residual_scale * MLP(LN_mlp(x))
        layer_norm(s.x, model.vector(Role::LnMlpW, l), model.vector(Role::LnMlpB, l), s.a);
        mlp(model, l, st, s);
        crate::math::axpy(s.x, cfg.residual_scale, s.a);
        tap(Tap::Block(l), s.x);
    }

    if want_logits {
        // logits = lm_head(LN_head(x)), optionally soft-capped
        layer_norm(s.x, model.vector(Role::LnHeadW, 0), model.vector(Role::LnHeadB, 0), s.a);
        kernels::matvec(&model.matrix(Role::LmHead, 0), s.a, s.logits, s.act);
        let cap = cfg.logit_softcap;
        if cap != 0.0 {
            for z in s.logits.iter_mut() {
                *z = cap * libm::tanhf(*z / cap);
            }
        }
    }
    Counters { pos: plan.t + 1, slots: plan.slots_after, coverage: plan.coverage_after }
}

/// `s.a <- Attn(s.a)` for layer `l` (spec §2 "Attn").
fn attention(model: &Model<'_>, l: usize, st: &mut LayerState<'_>, s: &mut Scratch<'_>, plan: &Plan) {
    let cfg = model.config();
    let (h_n, dk, dv) = (cfg.n_heads as usize, cfg.d_qk as usize, cfg.d_v as usize);

    // 1. q = c_q a, k = c_k a, v = c_v a
    kernels::matvec(&model.matrix(Role::Wq, l), s.a, s.q, s.act);
    kernels::matvec(&model.matrix(Role::Wk, l), s.a, s.k, s.act);
    kernels::matvec(&model.matrix(Role::Wv, l), s.a, s.v, s.act);

    // 2. value residual: v += (v_first - v) * sigmoid(v_gate0 + v_gate2(v_gate1 a)),
    //    v_first being layer 0's plain value projection.
    if cfg.has(flags::VALUE_RESIDUAL) {
        if l == 0 {
            s.v_first.copy_from_slice(s.v);
        }
        kernels::matvec(&model.matrix(Role::VGate1, l), s.a, s.vg_lo, s.act);
        kernels::matvec(&model.matrix(Role::VGate2, l), s.vg_lo, s.vg, s.act);
        let g0 = model.vector(Role::VGate0, l);
        for i in 0..s.v.len() {
            let g = sigmoid(g0.get(i) + s.vg[i]);
            s.v[i] += (s.v_first[i] - s.v[i]) * g;
        }
    }

    // 3. token shift of q, k, v towards the previous token's (itself at t = 0)
    if cfg.has(flags::TOKENSHIFT_ATT) {
        let first = plan.t == 0;
        token_shift(s.q, st.prev_q, model.vector(Role::ShiftQ, l), first);
        token_shift(s.k, st.prev_k, model.vector(Role::ShiftK, l), first);
        token_shift(s.v, st.prev_v, model.vector(Role::ShiftV, l), first);
    }

    // 4.-5. per-head LN_q / LN_k, then partial RoPE
    let (lnq, lnk) = (
        (model.vector(Role::LnQW, l), model.vector(Role::LnQB, l)),
        (model.vector(Role::LnKW, l), model.vector(Role::LnKB, l)),
    );
    for h in 0..h_n {
        let q = &mut s.q[h * dk..(h + 1) * dk];
        layer_norm_inplace(q, lnq.0, lnq.1);
        rope_apply(q, s.cos, s.sin);
        let k = &mut s.k[h * dk..(h + 1) * dk];
        layer_norm_inplace(k, lnk.0, lnk.1);
        rope_apply(k, s.cos, s.sin);
    }

    // 6. merge gate m_h = 1 + elu(key_weighting a)
    if cfg.has(flags::MERGE_GATE_KEYS) || cfg.has(flags::MERGE_GATE_VALUES) {
        kernels::matvec(&model.matrix(Role::MergeGate, l), s.a, s.mg, s.act);
        for m in s.mg.iter_mut() {
            *m = 1.0 + elu(*m);
        }
    } else {
        s.mg.fill(1.0);
    }

    // 7. per head: state update, window push, attention over state + window
    let temps = |h: usize| {
        if cfg.has(flags::HEAD_TEMPS) {
            (model.vector(Role::FrontTemp, l).get(h), model.vector(Role::StateTemp, l).get(h))
        } else {
            (1.0, 1.0)
        }
    };
    let ln_sk = (model.vector(Role::LnSkW, l), model.vector(Role::LnSkB, l));
    for h in 0..h_n {
        let mut hs = HeadState { st, h, cfg, state_len: plan.state_len, ln_sk };
        let (k, v) = (&s.k[h * dk..(h + 1) * dk], &s.v[h * dv..(h + 1) * dv]);
        if let Some(slot) = plan.initial {
            hs.initial_append(slot, k, v, s.mg[h], plan.gate_initial, &mut s.fold.pk[..dk]);
        }
        if let Some(b) = plan.fold_begin {
            hs.fold(b, plan.slots_before, plan.slots_after, &mut s.fold);
        }
        hs.push_window(plan.t, k, v, s.mg[h]);
        let q = &s.q[h * dk..(h + 1) * dk];
        hs.attend(q, plan, plan.slots_after, temps(h), s.scores, &mut s.att[h * dv..(h + 1) * dv]);
    }

    // Attn = c_proj(concat o_h)
    kernels::matvec(&model.matrix(Role::Wo, l), s.att, s.a, s.act);
}

/// `s.a <- MLP(s.a)` for layer `l`: `c_proj(relu(c_fc m)^2)`, `m` token-shifted towards
/// the previous token's LN_mlp output (zero at t = 0).
fn mlp(model: &Model<'_>, l: usize, st: &mut LayerState<'_>, s: &mut Scratch<'_>) {
    if model.config().has(flags::TOKENSHIFT_FFN) {
        token_shift(s.a, st.prev_m, model.vector(Role::ShiftFfn, l), false);
    }
    kernels::matvec(&model.matrix(Role::WUp, l), s.a, s.ff, s.act);
    for h in s.ff.iter_mut() {
        let r = h.max(0.0);
        *h = r * r;
    }
    kernels::matvec(&model.matrix(Role::WDown, l), s.ff, s.a, s.act);
}

/// `cur += mix * (prev - cur)`, then `prev <- cur` as it was (pre-shift). With `first`,
/// the previous token is the token itself.
fn token_shift(cur: &mut [f32], prev: &mut [f32], mix: Vector<'_>, first: bool) {
    for (i, (c, p)) in cur.iter_mut().zip(prev.iter_mut()).enumerate() {
        let x = *c;
        let before = if first { x } else { *p };
        *c = x + mix.get(i) * (before - x);
        *p = x;
    }
}

//! The weights view ([`Model`]) and the forward pass of one token (spec §2).

use crate::cache::CacheDtype;
use crate::config::{flags, Config};
use crate::error::{Error, Result};
use crate::format::{self, Header, Role, TensorEntry, ENTRY_LEN, HEADER_LEN, N_GLOBAL_ROLES};
use crate::kernels::{self, Matrix};
use crate::math::{elu, layer_norm, layer_norm_inplace, rope_apply, rope_tables};
use crate::state::{Acts, Counters, HeadReader, HeadState, LayerState, Layout, Phase, Plan, Scratch};
use crate::tokenizer::Tokenizer;

/// Per-layer roles in canonical order.
const LAYER_ROLES: usize = 26;

/// The tag of the first per-layer role; tags of the others follow without gaps.
const FIRST_LAYER_TAG: usize = 16;

const _: () = {
    let mut i = 0;
    while i < LAYER_ROLES {
        assert!(Role::ALL[N_GLOBAL_ROLES + i] as usize == FIRST_LAYER_TAG + i);
        i += 1;
    }
    assert!(Role::ALL.len() == N_GLOBAL_ROLES + LAYER_ROLES);
};

/// A validated model borrowed from its blob. Copying it copies a few words, not weights.
#[derive(Debug, Clone, Copy)]
pub struct Model<'a> {
    blob: &'a [u8],
    header: Header,
    /// Position of each per-layer role within a layer's run of table entries.
    layer_slot: [u8; LAYER_ROLES],
    /// Table entries per layer.
    per_layer: usize,
    tokenizer: Tokenizer<'a>,
    arena_len: usize,
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

    /// The elements in order (no bounds check per element, unlike [`Vector::get`]).
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = f32> + 'a {
        self.0.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
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

    /// As [`Model::from_bytes`] but skips the tensor-data checksums and the tokenizer's
    /// ordering checks (bounds are still checked everywhere, so decoding stays memory
    /// safe and panic-free): for trusted images in flash, where a CRC over every weight at
    /// boot costs time.
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
        let section = tokenizer_bytes(blob, &header);
        let tokenizer = if check_data {
            Tokenizer::from_section(header.tokenizer_kind, section, cfg.vocab_len)?
        } else {
            Tokenizer::from_section_trusted(header.tokenizer_kind, section, cfg.vocab_len)?
        };
        // The header's arena_len is what the writer's kvm computed; this build's own layout
        // decides (the two agree within a release), so only the capacity is checked here.
        let layout = Layout::new(cfg, header.state_capacity as usize, header.cache)?;
        let mut layer_slot = [u8::MAX; LAYER_ROLES];
        let mut per_layer = 0;
        for (i, role) in Role::ALL[N_GLOBAL_ROLES..].iter().enumerate() {
            if role.shape(cfg).is_some() {
                layer_slot[i] = per_layer as u8;
                per_layer += 1;
            }
        }
        Ok(Model { blob, header, layer_slot, per_layer, tokenizer, arena_len: layout.arena_len() })
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

    /// What identifies this model to its state snapshots: the CRC-32 of the file header,
    /// which holds the config and the checksums of the tensor table (every tensor's shape,
    /// dtype and data checksum) and of the tokenizer section. Two files differing in any
    /// of them differ here (unless the CRCs collide).
    pub fn identity(&self) -> u32 {
        self.blob.get(..HEADER_LEN).map_or(0, format::crc32)
    }

    /// Exact arena bytes of a session at the file's default state capacity, as this
    /// build lays the arena out.
    #[inline]
    pub fn arena_len(&self) -> usize {
        self.arena_len
    }

    /// Exact arena bytes of a session holding at most `state_len` slots.
    ///
    /// # Errors
    /// [`Error::BadConfig`] if `state_len` is outside `[chunk_len, natural_state_len]`.
    pub fn arena_len_for(&self, state_len: usize) -> Result<usize> {
        Ok(Layout::new(self.config(), state_len, self.cache())?.arena_len())
    }

    /// How this model's sessions store the rows attention reads (the file's choice unless
    /// overridden by [`Model::with_cache`]).
    #[inline]
    pub fn cache(&self) -> CacheDtype {
        self.header.cache
    }

    /// This model with its sessions storing attention rows as `cache`: `F16` halves the
    /// state bytes each decode step reads and their share of the arena, at f16 precision
    /// (see [`crate::cache`]). [`Model::arena_len`] follows.
    ///
    /// # Errors
    /// [`Error::BadConfig`] if the arena size overflows.
    pub fn with_cache(mut self, cache: CacheDtype) -> Result<Self> {
        let layout = Layout::new(self.config(), self.header.state_capacity as usize, cache)?;
        self.header.cache = cache;
        self.arena_len = layout.arena_len();
        Ok(self)
    }

    /// The model's tokenizer (validated at load).
    #[inline]
    pub fn tokenizer(&self) -> Tokenizer<'a> {
        self.tokenizer
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
            // Layer role tags run 16, 17, ... in `Role::ALL` order (asserted below).
            let pos = role as usize - FIRST_LAYER_TAG;
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

/// One head's work: `(head, out_h, scratch_h)`.
pub type HeadFn<'f> = dyn Fn(usize, &mut [f32], &mut [f32]) + Sync + 'f;

/// Work on one piece of an output: `(index, piece)`.
pub type PieceFn<'f> = dyn Fn(usize, &mut [f32]) + Sync + 'f;

/// Runs the matrix products and the other splittable work of a forward pass. [`Serial`]
/// runs them on the calling thread; the std runtime plugs in a thread pool. No method has
/// a default, so a wrapper (a timer, say) must forward each one and cannot fall back to
/// serial work unnoticed.
pub trait Exec {
    /// `ys[t] = w xs[t]` for every token `t`: `xs: [n, w.cols]`, `ys: [n, w.rows]`;
    /// `act` is kernel scratch of at least [`kernels::matmul_scratch_len`]`(w.cols, 1)`.
    fn matmul(&self, w: &Matrix<'_>, xs: &[f32], ys: &mut [f32], act: &mut [u8]);

    /// Every product's `y[t] = w xs[t]`, for matrices that read the same input (equal
    /// `cols`): one job, so the input is quantized once and a pool splits all the products'
    /// rows together, waiting once instead of once per matrix.
    fn matmuls(&self, xs: &[f32], products: &mut [Product<'_, '_>], act: &mut [u8]);

    /// Runs `f(h, out_h, scratch_h)` for every head `h`, where `out_h` and `scratch_h` are
    /// the `h`-th `out_len`- and `scratch_len`-long pieces of `outs` and `scratch`; the
    /// heads are independent, so an implementation may run them in parallel.
    fn heads(&self, outs: &mut [f32], out_len: usize, scratch: &mut [f32], scratch_len: usize, f: &HeadFn<'_>);

    /// Runs `f(i, piece_i)` for every `piece`-long piece of `out` (the last may be
    /// shorter); the pieces are independent, so an implementation may run them in parallel.
    fn pieces(&self, out: &mut [f32], piece: usize, f: &PieceFn<'_>);

    /// The matrices the next products read, in order, announced before work that is not a
    /// product (a layer's attention, norms, sampling): an implementation whose threads
    /// would wait through that work may load their first bytes into cache instead, where
    /// memory would otherwise be idle. A hint: results never depend on it.
    fn upcoming(&self, ws: &[Matrix<'_>]);
}

/// One product of [`Exec::matmuls`]: `y = w x` for every token (`y: [n, w.rows]`).
#[derive(Debug)]
pub struct Product<'w, 'y> {
    pub w: Matrix<'w>,
    pub y: &'y mut [f32],
}

impl Default for Product<'_, '_> {
    /// The empty product.
    fn default() -> Self {
        Product { w: Matrix::default(), y: &mut [] }
    }
}

impl Product<'_, '_> {
    /// The input of [`Exec::matmuls`] made once for all `products`, when they can share
    /// it: one token (`xs` is `cols` long) for products of `cols` columns each, quantized
    /// into `act` if any product is of an integer format. `None` when each product must
    /// run on its own (several tokens, other widths, `act` too short).
    pub fn shared_input<'a>(xs: &[f32], products: &[Product<'_, '_>], act: &'a mut [u8]) -> Option<&'a [u8]> {
        let cols = xs.len();
        if products.iter().any(|p| p.w.cols != cols) {
            return None;
        }
        let act = act.get_mut(..kernels::act_scratch_len(cols))?;
        if products.iter().any(|p| p.w.dtype.quantizes_act()) {
            kernels::quantize_act(xs, act);
        }
        Some(act)
    }
}

/// Every product on the calling thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct Serial;

impl Exec for Serial {
    #[inline]
    fn matmul(&self, w: &Matrix<'_>, xs: &[f32], ys: &mut [f32], act: &mut [u8]) {
        if xs.len() == w.cols {
            kernels::matvec(w, xs, ys, act)
        } else {
            kernels::matmul(w, xs, ys, act)
        }
    }

    fn matmuls(&self, xs: &[f32], products: &mut [Product<'_, '_>], act: &mut [u8]) {
        match Product::shared_input(xs, products, act) {
            Some(act) => products.iter_mut().for_each(|p| kernels::matvec_prepared(&p.w, xs, act, p.y)),
            None => products.iter_mut().for_each(|p| self.matmul(&p.w, xs, p.y, act)),
        }
    }

    fn heads(&self, outs: &mut [f32], out_len: usize, scratch: &mut [f32], scratch_len: usize, f: &HeadFn<'_>) {
        for (h, (out, s)) in outs.chunks_exact_mut(out_len).zip(scratch.chunks_exact_mut(scratch_len)).enumerate() {
            f(h, out, s);
        }
    }

    fn pieces(&self, out: &mut [f32], piece: usize, f: &PieceFn<'_>) {
        for (i, p) in out.chunks_mut(piece.max(1)).enumerate() {
            f(i, p);
        }
    }

    /// Nothing: the calling thread is the only one, and it is busy with the work between.
    fn upcoming(&self, _ws: &[Matrix<'_>]) {}
}

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

/// Runs `tokens` through the network as one batch, updating the session state token by
/// token exactly as single steps would (spec §2-3); returns the counters after them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    model: &Model<'_>,
    lay: &Layout,
    layers: &mut [f32],
    s: &mut Scratch<'_>,
    x: &mut Acts<'_>,
    at: Counters,
    tokens: &[u32],
    phase: Phase,
    logits: Logits<'_>,
    exec: &dyn Exec,
    tap: &mut dyn FnMut(Tap, &[f32]),
) -> Counters {
    let cfg = model.config();
    let (d, half) = (cfg.d_model as usize, cfg.rope_dim as usize / 2);

    // x0 = LN_emb(wte[token]); each token's RoPE tables
    let (ln_w, ln_b) = (model.vector(Role::LnEmbW, 0), model.vector(Role::LnEmbB, 0));
    for (i, &token) in tokens.iter().enumerate() {
        let row = &mut x.x[i * d..(i + 1) * d];
        kernels::dequant_row(&model.matrix(Role::TokEmbed, 0), token as usize, row);
        layer_norm_inplace(row, ln_w, ln_b);
        tap(Tap::Embed, row);
        rope_tables(
            at.pos + i,
            cfg.rope_theta,
            &mut x.cos[i * half..(i + 1) * half],
            &mut x.sin[i * half..(i + 1) * half],
        );
    }

    for l in 0..cfg.n_layers as usize {
        let st = &mut lay.carve_layer(layers, l);
        // x = x + residual_scale * Attn(LN_attn(x))
        rows_layer_norm(exec, x.x, x.a, d, model.vector(Role::LnAttnW, l), model.vector(Role::LnAttnB, l));
        attention(model, l, st, s, x, (at, lay.state_len), phase, exec);
        crate::math::axpy(x.x, cfg.residual_scale, x.a);
        // x = x + residual_scale * MLP(LN_mlp(x))
        rows_layer_norm(exec, x.x, x.a, d, model.vector(Role::LnMlpW, l), model.vector(Role::LnMlpB, l));
        mlp(model, l, st, x, exec);
        if l + 1 < cfg.n_layers as usize {
            exec.upcoming(&layer_inputs(model, l + 1));
        } else {
            exec.upcoming(&[model.matrix(Role::LmHead, 0)]);
        }
        crate::math::axpy(x.x, cfg.residual_scale, x.a);
        for row in x.x.chunks_exact(d) {
            tap(Tap::Block(l), row);
        }
    }

    // logits = lm_head(LN_head(x)), optionally soft-capped
    let (ln_w, ln_b) = (model.vector(Role::LnHeadW, 0), model.vector(Role::LnHeadB, 0));
    let lm_head = model.matrix(Role::LmHead, 0);
    let out: &mut [f32] = match logits {
        Logits::None => &mut [],
        Logits::Last => {
            let last = (x.n - 1) * d;
            layer_norm(&x.x[last..last + d], ln_w, ln_b, &mut x.a[..d]);
            exec.matmul(&lm_head, &x.a[..d], s.logits, x.act);
            s.logits
        }
        Logits::All(out) => {
            rows_layer_norm(exec, x.x, x.a, d, ln_w, ln_b);
            exec.matmul(&lm_head, x.a, out, x.act);
            out
        }
    };
    // The next step's (or batch's) first products, while the caller samples.
    exec.upcoming(&layer_inputs(model, 0));
    let cap = cfg.logit_softcap;
    if cap != 0.0 {
        for z in out.iter_mut() {
            *z = cap * libm::tanhf(*z / cap);
        }
    }
    (0..tokens.len()).fold(at, |c, _| Plan::new(cfg, lay.state_len, c, phase).next())
}

/// The products of layer `l`'s first job (attention step 1): `c_q`, `c_k`, `c_v`, and the
/// value residual's `v_gate1` and the merge gate's `key_weighting` (empty matrices when
/// the model has none).
fn layer_inputs<'m>(model: &Model<'m>, l: usize) -> [Matrix<'m>; 5] {
    [Role::Wq, Role::Wk, Role::Wv, Role::VGate1, Role::MergeGate].map(|role| model.matrix(role, l))
}

/// Token rows per piece of the per-token work spread through [`Exec::pieces`] (norms,
/// RoPE): a batch's rows split across threads, a single token's run in place.
const ROWS_PER_PIECE: usize = 8;

/// `out[i] = LN(x[i])` for every `width`-wide row.
fn rows_layer_norm(exec: &dyn Exec, x: &[f32], out: &mut [f32], width: usize, w: Vector<'_>, b: Vector<'_>) {
    exec.pieces(out, ROWS_PER_PIECE * width, &|p, piece| {
        let x = &x[p * ROWS_PER_PIECE * width..];
        for (xr, or) in x.chunks_exact(width).zip(piece.chunks_exact_mut(width)) {
            layer_norm(xr, w, b, or);
        }
    });
}

/// `x.a <- Attn(x.a)` for layer `l` (spec §2 "Attn"), every token in order.
#[allow(clippy::too_many_arguments)]
fn attention(
    model: &Model<'_>,
    l: usize,
    st: &mut LayerState<'_>,
    s: &mut Scratch<'_>,
    x: &mut Acts<'_>,
    (at, st_len): (Counters, usize),
    phase: Phase,
    exec: &dyn Exec,
) {
    let cfg = model.config();
    let (h_n, dk, dv) = (cfg.n_heads as usize, cfg.d_qk as usize, cfg.d_v as usize);
    let (qd, vd, half) = (cfg.q_dim(), cfg.v_dim(), cfg.rope_dim as usize / 2);

    // The state rows the first token writes in step 7, fetched while the products run.
    let ln_sk = (model.vector(Role::LnSkW, l), model.vector(Role::LnSkB, l));
    let plan = Plan::new(cfg, st_len, at, phase);
    for h in 0..h_n {
        HeadState { st, h, cfg, state_len: plan.state_len, ln_sk }.prefetch_writes(plan.t, plan.initial);
    }

    // 1. q = c_q a, k = c_k a, v = c_v a, and the other products of a: the value
    //    residual's v_gate1 a and the merge gate's key_weighting a (steps 2 and 6)
    let value_residual = cfg.has(flags::VALUE_RESIDUAL);
    let merge_gate = cfg.has(flags::MERGE_GATE_KEYS) || cfg.has(flags::MERGE_GATE_VALUES);
    let mut products: [Product<'_, '_>; 5] = Default::default();
    let mut n = 0;
    let outputs = [
        (true, &mut *x.q),
        (true, &mut *x.k),
        (true, &mut *x.v),
        (value_residual, &mut *x.vg_lo),
        (merge_gate, &mut *x.mg),
    ];
    for (w, (on, y)) in layer_inputs(model, l).into_iter().zip(outputs) {
        if on {
            products[n] = Product { w, y };
            n += 1;
        }
    }
    exec.matmuls(x.a, &mut products[..n], x.act);
    exec.upcoming(&[model.matrix(Role::Wo, l), model.matrix(Role::WUp, l)]);

    // 2. value residual: v += (v_first - v) * sigmoid(v_gate0 + v_gate2(v_gate1 a)),
    //    v_first being layer 0's plain value projection.
    if value_residual {
        if l == 0 {
            x.v_first.copy_from_slice(x.v);
        }
        exec.matmul(&model.matrix(Role::VGate2, l), x.vg_lo, x.vg, x.act);
        // sigmoid(z) = 1 / (1 + e^-z), the exponentials with the SIMD kernel
        let g0 = model.vector(Role::VGate0, l);
        for row in x.vg.chunks_exact_mut(vd) {
            for (vg, g) in row.iter_mut().zip(g0.iter()) {
                *vg = -(g + *vg);
            }
        }
        kernels::exp_sub(x.vg, 0.0);
        for ((v, &vf), &e) in x.v.iter_mut().zip(x.v_first.iter()).zip(x.vg.iter()) {
            *v += (vf - *v) * (1.0 / (1.0 + e));
        }
    }

    // 3. token shift of q, k, v towards the previous token's (itself at t = 0)
    if cfg.has(flags::TOKENSHIFT_ATT) {
        let (sq, sk, sv) =
            (model.vector(Role::ShiftQ, l), model.vector(Role::ShiftK, l), model.vector(Role::ShiftV, l));
        for i in 0..x.n {
            let first = at.pos + i == 0;
            token_shift(&mut x.q[i * qd..(i + 1) * qd], st.prev_q, sq, first);
            token_shift(&mut x.k[i * qd..(i + 1) * qd], st.prev_k, sk, first);
            token_shift(&mut x.v[i * vd..(i + 1) * vd], st.prev_v, sv, first);
        }
    }

    // 4.-5. per-head LN_q / LN_k, then partial RoPE at each token's position
    let (lnq_w, lnq_b) = (model.vector(Role::LnQW, l), model.vector(Role::LnQB, l));
    let (lnk_w, lnk_b) = (model.vector(Role::LnKW, l), model.vector(Role::LnKB, l));
    let (cos, sin) = (&*x.cos, &*x.sin);
    for (rows, w, b) in [(&mut *x.q, lnq_w, lnq_b), (&mut *x.k, lnk_w, lnk_b)] {
        exec.pieces(rows, ROWS_PER_PIECE * qd, &|p, piece| {
            for (j, row) in piece.chunks_exact_mut(qd).enumerate() {
                let i = p * ROWS_PER_PIECE + j;
                let (cos, sin) = (&cos[i * half..(i + 1) * half], &sin[i * half..(i + 1) * half]);
                for head in row.chunks_exact_mut(dk) {
                    layer_norm_inplace(head, w, b);
                    rope_apply(head, cos, sin);
                }
            }
        });
    }

    // 6. merge gate m_h = 1 + elu(key_weighting a)
    if merge_gate {
        for m in x.mg.iter_mut() {
            *m = 1.0 + elu(*m);
        }
    } else {
        x.mg.fill(1.0);
    }

    // 7. chunk by chunk (folds happen only at a chunk's first token, so within one chunk
    //    the state a token reads is final once the chunk's tokens are in): first the state
    //    updates and window pushes, token by token; then every head attends all of the
    //    segment's queries over its state and window (heads in parallel, each head's keys
    //    and values staying in cache across the queries).
    let temps = |h: usize| {
        if cfg.has(flags::HEAD_TEMPS) {
            (model.vector(Role::FrontTemp, l).get(h), model.vector(Role::StateTemp, l).get(h))
        } else {
            (1.0, 1.0)
        }
    };
    let chunk = cfg.chunk_len as usize;
    let mut c = at;
    let mut i0 = 0;
    while i0 < x.n {
        let i1 = x.n.min(i0 + chunk - c.pos % chunk);
        let first = c;
        for i in i0..i1 {
            let plan = Plan::new(cfg, st_len, c, phase);
            for h in 0..h_n {
                let mut hs = HeadState { st, h, cfg, state_len: plan.state_len, ln_sk };
                let k = &x.k[i * qd + h * dk..i * qd + (h + 1) * dk];
                let v = &x.v[i * vd + h * dv..i * vd + (h + 1) * dv];
                let m = x.mg[i * h_n + h];
                if let Some(slot) = plan.initial {
                    hs.initial_append(slot, k, v, m, plan.gate_initial, &mut s.fold.pk[..dk]);
                }
                if let Some(b) = plan.fold_begin {
                    hs.fold(b, plan.slots_before, plan.slots_after, &mut s.fold, exec);
                }
                hs.push_window(plan.t, k, v, m);
            }
            c = plan.next();
        }

        // o: [n_heads, i1 - i0, d_v] into v's rows of the segment, which the pushes consumed
        let seg = i1 - i0;
        let (q, st): (&[f32], &LayerState<'_>) = (x.q, st);
        let o = &mut x.v[i0 * vd..i1 * vd];
        let scores_len = s.scores.len() / h_n;
        exec.heads(o, seg * dv, s.scores, scores_len, &|h, out, scores| {
            let reader = HeadReader { st, h, cfg, state_len: st_len };
            let mut c = first;
            for (i, out) in (i0..i1).zip(out.chunks_exact_mut(dv)) {
                let plan = Plan::new(cfg, st_len, c, phase);
                let q = &q[i * qd + h * dk..i * qd + (h + 1) * dk];
                reader.attend(q, &plan, plan.slots_after, temps(h), scores, out);
                c = plan.next();
            }
        });
        // concat o_h: [i1 - i0, n_heads * d_v]
        for (h, o) in x.v[i0 * vd..i1 * vd].chunks_exact(seg * dv).enumerate() {
            for (j, o) in o.chunks_exact(dv).enumerate() {
                x.att[(i0 + j) * vd + h * dv..(i0 + j) * vd + (h + 1) * dv].copy_from_slice(o);
            }
        }
        i0 = i1;
    }

    // Attn = c_proj(concat o_h)
    exec.matmul(&model.matrix(Role::Wo, l), x.att, x.a, x.act);
    exec.upcoming(&[model.matrix(Role::WUp, l), model.matrix(Role::WDown, l)]);
}

/// `x.a <- MLP(x.a)` for layer `l`: `c_proj(relu(c_fc m)^2)`, `m` token-shifted towards
/// the previous token's LN_mlp output (zero at t = 0).
fn mlp(model: &Model<'_>, l: usize, st: &mut LayerState<'_>, x: &mut Acts<'_>, exec: &dyn Exec) {
    let d = model.config().d_model as usize;
    if model.config().has(flags::TOKENSHIFT_FFN) {
        let mix = model.vector(Role::ShiftFfn, l);
        for row in x.a.chunks_exact_mut(d) {
            token_shift(row, st.prev_m, mix, false);
        }
    }
    exec.matmul(&model.matrix(Role::WUp, l), x.a, x.ff, x.act);
    exec.upcoming(&[model.matrix(Role::WDown, l)]);
    for h in x.ff.iter_mut() {
        let r = h.max(0.0);
        *h = r * r;
    }
    exec.matmul(&model.matrix(Role::WDown, l), x.ff, x.a, x.act);
}

/// `cur += mix * (prev - cur)`, then `prev <- cur` as it was (pre-shift). With `first`,
/// the previous token is the token itself.
fn token_shift(cur: &mut [f32], prev: &mut [f32], mix: Vector<'_>, first: bool) {
    for ((c, p), mix) in cur.iter_mut().zip(prev.iter_mut()).zip(mix.iter()) {
        let x = *c;
        let before = if first { x } else { *p };
        *c = x + mix * (before - x);
        *p = x;
    }
}

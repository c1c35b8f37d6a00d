//! The forward pass (spec §2): embedding, then per layer attention (step 1-7 of spec
//! §2 "Attn", the state updates of spec §3 through [`crate::state`]) and the MLP, then the
//! head. One batch of tokens at a time; every step reads like the spec, a comment each.

use crate::cache::SlotReads;
use crate::config::flags;
use crate::error::Origin;
use crate::exec::{Exec, Product};
use crate::format::Role;
use crate::kernels;
use crate::math::{all_finite, axpy, elu, layer_norm, layer_norm_inplace, rope_apply, Rope};
use crate::model::Model;
use crate::state::{Acts, Counters, HeadReader, HeadState, LayerState, Layout, Phase, Scratch, Segment, SEGMENT_LEN};
use crate::tensor::{Matrix, Vector};

/// An observation point of the forward pass, for tests and debugging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tap {
    /// `LN_emb(wte[token])`, `[d_model]`.
    Embed,
    /// The residual stream after block `i`, `[d_model]`.
    Block(usize),
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
/// token exactly as single steps would (spec §2-3); returns the counters after them and
/// the first stage whose output held a NaN or an infinity (if any did before the head).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    (model, rope): (&Model<'_>, &Rope),
    lay: &Layout,
    (layers, reads): (&mut [f32], &mut [f32]),
    s: &mut Scratch<'_>,
    x: &mut Acts<'_>,
    at: Counters,
    tokens: &[u32],
    phase: Phase,
    logits: Logits<'_>,
    exec: &dyn Exec,
    tap: &mut dyn FnMut(Tap, &[f32]),
) -> (Counters, Option<Origin>) {
    let cfg = model.config();
    let (d, half) = (cfg.d_model as usize, cfg.rope_dim as usize / 2);

    // x0 = LN_emb(wte[token]); each token's RoPE tables
    let (ln_w, ln_b) = (model.vector(Role::LnEmbW, 0), model.vector(Role::LnEmbB, 0));
    for (i, &token) in tokens.iter().enumerate() {
        let row = &mut x.x[i * d..(i + 1) * d];
        kernels::dequant_row(&model.matrix(Role::TokEmbed, 0), token as usize, row);
        layer_norm_inplace(row, ln_w, ln_b);
        tap(Tap::Embed, row);
        rope.tables(at.pos + i, &mut x.cos[i * half..(i + 1) * half], &mut x.sin[i * half..(i + 1) * half]);
    }

    // Where a NaN or an infinity first appears, looked for only when logits are asked for
    // (the only time the caller hears of one).
    let watch = !matches!(logits, Logits::None);
    let mut origin = (watch && !all_finite(x.x)).then_some(Origin::Embedding);

    // The counters after the batch: every layer's attention makes the same state steps.
    let mut after = at;
    for l in 0..cfg.n_layers as usize {
        let st = &mut lay.carve_layer(layers, reads, l);
        // x = x + residual_scale * Attn(LN_attn(x))
        rows_layer_norm(exec, x.x, x.a, d, model.vector(Role::LnAttnW, l), model.vector(Role::LnAttnB, l));
        after = attention(model, l, st, s, x, (at, lay), phase, exec);
        axpy(x.x, cfg.residual_scale, x.a);
        // x = x + residual_scale * MLP(LN_mlp(x))
        rows_layer_norm(exec, x.x, x.a, d, model.vector(Role::LnMlpW, l), model.vector(Role::LnMlpB, l));
        mlp(model, l, st, x, exec);
        if l + 1 < cfg.n_layers as usize {
            exec.upcoming(&layer_inputs(model, l + 1));
        } else {
            exec.upcoming(&[model.matrix(Role::LmHead, 0)]);
        }
        axpy(x.x, cfg.residual_scale, x.a);
        for row in x.x.chunks_exact(d) {
            tap(Tap::Block(l), row);
        }
        if watch && origin.is_none() && !all_finite(x.x) {
            origin = Some(Origin::Block(l as u32));
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
    (after, origin)
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

/// `x.a <- Attn(x.a)` for layer `l` (spec §2 "Attn"), every token in order; returns the
/// counters after the batch.
#[allow(clippy::too_many_arguments)]
fn attention(
    model: &Model<'_>,
    l: usize,
    st: &mut LayerState<'_>,
    s: &mut Scratch<'_>,
    x: &mut Acts<'_>,
    (at, lay): (Counters, &Layout),
    phase: Phase,
    exec: &dyn Exec,
) -> Counters {
    let st_len = lay.state_len;
    let cfg = model.config();
    let (h_n, dk, dv) = (cfg.n_heads as usize, cfg.d_qk as usize, cfg.d_v as usize);
    let (qd, vd, half) = (cfg.q_dim(), cfg.v_dim(), cfg.rope_dim as usize / 2);

    // The state rows the first token writes in step 7, fetched while the products run.
    let ln_sk = (model.vector(Role::LnSkW, l), model.vector(Role::LnSkB, l));
    // This layer's slot reads, when the arena does not keep them: what stored ones would
    // hold, from the same sums.
    if lay.reads == SlotReads::Recomputed {
        for h in 0..h_n {
            HeadState::new(st, h, cfg, st_len, ln_sk).refresh(0, at.slots);
        }
    }
    let mut segment = Segment::new(cfg, st_len, at, phase, x.n);
    let first = segment.plans()[0];
    for h in 0..h_n {
        HeadState::new(st, h, cfg, st_len, ln_sk).prefetch_writes(first.t, first.initial);
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

    // 7. run by run (a run: the batch's tokens of one chunk, see `Segment`), one job a run
    //    with the heads in parallel, each on its own rows of the state: a segment at a
    //    time, a head updates its state token by token (initial appends, window pushes),
    //    then attends the segment's queries over its state and window (each key and value
    //    read once for them). A fold comes only at a chunk's first token, the first of a
    //    run: every head's runs before the job, each spread through `exec`. Within a chunk
    //    no update touches what an earlier token reads: a push overwrites a ring entry
    //    older than the chunk's window, and initial appends fill slots no earlier token
    //    reads.
    let temps = |h: usize| {
        if cfg.has(flags::HEAD_TEMPS) {
            (model.vector(Role::FrontTemp, l).get(h), model.vector(Role::StateTemp, l).get(h))
        } else {
            (1.0, 1.0)
        }
    };
    let chunk = cfg.chunk_len as usize;
    let (mut i1, mut next) = (0, at);
    let after = loop {
        let (i0, run_at) = (i1, next);
        let first = segment.plans()[0];
        if let Some(b) = first.fold_begin {
            for h in 0..h_n {
                HeadState::new(st, h, cfg, st_len, ln_sk).fold(
                    b,
                    first.slots_before,
                    first.slots_after,
                    &mut s.fold,
                    exec,
                );
            }
        }
        // The run's end.
        loop {
            i1 += segment.plans().len();
            next = segment.next();
            if i1 == x.n || next.pos % chunk == 0 {
                break;
            }
            segment = Segment::new(cfg, st_len, next, phase, x.n - i1);
        }

        // o: [n_heads, i1 - i0, d_v] into att's rows of the run; several queries of a
        // segment read each key once (a batch's scratch holds them).
        let run = i1 - i0;
        let (q, k, v, mg) = (&*x.q, &*x.k, &*x.v, &*x.mg);
        let o = &mut x.att[i0 * vd..i1 * vd];
        let many = run > 1 && !x.scores.is_empty();
        let scratch: &mut [f32] = if many { x.scores } else { s.scores };
        let scratch_len = scratch.len() / h_n;
        // `segment` is the run's last, so its only one when it is one segment (a decode step).
        let single = (run == segment.plans().len()).then_some(&segment);
        // Token i's key, value and merge gate of head h.
        let kvm = |i: usize, h: usize| {
            (&k[i * qd + h * dk..i * qd + (h + 1) * dk], &v[i * vd + h * dv..i * vd + (h + 1) * dv], mg[i * h_n + h])
        };
        // A lone token's updates (a decode step) come first, on this thread: in the heads'
        // jobs they cost a one-core step 0.4-0.6% more instructions (scripts/mcu-bench.sh).
        if run == 1 {
            for h in 0..h_n {
                HeadState::new(st, h, cfg, st_len, ln_sk).update(&segment.plans()[0], kvm(i0, h));
            }
        }
        let heads = st.heads(h_n);
        exec.heads(o, run * dv, scratch, scratch_len, &|h, out, scratch| {
            // SAFETY: `Exec::heads` runs this once for each head `h < h_n` (`o` holds
            // `h_n` heads' outputs).
            let mut own = unsafe { heads.head(h) };
            let query = |i: usize| &q[i * qd + h * dk..i * qd + (h + 1) * dk];
            // The run's segments again (their plans depend on the counters alone).
            let (mut i, mut at) = (i0, run_at);
            while i < i1 {
                let again;
                let segment = match single {
                    Some(segment) => segment,
                    None => {
                        again = Segment::new(cfg, st_len, at, phase, i1 - i);
                        &again
                    }
                };
                let plans = segment.plans();
                let seg = plans.len();
                // The segment's updates (head h's own state is head 0 of `own`), then its
                // queries, which read no later token's.
                if run > 1 {
                    let mut hs = HeadState::new(&mut own, 0, cfg, st_len, ln_sk);
                    for (i, plan) in (i..).zip(plans) {
                        debug_assert!(plan.fold_begin.is_none() || i == i0, "a fold inside a run");
                        hs.update(plan, kvm(i, h));
                    }
                }
                let reader = HeadReader::new(&own, 0, cfg, st_len);
                let out = &mut out[(i - i0) * dv..(i - i0 + seg) * dv];
                if many && seg > 1 {
                    // qs: [seg, d_qk], this head's queries
                    let (qs, scratch) = scratch.split_at_mut(SEGMENT_LEN * dk);
                    for (i, row) in (i..i + seg).zip(qs.chunks_exact_mut(dk)) {
                        row.copy_from_slice(query(i));
                    }
                    reader.attend_many(&qs[..seg * dk], plans, temps(h), scratch, out);
                } else {
                    for ((i, plan), out) in (i..).zip(plans).zip(out.chunks_exact_mut(dv)) {
                        reader.attend(query(i), plan, temps(h), scratch, out);
                    }
                }
                (i, at) = (i + seg, segment.next());
            }
        });
        // concat o_h: [i1 - i0, n_heads * d_v] into v's rows of the run, which the pushes
        // consumed
        for (h, o) in x.att[i0 * vd..i1 * vd].chunks_exact(run * dv).enumerate() {
            for (j, o) in o.chunks_exact(dv).enumerate() {
                x.v[(i0 + j) * vd + h * dv..(i0 + j) * vd + (h + 1) * dv].copy_from_slice(o);
            }
        }
        if i1 == x.n {
            break next;
        }
        segment = Segment::new(cfg, st_len, next, phase, x.n - i1);
    };

    // Attn = c_proj(concat o_h)
    exec.matmul(&model.matrix(Role::Wo, l), x.v, x.a, x.act);
    exec.upcoming(&[model.matrix(Role::WUp, l), model.matrix(Role::WDown, l)]);
    after
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
        // relu(h)^2 by a compare: `f32::max` is a libm call on single-precision FPUs, and
        // the square makes -0.0 and a NaN (both sent to 0 here) give `max`'s bits.
        let r = if *h > 0.0 { *h } else { 0.0 };
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

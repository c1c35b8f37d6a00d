//! Configurations beyond the golden cases (unequal head widths, full RoPE, one- and
//! three-chunk windows, rounding, sinks, growth laws, residual scaling...): random
//! weights, and every one must load, never panic, and give the same logits token by
//! token as in one batch, with a snapshot resuming exactly.

use kvm_core::cache::CacheDtype::{F16, F32, Q8};
use kvm_core::config::{flags, Config, StateBudget};
use kvm_core::exec::{Exec, Serial};
use kvm_core::format::{Role, TokenizerKind};
use kvm_core::forward::Logits;
use kvm_core::quant::DType;
use kvm_core::state::Phase;
use kvm_core::{Model, Session};
use kvm_runtime::pool::Pool;

use crate::common::*;

fn base() -> Config {
    Config {
        vocab_len: 80,
        n_layers: 2,
        n_heads: 2,
        d_model: 64,
        d_qk: 32,
        d_v: 32,
        d_ff: 128,
        d_vgate: 32,
        rope_dim: 16,
        rope_theta: 10000.0,
        chunk_len: 8,
        window_chunks: 2,
        max_state_chunks: 1,
        budget: StateBudget::Fixed,
        state_min_len: 8,
        state_round_down: 1,
        sink_len: 1,
        logit_softcap: 0.0,
        residual_scale: 1.0,
        // The released checkpoints' gates; a hybrid's KVM layers with their own v_first.
        flags: flags::MODEL & !flags::GATE_INITIAL_STATE & !flags::ALT_SHARE_V0,
        alt_layer_every: 0,
        alt_window: 0,
        alt_rope_dim: 0,
        alt_rope_theta: 0.0,
    }
}

/// Writes `cfg` with seeded random weights; returns the file's bytes.
fn random_model(cfg: &Config, seed: u64, dtype: DType) -> Vec<u8> {
    random_model_but(cfg, seed, dtype, None)
}

/// [`random_model`] with every weight of `zero`'s tensors 0. Each tensor draws from its
/// own stream (seeded by `seed`, role and layer), so a config without some tensor still
/// gets the same values in all the others.
fn random_model_but(cfg: &Config, seed: u64, dtype: DType, zero: Option<Role>) -> Vec<u8> {
    // A path of this call's own: tests running in parallel draw models of the same seed.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("kvm-configs-{}-{seed}-{call}.kvm", std::process::id()));
    let mut source = |role: Role, layer: u16, rows: u32, cols: u32| {
        let mut state = (seed ^ (role as u64) << 32 ^ (layer as u64) << 48).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
        };
        if Some(role) == zero {
            return Ok(vec![0.0; (rows * cols) as usize]);
        }
        let scale = if role.is_matrix() { 1.0 / (cols as f32).sqrt() } else { 0.5 };
        let offset = if matches!(role.hf_name(), n if n.ends_with("ln_attn.weight") || n.ends_with("ln_mlp.weight")) {
            1.0
        } else {
            0.0
        };
        Ok((0..rows * cols).map(|_| offset + scale * next()).collect())
    };
    kvm_write::writer::write_model(
        kvm_write::atomic::AtomicFile::create(&path, &[]).unwrap(),
        cfg,
        (TokenizerKind::Bytes, &[]),
        (kvm_core::cache::CacheDtype::F32, kvm_core::cache::SlotReads::Stored),
        &|_, _, _| dtype,
        &mut source,
        &mut |_| {},
    )
    .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).ok();
    bytes
}

/// Every token's logits of `ids` in `session`: the first `prompt` fed in batches of
/// `batch` tokens (single steps for 1), then the rest decoded one at a time.
fn logits(session: &mut Session<'_, '_>, ids: &[u32], prompt: usize, batch: usize) -> Vec<f32> {
    logits_on(&Serial, session, ids, prompt, batch)
}

/// [`logits`] with the batches' work run by `exec`.
fn logits_on(exec: &dyn Exec, session: &mut Session<'_, '_>, ids: &[u32], prompt: usize, batch: usize) -> Vec<f32> {
    let vocab = session.model().config().vocab_len as usize;
    let mut out = vec![0f32; ids.len() * vocab];
    let mut acts = vec![0f32; session.layout().acts_len(batch).unwrap()];
    for (i, chunk) in ids[..prompt].chunks(batch).enumerate() {
        let out = &mut out[i * batch * vocab..][..chunk.len() * vocab];
        session.step_batch(chunk, Phase::Prefill, &mut acts, exec, Logits::All(out)).unwrap();
    }
    for (t, &id) in ids.iter().enumerate().skip(prompt) {
        out[t * vocab..(t + 1) * vocab].copy_from_slice(session.decode(id).unwrap());
    }
    out
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Random weights of `cfg`: every token's logits the same bits stepwise as in batches,
/// and a snapshot after the prompt resuming exactly. Integer (q8_0) weights in one batch
/// on two threads, with each attention cache; f32 ones in batches of 5 (decode's kernels, so the steps'
/// bits), and in one batch of the whole prompt against two (the batch kernel, whose bits
/// depend on no batch size).
fn check(name: &str, cfg: Config) {
    let ids: Vec<u32> = (0..150u32).map(|i| (i * 37 + 11) % cfg.vocab_len).collect();
    let prompt = 41;
    let pool = Pool::new(2).unwrap();
    for (dtype, cache) in [(DType::Q8_0, F32), (DType::Q8_0, F16), (DType::Q8_0, Q8), (DType::F32, F32)] {
        let blob = random_model(&cfg, name.len() as u64 * 7919, dtype);
        let model = Model::from_bytes(&blob).unwrap_or_else(|e| panic!("{name} {dtype:?}: {e}"));
        let model = model.with_cache(cache).unwrap();
        let case = (dtype, cache);
        let mut arenas: Vec<Arena> = (0..5).map(|_| Arena::new(model.arena_len())).collect();
        let [a1, a2, a3, a4, a5] = &mut arenas[..] else { unreachable!() };
        let mut one = Session::new(model, a1.bytes_mut()).unwrap();
        let stepwise = logits(&mut one, &ids, prompt, 1);
        assert!(stepwise.iter().all(|z| z.is_finite()), "{name} {case:?}: non-finite logits");
        let exact = if dtype == DType::Q8_0 { prompt } else { 5 };
        // Integer weights' batch on two threads: heads attend in parallel, the products'
        // rows split (integer sums: the same bits however split).
        let exec: &dyn Exec = if dtype == DType::Q8_0 { &pool } else { &Serial };
        let mut batched = Session::new(model, a2.bytes_mut()).unwrap();
        let out = logits_on(exec, &mut batched, &ids, prompt, exact);
        assert!(same_bits(&stepwise, &out), "{name} {case:?}: batches of {exact} differ from single steps");
        assert_eq!(one.state_slots(), batched.state_slots(), "{name} {case:?}");
        if dtype == DType::F32 {
            let whole = logits(&mut Session::new(model, a3.bytes_mut()).unwrap(), &ids, prompt, prompt);
            let halves = logits(&mut Session::new(model, a4.bytes_mut()).unwrap(), &ids, prompt, prompt.div_ceil(2));
            assert!(same_bits(&whole, &halves), "{name} {case:?}: one batch and two differ");
        }

        // Resume from a snapshot taken after the prompt: the same continuation, exactly.
        let mut fresh = Session::new(model, a3.bytes_mut()).unwrap();
        let mut acts = vec![0f32; fresh.layout().acts_len(prompt).unwrap()];
        fresh.step_batch(&ids[..prompt], Phase::Prefill, &mut acts, &Serial, Logits::Last).unwrap();
        let mut snap = vec![0u8; fresh.snapshot_len()];
        fresh.snapshot(&mut snap).unwrap();
        let mut resumed = Session::new(model, a5.bytes_mut()).unwrap();
        resumed.restore(&snap).unwrap();
        for (t, &id) in ids.iter().enumerate().skip(prompt) {
            let want = fresh.decode(id).unwrap().to_vec();
            assert_eq!(resumed.decode(id).unwrap(), &want[..], "{name} {case:?}: resumed at {t}");
        }
    }
}

#[test]
fn unusual_configurations_run_consistently() {
    let b = base();
    let cases: Vec<(&str, Config)> = vec![
        ("base", b),
        ("unequal head widths", Config { d_qk: 16, d_v: 48, rope_dim: 8, ..b }),
        // Values wide enough for the multi-query sums' 64-column tiles, and a tail.
        ("wide values", Config { d_qk: 48, d_v: 80, ..b }),
        ("full rope", Config { rope_dim: 32, ..b }),
        ("rope of two dims", Config { rope_dim: 2, ..b }),
        ("one-chunk window", Config { window_chunks: 1, ..b }),
        ("three-chunk window", Config { window_chunks: 3, ..b }),
        ("no sink", Config { sink_len: 0, ..b }),
        ("three sinks", Config { sink_len: 3, ..b }),
        ("state of three chunks", Config { max_state_chunks: 3, state_min_len: 24, ..b }),
        ("state below a chunk", Config { state_min_len: 3, ..b }),
        ("no minimum", Config { state_min_len: -1, ..b }),
        ("no cap", Config { max_state_chunks: 0, ..b }),
        (
            "power law rounded",
            Config {
                budget: StateBudget::PowerLaw { factor: 1.5, exponent: 0.6 },
                state_round_down: 4,
                max_state_chunks: 4,
                ..b
            },
        ),
        (
            "saturation",
            Config { budget: StateBudget::Saturation { n: 30.0 }, state_min_len: 1, max_state_chunks: 5, ..b },
        ),
        (
            "growable sink = chunk",
            Config {
                budget: StateBudget::PowerLaw { factor: 3.0, exponent: 0.5 },
                sink_len: 8,
                max_state_chunks: 4,
                ..b
            },
        ),
        (
            // More slots than a fold's bitmap of touched slots holds (32 per chunk token).
            "state wider than 32 slots per chunk token",
            Config {
                chunk_len: 2,
                budget: StateBudget::PowerLaw { factor: 8.0, exponent: 0.5 },
                state_min_len: 2,
                max_state_chunks: 64,
                ..b
            },
        ),
        ("residual scale and softcap", Config { residual_scale: 0.7, logit_softcap: -5.0, ..b }),
        ("gated initial state", Config { flags: flags::MODEL, ..b }),
        ("no vlens", Config { flags: flags::MODEL & !flags::VLENS, ..b }),
        ("bare", Config { flags: flags::VLENS, d_vgate: 0, ..b }),
        // The paper's `ablation_kvm_no_merge_gate`: no `key_weighting`, temperatures and
        // value lengths on.
        ("no merge gates", Config { flags: flags::MODEL & !(flags::MERGE_GATE_KEYS | flags::MERGE_GATE_VALUES), ..b }),
        (
            "four heads, big chunk",
            Config { n_heads: 4, d_qk: 16, d_v: 16, rope_dim: 4, chunk_len: 16, state_min_len: 16, ..b },
        ),
    ];
    for (name, cfg) in cases {
        check(name, cfg);
    }
}

/// Both merge gates off is the same computation as both on with `key_weighting` all 0
/// (every gate `1 + elu(0) = 1`): the same bits, prefill and decode, past several folds.
/// At f32 the file without the gate's tensor once read tensor data as a table entry.
#[test]
fn no_merge_gate_equals_a_gate_of_one() {
    let gated = base();
    let ungated = Config { flags: gated.flags & !(flags::MERGE_GATE_KEYS | flags::MERGE_GATE_VALUES), ..gated };
    let ids: Vec<u32> = (0..120u32).map(|i| (i * 53 + 7) % gated.vocab_len).collect();
    for dtype in [DType::F32, DType::F16, DType::Q8_0] {
        let run = |cfg: &Config, zero| {
            let blob = random_model_but(cfg, 5, dtype, zero);
            let model = Model::from_bytes(&blob).unwrap();
            let mut arena = Arena::new(model.arena_len());
            logits(&mut Session::new(model, arena.bytes_mut()).unwrap(), &ids, 40, 8)
        };
        let want = run(&gated, Some(Role::MergeGate));
        let got = run(&ungated, None);
        assert!(got.iter().all(|z| z.is_finite()), "{dtype:?}: non-finite logits");
        assert!(same_bits(&got, &want), "{dtype:?}: no merge gate differs from a gate of one");
    }
}

#[test]
fn hybrid_stacks_run_consistently() {
    // Chunks of 8; every layer `i % every == 0` a sliding-window layer of `window` tokens.
    let hybrid = |n_layers: u32, every: u32, window: u32| Config {
        n_layers,
        alt_layer_every: every,
        alt_window: window,
        alt_rope_dim: 32,
        alt_rope_theta: 10000.0,
        ..base()
    };
    let b = hybrid(4, 2, 12);
    let cases: Vec<(&str, Config)> = vec![
        ("every 2, window 12", b),
        ("every 3, window 5 (shorter than a chunk)", hybrid(4, 3, 5)),
        ("every 4, window = chunk", hybrid(5, 4, 8)),
        ("window of two chunks", hybrid(4, 2, 16)),
        ("window longer than the prompt", hybrid(3, 2, 45)),
        ("window of one token", hybrid(3, 2, 1)),
        ("alternate rope of 8 dims, theta 500", Config { alt_rope_dim: 8, alt_rope_theta: 500.0, ..b }),
        ("no value residual", Config { flags: b.flags & !flags::VALUE_RESIDUAL, d_vgate: 0, ..b }),
        ("shared v_first", Config { flags: b.flags | flags::ALT_SHARE_V0, ..b }),
        ("growable KVM layers", Config { budget: StateBudget::Saturation { n: 30.0 }, max_state_chunks: 5, ..b }),
    ];
    for (name, cfg) in cases {
        cfg.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        check(name, cfg);
    }
}

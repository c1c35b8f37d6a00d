//! Random-weight models with the paper's shapes, for measuring speed and memory without a
//! trained checkpoint.
//!
//! Weights come from a seeded PRNG, one stream per tensor (seeded by the model seed, the
//! tensor's role and its layer), so a file is a pure function of `(preset, dtype, seed)`
//! and each tensor is generated only when [`write_model`] asks for it: peak memory is
//! about one tensor. Scales keep activations in a sensible range through a deep stack:
//! matrices `N(0, 1/sqrt(cols))`, layer-norm weights near 1, biases near 0, token-shift
//! mixes uniform in `[0, 1]`, head temperatures near 1.
//!
//! A preset's state is fixed, as the paper's main models' is; [`growable`] gives it one
//! of the paper's growable budgets instead, with room for the slots it grows to over a
//! given context.

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use kvm_core::config::{flags, Config, StateBudget};
use kvm_core::format::{Role, TokenizerKind};

use crate::room;
use kvm_write::atomic::AtomicFile;
use kvm_write::policy::Policy;
use kvm_write::writer::{write_model, TensorReport, WriteReport};

/// A named model shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// The paper's 120M model: 12 layers, `d_model` 768, 6 heads of 128.
    Paper120m,
    /// The paper's 350M model: 24 layers, `d_model` 1024, 8 heads of 128.
    Paper350m,
    /// A model small enough for unit tests (2 layers, `d_model` 64, byte vocabulary)
    /// that still folds its state every 16 tokens.
    Tiny,
}

impl Preset {
    /// Every preset.
    pub const ALL: [Preset; 3] = [Preset::Paper120m, Preset::Paper350m, Preset::Tiny];

    /// The command-line name (`paper-120m`).
    pub const fn name(self) -> &'static str {
        match self {
            Preset::Paper120m => "paper-120m",
            Preset::Paper350m => "paper-350m",
            Preset::Tiny => "tiny",
        }
    }

    /// Parses a [`Preset::name`].
    pub fn from_name(s: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The preset's configuration.
    pub fn config(self) -> Config {
        match self {
            Preset::Paper120m => paper(12, 768, 6),
            // The 350M configs halve each block's residual branch (`residual_scale: 0.5`
            // in the reference's configs/prolong/350M/kvm_wd.yaml).
            Preset::Paper350m => Config { residual_scale: 0.5, ..paper(24, 1024, 8) },
            Preset::Tiny => Config {
                vocab_len: 256,
                n_layers: 2,
                n_heads: 2,
                d_model: 64,
                d_qk: 32,
                d_v: 32,
                d_ff: 256,
                d_vgate: 32,
                rope_dim: 16,
                chunk_len: 16,
                state_min_len: 16,
                ..paper(2, 64, 2)
            },
        }
    }
}

/// The value-gate LoRA rank the reference picks for width `d`:
/// `max(32, int(round((1.3 * d**0.5) / 32) * 32))`.
pub fn vgate_rank(d_model: u32) -> u32 {
    // Python's round() is round-half-even; `round_ties_even` matches it.
    let r = ((1.3 * (d_model as f64).sqrt()) / 32.0).round_ties_even() * 32.0;
    (r as u32).max(32)
}

/// The paper's layout at a given depth and width: heads of 128, 50304 tokens, chunks of
/// 256, a window of two chunks, a fixed state of 256 slots, one sink, RoPE on 64 dims,
/// token shift on attention and MLP, value residual, every KVM gate, MLP expansion 4.
fn paper(n_layers: u32, d_model: u32, n_heads: u32) -> Config {
    Config {
        vocab_len: 50304,
        n_layers,
        n_heads,
        d_model,
        d_qk: 128,
        d_v: 128,
        d_ff: 4 * d_model / 32 * 32,
        d_vgate: vgate_rank(d_model),
        rope_dim: 64,
        rope_theta: 10000.0,
        chunk_len: 256,
        window_chunks: 2,
        max_state_chunks: 1,
        budget: StateBudget::Fixed,
        state_min_len: 256,
        state_round_down: 1,
        sink_len: 1,
        logit_softcap: 0.0,
        residual_scale: 1.0,
        flags: flags::MODEL,
        alt_layer_every: 0,
        alt_window: 0,
        alt_rope_dim: 0,
        alt_rope_theta: 0.0,
    }
}

/// The paper's square-root state: `16 * ctx^0.5` slots, at least the fixed model's 256
/// (`state_budget_mode: power_law`, `state_growth_factor: 16.0`, `state_growth_exponent:
/// 0.5`, `state_min_len: 256` in configs/prolong/{120M,350M}/kvm_sqrt16_wd.yaml of the
/// reference, github.com/recursal/KVM-paper).
pub const SQRT16: StateBudget = StateBudget::PowerLaw { factor: 16.0, exponent: 0.5 };

/// The paper's saturating state: `1024 * ctx / (1024 + ctx)` slots, at least one
/// (`state_budget_mode: kvm_saturation`, `state_saturation_n: 1024`, `state_min_len: 1` in
/// configs/prolong/{120M,350M}/kvm_swa_saturate1024_wd.yaml). That model alternates KVM
/// layers with sliding-window ones ([`paper_hybrid`]).
pub const SATURATE1024: StateBudget = StateBudget::Saturation { n: 1024.0 };

/// The paper's hybrid stack of `kvm_swa_saturate1024_wd.yaml` over a preset's `cfg`: every
/// other layer from layer 0 a sliding-window layer (`alt_layer_every: 2`) over the last
/// 256 tokens (`swa_window_size`), its RoPE over the whole head (`alt_rope_partial_dim`
/// 128 of 128), theta 10000; the KVM layers' value residual from their own first layer.
pub fn paper_hybrid(cfg: Config) -> Config {
    Config {
        alt_layer_every: 2,
        alt_window: 256,
        alt_rope_dim: cfg.d_qk,
        alt_rope_theta: 10000.0,
        flags: cfg.flags & !flags::ALT_SHARE_V0,
        ..cfg
    }
}

/// What `--state` asks for: a budget, and whether the stack is the paper's hybrid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StateChoice {
    pub budget: StateBudget,
    pub hybrid: bool,
}

/// Parses `--state`: `fixed`, `sqrt` ([`SQRT16`]), `saturation` (the paper's hybrid stack
/// with [`SATURATE1024`], as `kvm_swa_saturate1024_wd` trains it), `saturation-all-kvm`
/// ([`SATURATE1024`] in every layer, no sliding-window layers), `power-law:F:E` (`F *
/// ctx^E` slots) or `saturation:N` (`N * ctx / (N + ctx)` slots); all but `saturation`
/// all-KVM stacks.
///
/// # Errors
/// Any other text, or numbers that do not parse.
pub fn parse_state(s: &str) -> Result<StateChoice> {
    let num = |x: &str| x.parse::<f64>().map_err(|_| anyhow!("--state {s}: `{x}` is not a number"));
    let budget = match s.split(':').collect::<Vec<_>>()[..] {
        ["fixed"] => StateBudget::Fixed,
        ["sqrt"] => SQRT16,
        ["saturation"] => return Ok(StateChoice { budget: SATURATE1024, hybrid: true }),
        ["saturation-all-kvm"] => SATURATE1024,
        ["power-law", f, e] => StateBudget::PowerLaw { factor: num(f)?, exponent: num(e)? },
        ["saturation", n] => StateBudget::Saturation { n: num(n)? },
        _ => bail!(
            "unknown --state `{s}` (expected fixed, sqrt, saturation, saturation-all-kvm, power-law:F:E or \
             saturation:N)"
        ),
    };
    Ok(StateChoice { budget, hybrid: false })
}

/// `cfg` (a preset's fixed-state config) with a growable `budget` and room for every
/// slot it reaches within `context` tokens ([`room::fit`], with no cap of the
/// reference's). A power law keeps the fixed state's size as its floor, a saturating
/// state starts from one slot, as the paper's configs do ([`SQRT16`], [`SATURATE1024`]).
///
/// # Errors
/// A fixed `budget`, and as [`room::fit`].
pub fn growable(cfg: Config, budget: StateBudget, context: usize) -> Result<Config> {
    let state_min_len = match budget {
        StateBudget::Fixed => bail!("a fixed state does not grow"),
        StateBudget::PowerLaw { .. } => cfg.state_min_len,
        StateBudget::Saturation { .. } => 1,
    };
    room::fit(Config { budget, state_min_len, ..cfg }, u32::MAX, context).map_err(|e| anyhow!("--state: {e}"))
}

/// SplitMix64: tiny, fast, and every seed (zero included) gives a full-period stream.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A stream seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 24 random bits (every value an exact f32).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Two independent standard normals (Box-Muller).
    fn normal_pair(&mut self) -> (f32, f32) {
        // 1 - u lies in (0, 1], so the log is finite.
        let u = 1.0 - (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        let v = (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        let r = (-2.0 * u.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * v).sin_cos();
        ((r * c) as f32, (r * s) as f32)
    }

    /// Fills `out` with `N(mean, std^2)` samples.
    pub fn fill_normal(&mut self, out: &mut [f32], mean: f32, std: f32) {
        for pair in out.chunks_mut(2) {
            let (a, b) = self.normal_pair();
            pair[0] = mean + std * a;
            if let Some(x) = pair.get_mut(1) {
                *x = mean + std * b;
            }
        }
    }
}

/// The seed of tensor `(role, layer)`'s own stream.
fn tensor_seed(seed: u64, role: Role, layer: u16) -> u64 {
    let mut r = Rng::new(seed ^ ((role as u64) << 32) ^ ((layer as u64) << 48));
    r.next_u64()
}

/// The random values of tensor `(role, layer)`, `[rows, cols]` row-major.
pub fn tensor(seed: u64, role: Role, layer: u16, rows: u32, cols: u32) -> Vec<f32> {
    let mut rng = Rng::new(tensor_seed(seed, role, layer));
    let mut v = vec![0f32; rows as usize * cols as usize];
    match role {
        _ if role.is_matrix() => rng.fill_normal(&mut v, 0.0, 1.0 / (cols as f32).sqrt()),
        Role::LnEmbW
        | Role::LnHeadW
        | Role::LnAttnW
        | Role::LnMlpW
        | Role::LnQW
        | Role::LnKW
        | Role::LnSkW
        | Role::FrontTemp
        | Role::StateTemp => rng.fill_normal(&mut v, 1.0, 0.05),
        Role::ShiftQ | Role::ShiftK | Role::ShiftV | Role::ShiftFfn => v.iter_mut().for_each(|x| *x = rng.uniform()),
        // Biases, and the value gate's bias (sigmoid(0) = 1/2: half first-layer value).
        _ => rng.fill_normal(&mut v, 0.0, 0.02),
    }
    v
}

/// Writes a random-weight model of `cfg` to `out`, matrices stored as `policy` says,
/// with the byte-level tokenizer (ids past 255 decode to nothing).
///
/// # Errors
/// An invalid `cfg`, or I/O errors.
pub fn synth(
    out: &Path,
    cfg: &Config,
    policy: &Policy,
    seed: u64,
    on_tensor: &mut dyn FnMut(&TensorReport),
) -> Result<WriteReport> {
    let mut source = |role: Role, layer: u16, rows: u32, cols: u32| Ok(tensor(seed, role, layer, rows, cols));
    let dtype_for = |role: Role, rows: u32, cols: u32| policy.dtype_for(role, rows, cols);
    let out = AtomicFile::create(out, &[])?;
    let cfg = &policy.config(*cfg);
    write_model(out, cfg, (TokenizerKind::Bytes, &[]), (policy.cache, policy.reads), &dtype_for, &mut source, on_tensor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_core::quant::DType;
    use kvm_core::state::state_slots;
    use kvm_core::{Model, Session};

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("kvm-synth-{}-{name}", std::process::id()))
    }

    fn write(name: &str, preset: Preset, dtype: DType, seed: u64) -> Vec<u8> {
        let path = tmp(name);
        let policy = Policy::uniform(dtype);
        synth(&path, &preset.config(), &policy, seed, &mut |_| {}).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).ok();
        bytes
    }

    #[repr(C, align(64))]
    struct Block([u8; 64]);

    /// Runs `f` on a session of `blob`'s model in an arena of the file's capacity.
    fn with_session<T>(blob: &[u8], f: impl FnOnce(Session<'_, '_>) -> T) -> T {
        let model = Model::from_bytes(blob).unwrap();
        let mut buf: Vec<Block> = (0..model.arena_len().div_ceil(64)).map(|_| Block([0; 64])).collect();
        // SAFETY: `Block` is plain bytes; the slice covers the allocation.
        let arena = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 64) };
        f(Session::new(model, &mut arena[..model.arena_len()]).unwrap())
    }

    /// Greedy continuation of a fixed prompt, as token ids.
    fn greedy(blob: &[u8], n: usize) -> Vec<u32> {
        with_session(blob, |mut s| {
            let mut logits = s.prefill(b"In the beginning".map(u32::from).as_slice()).unwrap().to_vec();
            let mut out = Vec::new();
            for _ in 0..n {
                assert!(logits.iter().all(|x| x.is_finite()));
                let next = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
                out.push(next);
                logits = s.decode(next).unwrap().to_vec();
            }
            out
        })
    }

    #[test]
    fn paper_shapes() {
        let c = Preset::Paper120m.config();
        assert_eq!((c.n_layers, c.d_model, c.n_heads, c.d_qk, c.d_v), (12, 768, 6, 128, 128));
        assert_eq!((c.d_ff, c.d_vgate, c.natural_state_len(), c.window_len()), (3072, 32, 256, 512));
        c.validate().unwrap();
        let c = Preset::Paper350m.config();
        assert_eq!((c.n_layers, c.d_model, c.n_heads, c.d_ff, c.d_vgate), (24, 1024, 8, 4096, 32));
        assert_eq!(c.residual_scale, 0.5);
        c.validate().unwrap();
        Preset::Tiny.config().validate().unwrap();
        assert_eq!((vgate_rank(768), vgate_rank(2048), vgate_rank(4096)), (32, 64, 96));
        for p in Preset::ALL {
            assert_eq!(Preset::from_name(p.name()), Some(p));
        }
    }

    #[test]
    fn budgets_parse_and_the_papers_growable_states_have_room_for_65536_tokens() {
        // The paper's hybrid: its KVM layers take their own first layer's v_first.
        let h = paper_hybrid(Preset::Paper120m.config());
        assert_eq!((h.alt_layer_every, h.alt_window, h.alt_rope_dim), (2, 256, 128));
        assert!(!h.has(flags::ALT_SHARE_V0) && h.validate().is_ok());
        let budget = |s: &str| parse_state(s).map(|c| (c.budget, c.hybrid)).unwrap();
        assert_eq!(budget("fixed"), (StateBudget::Fixed, false));
        assert_eq!(budget("sqrt"), (StateBudget::PowerLaw { factor: 16.0, exponent: 0.5 }, false));
        assert_eq!(budget("saturation"), (StateBudget::Saturation { n: 1024.0 }, true));
        assert_eq!(budget("saturation-all-kvm"), (StateBudget::Saturation { n: 1024.0 }, false));
        assert_eq!(budget("power-law:8:0.25"), (StateBudget::PowerLaw { factor: 8.0, exponent: 0.25 }, false));
        assert_eq!(budget("saturation:300"), (StateBudget::Saturation { n: 300.0 }, false));
        for bad in ["", "sqrt:2", "power-law:1", "power-law:a:1", "saturation:", "linear"] {
            assert!(parse_state(bad).is_err(), "{bad}");
        }
        // sqrt: 16 * 65536^0.5 = 4096 slots, 16 chunks of 256, at least the fixed 256.
        let c = growable(Preset::Paper120m.config(), SQRT16, room::DEFAULT_CONTEXT).unwrap();
        assert_eq!((c.max_state_chunks, c.natural_state_len(), c.state_min_len), (16, 4096, 256));
        assert_eq!(c.budget, SQRT16);
        // saturation: floor(1024 * 65536 / 66560) = 1008 slots, in 4 chunks, from one slot up.
        let c = growable(Preset::Paper350m.config(), SATURATE1024, room::DEFAULT_CONTEXT).unwrap();
        assert_eq!((c.max_state_chunks, c.natural_state_len(), c.state_min_len), (4, 1024, 1));
        assert!(growable(Preset::Tiny.config(), StateBudget::Fixed, 1024).is_err());
        // A context of none, or too long to follow (once, it looped over 2^32 tokens).
        for context in [0, room::MAX_CONTEXT + 1, 1 << 32] {
            let e = growable(Preset::Paper120m.config(), SATURATE1024, context).unwrap_err().to_string();
            assert!(e.contains(&format!("--max-context {context}")) && e.contains("[1, 67108864]"), "{e}");
        }
        assert!(growable(Preset::Paper120m.config(), SATURATE1024, 1).is_ok());
        assert!(growable(Preset::Tiny.config(), StateBudget::Saturation { n: -1.0 }, 1024).is_err());
        // A state as large as its context outgrows the format's 1024 chunks (262,144 slots).
        let linear = StateBudget::PowerLaw { factor: 1.0, exponent: 1.0 };
        assert!(growable(Preset::Paper120m.config(), linear, 200_000).is_ok());
        assert!(growable(Preset::Paper120m.config(), linear, 300_000).is_err());
    }

    /// Spec §3 on its own: the slots after each of `n` tokens for a power-law budget
    /// `factor * ctx^0.5`, at least `min_len`, at most `cap`.
    fn power_law_slots(cfg: &Config, factor: f64, min_len: usize, cap: usize, n: usize) -> Vec<usize> {
        let (c, w) = (cfg.chunk_len as usize, cfg.window_len());
        let mut slots = 0;
        (1..=n)
            .map(|n| {
                if n <= c {
                    slots = n;
                } else if n > w + c && (n - w - 1).is_multiple_of(c) {
                    // The chunk [b, b + c) leaves the window as token b + w + 1 comes in.
                    let b = n - w - 1;
                    let ctx = b + w;
                    let want = ((factor * (ctx as f64).sqrt()).floor() as usize).max(min_len);
                    let target = want.min(b + c).min(cap).max(slots);
                    slots += (target - slots).min(c);
                }
                slots
            })
            .collect()
    }

    #[test]
    fn a_growable_tiny_model_grows_its_state_as_its_budget_says() {
        // The paper's sqrt budget on tiny's chunks of 16 and window of 32, with room for
        // 1024 tokens of context: 16 * 1024^0.5 = 512 slots, 32 chunks.
        let cfg = growable(Preset::Tiny.config(), SQRT16, 1024).unwrap();
        assert_eq!(cfg.natural_state_len(), 512);
        let path = tmp("sqrt.kvm");
        synth(&path, &cfg, &Policy::uniform(DType::Q8_0), 3, &mut |_| {}).unwrap();
        let blob = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).ok();
        let model = Model::from_bytes(&blob).unwrap();
        assert_eq!((model.config().budget, model.header().state_capacity), (SQRT16, 512));
        // Past 1024 tokens of context, so the state fills its room and stays there.
        let n = 1200;
        let expected = power_law_slots(&cfg, 16.0, 16, 512, n);
        let grown: Vec<usize> = with_session(&blob, |mut s| {
            let mut rng = Rng::new(9);
            (0..n)
                .map(|_| {
                    s.decode((rng.next_u64() % 256) as u32).unwrap();
                    s.state_slots()
                })
                .collect()
        });
        assert_eq!(grown, expected);
        assert!(grown.iter().copied().eq(state_slots(&cfg, 512).take(n)));
        // Whole chunks go in (the first fold, at token 49, makes 32 slots) until the root
        // is smaller than the tokens covered (271 at ctx 288), then the root: 16 * 512^0.5
        // = 362 at ctx 512, 512 at 1024 and no more.
        let at = |n: usize| grown[n - 1];
        assert_eq!((at(48), at(49), at(289), at(513), at(1025), at(n)), (16, 32, 271, 362, 512, 512));
    }

    #[test]
    fn normals_have_the_asked_moments() {
        let mut v = vec![0f32; 100_001];
        Rng::new(7).fill_normal(&mut v, 0.5, 2.0);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!((mean - 0.5).abs() < 0.03, "{mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.03, "{var}");
    }

    #[test]
    fn tiny_is_deterministic_loads_and_decodes() {
        let a = write("a.kvm", Preset::Tiny, DType::Q8_0, 1);
        let b = write("b.kvm", Preset::Tiny, DType::Q8_0, 1);
        let c = write("c.kvm", Preset::Tiny, DType::Q8_0, 2);
        assert_eq!(a, b, "same seed, same file");
        assert_ne!(a, c, "another seed, another file");
        // 40 tokens: past the window (32), so the state folds.
        let (ga, gc) = (greedy(&a, 40), greedy(&c, 40));
        assert_eq!(ga, greedy(&b, 40));
        assert_ne!(ga, gc);
        for dtype in [DType::F32, DType::F16, DType::Q4_0] {
            greedy(&write(&format!("d-{}.kvm", dtype.name()), Preset::Tiny, dtype, 1), 40);
        }
    }
}

//! `kvm-export`: converts checkpoints into kvm model files, or makes random-weight ones.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use kvm_core::cache::{CacheDtype, SlotReads};
use kvm_core::config::{Config, StateBudget};
use kvm_core::format::{canonical_tensors, Role};
use kvm_core::quant::DType;
use kvm_export::convert::{convert, TokenizerSource};
use kvm_export::room::DEFAULT_CONTEXT;
use kvm_export::synth::{growable, paper_hybrid, parse_state, synth, Preset};
use kvm_write::atomic::AtomicFile;
use kvm_write::policy::Policy;
use kvm_write::writer::{error_table, peak_rss_bytes, TensorReport, WriteReport};

#[derive(Parser)]
#[command(name = "kvm-export", version, about = "Convert KVM checkpoints into kvm model files")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// How a model file stores its weights and what cache its sessions default to (both
/// commands).
#[derive(clap::Args)]
struct Storage {
    /// Storage type of weight matrices: f32, f32p (the same f32 values packed without
    /// loss into 28 bits each), f16, bf16, q8_0, q4_0 (q8_0x16 and q4_0x16 force the
    /// interleaved forms).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Keep q8_0 and q4_0 matrices row-major instead of interleaving 16 rows (q8_0x16,
    /// q4_0x16), for targets that run the scalar kernels (microcontrollers: 23% fewer
    /// instructions at q4_0).
    #[arg(long)]
    no_repack: bool,
    /// How sessions store attention's keys and values by default: f32 (exact), f16 (half
    /// the state bytes per decode step and of the arena) or q8 (a quarter); runtimes may
    /// override.
    #[arg(long, default_value = "f32")]
    cache: String,
    /// Where sessions keep each state slot's normalised key and value by default: stored
    /// (in every layer's state) or recomputed (from the slot's sums as each layer's
    /// attention begins: the same bits, one layer's worth of them in the arena instead of
    /// every layer's, for more work per token); runtimes may override.
    #[arg(long, default_value = "stored", value_name = "stored|recomputed")]
    slot_reads: String,
    /// The numerics sessions of the file compute with: float (the reference's, in the
    /// storage above) or int (docs/integer.md: every operation in integers, for
    /// microcontrollers without an FPU; matrices are stored as i8 rows, vectors as
    /// fixed point, and --dtype and --tensor-dtype do not apply; --cache is f32 for i16
    /// attention rows or q8 for i8 ones).
    #[arg(long, default_value = "float", value_name = "float|int")]
    numerics: String,
    /// Per-tensor override, ROLE=DTYPE (roles: embed, lm_head, wq, wk, wv, wo, up, down, vgate1, vgate2, gate); repeatable.
    #[arg(long = "tensor-dtype", value_name = "ROLE=DTYPE")]
    overrides: Vec<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Convert an HF checkpoint directory (config.json + model.safetensors).
    Convert {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Output model file.
        #[arg(short, long)]
        out: PathBuf,
        #[command(flatten)]
        storage: Storage,
        /// Tokenizer: a tokenizer.json path, or `bytes`. Default: the checkpoint's tokenizer.json if present, else bytes.
        #[arg(long)]
        tokenizer: Option<String>,
        /// A growable state's room (the paper's sqrt and saturating states): every slot it
        /// grows to within this many tokens of context, at most the checkpoint's
        /// `n_max_d_chunks`; past it the state merges without growing. Sessions may hold
        /// fewer slots (`kvm --state-slots`). Ignored for a fixed state.
        #[arg(long, value_name = "TOKENS", default_value_t = DEFAULT_CONTEXT)]
        max_context: usize,
        /// Print nothing but errors.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Write the tokenizer section a model file would hold for a tokenizer.json (to inspect
    /// it, or to seed the tokenizer fuzz target).
    Tokenizer {
        /// An HF tokenizer.json.
        json: PathBuf,
        /// Output file: the section's bytes.
        #[arg(short, long)]
        out: PathBuf,
    },
    /// Write a model with random weights and the shapes of a preset (for benchmarks).
    Synth {
        /// paper-120m, paper-350m or tiny.
        #[arg(long)]
        preset: String,
        /// Output model file.
        #[arg(short, long)]
        out: PathBuf,
        #[command(flatten)]
        storage: Storage,
        /// The state budget: fixed (the preset's, like the paper's main models: 256 slots),
        /// sqrt (the paper's growable `16 * ctx^0.5` slots, at least the fixed size),
        /// saturation (the paper's hybrid `kvm_swa_saturate1024`: every other layer from 0
        /// sliding-window attention over 256 tokens, the others KVM with `1024 * ctx /
        /// (1024 + ctx)` slots), saturation-all-kvm (that budget in every layer),
        /// power-law:F:E (`F * ctx^E`, at least the fixed size) or saturation:N (`N * ctx /
        /// (N + ctx)`); all but saturation every layer KVM.
        #[arg(long, default_value = "fixed", value_name = "BUDGET")]
        state: String,
        /// A growable state's room: every slot it grows to within this many tokens of
        /// context, in [1, 2^26] (default 65536, where sqrt reaches 4096 slots); past it
        /// the state merges without growing.
        #[arg(long, value_name = "TOKENS")]
        max_context: Option<usize>,
        /// The random seed: the same seed gives the same file.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Print nothing but errors.
        #[arg(short, long)]
        quiet: bool,
    },
}

fn parse_dtype(s: &str) -> Result<DType> {
    DType::from_name(s)
        .ok_or_else(|| anyhow!("unknown dtype `{s}` (expected f32, f32p, f16, bf16, q8_0, q4_0, q8_0x16 or q4_0x16)"))
}

fn parse_role(s: &str) -> Result<Role> {
    Ok(match s {
        "embed" => Role::TokEmbed,
        "lm_head" => Role::LmHead,
        "wq" => Role::Wq,
        "wk" => Role::Wk,
        "wv" => Role::Wv,
        "wo" => Role::Wo,
        "up" => Role::WUp,
        "down" => Role::WDown,
        "vgate1" => Role::VGate1,
        "vgate2" => Role::VGate2,
        "gate" => Role::MergeGate,
        _ => return Err(anyhow!("unknown tensor role `{s}`")),
    })
}

fn parse_policy(storage: &Storage) -> Result<Policy> {
    let Storage { dtype, cache, slot_reads, overrides, no_repack, numerics } = storage;
    let cache = CacheDtype::from_name(cache)
        .ok_or_else(|| anyhow!("unknown cache dtype `{cache}` (expected f32, f16 or q8)"))?;
    let reads = SlotReads::from_name(slot_reads)
        .ok_or_else(|| anyhow!("unknown --slot-reads `{slot_reads}` (expected stored or recomputed)"))?;
    match numerics.as_str() {
        "float" => {}
        "int" => {
            if dtype != "f32" || !overrides.is_empty() || *no_repack {
                bail!("--numerics int stores every matrix as i8 rows: drop --dtype, --tensor-dtype and --no-repack");
            }
            // Its attention rows: i16 (the default, `f32`) or i8 (`q8`).
            if cache == CacheDtype::F16 {
                bail!("--numerics int keeps attention rows as i16 (--cache f32) or i8 (--cache q8), not f16");
            }
            return Ok(Policy { cache, reads, ..Policy::int() });
        }
        other => bail!("unknown --numerics `{other}` (expected float or int)"),
    }
    let overrides_names: Vec<&str> =
        overrides.iter().map(|o| o.split_once('=').map_or(o.as_str(), |(r, _)| r)).collect();
    let overrides = overrides
        .iter()
        .map(|o| {
            let (r, d) = o.split_once('=').ok_or_else(|| anyhow!("--tensor-dtype wants ROLE=DTYPE, got `{o}`"))?;
            Ok((parse_role(r)?, parse_dtype(d)?))
        })
        .collect::<Result<Vec<_>>>()?;
    for (i, (role, _)) in overrides.iter().enumerate() {
        if overrides[..i].iter().any(|(r, _)| r == role) {
            bail!("--tensor-dtype gives `{}` twice: give each role once", overrides_names[i]);
        }
    }
    Ok(Policy {
        dtype: parse_dtype(dtype)?,
        overrides,
        cache,
        reads,
        repack: !no_repack,
        ..Policy::uniform(DType::F32)
    })
}

/// A bar over the tensors of `cfg`, drawn on stderr only when it is a terminal and the
/// user did not ask for quiet.
fn tensor_bar(n_tensors: usize, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(n_tensors as u64);
    let style = ProgressStyle::with_template("{bar:40} {pos}/{len} tensors {elapsed_precise} (eta {eta}) {wide_msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Runs `write` (which reports each tensor as it is stored) under a progress bar, then
/// prints the error table and the memory summary.
fn write_with_progress(
    out: &Path,
    quiet: bool,
    n_tensors: usize,
    write: impl FnOnce(&mut dyn FnMut(&TensorReport)) -> Result<WriteReport>,
) -> Result<()> {
    let bar = tensor_bar(n_tensors, quiet);
    let mut on_tensor = |r: &TensorReport| {
        bar.set_message(format!("{} ({})", r.name, r.dtype.name()));
        bar.inc(1);
    };
    let report = write(&mut on_tensor);
    bar.finish_and_clear();
    let report = report?;
    if !quiet {
        eprint!("{}", error_table(&report.tensors));
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let rss = peak_rss_bytes().map_or_else(|| "unknown".to_string(), |b| format!("{:.1} MiB", mib(b)));
        eprintln!(
            "wrote {} ({:.1} MiB, {} tensors, session arena {:.2} MiB); peak memory {rss} (VmHWM, mapped input \
             pages included), largest tensor in flight {:.1} MiB",
            out.display(),
            mib(report.file_len),
            report.tensors.len(),
            mib(report.arena_len),
            mib(report.peak_tensor_bytes)
        );
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Convert { dir, out, storage, tokenizer, max_context, quiet } => {
            let policy = Policy { max_context, ..parse_policy(&storage)? };
            let tokenizer = match tokenizer.as_deref() {
                None => TokenizerSource::Auto,
                Some("bytes") => TokenizerSource::Bytes,
                Some(p) => TokenizerSource::Json(PathBuf::from(p)),
            };
            // The bar's length needs the config; a broken one is reported by `convert` itself.
            let n_tensors = kvm_export::convert::read_config(&dir, max_context).map_or(0, |cfg| count(&cfg));
            write_with_progress(&out, quiet, n_tensors, |on_tensor| {
                let (_, report) = convert(&dir, &out, &policy, &tokenizer, on_tensor)
                    .with_context(|| format!("converting {}", dir.display()))?;
                Ok(report)
            })
        }
        Cmd::Tokenizer { json, out } => {
            let text = kvm_write::input::read_to_string(&json)?;
            let section =
                kvm_write::tokenizer::build_section(&text).with_context(|| format!("in {}", json.display()))?;
            let mut file = AtomicFile::create(&out, &[&json]).with_context(|| format!("creating {}", out.display()))?;
            file.file().write_all(&section).with_context(|| format!("writing {}", out.display()))?;
            file.commit()
        }
        Cmd::Synth { preset, out, storage, state, max_context, seed, quiet } => {
            let names = Preset::ALL.map(Preset::name).join(", ");
            let preset =
                Preset::from_name(&preset).ok_or_else(|| anyhow!("unknown preset `{preset}` (expected {names})"))?;
            let policy = parse_policy(&storage)?;
            let choice = parse_state(&state)?;
            let cfg = match (choice.budget, max_context) {
                (StateBudget::Fixed, None) => preset.config(),
                (StateBudget::Fixed, Some(_)) => bail!("--max-context sizes a growable state: give --state too"),
                (budget, context) => growable(preset.config(), budget, context.unwrap_or(DEFAULT_CONTEXT))?,
            };
            let cfg = if choice.hybrid { paper_hybrid(cfg) } else { cfg };
            cfg.validate().map_err(|e| anyhow!("--state {state}: {e}"))?;
            write_with_progress(&out, quiet, count(&cfg), |on_tensor| {
                synth(&out, &cfg, &policy, seed, on_tensor).with_context(|| format!("writing {}", out.display()))
            })
        }
    }
}

fn count(cfg: &Config) -> usize {
    canonical_tensors(cfg).count()
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Help and the version as clap prints them; a usage error in one line, clap's
        // exit code (2).
        Err(e) if !e.use_stderr() || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            e.exit()
        }
        Err(e) => {
            eprintln!("kvm-export: error: {}", kvm_write::usage::one_line(&e.render().to_string()));
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvm-export: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

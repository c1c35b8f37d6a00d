//! `kvm`: run KVM language models from the command line.
//!
//! Every error prints one line on stderr and exits non-zero; no subcommand panics on bad
//! input (a panic hook turns an internal bug into one line too).

mod bench;
mod chat;
mod flags;
mod generate;
mod info;
mod logits;
mod perplexity;
mod prompt;
mod reply;
mod snapshot;
mod tokenize;
mod tokens;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::bail;
use clap::{Parser, Subcommand};
use kvm_core::cache::CacheDtype;
use kvm_core::{Model, Session};
use kvm_runtime::arena::Arena;
use kvm_runtime::file::{ModelFile, Pages};

#[derive(Parser)]
#[command(name = "kvm", version, about = "Run Key-Value Means language models in constant memory")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print a model's config, tensors, arena size and kernel tier.
    Info {
        #[arg(long)]
        model: PathBuf,
    },
    /// Run tokens through a model and write every position's logits as float32 .npy.
    Logits(logits::Args),
    /// Score a text file with the model's own state; bits per token/byte, perplexity.
    Perplexity(perplexity::Args),
    /// Generate text from a prompt, streaming it as it comes.
    Generate(generate::Args),
    /// Talk with a model turn by turn, one session (constant memory) for the whole chat.
    Chat(chat::Args),
    /// Print the token ids of a text.
    Tokenize(tokenize::Args),
    /// Measure prefill and decode speed, memory and bandwidth use.
    Bench(bench::Args),
}

/// `--model PATH [--mmap] [--no-pack]`, for every command that runs the model.
#[derive(Debug, clap::Args)]
pub struct ModelArg {
    /// The model file.
    #[arg(long)]
    model: PathBuf,
    /// Map the file instead of reading it into huge pages: nothing copied, pages shared
    /// with other processes, but decode streams the weights through 4 KiB pages (slower).
    #[arg(long)]
    mmap: bool,
    /// Keep an f32 model's weights as stored. Without `--mmap` or this, an all-f32 model
    /// is packed losslessly into f32p as it loads: the same values in 28 bits a weight,
    /// so decode reads 11% fewer bytes.
    #[arg(long)]
    no_pack: bool,
}

impl ModelArg {
    /// The model file, read into huge pages unless `--mmap`, and then packed unless
    /// `--no-pack` ([`ModelFile::pack_f32`]).
    pub fn open(&self) -> anyhow::Result<ModelFile> {
        if !self.mmap && !self.no_pack {
            // Packed from the page cache, so only the packed copy stays in memory. Where
            // it cannot be (no memory for it, or a damaged file), the file loads as
            // stored, and loading reports what is wrong with it.
            if let Ok(Some(packed)) = ModelFile::open(&self.model, Pages::Mapped)?.pack_f32() {
                return Ok(packed);
            }
        }
        ModelFile::open(&self.model, if self.mmap { Pages::Mapped } else { Pages::Huge })
    }

    pub fn path(&self) -> &Path {
        &self.model
    }
}

/// `--cache f32|f16|q8`, for every command that runs sessions: how they store attention's
/// rows, overriding the model file.
#[derive(Debug, clap::Args)]
pub struct CacheArg {
    /// Store attention's keys and values as f32 (exact), f16 (half the state bytes per
    /// step) or q8 (a quarter: i8 times a scale per row); default: what the model file says.
    #[arg(long, value_parser = parse_cache)]
    cache: Option<CacheDtype>,
}

impl CacheArg {
    /// `model` with its sessions' cache dtype set as asked (unchanged if not asked).
    pub fn apply<'m>(&self, model: Model<'m>) -> anyhow::Result<Model<'m>> {
        let int = model.config().has(kvm_core::config::flags::INT_NUMERICS);
        Ok(match self.cache {
            Some(CacheDtype::F16) if int => {
                bail!("--cache f16: a model of the integer numerics keeps attention rows as i16 (f32) or i8 (q8)")
            }
            Some(c) => model.with_cache(c)?,
            None => model,
        })
    }
}

/// What every command that builds sessions takes: the model, its cache dtype, and the
/// state capacity of growable-state models.
#[derive(Debug, clap::Args)]
pub struct SessionArgs {
    #[command(flatten)]
    pub model: ModelArg,
    #[command(flatten)]
    pub cache: CacheArg,
    /// State slots a session holds, from `chunk_len` to the most the model can use
    /// (`kvm info` shows both); fewer keeps a growable-state model's arena smaller, and it
    /// then merges without growing once full. Default: the file's capacity (`kvm bench`:
    /// the slots each run reaches).
    #[arg(long)]
    pub state_slots: Option<usize>,
    /// The numerics the session must compute with: float or int (docs/integer.md). A
    /// file holds one (`kvm info` says which; `kvm-export convert --numerics int` writes
    /// an integer one); asking for the other is an error. Default: the file's.
    #[arg(long, value_name = "float|int", value_parser = ["float", "int"])]
    pub numerics: Option<String>,
}

impl SessionArgs {
    /// The model in `file`, its cache dtype set as asked, in the numerics asked for.
    pub fn model<'f>(&self, file: &'f ModelFile) -> anyhow::Result<Model<'f>> {
        let model = file.model()?;
        let has = numerics_name(&model);
        if let Some(asked) = self.numerics.as_deref().filter(|&n| n != has) {
            bail!(
                "--numerics {asked}: this model file's numerics is {has} (`kvm-export convert --numerics {asked}` \
                 writes a file of the other)"
            );
        }
        self.cache.apply(model)
    }

    /// The state capacity asked for (the file's by default), checked against the model.
    pub fn state_len(&self, model: &Model<'_>) -> anyhow::Result<usize> {
        let Some(n) = self.state_slots else { return Ok(model.header().state_capacity as usize) };
        let cfg = model.config();
        let (min, max) = (cfg.chunk_len as usize, cfg.natural_state_len());
        if n < min {
            bail!("--state-slots {n} is below {min}, this model's chunk_len: the first chunk always enters the state whole");
        }
        if n > max {
            bail!("--state-slots {n} is above {max}, the most state slots this model can ever hold");
        }
        Ok(n)
    }

    /// A zeroed arena for one session of `model` at the asked capacity, and that capacity.
    pub fn arena(&self, model: &Model<'_>) -> anyhow::Result<(Arena, usize)> {
        let state_len = self.state_len(model)?;
        Ok((Arena::try_new(model.arena_len_for(state_len)?)?, state_len))
    }
}

/// A session of `model` holding `state_len` slots in `arena` (from [`SessionArgs::arena`]).
pub fn session<'m, 'a>(model: Model<'m>, arena: &'a mut Arena, state_len: usize) -> anyhow::Result<Session<'m, 'a>> {
    Ok(Session::with_state_len(model, arena.bytes_mut(), state_len)?)
}

/// `"int"` for a model of the integer numerics, else `"float"`.
pub fn numerics_name(model: &Model<'_>) -> &'static str {
    if model.config().has(kvm_core::config::flags::INT_NUMERICS) {
        "int"
    } else {
        "float"
    }
}

fn parse_cache(s: &str) -> Result<CacheDtype, String> {
    CacheDtype::from_name(s).ok_or_else(|| format!("`{s}` is not a cache dtype (f32, f16 or q8)"))
}

/// Name of the matrix kernel tier in use.
pub fn kernel_tier() -> &'static str {
    kvm_core::kernels::tier().name()
}

/// How the float decode tiles stream their rows (`KVM_STREAMING`; by default the CPU's).
pub fn kernel_streaming() -> &'static str {
    kvm_core::kernels::streaming().name()
}

/// A command line clap refuses: one line `kvm: error: ...`, clap's exit code (2); help and
/// the version as clap prints them.
fn usage_error(e: clap::Error) -> ExitCode {
    if !e.use_stderr() || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        e.exit();
    }
    eprintln!("kvm: error: {}", kvm_write::usage::one_line(&e.render().to_string()));
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, which turns a closed pipe (`kvm info | head -1`) into an error
    // on the next print. The default action ends the process quietly, as it does every
    // Unix tool.
    #[cfg(unix)]
    // SAFETY: sets a signal's disposition to the default before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned());
        eprintln!("kvm: internal error: {}", msg.unwrap_or_else(|| "panic".into()));
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    // The best kernels this CPU runs, unless KVM_KERNELS forces a tier.
    if let Err(e) = kvm_core::kernels::init_from_env() {
        eprintln!("kvm: error: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.cmd {
        Cmd::Info { model } => info::run(&model),
        Cmd::Logits(args) => logits::run(&args),
        Cmd::Perplexity(args) => perplexity::run(&args),
        Cmd::Generate(args) => generate::run(&args),
        Cmd::Chat(args) => chat::run(&args),
        Cmd::Tokenize(args) => tokenize::run(&args),
        Cmd::Bench(args) => bench::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvm: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

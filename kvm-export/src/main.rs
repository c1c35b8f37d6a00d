//! `kvm-export`: converts checkpoints into kvm model files.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Context, Result};
use clap::{Parser, Subcommand};
use kvm_core::format::Role;
use kvm_core::quant::DType;
use kvm_export::convert::{convert, Policy, TokenizerSource};

#[derive(Parser)]
#[command(name = "kvm-export", version, about = "Convert KVM checkpoints into kvm model files")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
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
        /// Storage type of weight matrices: f32, f16, bf16, q8_0, q4_0.
        #[arg(long, default_value = "f32")]
        dtype: String,
        /// Per-tensor override, ROLE=DTYPE (roles: embed, lm_head, wq, wk, wv, wo, up, down, vgate1, vgate2, gate); repeatable.
        #[arg(long = "tensor-dtype", value_name = "ROLE=DTYPE")]
        overrides: Vec<String>,
        /// Tokenizer: a tokenizer.json path, or `bytes`. Default: the checkpoint's tokenizer.json if present, else bytes.
        #[arg(long)]
        tokenizer: Option<String>,
        /// Print nothing but errors.
        #[arg(short, long)]
        quiet: bool,
    },
}

fn parse_dtype(s: &str) -> Result<DType> {
    DType::from_name(s).ok_or_else(|| anyhow!("unknown dtype `{s}` (expected f32, f16, bf16, q8_0 or q4_0)"))
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

fn run() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Convert { dir, out, dtype, overrides, tokenizer, quiet } => {
            let overrides = overrides
                .iter()
                .map(|o| {
                    let (r, d) =
                        o.split_once('=').ok_or_else(|| anyhow!("--tensor-dtype wants ROLE=DTYPE, got `{o}`"))?;
                    Ok((parse_role(r)?, parse_dtype(d)?))
                })
                .collect::<Result<Vec<_>>>()?;
            let policy = Policy { dtype: parse_dtype(&dtype)?, overrides };
            let tokenizer = match tokenizer.as_deref() {
                None => TokenizerSource::Auto,
                Some("bytes") => TokenizerSource::Bytes,
                Some(p) => TokenizerSource::Json(PathBuf::from(p)),
            };
            let mut on_tensor = |r: &kvm_export::writer::TensorReport| {
                if !quiet {
                    eprintln!(
                        "  {:<44} {:>5} [{:>6}, {:>6}] rmse {:.3e} max {:.3e}",
                        r.name,
                        r.dtype.name(),
                        r.rows,
                        r.cols,
                        r.rmse,
                        r.max_abs
                    );
                }
            };
            let (_, report) = convert(&dir, &out, &policy, &tokenizer, &mut on_tensor)
                .with_context(|| format!("converting {}", dir.display()))?;
            if !quiet {
                eprintln!(
                    "wrote {} ({} bytes, {} tensors, arena {} bytes, peak tensor memory {} bytes)",
                    out.display(),
                    report.file_len,
                    report.tensors.len(),
                    report.arena_len,
                    report.peak_tensor_bytes
                );
            }
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvm-export: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

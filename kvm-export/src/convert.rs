//! HF checkpoint directory (`config.json` + `model.safetensors` + optional
//! `tokenizer.json`) -> model file.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use kvm_core::cache::CacheDtype;
use kvm_core::config::Config;
use kvm_core::format::{self, Role, TokenizerKind};
use kvm_core::quant::DType;
use kvm_core::tokenizer::Tokenizer;
use safetensors::{Dtype, SafeTensors};

use crate::atomic::same_file;
use crate::writer::{hf_name, write_model, TensorReport, WriteReport};

/// Which tokenizer goes into the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizerSource {
    /// The checkpoint's `tokenizer.json` if present, else bytes.
    Auto,
    /// Byte-level (token id = byte value).
    Bytes,
    /// An HF `tokenizer.json`.
    Json(PathBuf),
}

/// How weights are stored.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Dtype of weight matrices.
    pub dtype: DType,
    /// Per-role overrides (`lm_head=q8_0`), by role.
    pub overrides: Vec<(Role, DType)>,
    /// How sessions store attention rows by default (the header's cache dtype).
    pub cache: CacheDtype,
    /// Store matrices in their dtype's row-interleaved form where it has one and the
    /// shape allows (q4_0 as q4_0x16: the SIMD kernels read it faster). Off for targets
    /// that run the scalar kernels, which read the plain form a little faster.
    pub repack: bool,
}

impl Policy {
    /// Every matrix `dtype` (with the q4_0 exceptions of [`Policy::dtype_for`]), no
    /// overrides, the exact f32 cache, repacked.
    pub fn uniform(dtype: DType) -> Policy {
        Policy { dtype, overrides: vec![], cache: CacheDtype::F32, repack: true }
    }

    /// The dtype a `[rows, cols]` matrix of `role` gets: the override, else the policy
    /// dtype, except that under q4_0 the embedding stays q8_0 (a step reads one row of
    /// it, so that costs bytes on disk only; on tiny-kjv it takes a third off q4_0's loss
    /// in bits per byte); quantized formats fall back to f16 when `cols` is not a whole
    /// number of blocks, f32p to f32 (also where it would not make the rows smaller: 64
    /// columns or fewer). The result is row-interleaved when asked for (`q4_0x16`,
    /// `q8_0x16`, or [`Policy::repack`]) and `rows` is a whole number of groups, else
    /// plain; the embedding, read a row at a time, is interleaved only when its override
    /// names an interleaved dtype.
    pub fn dtype_for(&self, role: Role, rows: u32, cols: u32) -> DType {
        let default = match (role, self.dtype.plain()) {
            (Role::TokEmbed, DType::Q4_0) => DType::Q8_0,
            (Role::TokEmbed, d) => d,
            _ => self.dtype,
        };
        let asked = self.overrides.iter().find(|(r, _)| *r == role).map(|&(_, d)| d).unwrap_or(default);
        let d = asked.plain();
        let bytes = |d: DType| d.row_bytes(cols as usize);
        if d == DType::F32P && !matches!((bytes(d), bytes(DType::F32)), (Some(p), Some(f)) if p < f) {
            return DType::F32;
        }
        if bytes(d).is_none() {
            return DType::F16;
        }
        let repack = self.repack && role != Role::TokEmbed;
        match d.interleaved() {
            Some(x) if (repack || asked == x) && x.matrix_bytes(rows as usize, cols as usize).is_some() => x,
            _ => d,
        }
    }
}

/// The model config of checkpoint `dir`, without converting anything.
///
/// # Errors
/// As [`convert`] for a missing or invalid `config.json` or `model.safetensors`.
pub fn read_config(dir: &Path) -> Result<Config> {
    let json = read_config_json(dir)?;
    let mmap = map_checkpoint(dir)?;
    config_of(dir, &json, &parse_checkpoint(dir, &mmap)?)
}

fn read_config_json(dir: &Path) -> Result<serde_json::Value> {
    let config_path = dir.join("config.json");
    let config_text =
        std::fs::read_to_string(&config_path).with_context(|| format!("reading {}", config_path.display()))?;
    serde_json::from_str(&config_text).with_context(|| format!("parsing {}", config_path.display()))
}

fn map_checkpoint(dir: &Path) -> Result<memmap2::Mmap> {
    let st_path = dir.join("model.safetensors");
    let file = File::open(&st_path).with_context(|| format!("opening {}", st_path.display()))?;
    // SAFETY: the map is read-only and the file is not modified while we convert.
    unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", st_path.display()))
}

fn parse_checkpoint<'m>(dir: &Path, mmap: &'m [u8]) -> Result<SafeTensors<'m>> {
    SafeTensors::deserialize(mmap).with_context(|| format!("parsing {}", dir.join("model.safetensors").display()))
}

/// `config.json` of `dir` (parsed as `config_json`), with the value-gate rank the
/// checkpoint's tensors imply.
fn config_of(dir: &Path, config_json: &serde_json::Value, st: &SafeTensors<'_>) -> Result<Config> {
    let config_path = dir.join("config.json");
    let vgate = format!("transformer.h.0.attn.{}", "v_gate1.weight");
    let d_vgate = st.tensor(&vgate).map(|t| t.shape().first().copied().unwrap_or(0) as u32).unwrap_or(0);
    crate::hf_config::parse(config_json, d_vgate).with_context(|| format!("in {}", config_path.display()))
}

/// Converts `dir` into `out`.
pub fn convert(
    dir: &Path,
    out: &Path,
    policy: &Policy,
    tokenizer: &TokenizerSource,
    on_tensor: &mut dyn FnMut(&TensorReport),
) -> Result<(Config, WriteReport)> {
    let mut inputs = vec![dir.join("config.json"), dir.join("model.safetensors")];
    if let TokenizerSource::Json(p) = tokenizer {
        inputs.push(p.clone());
    } else if *tokenizer == TokenizerSource::Auto {
        inputs.push(dir.join("tokenizer.json"));
    }
    if let Some(input) = inputs.iter().find(|i| same_file(out, i)) {
        bail!("the output {} is the input {}: write the model somewhere else", out.display(), input.display());
    }
    let json = read_config_json(dir)?;
    let mmap = map_checkpoint(dir)?;
    let st = parse_checkpoint(dir, &mmap)?;
    let st_path = dir.join("model.safetensors");
    let cfg = config_of(dir, &json, &st)?;

    // Every tensor the file holds must be one the config explains.
    let expected: BTreeSet<String> = format::canonical_tensors(&cfg).map(|(r, l)| hf_name(r, l)).collect();
    for name in st.names() {
        // x_v exists (as zeros) in value-residual checkpoints without token shift.
        let harmless = name.ends_with(".attn.x_v") && !expected.contains(name);
        if !expected.contains(name) && !harmless {
            bail!("{}: unexpected tensor `{name}` for this config", st_path.display());
        }
    }

    let (kind, section) = tokenizer_section(dir, tokenizer, cfg.vocab_len)?;
    let st_name = st_path.display().to_string();
    let mut source = |role: Role, layer: u16, rows: u32, cols: u32| -> Result<Vec<f32>> {
        let name = hf_name(role, layer);
        let t = st.tensor(&name).map_err(|_| anyhow!("{st_name}: missing tensor `{name}`"))?;
        let numel: usize = t.shape().iter().product();
        if numel != rows as usize * cols as usize || t.shape().iter().filter(|&&d| d != 1).count() > 2 {
            bail!("{st_name}: tensor `{name}` has shape {:?}, expected [{rows}, {cols}]", t.shape());
        }
        if t.shape().len() == 2 && (t.shape()[0], t.shape()[1]) != (rows as usize, cols as usize) {
            bail!("{st_name}: tensor `{name}` has shape {:?}, expected [{rows}, {cols}]", t.shape());
        }
        to_f32(t.dtype(), t.data()).with_context(|| format!("{st_name}: tensor `{name}`"))
    };
    let dtype_for = |role: Role, rows: u32, cols: u32| policy.dtype_for(role, rows, cols);
    let report = write_model(out, &cfg, (kind, &section), policy.cache, &dtype_for, &mut source, on_tensor)?;
    Ok((cfg, report))
}

/// Decodes little-endian f32/f16/bf16 tensor bytes.
fn to_f32(dtype: Dtype, data: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::F16 => data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::BF16 => data.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        other => bail!("dtype {other:?} is not supported (expected F32, F16 or BF16)"),
    })
}

/// The tokenizer section for a model of `vocab_len` tokens, refusing a tokenizer with
/// more (another model's).
fn tokenizer_section(dir: &Path, src: &TokenizerSource, vocab_len: u32) -> Result<(TokenizerKind, Vec<u8>)> {
    let json_path = match src {
        TokenizerSource::Bytes => return Ok((TokenizerKind::Bytes, Vec::new())),
        TokenizerSource::Json(p) => p.clone(),
        TokenizerSource::Auto => {
            let p = dir.join("tokenizer.json");
            if !p.exists() {
                return Ok((TokenizerKind::Bytes, Vec::new()));
            }
            p
        }
    };
    let text = std::fs::read_to_string(&json_path).with_context(|| format!("reading {}", json_path.display()))?;
    let section = crate::tokenizer::build_section(&text).with_context(|| format!("in {}", json_path.display()))?;
    let n = Tokenizer::from_bytes(&section).map_err(|e| anyhow!("{}: {e}", json_path.display()))?.vocab_len();
    if n > vocab_len {
        bail!(
            "{} has {n} tokens but the model's vocab_size is {vocab_len}: it is another model's tokenizer",
            json_path.display()
        );
    }
    Ok((TokenizerKind::Bpe, section))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_packs_f32_where_the_columns_are_whole_blocks_and_rows_shrink() {
        let p = Policy::uniform(DType::F32P);
        assert_eq!(p.dtype_for(Role::Wq, 768, 768), DType::F32P);
        assert_eq!(p.dtype_for(Role::TokEmbed, 50304, 768), DType::F32P);
        assert_eq!(p.dtype_for(Role::Wq, 768, 100), DType::F32);
        // A row of 64: 264 bytes packed (two blocks and a head of 40) against 256.
        assert_eq!(p.dtype_for(Role::Wq, 64, 64), DType::F32);
        assert_eq!(p.dtype_for(Role::Wq, 64, 96), DType::F32P);
    }

    #[test]
    fn policy_keeps_q4_0_edges_at_q8_0_and_interleaves_whole_row_groups() {
        let q4 = Policy::uniform(DType::Q4_0);
        assert_eq!(q4.dtype_for(Role::Wq, 768, 768), DType::Q4_0x16);
        assert_eq!(q4.dtype_for(Role::TokEmbed, 50304, 768), DType::Q8_0);
        assert_eq!(q4.dtype_for(Role::LmHead, 50304, 768), DType::Q4_0x16);
        // Rows that are not whole groups of 16 stay row-major; columns that are not whole
        // blocks fall back to f16.
        assert_eq!(q4.dtype_for(Role::MergeGate, 6, 768), DType::Q4_0);
        assert_eq!(q4.dtype_for(Role::Wq, 768, 100), DType::F16);
        let plain = Policy { repack: false, ..Policy::uniform(DType::Q4_0) };
        assert_eq!(plain.dtype_for(Role::Wq, 768, 768), DType::Q4_0);
        // Asking for q4_0x16 by name interleaves even without `repack`, where it can.
        let named = Policy { repack: false, ..Policy::uniform(DType::Q4_0x16) };
        assert_eq!(named.dtype_for(Role::Wq, 768, 768), DType::Q4_0x16);
        assert_eq!(named.dtype_for(Role::MergeGate, 6, 768), DType::Q4_0);
        assert_eq!(named.dtype_for(Role::TokEmbed, 50304, 768), DType::Q8_0);
        let head = Policy { overrides: vec![(Role::LmHead, DType::Q4_0)], ..Policy::uniform(DType::Q8_0) };
        assert_eq!(head.dtype_for(Role::LmHead, 50304, 768), DType::Q4_0x16);
        assert_eq!(head.dtype_for(Role::Wq, 768, 768), DType::Q8_0x16);
    }

    #[test]
    fn policy_interleaves_q8_0_but_the_embedding() {
        let q8 = Policy::uniform(DType::Q8_0);
        assert_eq!(q8.dtype_for(Role::Wq, 768, 768), DType::Q8_0x16);
        assert_eq!(q8.dtype_for(Role::LmHead, 50304, 768), DType::Q8_0x16);
        assert_eq!(q8.dtype_for(Role::TokEmbed, 50304, 768), DType::Q8_0);
        assert_eq!(Policy::uniform(DType::Q8_0x16).dtype_for(Role::TokEmbed, 50304, 768), DType::Q8_0);
        let named = Policy { overrides: vec![(Role::TokEmbed, DType::Q8_0x16)], ..Policy::uniform(DType::Q8_0) };
        assert_eq!(named.dtype_for(Role::TokEmbed, 50304, 768), DType::Q8_0x16);
        let plain = Policy { repack: false, ..Policy::uniform(DType::Q8_0) };
        assert_eq!(plain.dtype_for(Role::Wq, 768, 768), DType::Q8_0);
        assert_eq!(plain.dtype_for(Role::MergeGate, 6, 768), DType::Q8_0);
    }
}

//! HF checkpoint directory (`config.json` + `model.safetensors` + optional
//! `tokenizer.json`) -> model file.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use kvm_core::config::Config;
use kvm_core::format::{self, Role, TokenizerKind};
use kvm_core::tokenizer::Tokenizer;
use safetensors::{Dtype, SafeTensors};

use kvm_write::atomic::AtomicFile;
use kvm_write::policy::Policy;
use kvm_write::writer::{hf_name, write_model, TensorReport, WriteReport};

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

/// The model config of checkpoint `dir` (a growable state with room for `context`
/// tokens), without converting anything.
///
/// # Errors
/// As [`convert`] for a missing or invalid `config.json` or `model.safetensors`.
pub fn read_config(dir: &Path, context: usize) -> Result<Config> {
    let json = read_config_json(dir)?;
    let mmap = map_checkpoint(dir)?;
    config_of(dir, &json, &parse_checkpoint(dir, &mmap)?, context)
}

fn read_config_json(dir: &Path) -> Result<serde_json::Value> {
    let config_path = dir.join("config.json");
    let config_text = kvm_write::input::read_to_string(&config_path)?;
    serde_json::from_str(&config_text).with_context(|| format!("parsing {}", config_path.display()))
}

fn map_checkpoint(dir: &Path) -> Result<memmap2::Mmap> {
    let st_path = dir.join("model.safetensors");
    let file = kvm_write::input::open(&st_path)?;
    // SAFETY: the map is read-only and the file is not modified while we convert.
    unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", st_path.display()))
}

fn parse_checkpoint<'m>(dir: &Path, mmap: &'m [u8]) -> Result<SafeTensors<'m>> {
    let path = dir.join("model.safetensors");
    let st = SafeTensors::deserialize(mmap).with_context(|| format!("parsing {}", path.display()))?;
    // The parser keeps one of two entries of a name; which one the file meant, nobody knows.
    if let Some(name) = duplicate_name(mmap) {
        bail!("{}: the tensor `{name}` is listed twice", path.display());
    }
    Ok(st)
}

/// A name that a safetensors file's header (the JSON object after its 8-byte length)
/// lists twice, if any. `None` also for a header that does not parse, which the
/// safetensors parser has refused by then.
fn duplicate_name(file: &[u8]) -> Option<String> {
    let len = usize::try_from(u64::from_le_bytes(file.get(..8)?.try_into().ok()?)).ok()?;
    let header = file.get(8..8usize.checked_add(len)?)?;
    let Keys(mut names) = serde_json::from_slice(header).ok()?;
    names.sort_unstable();
    names.windows(2).find(|w| w[0] == w[1]).map(|w| w[0].clone())
}

/// The keys of a JSON object, as written (repeats kept), values skipped.
struct Keys(Vec<String>);

impl<'de> serde::Deserialize<'de> for Keys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Keys, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Keys;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<Keys, A::Error> {
                let mut keys = Vec::new();
                while let Some((k, serde::de::IgnoredAny)) = map.next_entry::<String, serde::de::IgnoredAny>()? {
                    keys.push(k);
                }
                Ok(Keys(keys))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// `config.json` of `dir` (parsed as `config_json`), with the value-gate rank the
/// checkpoint's tensors imply and room for `context` tokens.
fn config_of(dir: &Path, config_json: &serde_json::Value, st: &SafeTensors<'_>, context: usize) -> Result<Config> {
    let config_path = dir.join("config.json");
    let vgate = format!("transformer.h.0.attn.{}", "v_gate1.weight");
    // A rank past u32 is kept past every bound (u32::MAX), so the config refuses it.
    let rank = |t: safetensors::tensor::TensorView<'_>| u32::try_from(t.shape().first().copied().unwrap_or(0));
    let d_vgate = st.tensor(&vgate).map(|t| rank(t).unwrap_or(u32::MAX)).unwrap_or(0);
    crate::hf_config::parse(config_json, d_vgate, context).with_context(|| format!("in {}", config_path.display()))
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
    let inputs: Vec<&Path> = inputs.iter().map(PathBuf::as_path).collect();
    let file = AtomicFile::create(out, &inputs).with_context(|| format!("creating {}", out.display()))?;
    let json = read_config_json(dir)?;
    let mmap = map_checkpoint(dir)?;
    let st = parse_checkpoint(dir, &mmap)?;
    let st_path = dir.join("model.safetensors");
    let cfg = policy.config(config_of(dir, &json, &st, policy.max_context)?);

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
    // A config that names a tokenizer without its file would silently become byte-level.
    let declared = json.get("tokenizer").filter(|v| !v.is_null() && v.as_str() != Some("bytes"));
    if let (TokenizerKind::Bytes, TokenizerSource::Auto, Some(v)) = (kind, tokenizer, declared) {
        bail!(
            "config field `tokenizer` is {v}, but {} has no tokenizer.json: add it, or give --tokenizer (a file, or bytes)",
            dir.display()
        );
    }
    let st_name = st_path.display().to_string();
    let mut source = |role: Role, layer: u16, rows: u32, cols: u32| -> Result<Vec<f32>> {
        let name = hf_name(role, layer);
        let t = st.tensor(&name).map_err(|_| anyhow!("{st_name}: missing tensor `{name}`"))?;
        // The shapes with their 1s dropped (`[1, 1, d]` is a vector of d) must be the same:
        // the element count alone would take a matrix stored flat, or transposed.
        let squeeze = |dims: &[usize]| dims.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
        if squeeze(t.shape()) != squeeze(&[rows as usize, cols as usize]) {
            bail!("{st_name}: tensor `{name}` has shape {:?}, expected [{rows}, {cols}]", t.shape());
        }
        to_f32(t.dtype(), t.data()).with_context(|| format!("{st_name}: tensor `{name}`"))
    };
    let dtype_for = |role: Role, rows: u32, cols: u32| policy.dtype_for(role, rows, cols);
    let report =
        write_model(file, &cfg, (kind, &section), (policy.cache, policy.reads), &dtype_for, &mut source, on_tensor)?;
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
    let text = kvm_write::input::read_to_string(&json_path)?;
    let section = kvm_write::tokenizer::build_section(&text).with_context(|| format!("in {}", json_path.display()))?;
    let n = Tokenizer::from_bytes(&section).map_err(|e| anyhow!("{}: {e}", json_path.display()))?.vocab_len();
    if n > vocab_len {
        bail!(
            "{} has {n} tokens but the model's vocab_size is {vocab_len}: it is another model's tokenizer",
            json_path.display()
        );
    }
    Ok((TokenizerKind::Bpe, section))
}

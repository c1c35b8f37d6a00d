//! `kvm logits`: every position's logits for a token sequence, as float32 .npy.

use std::io::BufWriter;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use kvm_core::state::Phase;
use kvm_core::Session;
use kvm_runtime::arena::Arena;
use kvm_runtime::pool::{default_threads, Pool};
use kvm_runtime::prefill::prefill;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: crate::ModelArg,
    #[command(flatten)]
    cache: crate::CacheArg,
    /// Comma-separated token ids.
    #[arg(long, conflicts_with = "tokens_file", required_unless_present = "tokens_file")]
    tokens: Option<String>,
    /// A file of token ids (separated by commas, whitespace or JSON brackets).
    #[arg(long)]
    tokens_file: Option<PathBuf>,
    /// The first P tokens are the prompt (prefill); the rest are decoded one at a time.
    #[arg(long)]
    prompt_len: usize,
    /// Output .npy, shape [T, vocab_len].
    #[arg(long)]
    out: PathBuf,
    /// Worker threads for the prompt's matrix products (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// Parses token ids from text: any run of digits is an id; `,`, whitespace, `[` and `]`
/// separate them; anything else is an error.
pub fn parse_ids(text: &str) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for part in text.split(|c: char| c == ',' || c == '[' || c == ']' || c.is_whitespace()) {
        if part.is_empty() {
            continue;
        }
        ids.push(part.parse::<u32>().with_context(|| format!("`{part}` is not a token id"))?);
    }
    Ok(ids)
}

pub fn run(a: &Args) -> Result<()> {
    let ids = match (&a.tokens, &a.tokens_file) {
        (Some(t), _) => parse_ids(t)?,
        (None, Some(f)) => parse_ids(&std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?)?,
        (None, None) => bail!("give --tokens or --tokens-file"),
    };
    if ids.is_empty() {
        bail!("no tokens given");
    }
    if a.prompt_len > ids.len() {
        bail!("--prompt-len {} exceeds the {} tokens given", a.prompt_len, ids.len());
    }
    let file = a.model.open()?;
    let model = a.cache.apply(file.model()?)?;
    let vocab = model.config().vocab_len as usize;
    let mut arena = Arena::new(model.arena_len());
    let mut session = Session::new(model, arena.bytes_mut())?;
    let pool = Pool::new(a.threads.unwrap_or_else(default_threads))?;
    let (prompt, rest) = ids.split_at(a.prompt_len);
    let mut out = Vec::with_capacity(ids.len() * vocab);
    if !prompt.is_empty() {
        out = prefill(&mut session, prompt, Phase::Prefill, &pool, true).context("prompt")?;
    }
    for (t, &id) in rest.iter().enumerate() {
        session.decode_with(id, &pool).map(|_| ()).with_context(|| format!("token {}", a.prompt_len + t))?;
        out.extend_from_slice(session.logits());
    }
    let f = std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    kvm_runtime::npy::write_f32(BufWriter::new(f), &[ids.len(), vocab], &out)
        .with_context(|| format!("writing {}", a.out.display()))?;
    Ok(())
}

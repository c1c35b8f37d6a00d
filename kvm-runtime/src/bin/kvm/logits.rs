//! `kvm logits`: every position's logits for a token sequence, as float32 .npy.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use kvm_core::state::Phase;
use kvm_core::Session;
use kvm_runtime::arena::Arena;
use kvm_runtime::pool::{default_threads, Pool};
use kvm_runtime::prefill::prefill_rows;
use kvm_write::atomic::AtomicFile;

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

/// Parses token ids from text: ids are runs of digits separated by `,` or whitespace
/// (`[` and `]` count as whitespace, for JSON lists); two commas with no id between them,
/// or anything else, is an error.
pub fn parse_ids(text: &str) -> Result<Vec<u32>> {
    let text = text.replace(['[', ']'], " ");
    let pieces: Vec<&str> = text.split(',').collect();
    let mut ids = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        let before = ids.len();
        for word in piece.split_whitespace() {
            ids.push(word.parse::<u32>().with_context(|| format!("`{word}` is not a token id"))?);
        }
        if ids.len() == before && pieces.len() > 1 {
            let at = if i == 0 { "before the first comma".to_string() } else { format!("after comma {i}") };
            bail!("no token id {at}");
        }
    }
    Ok(ids)
}

pub fn run(a: &Args) -> Result<()> {
    let ids = match (&a.tokens, &a.tokens_file) {
        (Some(t), _) => parse_ids(t).context("--tokens")?,
        (None, Some(f)) => {
            let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            parse_ids(&text).with_context(|| format!("in {}", f.display()))?
        }
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
    if let Some(pos) = ids.iter().position(|&t| t as usize >= vocab) {
        bail!("the token at position {pos}, {}, is out of range: the vocabulary has {vocab} tokens", ids[pos]);
    }
    let mut arena = Arena::new(model.arena_len());
    let mut session = Session::new(model, arena.bytes_mut())?;
    let pool = Pool::new(a.threads.unwrap_or_else(default_threads))?;
    let (prompt, rest) = ids.split_at(a.prompt_len);
    // Rows go to the file as they come, so memory stays a batch of logits whatever the
    // length; the file appears only once complete.
    let mut file = AtomicFile::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut w = BufWriter::new(file.file());
    let writing = || format!("writing {}", a.out.display());
    kvm_runtime::npy::write_header(&mut w, &[ids.len(), vocab]).with_context(writing)?;
    if !prompt.is_empty() {
        let mut rows = |rows: &[f32]| kvm_runtime::npy::write_values(&mut w, rows).with_context(writing);
        prefill_rows(&mut session, prompt, Phase::Prefill, &pool, &mut rows).context("prompt")?;
    }
    for (t, &id) in rest.iter().enumerate() {
        let logits =
            session.decode_with(id, &pool).with_context(|| format!("decoding position {}", a.prompt_len + t))?;
        kvm_runtime::npy::write_values(&mut w, logits).with_context(writing)?;
    }
    w.flush().with_context(writing)?;
    drop(w);
    file.commit()
}

//! `kvm logits`: every position's logits for a token sequence, as float32 .npy.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use kvm_core::state::Phase;
use kvm_runtime::pool::Pool;
use kvm_runtime::prefill::prefill_rows;
use kvm_write::atomic::AtomicFile;

use crate::prompt::{encode, PromptArg};

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["tokens", "tokens_file", "prompt", "prompt_file"])))]
pub struct Args {
    #[command(flatten)]
    session: crate::SessionArgs,
    /// Comma-separated token ids.
    #[arg(long)]
    tokens: Option<String>,
    /// A file of token ids (separated by commas, whitespace or JSON brackets).
    #[arg(long)]
    tokens_file: Option<PathBuf>,
    /// Or a text, encoded with the model's tokenizer.
    #[command(flatten)]
    text: PromptArg,
    /// The first P tokens are the prompt (prefill); the rest are decoded one at a time.
    /// Default: all of them.
    #[arg(long)]
    prompt_len: Option<usize>,
    /// Output .npy, shape [T, vocab_len].
    #[arg(long)]
    out: PathBuf,
    /// Worker threads for the prompt's matrix products, in [1, 256] (default: all cores, at most 256).
    #[arg(long, value_parser = crate::flags::threads())]
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
    let file = a.session.model.open()?;
    let model = a.session.model(&file)?;
    let ids = match (&a.tokens, &a.tokens_file, a.text.bytes()?) {
        (Some(t), _, _) => parse_ids(t).context("--tokens")?,
        (None, Some(f), _) => {
            let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            parse_ids(&text).with_context(|| format!("in {}", f.display()))?
        }
        (None, None, Some(text)) => encode(&model, &text)?,
        (None, None, None) => bail!("give --tokens, --tokens-file, --prompt or --prompt-file"),
    };
    if ids.is_empty() {
        bail!("no tokens given");
    }
    let prompt_len = a.prompt_len.unwrap_or(ids.len());
    if prompt_len > ids.len() {
        bail!("--prompt-len {prompt_len} exceeds the {} tokens given", ids.len());
    }
    let vocab = model.config().vocab_len as usize;
    if let Some(pos) = ids.iter().position(|&t| t as usize >= vocab) {
        bail!("the token at position {pos}, {}, is out of range: the vocabulary has {vocab} tokens", ids[pos]);
    }
    let (mut arena, state_len) = a.session.arena(&model)?;
    let mut session = crate::session(model, &mut arena, state_len)?;
    let pool = Pool::new(crate::flags::threads_or_all(a.threads))?;
    let (prompt, rest) = ids.split_at(prompt_len);
    // Rows go to the file as they come, so memory stays a batch of logits whatever the
    // length; the file appears only once complete.
    let inputs = [Some(a.session.model.path()), a.tokens_file.as_deref(), a.text.file()];
    let inputs: Vec<&Path> = inputs.into_iter().flatten().collect();
    let mut file = AtomicFile::create(&a.out, &inputs).with_context(|| format!("creating {}", a.out.display()))?;
    let mut w = BufWriter::new(file.file());
    let writing = || format!("writing {}", a.out.display());
    kvm_runtime::npy::write_header(&mut w, &[ids.len(), vocab]).with_context(writing)?;
    if !prompt.is_empty() {
        let mut rows = |rows: &[f32]| kvm_runtime::npy::write_values(&mut w, rows).with_context(writing);
        prefill_rows(&mut session, prompt, Phase::Prefill, &pool, &mut rows).context("prompt")?;
    }
    for (t, &id) in rest.iter().enumerate() {
        let logits = session.decode_with(id, &pool).with_context(|| format!("decoding position {}", prompt_len + t))?;
        kvm_runtime::npy::write_values(&mut w, logits).with_context(writing)?;
    }
    w.flush().with_context(writing)?;
    drop(w);
    file.commit()
}

//! Prompts: from the command line, a file or stdin, of any length; encoded with the
//! model's tokenizer and prefilled in pieces, with a progress line for long ones.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use kvm_core::format::TokenizerKind;
use kvm_core::state::Phase;
use kvm_core::{Model, Session};
use kvm_runtime::pool::Pool;
use kvm_runtime::prefill::{prefill, BATCH_TOKENS};

/// `--prompt TEXT|-` or `--prompt-file F`.
#[derive(Debug, clap::Args)]
pub struct PromptArg {
    /// The text to continue (it may start with `-`); `-` reads it from stdin.
    #[arg(long, allow_hyphen_values = true, conflicts_with = "prompt_file")]
    prompt: Option<String>,
    /// Read the prompt from this file: any length, any bytes for a byte-level model.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
}

impl PromptArg {
    /// The prompt's bytes, or `None` when neither flag was given.
    pub fn bytes(&self) -> Result<Option<Vec<u8>>> {
        match (&self.prompt, &self.prompt_file) {
            (Some(p), _) => read_text(p, None).map(Some),
            (None, Some(f)) => read_text("", Some(f)).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// The prompt file, if the prompt comes from one.
    pub fn file(&self) -> Option<&Path> {
        self.prompt_file.as_deref()
    }
}

/// `text` itself, all of stdin if `text` is `-`, or the file `file` if given.
pub fn read_text(text: &str, file: Option<&Path>) -> Result<Vec<u8>> {
    if let Some(f) = file {
        return std::fs::read(f).with_context(|| format!("reading {}", f.display()));
    }
    if text == "-" {
        let mut buf = Vec::new();
        std::io::stdin().lock().read_to_end(&mut buf).context("reading the prompt from stdin")?;
        return Ok(buf);
    }
    Ok(text.as_bytes().to_vec())
}

/// The ids of `bytes` for `model`: the bytes themselves for a byte-level model (any bytes
/// are text to it), the BPE encoding of the UTF-8 text otherwise.
pub fn encode(model: &Model<'_>, bytes: &[u8]) -> Result<Vec<u32>> {
    match model.header().tokenizer_kind {
        TokenizerKind::Bytes => Ok(bytes.iter().map(|&b| u32::from(b)).collect()),
        TokenizerKind::Bpe => {
            let text = std::str::from_utf8(bytes)
                .map_err(|e| anyhow!("the text is not UTF-8 ({e}), which this model's BPE tokenizer needs"))?;
            crate::tokens::encode(&model.tokenizer(), text)
        }
    }
}

/// Prompt tokens fed per progress update: whole batches, so the batches (and so the
/// results) are the same as one [`prefill`] of the whole prompt.
const PIECE_TOKENS: usize = 16 * BATCH_TOKENS;

/// [`prefill`] of `ids`, a piece at a time; for prompts of several pieces, a progress line
/// on stderr when it is a terminal (cleared when done).
pub fn prefill_with_progress(session: &mut Session<'_, '_>, ids: &[u32], phase: Phase, pool: &Pool) -> Result<()> {
    if ids.is_empty() {
        bail!("no tokens to prefill");
    }
    let show = ids.len() > 2 * PIECE_TOKENS && std::io::stderr().is_terminal();
    let t0 = Instant::now();
    let mut done = 0;
    for piece in ids.chunks(PIECE_TOKENS) {
        prefill(session, piece, phase, pool).with_context(|| format!("prompt, after {done} tokens"))?;
        done += piece.len();
        if show {
            let rate = done as f64 / t0.elapsed().as_secs_f64().max(1e-9);
            eprint!("\rprompt: {done}/{} tokens, {rate:.0} tok/s", ids.len());
            std::io::stderr().flush().ok();
        }
    }
    if show {
        eprint!("\r\x1b[2K");
    }
    Ok(())
}

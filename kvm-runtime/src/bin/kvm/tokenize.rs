//! `kvm tokenize`: the ids a model (or a tokenizer.json) gives a text.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Result};
use kvm_core::tokenizer::Tokenizer;
use kvm_runtime::file::{ModelFile, Pages};

#[derive(clap::Args)]
pub struct Args {
    /// Use this model's tokenizer.
    #[arg(long, conflicts_with = "tokenizer", required_unless_present = "tokenizer")]
    model: Option<PathBuf>,
    /// Use an HF tokenizer.json.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Print {"ids": [...]}.
    #[arg(long)]
    json: bool,
    /// The text; `-` reads it from stdin.
    #[arg(allow_hyphen_values = true, conflicts_with = "prompt_file", required_unless_present = "prompt_file")]
    text: Option<String>,
    /// Read the text from this file.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
}

pub fn run(a: &Args) -> Result<()> {
    let text = crate::prompt::read_text(a.text.as_deref().unwrap_or(""), a.prompt_file.as_deref())?;
    let ids = match (&a.model, &a.tokenizer) {
        (Some(m), _) => {
            let file = ModelFile::open(m, Pages::Mapped)?;
            crate::prompt::encode(&file.model()?, &text)?
        }
        (None, Some(t)) => {
            let text = std::str::from_utf8(&text).map_err(|e| anyhow::anyhow!("the text is not UTF-8 ({e})"))?;
            let json = kvm_write::input::read_to_string(t)?;
            let section = kvm_write::tokenizer::build_section(&json)?;
            let tok = Tokenizer::from_bytes(&section).map_err(|e| anyhow::anyhow!("{}: {e}", t.display()))?;
            crate::tokens::encode(&tok, text)?
        }
        (None, None) => bail!("give --model or --tokenizer"),
    };
    // Written as they are formatted: the text and its ids are all this command holds.
    let mut out = BufWriter::new(std::io::stdout().lock());
    let sep: &[u8] = if a.json { b"," } else { b" " };
    if a.json {
        out.write_all(b"{\"ids\":[")?;
    }
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.write_all(sep)?;
        }
        write!(out, "{id}")?;
    }
    if a.json {
        out.write_all(b"]}")?;
    }
    writeln!(out)?;
    Ok(out.flush()?)
}

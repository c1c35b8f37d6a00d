//! Placeholder until the tokenizer branch lands.
use anyhow::{bail, Result};

/// Builds the tokenizer section from an HF `tokenizer.json`.
pub fn build_section(_json: &str) -> Result<Vec<u8>> {
    bail!("BPE tokenizers are not supported yet")
}

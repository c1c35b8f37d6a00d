//! Text <-> token ids with the model's own tokenizer.

use anyhow::{anyhow, Result};
use kvm_core::tokenizer::Tokenizer;

/// Encodes `text`, growing the id buffer as the tokenizer asks.
pub fn encode(tok: &Tokenizer<'_>, text: &str) -> Result<Vec<u32>> {
    let mut ids = vec![0u32; text.len() + 1];
    loop {
        match tok.encode(text, &mut ids) {
            Ok(n) => {
                ids.truncate(n);
                return Ok(ids);
            }
            Err(kvm_core::Error::BufferTooSmall { needed }) if needed > ids.len() => ids.resize(needed, 0),
            Err(e) => return Err(anyhow!("cannot encode the text: {e}")),
        }
    }
}

//! Text <-> token ids with the model's own tokenizer.

use anyhow::{bail, Result};
use kvm_core::format::TokenizerKind;
use kvm_core::Model;

/// Encodes `text` with the model's tokenizer.
pub fn encode(model: &Model<'_>, text: &str) -> Result<Vec<u32>> {
    match model.header().tokenizer_kind {
        TokenizerKind::Bytes => {
            let vocab = model.config().vocab_len;
            text.bytes()
                .map(|b| {
                    if (b as u32) < vocab {
                        Ok(b as u32)
                    } else {
                        bail!("byte {b} is outside the vocabulary ({vocab})")
                    }
                })
                .collect()
        }
        TokenizerKind::Bpe => bail!("BPE tokenizers are not supported yet"),
    }
}

/// Bytes of text token `id` stands for.
pub fn token_text_len(model: &Model<'_>, id: u32) -> usize {
    match model.header().tokenizer_kind {
        TokenizerKind::Bytes => 1,
        TokenizerKind::Bpe => {
            let _ = id;
            0
        }
    }
}

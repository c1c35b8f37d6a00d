//! Tokenizers stored in the model blob: byte-level, and GPT-2 byte-level BPE.

use crate::error::{Error, Result};
use crate::format::TokenizerKind;

/// Checks a model's tokenizer section.
///
/// # Errors
/// [`Error::BadTokenizer`].
pub fn validate_section(kind: TokenizerKind, section: &[u8], _vocab_len: u32) -> Result<()> {
    match kind {
        TokenizerKind::Bytes if section.is_empty() => Ok(()),
        TokenizerKind::Bpe if !section.is_empty() => Ok(()),
        _ => Err(Error::BadTokenizer),
    }
}

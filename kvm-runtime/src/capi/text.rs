//! Text <-> token ids for the C API, into caller buffers, with the model's own tokenizer
//! (`kvm_core::tokenizer`): byte-level or GPT-2 byte-level BPE.

use core::mem::MaybeUninit;

use kvm_core::format::TokenizerKind;
use kvm_core::{Error, Model};

use super::kvm_status;

/// Encodes `text` into `out`; returns how many ids it wrote.
///
/// # Errors
/// `KVM_ERR_BUFFER_TOO_SMALL` with the count needed (nothing written);
/// `KVM_ERR_TOKEN_OUT_OF_RANGE` if a byte is not in the vocabulary;
/// `KVM_ERR_UNSUPPORTED` for tokenizers this build cannot run yet.
pub(crate) fn encode(
    model: &Model<'_>,
    text: &[u8],
    out: &mut [MaybeUninit<u32>],
) -> Result<usize, (kvm_status, usize)> {
    let tok = model.tokenizer();
    match model.header().tokenizer_kind {
        // Any bytes are text to a byte-level model, UTF-8 or not.
        TokenizerKind::Bytes => {
            let vocab_len = model.config().vocab_len;
            if text.iter().any(|&b| u32::from(b) >= vocab_len) {
                return Err((kvm_status::KVM_ERR_TOKEN_OUT_OF_RANGE, 0));
            }
            let out = out.get_mut(..text.len()).ok_or((kvm_status::KVM_ERR_BUFFER_TOO_SMALL, text.len()))?;
            for (o, &b) in out.iter_mut().zip(text) {
                o.write(u32::from(b));
            }
            Ok(text.len())
        }
        TokenizerKind::Bpe => {
            let text = core::str::from_utf8(text).map_err(|_| (kvm_status::KVM_ERR_INVALID_ARGUMENT, 0))?;
            for o in out.iter_mut() {
                o.write(0);
            }
            // SAFETY: every element was initialised just above; u32 and MaybeUninit<u32>
            // have the same layout.
            let ids = unsafe { core::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u32>(), out.len()) };
            tok.encode(text, ids).map_err(|e| match e {
                Error::BufferTooSmall { needed } => (kvm_status::KVM_ERR_BUFFER_TOO_SMALL, needed),
                other => (kvm_status::from(other), 0),
            })
        }
    }
}

/// The bytes of token `id`.
///
/// # Errors
/// `KVM_ERR_TOKEN_OUT_OF_RANGE`, `KVM_ERR_UNSUPPORTED` as [`encode`].
pub(crate) fn piece<'m>(model: &Model<'m>, id: u32) -> Result<&'m [u8], kvm_status> {
    if id >= model.config().vocab_len {
        return Err(kvm_status::KVM_ERR_TOKEN_OUT_OF_RANGE);
    }
    // Ids past the tokenizer's own vocabulary (a model's padding) have no text.
    Ok(model.tokenizer().token_bytes(id).unwrap_or(&[]))
}

/// Decodes `ids` into `out`; returns how many bytes it wrote.
///
/// # Errors
/// `KVM_ERR_BUFFER_TOO_SMALL` with the byte count needed (`out` partly written); as
/// [`piece`].
pub(crate) fn decode(
    model: &Model<'_>,
    ids: &[u32],
    out: &mut [MaybeUninit<u8>],
) -> Result<usize, (kvm_status, usize)> {
    let mut needed = 0usize;
    for &id in ids {
        needed = needed.saturating_add(piece(model, id).map_err(|e| (e, 0))?.len());
    }
    let out = out.get_mut(..needed).ok_or((kvm_status::KVM_ERR_BUFFER_TOO_SMALL, needed))?;
    let mut at = 0;
    for &id in ids {
        let p = piece(model, id).map_err(|e| (e, 0))?;
        for (o, &b) in out[at..at + p.len()].iter_mut().zip(p) {
            o.write(b);
        }
        at += p.len();
    }
    Ok(needed)
}

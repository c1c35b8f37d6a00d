//! Text <-> token ids for the C API, into caller buffers.
//!
//! issue #5: `encode`, `decode` and `piece` are the only places the C API touches a
//! tokenizer. They know byte-level models (token id = byte value) only; switch their
//! bodies to `kvm_core::tokenizer` when the GPT-2 tokenizer lands, and BPE models work
//! through every C function unchanged.

use core::mem::MaybeUninit;

use kvm_core::format::TokenizerKind;
use kvm_core::Model;

use super::kvm_status;

/// Every byte value, so a byte-level token's text can be a `'static` slice.
static BYTES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = i as u8;
        i += 1;
    }
    t
};

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
    match model.header().tokenizer_kind {
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
        TokenizerKind::Bpe => Err((kvm_status::KVM_ERR_UNSUPPORTED, 0)),
    }
}

/// The bytes of token `id`.
///
/// # Errors
/// `KVM_ERR_TOKEN_OUT_OF_RANGE`, `KVM_ERR_UNSUPPORTED` as [`encode`].
pub(crate) fn piece<'m>(model: &Model<'m>, id: u32) -> Result<&'m [u8], kvm_status> {
    match model.header().tokenizer_kind {
        TokenizerKind::Bytes => {
            if id >= model.config().vocab_len {
                return Err(kvm_status::KVM_ERR_TOKEN_OUT_OF_RANGE);
            }
            // A byte-level vocabulary larger than 256 has ids with no text.
            BYTES.get(id as usize..id as usize + 1).ok_or(kvm_status::KVM_ERR_TOKEN_OUT_OF_RANGE)
        }
        TokenizerKind::Bpe => Err(kvm_status::KVM_ERR_UNSUPPORTED),
    }
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

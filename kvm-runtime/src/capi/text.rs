//! Text <-> token ids for the C API, into caller buffers, with the model's own tokenizer
//! (`kvm_core::tokenizer`): byte-level or GPT-2 byte-level BPE. The helpers, then the
//! exported `kvm_tokenize()` and `kvm_detokenize()`.

use core::ffi::c_char;
use core::mem::MaybeUninit;

use kvm_core::format::TokenizerKind;
use kvm_core::{Error, Model};

use super::check::{catch, counted, input, model_of, output, status};
use super::types::{kvm_model, kvm_status};

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

/// Encodes `text_len` bytes of UTF-8 `text` into token ids. On success `*n_ids` is the
/// count written to `ids` (capacity `ids_cap`). If `ids_cap` is too small, returns
/// `KVM_ERR_BUFFER_TOO_SMALL` with the count needed in `*n_ids` (`ids` may be null when
/// `ids_cap` is 0, to ask for the size).
///
/// # Safety
/// `model` is null or a `kvm_model`; `text` is valid for reads of `text_len` bytes (null
/// if 0); `ids` for writes of `ids_cap` ids; `n_ids` null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_tokenize(
    model: *const kvm_model,
    text: *const c_char,
    text_len: usize,
    ids: *mut u32,
    ids_cap: usize,
    n_ids: *mut usize,
) -> kvm_status {
    status(catch(|| {
        // SAFETY: per the contract.
        let (m, text, out) = unsafe { (model_of(model)?, input(text.cast::<u8>(), text_len)?, output(ids, ids_cap)?) };
        // SAFETY: per the contract.
        unsafe { counted(n_ids, || encode(&m, text, out)) }
    }))
}

/// Decodes `n_ids` token ids into text (raw bytes, not NUL-terminated). On success
/// `*text_len` is the byte count written to `text` (capacity `text_cap`). If `text_cap`
/// is too small, returns `KVM_ERR_BUFFER_TOO_SMALL` with the bytes needed in `*text_len`
/// (`text` may be null when `text_cap` is 0).
///
/// # Safety
/// `model` is null or a `kvm_model`; `ids` is valid for reads of `n_ids` ids (null if
/// 0); `text` for writes of `text_cap` bytes; `text_len` null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn kvm_detokenize(
    model: *const kvm_model,
    ids: *const u32,
    n_ids: usize,
    text: *mut c_char,
    text_cap: usize,
    text_len: *mut usize,
) -> kvm_status {
    status(catch(|| {
        // SAFETY: per the contract.
        let (m, ids, out) = unsafe { (model_of(model)?, input(ids, n_ids)?, output(text.cast::<u8>(), text_cap)?) };
        // SAFETY: per the contract.
        unsafe { counted(text_len, || decode(&m, ids, out)) }
    }))
}

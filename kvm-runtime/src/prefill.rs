//! Chunked prefill: a prompt goes through the model a batch of tokens at a time, every
//! matrix product over the whole batch (weights read once per batch) and split across
//! the pool's threads, the state updated token by token exactly as decode does.

use kvm_core::exec::Exec;
use kvm_core::forward::Logits;
use kvm_core::state::Phase;
use kvm_core::{Error, Session};

use crate::arena::zeroed;
use crate::pool::Pool;

/// Tokens per batch: each weight is read once per batch, and float weights from memory
/// keep the batch kernel at the FMA units' rate only when one read feeds hundreds of
/// tokens; the activations (a few KB a token) stay in the L2 and L3.
pub const BATCH_TOKENS: usize = 256;

/// Feeds `tokens` to `session` in batches of [`BATCH_TOKENS`], leaving the last token's
/// logits in [`Session::logits`]. `exec` runs the products and heads: a [`Pool`], or one
/// that times them (`kvm bench`).
///
/// # Errors
/// As [`Session::step_batch`]; batches before the failing one have been consumed.
pub fn prefill(session: &mut Session<'_, '_>, tokens: &[u32], phase: Phase, exec: &dyn Exec) -> Result<(), Error> {
    let mut batch = batch_buffer(session, tokens.len())?;
    let n_batches = tokens.len().div_ceil(BATCH_TOKENS);
    for (i, chunk) in tokens.chunks(BATCH_TOKENS).enumerate() {
        let logits = if i + 1 == n_batches { Logits::Last } else { Logits::None };
        session.step_batch(chunk, phase, &mut batch, exec, logits)?;
    }
    Ok(())
}

/// Tokens per batch of [`prefill_rows`], whose batches hold every token's logits: 64 keep
/// them at 64 rows of the vocabulary (13 MB for 50,304 tokens).
const ROWS_BATCH_TOKENS: usize = 64;

/// As [`prefill`], handing every token's logits to `rows`, a batch (`[n, vocab_len]`,
/// `n <= 64`) at a time, so memory stays one batch's whatever the length.
///
/// # Errors
/// As [`prefill`], and what `rows` returns (it stops the prefill).
pub fn prefill_rows<E: From<Error>>(
    session: &mut Session<'_, '_>,
    tokens: &[u32],
    phase: Phase,
    pool: &Pool,
    rows: &mut dyn FnMut(&[f32]) -> Result<(), E>,
) -> Result<(), E> {
    let vocab = session.model().config().vocab_len as usize;
    let batch_len = tokens.len().clamp(1, ROWS_BATCH_TOKENS);
    let mut batch = zeroed(session.layout().acts_len(batch_len).ok_or(Error::InvalidArgument)?)?;
    let mut out = zeroed(batch_len.checked_mul(vocab).ok_or(Error::InvalidArgument)?)?;
    for chunk in tokens.chunks(ROWS_BATCH_TOKENS) {
        let out = &mut out[..chunk.len() * vocab];
        session.step_batch(chunk, phase, &mut batch, pool, Logits::All(out))?;
        rows(out)?;
    }
    Ok(())
}

/// Scratch for batches of up to `n` tokens (at most [`BATCH_TOKENS`]).
fn batch_buffer(session: &Session<'_, '_>, n: usize) -> Result<Vec<f32>, Error> {
    let batch_len = n.clamp(1, BATCH_TOKENS);
    zeroed(session.layout().acts_len(batch_len).ok_or(Error::InvalidArgument)?)
}

//! Chunked prefill: a prompt goes through the model a batch of tokens at a time, every
//! matrix product over the whole batch (weights read once per batch) and split across
//! the pool's threads, the state updated token by token exactly as decode does.

use kvm_core::forward::Logits;
use kvm_core::state::Phase;
use kvm_core::{Error, Session};

use crate::pool::Pool;

/// Tokens per batch: large enough that each weight read feeds many tokens, small enough
/// that the activations (a few KB per token) stay in cache.
pub const BATCH_TOKENS: usize = 64;

/// Feeds `tokens` to `session` in batches of [`BATCH_TOKENS`]; with `all_logits`, returns
/// every token's logits (`[n, vocab_len]`), else leaves the last token's in
/// [`Session::logits`] and returns nothing.
///
/// # Errors
/// As [`Session::step_batch`]; batches before the failing one have been consumed.
pub fn prefill(
    session: &mut Session<'_, '_>,
    tokens: &[u32],
    phase: Phase,
    pool: &Pool,
    all_logits: bool,
) -> Result<Vec<f32>, Error> {
    let vocab = session.model().config().vocab_len as usize;
    let batch_len = tokens.len().clamp(1, BATCH_TOKENS);
    let mut batch = vec![0f32; session.layout().acts_len(batch_len).ok_or(Error::InvalidArgument)?];
    let mut out = if all_logits { vec![0f32; tokens.len() * vocab] } else { Vec::new() };
    let n_batches = tokens.len().div_ceil(BATCH_TOKENS);
    for (i, chunk) in tokens.chunks(BATCH_TOKENS).enumerate() {
        let logits = if all_logits {
            let start = i * BATCH_TOKENS * vocab;
            Logits::All(&mut out[start..start + chunk.len() * vocab])
        } else if i + 1 == n_batches {
            Logits::Last
        } else {
            Logits::None
        };
        session.step_batch(chunk, phase, &mut batch, pool, logits)?;
    }
    Ok(out)
}

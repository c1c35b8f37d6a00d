//! `kvm perplexity`: how well a model predicts a text, scored with its own state (one
//! pass, no windows): every token after the first is predicted from all before it.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use kvm_core::forward::Logits;
use kvm_core::state::Phase;
use kvm_runtime::pool::Pool;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    session: crate::SessionArgs,
    /// Text file to score (`-`: stdin): UTF-8 for a BPE model, any bytes for a byte-level
    /// one.
    #[arg(long)]
    text: PathBuf,
    /// Worker threads for the matrix products, in [1, 256] (default: all cores, at most 256).
    #[arg(long, value_parser = crate::flags::threads())]
    threads: Option<usize>,
    /// Print one JSON object: tokens, bytes, bits_per_token, bits_per_byte, perplexity.
    #[arg(long)]
    json: bool,
}

/// `-log p(target)` in nats under `softmax(logits)`, computed stably in f64.
pub fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&z| (z as f64 - max).exp()).sum();
    sum.ln() + max - logits[target as usize] as f64
}

pub fn run(a: &Args) -> Result<()> {
    let stdin = a.text.as_os_str() == "-";
    let text = crate::prompt::read_text(if stdin { "-" } else { "" }, (!stdin).then_some(a.text.as_path()))?;
    let file = a.session.model.open()?;
    let model = a.session.model(&file)?;
    let tok = model.tokenizer();
    let ids = crate::prompt::encode(&model, &text).with_context(|| format!("in {}", a.text.display()))?;
    if ids.len() < 2 {
        bail!("{} has fewer than two tokens", a.text.display());
    }
    let vocab = model.config().vocab_len;
    if let Some(pos) = ids.iter().position(|&t| t >= vocab) {
        bail!("byte {pos} of {}, {}, is not a token of this {vocab}-token model", a.text.display(), ids[pos]);
    }
    let pool = Pool::new(crate::flags::threads_or_all(a.threads))?;
    let (mut arena, state_len) = a.session.arena(&model)?;
    let mut session = crate::session(model, &mut arena, state_len)?;
    let acts_len = session.layout().acts_len(1).context("activation size")?;
    let mut batch = kvm_runtime::arena::zeroed(acts_len)?;
    let mut nats = 0f64;
    for w in ids.windows(2) {
        session.step_batch(&w[..1], Phase::Prefill, &mut batch, &pool, Logits::Last)?;
        nats += nll(session.logits(), w[1]);
    }
    let tokens = ids.len() - 1;
    // Bytes of the scored text: everything after the first token.
    let bytes = text.len() - tok.token_bytes(ids[0]).map_or(0, <[u8]>::len);
    let bits = nats / std::f64::consts::LN_2;
    let (bpt, bpb, ppl) = (bits / tokens as f64, bits / bytes as f64, (nats / tokens as f64).exp());
    if a.json {
        println!(
            "{}",
            serde_json::json!({"tokens": tokens, "bytes": bytes, "bits_per_token": bpt, "bits_per_byte": bpb, "perplexity": ppl})
        );
    } else {
        println!("tokens {tokens}  bytes {bytes}  bits/token {bpt:.4}  bits/byte {bpb:.4}  perplexity {ppl:.4}");
    }
    Ok(())
}

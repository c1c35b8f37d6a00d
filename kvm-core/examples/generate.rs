//! Greedy generation with the core alone, as `kvm generate --temperature 0` prints it (the
//! prompt, then the text, then a newline): `generate MODEL PROMPT N`. CI runs it on
//! wasm32-wasip1 under Node, scalar and simd128, and compares the text with the CLI's on
//! the host (scripts/test.sh):
//!
//! ```sh
//! export CARGO_TARGET_WASM32_WASIP1_RUNNER="node $PWD/scripts/wasi-run.mjs"
//! cargo run -p kvm-core --release --example generate --target wasm32-wasip1 -- \
//!     models/tiny-kjv-q8_0.kvm "And God said" 64
//! ```

use std::io::Write;

use kvm_core::sampler::{scratch_len, Candidate, Sampler, SamplerConfig};
use kvm_core::{Model, Session};

/// One cache line of the arena, which the session wants 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, prompt, n] = &args[..] else {
        return Err("usage: generate MODEL PROMPT N".into());
    };
    let n: usize = n.parse()?;
    let blob = std::fs::read(path)?;
    let model = Model::from_bytes(&blob)?;
    let mut lines = vec![Line([0; 64]); model.arena_len().div_ceil(64)];
    // SAFETY: `lines` is `64 * lines.len()` initialized bytes, borrowed mutably once here.
    let arena = unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), 64 * lines.len()) };
    let mut session = Session::new(model, &mut arena[..model.arena_len()])?;

    let tok = model.tokenizer();
    let mut ids = vec![0u32; prompt.len() + 1];
    let len = tok.encode(prompt, &mut ids)?;
    let mut sampler = Sampler::new(SamplerConfig::greedy(), 0);
    let mut scratch = vec![Candidate::EMPTY; scratch_len(model.config().vocab_len as usize)];
    let mut out = prompt.as_bytes().to_vec();
    let mut logits = session.prefill(&ids[..len])?;
    for _ in 0..n {
        let next = sampler.sample(logits, &[], &mut scratch)?;
        out.extend_from_slice(tok.token_bytes(next).unwrap_or(&[]));
        logits = session.decode(next)?;
    }
    out.push(b'\n');
    std::io::stdout().write_all(&out)?;
    Ok(())
}

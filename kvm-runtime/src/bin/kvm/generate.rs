//! `kvm generate`: stream text from a prompt.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kvm_core::sampler::{scratch_len, Candidate, Sampler, SamplerConfig};
use kvm_core::state::Phase;
use kvm_core::tokenizer::StreamDecoder;
use kvm_core::Session;
use kvm_runtime::arena::Arena;
use kvm_runtime::pool::{default_threads, Pool};
use kvm_runtime::prefill::prefill;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: crate::ModelArg,
    #[command(flatten)]
    cache: crate::CacheArg,
    /// The text to continue.
    #[arg(long)]
    prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-tokens", default_value_t = 128)]
    n: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = SamplerConfig::DEFAULT.temperature)]
    temperature: f32,
    /// 0 = off.
    #[arg(long, default_value_t = SamplerConfig::DEFAULT.top_k)]
    top_k: u32,
    #[arg(long, default_value_t = SamplerConfig::DEFAULT.top_p)]
    top_p: f32,
    #[arg(long, default_value_t = SamplerConfig::DEFAULT.min_p)]
    min_p: f32,
    /// 1 = off.
    #[arg(long, default_value_t = SamplerConfig::DEFAULT.repeat_penalty)]
    repeat_penalty: f32,
    /// Tokens the repetition penalty looks back over.
    #[arg(long, default_value_t = SamplerConfig::DEFAULT.repeat_window)]
    repeat_window: u32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print one JSON object {prompt_ids, generated_ids, text, stats} instead of streaming.
    #[arg(long)]
    json: bool,
}

/// Peak resident memory of this process, from the kernel's accounting.
pub fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

pub fn run(a: &Args) -> Result<()> {
    let cfg = SamplerConfig {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        repeat_window: a.repeat_window,
    };
    cfg.validate().context("sampler settings")?;
    let file = a.model.open()?;
    let model = a.cache.apply(file.model()?)?;
    let tok = model.tokenizer();
    let prompt_ids = crate::tokens::encode(&tok, &a.prompt)?;
    if prompt_ids.is_empty() {
        bail!("the prompt is empty");
    }
    let pool = Pool::new(a.threads.unwrap_or_else(default_threads))?;
    let mut arena = Arena::new(model.arena_len());
    let mut session = Session::new(model, arena.bytes_mut())?;
    let mut sampler = Sampler::new(cfg, a.seed);
    let mut scratch = vec![Candidate::EMPTY; scratch_len(model.config().vocab_len as usize)];

    let t0 = Instant::now();
    prefill(&mut session, &prompt_ids, Phase::Prefill, &pool, false).context("prompt")?;
    let prompt_secs = t0.elapsed().as_secs_f64();

    let mut out = std::io::stdout().lock();
    if !a.json {
        write!(out, "{}", a.prompt)?;
        out.flush()?;
    }
    let mut history = prompt_ids.clone();
    let mut generated = Vec::with_capacity(a.n);
    let mut text = String::new();
    let mut stream = StreamDecoder::new();
    let mut piece = vec![0u8; 4 * tok.max_token_len() + 8];
    let t1 = Instant::now();
    let mut logits_ready = true;
    for _ in 0..a.n {
        if !logits_ready {
            let last = *history.last().unwrap_or(&0);
            session.decode_with(last, &pool).map(|_| ())?;
        }
        logits_ready = false;
        let next = sampler.sample(session.logits(), &history, &mut scratch)?;
        if Some(next) == tok.eos() {
            break;
        }
        generated.push(next);
        history.push(next);
        let s = stream.push(&tok, next, &mut piece)?;
        text.push_str(s);
        if !a.json {
            write!(out, "{s}")?;
            out.flush()?;
        }
    }
    let tail = stream.finish();
    text.push_str(tail);
    let decode_secs = t1.elapsed().as_secs_f64();
    // The first generated token comes from the prompt's logits: n tokens cost n - 1 steps.
    let steps = generated.len().saturating_sub(1).max(1);
    let stats = serde_json::json!({
        "prompt_tokens": prompt_ids.len(),
        "prompt_tok_s": prompt_ids.len() as f64 / prompt_secs.max(1e-9),
        "generated_tokens": generated.len(),
        "decode_tok_s": steps as f64 / decode_secs.max(1e-9),
        "peak_rss_bytes": peak_rss_bytes(),
        "threads": pool.threads(),
        "kernel_tier": crate::kernel_tier(),
    });
    if a.json {
        let obj =
            serde_json::json!({"prompt_ids": prompt_ids, "generated_ids": generated, "text": text, "stats": stats});
        writeln!(out, "{obj}")?;
    } else {
        writeln!(out, "{tail}")?;
        eprintln!(
            "prompt: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s | peak memory {:.1} MiB | {} threads, {} kernels",
            prompt_ids.len(),
            stats["prompt_tok_s"].as_f64().unwrap_or(0.0),
            generated.len(),
            stats["decode_tok_s"].as_f64().unwrap_or(0.0),
            peak_rss_bytes() as f64 / (1 << 20) as f64,
            pool.threads(),
            crate::kernel_tier()
        );
    }
    Ok(())
}

//! `kvm generate`: stream text from a prompt.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kvm_core::sampler::{scratch_len, Candidate, Sampler, SamplerConfig};
use kvm_core::state::Phase;
use kvm_core::tokenizer::StreamDecoder;
use kvm_core::Session;
use kvm_runtime::arena::Arena;
use kvm_runtime::capi::KVM_MAX_REPEAT_WINDOW;
use kvm_runtime::pool::{default_threads, Pool};
use kvm_runtime::prefill::prefill;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: crate::ModelArg,
    #[command(flatten)]
    cache: crate::CacheArg,
    /// The text to continue (it may start with `-`).
    #[arg(long, allow_hyphen_values = true)]
    prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-tokens", default_value_t = 128)]
    n: usize,
    /// Softmax temperature, >= 0; 0 = greedy.
    #[arg(long, allow_negative_numbers = true, default_value_t = SamplerConfig::DEFAULT.temperature)]
    temperature: f32,
    /// Keep the k most likely tokens; 0 = off.
    #[arg(long, allow_negative_numbers = true, default_value_t = SamplerConfig::DEFAULT.top_k)]
    top_k: u32,
    /// Nucleus sampling, in (0, 1]; 1 = off.
    #[arg(long, allow_negative_numbers = true, default_value_t = SamplerConfig::DEFAULT.top_p)]
    top_p: f32,
    /// Keep tokens at least this likely relative to the most likely, in [0, 1]; 0 = off.
    #[arg(long, allow_negative_numbers = true, default_value_t = SamplerConfig::DEFAULT.min_p)]
    min_p: f32,
    /// Repetition penalty, > 0; 1 = off.
    #[arg(long, allow_negative_numbers = true, default_value_t = SamplerConfig::DEFAULT.repeat_penalty)]
    repeat_penalty: f32,
    /// Tokens the repetition penalty looks back over, at most 256 (as in the C API).
    #[arg(long, allow_negative_numbers = true, default_value_t = SamplerConfig::DEFAULT.repeat_window)]
    repeat_window: u32,
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
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

/// Refuses a sampler setting out of range, naming its flag and the range.
fn check_sampler(c: &SamplerConfig) -> Result<()> {
    let bad = |flag: &str, v: &dyn std::fmt::Display, range: &str| bail!("--{flag} {v} is out of range: {range}");
    if !(c.temperature.is_finite() && c.temperature >= 0.0) {
        return bad("temperature", &c.temperature, "it must be finite and >= 0 (0 is greedy)");
    }
    if !(c.top_p > 0.0 && c.top_p <= 1.0) {
        return bad("top-p", &c.top_p, "it must be in (0, 1] (1 is off)");
    }
    if !(0.0..=1.0).contains(&c.min_p) {
        return bad("min-p", &c.min_p, "it must be in [0, 1] (0 is off)");
    }
    if !(c.repeat_penalty.is_finite() && c.repeat_penalty > 0.0) {
        return bad("repeat-penalty", &c.repeat_penalty, "it must be finite and > 0 (1 is off)");
    }
    if c.repeat_window > KVM_MAX_REPEAT_WINDOW {
        return bad("repeat-window", &c.repeat_window, &format!("it must be at most {KVM_MAX_REPEAT_WINDOW}"));
    }
    // Whatever the checks above miss, the sampler's own validation still refuses.
    c.validate().context("sampler settings")
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
    check_sampler(&cfg)?;
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
    prefill(&mut session, &prompt_ids, Phase::Prefill, &pool).context("prompt")?;
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
    // The first generated token comes from the prompt's logits: n tokens cost n - 1 steps,
    // and with no step there is no rate.
    let steps = generated.len().saturating_sub(1);
    let decode_tok_s = (steps > 0).then(|| steps as f64 / decode_secs.max(1e-9));
    let stats = serde_json::json!({
        "prompt_tokens": prompt_ids.len(),
        "prompt_tok_s": prompt_ids.len() as f64 / prompt_secs.max(1e-9),
        "generated_tokens": generated.len(),
        "decode_tok_s": decode_tok_s,
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
        let rate = decode_tok_s.map_or_else(|| "no steps".to_string(), |r| format!("{r:.1} tok/s"));
        eprintln!(
            "prompt: {} tokens, {:.1} tok/s | decode: {} tokens, {rate} | peak memory {:.1} MiB | {} threads, {} kernels",
            prompt_ids.len(),
            stats["prompt_tok_s"].as_f64().unwrap_or(0.0),
            generated.len(),
            peak_rss_bytes() as f64 / (1 << 20) as f64,
            pool.threads(),
            crate::kernel_tier()
        );
    }
    Ok(())
}

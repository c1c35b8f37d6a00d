//! `kvm generate`: stream text from a prompt.

use std::io::{StdoutLock, Write};
use std::ops::Bound::{Excluded, Included};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use kvm_core::state::Phase;
use kvm_core::tokenizer::Tokenizer;
use kvm_core::Session;
use kvm_runtime::pool::Pool;
use serde_json::{json, Value};

use crate::flags::ranged;
use crate::prompt::{encode, prefill_with_progress, PromptArg};
use crate::reply::{logprobs, End, Generator, Limits, Outcome, SamplerArgs, TextOut};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    session: crate::SessionArgs,
    #[command(flatten)]
    prompt: PromptArg,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-tokens", default_value_t = 128)]
    n: usize,
    #[command(flatten)]
    sampler: SamplerArgs,
    /// End the text where this string appears (not printed); repeatable.
    #[arg(long, allow_hyphen_values = true)]
    stop: Vec<String>,
    /// Never end at the end-of-text token (it is never sampled).
    #[arg(long)]
    ignore_eos: bool,
    /// Stop generating after this many seconds, in (0, 1e9].
    #[arg(long, value_parser = ranged((Excluded(0.0), Included(MAX_TIME_SECS))))]
    max_time: Option<f64>,
    /// Worker threads, in [1, 256] (default: all cores, at most 256).
    #[arg(long, value_parser = crate::flags::threads())]
    threads: Option<usize>,
    /// Print one JSON object {prompt_ids, generated_ids, text, end, sampler, tokens, stats}
    /// instead of streaming; it holds every generated token until the end.
    #[arg(long, conflicts_with = "raw")]
    json: bool,
    /// With --json: each token's log-probability and the N most likely tokens at its step,
    /// N in [0, 1000].
    #[arg(long, default_value_t = 0, requires = "json", value_parser = ranged(0..=MAX_LOGPROBS))]
    logprobs: usize,
    /// Write the text's exact bytes (a byte-level model may emit bytes that are not
    /// UTF-8) instead of replacing invalid UTF-8 with U+FFFD. (--json's `text` is always
    /// UTF-8; its `generated_ids` give the bytes.)
    #[arg(long)]
    raw: bool,
    /// Before the prompt, restore the session from this state file (--save-state's); the
    /// prompt then continues it, or with an empty prompt generation starts from the
    /// logits saved with the state.
    #[arg(long)]
    load_state: Option<PathBuf>,
    /// Right after the prompt (before generating), save the session's state to this file.
    #[arg(long)]
    save_state: Option<PathBuf>,
}

/// What `--json` keeps of the generated tokens until it prints them: 12 bytes a token, the
/// text's bytes, and 16 bytes for each of its `--logprobs` alternatives; and their count,
/// which every run keeps.
#[derive(Default)]
struct Kept {
    text: Vec<u8>,
    ids: Vec<u32>,
    /// One per id.
    logprobs: Vec<f64>,
    /// `--logprobs` (or `vocab_len`, if fewer) per id, most likely first.
    top: Vec<(u32, f64)>,
    /// Tokens generated (kept or not), an end-of-text token left out.
    n_generated: usize,
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

/// The longest `--max-time`, in seconds (31 years: no run asks for more, and every value
/// up to it is a `Duration`).
const MAX_TIME_SECS: f64 = 1e9;

/// The most alternatives `--logprobs` lists a token (each step sorts them in, so the cost
/// grows with it).
const MAX_LOGPROBS: usize = 1000;

pub fn run(a: &Args) -> Result<()> {
    let cfg = a.sampler.config()?;
    let Some(prompt) = a.prompt.bytes()? else { bail!("give --prompt or --prompt-file") };
    let inputs = [Some(a.session.model.path()), a.prompt.file(), a.load_state.as_deref()];
    let inputs: Vec<&Path> = inputs.into_iter().flatten().collect();
    let state_out = a.save_state.as_deref().map(|f| crate::snapshot::create(f, &inputs)).transpose()?;
    let file = a.session.model.open()?;
    let model = a.session.model(&file)?;
    let tok = model.tokenizer();
    let prompt_ids = encode(&model, &prompt)?;
    if prompt_ids.is_empty() && a.load_state.is_none() {
        bail!("the prompt is empty");
    }
    let pool = Pool::new(crate::flags::threads_or_all(a.threads))?;
    let (mut arena, state_len) = a.session.arena(&model)?;
    let mut session = crate::session(model, &mut arena, state_len)?;
    if let Some(f) = &a.load_state {
        crate::snapshot::load(&mut session, f)?;
        if prompt_ids.is_empty() && !session.has_logits() {
            bail!("the prompt is empty and {} holds no logits: saved by an older kvm; give a prompt", f.display());
        }
    }
    let mut gen = Generator::new(tok, cfg, a.sampler.seed(), a.ignore_eos, &a.stop)?;

    let t0 = Instant::now();
    // After --load-state an empty prompt leaves the restored logits to sample from.
    if !prompt_ids.is_empty() {
        prefill_with_progress(&mut session, &prompt_ids, Phase::Prefill, &pool)?;
    }
    let prompt_secs = t0.elapsed().as_secs_f64();
    if let Some(out) = state_out {
        crate::snapshot::write(&session, out)?;
    }
    gen.saw(&prompt_ids);

    let mut out = std::io::stdout().lock();
    let mut text_out = TextOut::new(a.raw);
    if !a.json {
        text_out.write(&mut out, &prompt)?;
    }
    let t1 = Instant::now();
    let (done, kept) = generate(a, &mut gen, &mut session, &pool, &mut out, &mut text_out)?;
    let decode_secs = t1.elapsed().as_secs_f64();
    // The first generated token comes from the prompt's logits: n tokens cost n - 1 steps,
    // and with no step there is no rate.
    let steps = kept.n_generated.saturating_sub(1);
    let decode_tok_s = (steps > 0).then(|| steps as f64 / decode_secs.max(1e-9));
    let stats = json!({
        "prompt_tokens": prompt_ids.len(),
        "prompt_tok_s": prompt_ids.len() as f64 / prompt_secs.max(1e-9),
        "generated_tokens": kept.n_generated,
        "decode_tok_s": decode_tok_s,
        "peak_rss_bytes": peak_rss_bytes(),
        "threads": pool.threads(),
        "kernel_tier": crate::kernel_tier(),
    });
    let report = Report { prompt_ids: &prompt_ids, end: done.end, kept, stats };
    if a.json {
        print_json(&mut out, a, tok, &report)
    } else {
        text_out.finish(&mut out)?;
        writeln!(out)?;
        print_summary(&report, decode_tok_s, &pool);
        Ok(())
    }
}

/// Samples up to `-n` tokens after the prompt, streaming their text to `out` (or, with
/// `--json`, keeping it and the tokens to print at the end).
fn generate(
    a: &Args,
    gen: &mut Generator<'_>,
    session: &mut Session<'_, '_>,
    pool: &Pool,
    out: &mut StdoutLock<'_>,
    text_out: &mut TextOut,
) -> Result<(Outcome, Kept)> {
    // Only --json keeps the generated tokens, to print them at the end; streamed, memory
    // stays the same for any -n.
    let mut kept = Kept::default();
    let limits = Limits { tokens: a.n, time: a.max_time.map(Duration::from_secs_f64), interrupt: None };
    let done = gen.reply(
        session,
        pool,
        &limits,
        &mut |bytes| {
            if a.json {
                kept.text.extend_from_slice(bytes);
                Ok(())
            } else {
                text_out.write(out, bytes)
            }
        },
        &mut |id, logits| {
            kept.n_generated += 1;
            if a.json {
                let (lp, top) = logprobs(logits, id, a.logprobs);
                kept.ids.push(id);
                kept.logprobs.push(lp);
                kept.top.extend(top);
            }
            Ok(())
        },
    )?;
    Ok((done, kept))
}

/// What a run prints at its end.
struct Report<'r> {
    prompt_ids: &'r [u32],
    end: End,
    kept: Kept,
    stats: Value,
}

/// `--json`'s one object: the end, the ids, the sampler's settings echoed, the stats, the
/// text and each token (with its alternatives under `--logprobs`).
fn print_json(out: &mut StdoutLock<'_>, a: &Args, tok: Tokenizer<'_>, r: &Report<'_>) -> Result<()> {
    let mut sampler = a.sampler.echo();
    sampler["stop"] = json!(a.stop);
    sampler["ignore_eos"] = json!(a.ignore_eos);
    sampler["n_tokens"] = json!(a.n);
    sampler["max_time"] = json!(a.max_time);
    let kept = &r.kept;
    // Written a piece at a time, so printing holds no second copy of the tokens. The
    // keys in order, as serde_json orders an object's.
    out.write_all(b"{\"end\":")?;
    serde_json::to_writer(&mut *out, r.end.name())?;
    out.write_all(b",\"generated_ids\":")?;
    serde_json::to_writer(&mut *out, &kept.ids)?;
    out.write_all(b",\"prompt_ids\":")?;
    serde_json::to_writer(&mut *out, r.prompt_ids)?;
    out.write_all(b",\"sampler\":")?;
    serde_json::to_writer(&mut *out, &sampler)?;
    out.write_all(b",\"stats\":")?;
    serde_json::to_writer(&mut *out, &r.stats)?;
    out.write_all(b",\"text\":")?;
    serde_json::to_writer(&mut *out, &String::from_utf8_lossy(&kept.text))?;
    out.write_all(b",\"tokens\":[")?;
    let piece = |t: u32| String::from_utf8_lossy(tok.token_bytes(t).unwrap_or(&[])).into_owned();
    let n_top = kept.top.len() / kept.ids.len().max(1);
    for (i, (&id, &lp)) in kept.ids.iter().zip(&kept.logprobs).enumerate() {
        let mut entry = json!({"id": id, "text": piece(id), "logprob": lp});
        if a.logprobs > 0 {
            let top = kept.top.get(i * n_top..(i + 1) * n_top).unwrap_or_default();
            entry["top"] = top.iter().map(|&(t, lp)| json!({"id": t, "text": piece(t), "logprob": lp})).collect();
        }
        if i > 0 {
            out.write_all(b",")?;
        }
        serde_json::to_writer(&mut *out, &entry)?;
    }
    out.write_all(b"]}\n")?;
    Ok(())
}

/// The one line on stderr after streamed text: rates, how it ended, memory, threads.
fn print_summary(r: &Report<'_>, decode_tok_s: Option<f64>, pool: &Pool) {
    let rate = decode_tok_s.map_or_else(|| "no steps".to_string(), |r| format!("{r:.1} tok/s"));
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | decode: {} tokens, {rate}, ended by {} | peak memory {:.1} MiB | {} threads, {} kernels",
        r.prompt_ids.len(),
        r.stats["prompt_tok_s"].as_f64().unwrap_or(0.0),
        r.kept.n_generated,
        r.end.name(),
        peak_rss_bytes() as f64 / (1 << 20) as f64,
        pool.threads(),
        crate::kernel_tier()
    );
}

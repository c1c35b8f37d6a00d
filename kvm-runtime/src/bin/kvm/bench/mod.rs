//! `kvm bench`: prefill and decode speed, the bytes each decoded token reads and the
//! FLOPs each prefill token costs, this machine's memory bandwidth and FMA peak measured
//! in the same run, and (with `--checkpoints`) a
//! long run showing that per-token latency and memory stay flat. Comma lists of prompt
//! lengths, decode lengths, context depths and thread counts run as a sweep, one report
//! per combination.
//!
//! Tokens are a fixed pseudo-random stream (prompt) and greedy picks (decode): the
//! arithmetic of a step does not depend on which token it is, so no text is needed and
//! any model file, random-weight ones included, can be measured.

mod fma;
mod probe;
mod report;
mod runs;

use std::io::{IsTerminal, Write};

use anyhow::{bail, Result};
use kvm_core::config::Config;
use kvm_core::format::Role;
use kvm_core::state::{bswa_begin, state_slots};
use kvm_core::Model;
use kvm_runtime::file::{ModelFile, Pages};
use kvm_runtime::pool::Pool;
use serde_json::{json, Value};

use crate::flags::ranged;
use fma::{add_fma_peak, flops_per_token, fma_peak};
use probe::{add_bandwidth, bandwidth};
use report::{print_report, print_table, Format};
use runs::{long_run, reset_peak_rss, speed, status_bytes};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    session: crate::SessionArgs,
    /// Prompt tokens fed by chunked prefill, timed (`prefill_tok_s`), each in [1, 2^24]; a
    /// comma list sweeps.
    #[arg(long, value_delimiter = ',', default_value = "512", value_parser = ranged(1..=MAX_PROMPT))]
    prompt_len: Vec<usize>,
    /// Tokens decoded one at a time, timed (`decode_tok_s`; with --checkpoints: the length
    /// of the long run), each in [1, 2^32 - 1]; a comma list sweeps.
    #[arg(long, value_delimiter = ',', default_value = "128", value_parser = ranged(1..=MAX_POSITION))]
    gen: Vec<usize>,
    /// Tokens in the session when the timed decode starts: 0 (the default) decodes from an
    /// empty context, as llama-bench's tg test does; equal to --prompt-len, it continues
    /// after the timed prompt; any other value is prefilled, untimed, in a fresh session
    /// (llama-bench's `-d`); each in [0, 2^24]; a comma list sweeps.
    #[arg(long, value_delimiter = ',', default_value = "0", value_parser = ranged(0..=MAX_PROMPT))]
    context: Vec<usize>,
    /// Worker threads, each in [1, 256] (default: all cores, at most 256); a comma list
    /// sweeps.
    #[arg(long, value_delimiter = ',', value_parser = crate::flags::threads())]
    threads: Vec<usize>,
    /// Repeat the prefill + decode measurement this many times (fresh session each), in
    /// [1, 1000], and report the medians.
    #[arg(long, default_value_t = 1, value_parser = ranged(1..=MAX_RUNS))]
    runs: usize,
    /// md: a table like llama-bench's (the default when stdout is a terminal); csv: the
    /// same table; json: one JSON object per combination, a line each (the default
    /// otherwise); text: a full report per combination.
    #[arg(long, value_enum)]
    output: Option<Format>,
    /// The same as --output json.
    #[arg(long, conflicts_with = "output")]
    json: bool,
    /// Long-run mode: context positions (comma-separated, at most --gen) at which to
    /// report per-token latency and resident memory, each in [1, 2^32 - 1].
    #[arg(long, value_delimiter = ',', value_parser = ranged(1..=MAX_POSITION))]
    checkpoints: Vec<usize>,
    /// Long run: decode steps timed before each checkpoint, rounded up to whole chunks;
    /// the latency reported is the median over the window's chunks of the mean step time
    /// (default: 4 chunks, at least 1024 steps), in [1, 2^24].
    #[arg(long, value_parser = ranged(1..=MAX_PROMPT))]
    window: Option<usize>,
    /// Long run: reach each checkpoint's window by chunked prefill instead of decoding
    /// every token (much faster for big models; the state evolves the same way).
    #[arg(long)]
    fast_forward: bool,
    /// Long run: at every checkpoint also snapshot the session, decode this many random
    /// tokens, restore and decode them again, and fail unless the logits are the same bits
    /// (then go on from the snapshot, so the run itself is unchanged); in [0, 1024], 0
    /// skips it.
    #[arg(long, default_value_t = 0, value_parser = ranged(0..=MAX_ROUND_TRIP))]
    round_trip: usize,
    /// MiB the bandwidth probe reads, in [0, 16384] (0 skips it). Default: the bytes of
    /// weights a decode step reads, so that the probe's reads meet the same caches as the
    /// step's (a model within the L3 is read from it). The probe holds this buffer, after
    /// the timed runs, on top of the run's memory.
    #[arg(long, value_parser = ranged(0..=MAX_BW_MIB))]
    bw_mib: Option<usize>,
    /// Seed of the prompt's token stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// The most prompt or context tokens (and window steps): the run holds their ids, 4
/// bytes each.
const MAX_PROMPT: usize = 1 << 24;

/// The most positions a session reaches (the core counts them in 32 bits).
const MAX_POSITION: usize = u32::MAX as usize;

/// The most round-trip tokens: both passes keep every token's logits to compare them.
const MAX_ROUND_TRIP: usize = 1024;

/// The most repeats of a measurement.
const MAX_RUNS: usize = 1000;

/// The largest bandwidth probe, in MiB: past a few times the L3 a larger buffer measures
/// the same rate.
const MAX_BW_MIB: usize = 16 << 10;

/// One combination of a sweep.
pub(super) struct Point {
    threads: usize,
    prompt_len: usize,
    gen: usize,
    context: usize,
    state_len: usize,
}

pub fn run(a: &Args) -> Result<()> {
    let file = a.session.model.open()?;
    let model = a.session.model(&file)?;
    let format = match (a.json, a.output) {
        (true, _) => Format::Json,
        (false, Some(f)) => f,
        (false, None) if std::io::stdout().is_terminal() => Format::Md,
        (false, None) => Format::Json,
    };
    let points = sweep(a, &model)?;
    // Fault every page of the model in now, so no timed step pays for first touches.
    std::hint::black_box(file.bytes().iter().step_by(4096).fold(0u8, |s, &b| s ^ b));
    let progress = std::io::stderr().is_terminal();
    let mut reports = measure(a, &file, &model, &points, progress)?;
    add_fma_peaks(&points, &mut reports, progress);
    if a.bw_mib != Some(0) {
        add_bandwidths(a, &points, &mut reports, progress)?;
    }
    if progress {
        eprint!("\r\x1b[2K");
    }
    match format {
        Format::Json => reports.iter().for_each(|r| println!("{r}")),
        Format::Text => reports.iter().for_each(print_report),
        Format::Md | Format::Csv => print_table(&reports, format),
    }
    Ok(())
}

/// Every combination of the thread counts, prompt lengths, decode lengths and context
/// depths asked for, each with the state capacity its session needs.
fn sweep(a: &Args, model: &Model<'_>) -> Result<Vec<Point>> {
    let asked = a.session.state_slots.map(|_| a.session.state_len(model)).transpose()?;
    let threads = if a.threads.is_empty() { vec![crate::flags::threads_or_all(None)] } else { a.threads.clone() };
    if !a.checkpoints.is_empty() && threads.len() * a.prompt_len.len() * a.gen.len() * a.context.len() > 1 {
        bail!("--checkpoints makes one long run: give one --threads, --gen and --context");
    }
    let mut points = Vec::new();
    for &t in &threads {
        for &prompt_len in &a.prompt_len {
            for &gen in &a.gen {
                for &context in &a.context {
                    // The most tokens one session of the run holds (with --checkpoints: the
                    // long run and its round trips; else the prompt or the context, then
                    // the decoded tokens).
                    let tokens = if a.checkpoints.is_empty() { prompt_len.max(context) } else { a.round_trip } + gen;
                    let state_len = asked.unwrap_or_else(|| state_len_for(model, tokens));
                    points.push(Point { threads: t, prompt_len, gen, context, state_len });
                }
            }
        }
    }
    Ok(points)
}

/// One report per point: the model and machine described, then its timed runs (speed, or
/// the long run of `--checkpoints`) and peak memory.
fn measure(a: &Args, file: &ModelFile, model: &Model<'_>, points: &[Point], progress: bool) -> Result<Vec<Value>> {
    let mut reports = Vec::with_capacity(points.len());
    for (i, p) in points.iter().enumerate() {
        if progress {
            eprint!(
                "\rbench {}/{}: {} threads, prompt {}, gen {}, context {}\x1b[K",
                i + 1,
                points.len(),
                p.threads,
                p.prompt_len,
                p.gen,
                p.context
            );
            std::io::stderr().flush().ok();
        }
        reset_peak_rss();
        let pool = Pool::new(p.threads)?;
        let mut report = describe(a.session.model.path(), model, &pool, p.state_len)?;
        report["model_pages"] = json!(match file.pages() {
            Pages::Huge => "huge",
            Pages::Mapped => "mapped",
        });
        report["packed_at_load"] = json!(file.packed());
        if a.checkpoints.is_empty() {
            speed(a, p, model, &pool, &mut report)?;
        } else {
            long_run(a, p, model, &pool, &mut report)?;
        }
        // Read before the bandwidth buffer raises it.
        report["peak_rss_bytes"] = json!(status_bytes("VmHWM:"));
        reports.push(report);
    }
    Ok(reports)
}

/// The FMA probe's peaks added to each report: run once per thread count, after every
/// timed run, so that no run shares the cores with it.
fn add_fma_peaks(points: &[Point], reports: &mut [Value], progress: bool) {
    let mut measured: Vec<(usize, (f64, f64))> = Vec::new();
    for (p, report) in points.iter().zip(reports) {
        let peak = match measured.iter().find(|m| m.0 == p.threads) {
            Some(m) => m.1,
            None => {
                if progress {
                    eprint!("\rbench: FMA peak, {} threads\x1b[K", p.threads);
                    std::io::stderr().flush().ok();
                }
                let peak = fma_peak(p.threads);
                measured.push((p.threads, peak));
                peak
            }
        };
        add_fma_peak(report, peak);
    }
}

/// The memory bandwidth probe's rates added to each report: run once per thread count and
/// size, after every timed run, so its buffer inflates no run's peak memory.
fn add_bandwidths(a: &Args, points: &[Point], reports: &mut [Value], progress: bool) -> Result<()> {
    let mut measured: Vec<((usize, usize), (f64, f64))> = Vec::new();
    for (p, report) in points.iter().zip(reports) {
        let step = report["weight_bytes_per_token"].as_f64().unwrap_or(0.0);
        let mib = a.bw_mib.unwrap_or_else(|| ((step / (1u64 << 20) as f64).ceil() as usize).clamp(1, MAX_BW_MIB));
        let key = (p.threads, mib);
        let bw = match measured.iter().find(|m| m.0 == key) {
            Some(m) => m.1,
            None => {
                if progress {
                    eprint!("\rbench: memory bandwidth, {} threads, {mib} MiB\x1b[K", p.threads);
                    std::io::stderr().flush().ok();
                }
                let bw = bandwidth(mib, p.threads)?;
                measured.push((key, bw));
                bw
            }
        };
        report["bw_mib"] = json!(mib);
        add_bandwidth(report, bw);
    }
    Ok(())
}

/// The state capacity a session of `tokens` tokens needs: the slots it reaches, within the
/// file's capacity and never below `chunk_len` (the least a session holds). A growable
/// state's arena is then as large as the context it is measured at, as llama-bench sizes
/// its KV cache to each test; a fixed state's is the file's.
fn state_len_for(model: &Model<'_>, tokens: usize) -> usize {
    let (cfg, capacity) = (model.config(), model.header().state_capacity as usize);
    let reached = state_slots(cfg, capacity).nth(tokens.saturating_sub(1)).unwrap_or(0);
    reached.max(cfg.chunk_len as usize).min(capacity)
}

/// The model, the machine, the bytes one decode step reads and the FLOPs a prefill token
/// costs.
fn describe(path: &std::path::Path, model: &Model<'_>, pool: &Pool, state_len: usize) -> Result<Value> {
    let cfg = model.config();
    let mut weight_bytes = 0u64;
    let mut params = 0u64;
    for e in model.tensors() {
        params += e.rows as u64 * e.cols as u64;
        // A step reads one embedding row and every other tensor whole.
        weight_bytes += if e.role == Role::TokEmbed { e.len / e.rows.max(1) as u64 } else { e.len };
    }
    let dtype = model.matrix(Role::Wq, 0).dtype.name();
    // Attention reads every state slot and the window's keys and values, stored as the
    // cache dtype, for each head of each layer. Steady state: all `state_len` slots are in
    // use and the window holds `window_len - chunk_len + r` tokens, r = 1..=chunk_len, so
    // on average this many.
    let (c, w) = (cfg.chunk_len as f64, cfg.window_len() as f64);
    let state_bytes = position_bytes(model) * (state_len as f64 + w - c + (c + 1.0) / 2.0);
    Ok(json!({
        "model": path.display().to_string(),
        "dtype": dtype,
        "params": params,
        "file_bytes": model.blob().len(),
        "arena_bytes": model.arena_len_for(state_len)?,
        "state_len": state_len,
        "threads": pool.threads(),
        "kernel_tier": crate::kernel_tier(),
        "kernel_streaming": crate::kernel_streaming(),
        "cache": model.cache().name(),
        // Other processes' load makes numbers noisy (and 2-thread ones low) on shared machines.
        "loadavg_1m": std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split(' ').next()?.parse::<f64>().ok()),
        "weight_bytes_per_token": weight_bytes,
        "state_bytes_per_token": state_bytes.round() as u64,
        "flops_per_token": flops_per_token(model),
    }))
}

/// Bytes attention reads per position it attends to: a key and a value row, stored as the
/// cache dtype, in every head of every layer.
fn position_bytes(model: &Model<'_>) -> f64 {
    let cfg = model.config();
    let row_bytes = model.cache().row_bytes(cfg.d_qk as usize) + model.cache().row_bytes(cfg.d_v as usize);
    (cfg.n_layers * cfg.n_heads) as f64 * row_bytes as f64
}

/// Positions the step at position `t` attends to: its window's tokens, and once the
/// context outgrows the window, the `slots` the state holds then.
fn positions_read(cfg: &Config, slots: usize, t: usize) -> usize {
    let n = t + 1;
    let window = n - bswa_begin(cfg, n);
    window + if n > cfg.window_len() { slots } else { 0 }
}

/// The median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

//! `kvm bench`: prefill and decode speed, the bytes each decoded token reads, this
//! machine's memory bandwidth measured in the same run, and (with `--checkpoints`) a
//! long run showing that per-token latency and memory stay flat.
//!
//! Tokens are a fixed pseudo-random stream (prompt) and greedy picks (decode): the
//! arithmetic of a step does not depend on which token it is, so no text is needed and
//! any model file, random-weight ones included, can be measured.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use kvm_core::config::Config;
use kvm_core::exec::{Exec, HeadFn, PieceFn, Product};
use kvm_core::format::Role;
use kvm_core::kernels;
use kvm_core::sampler::Pcg32;
use kvm_core::state::{bswa_begin, Phase};
use kvm_core::tensor::Matrix;
use kvm_core::{Model, Session};
use kvm_runtime::arena::Arena;
use kvm_runtime::file::Pages;
use kvm_runtime::pool::{default_threads, Pool};
use kvm_runtime::prefill::prefill;
use serde_json::{json, Value};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: crate::ModelArg,
    #[command(flatten)]
    cache: crate::CacheArg,
    /// Prompt tokens fed by chunked prefill, timed (`prefill_tok_s`).
    #[arg(long, default_value_t = 512)]
    prompt_len: usize,
    /// Tokens decoded one at a time, timed (`decode_tok_s`; with --checkpoints: the length
    /// of the long run).
    #[arg(long, default_value_t = 128)]
    gen: usize,
    /// Tokens in the session when the timed decode starts: 0 (the default) decodes from an
    /// empty context, as llama-bench's tg test does; equal to --prompt-len, it continues
    /// after the timed prompt; any other value is prefilled, untimed, in a fresh session.
    #[arg(long, default_value_t = 0)]
    context: usize,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Repeat the prefill + decode measurement this many times (fresh session each) and
    /// report the medians.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    runs: usize,
    /// Print one JSON object instead of a report.
    #[arg(long)]
    json: bool,
    /// Long-run mode: context positions (comma-separated, at most --gen) at which to
    /// report per-token latency and resident memory.
    #[arg(long, value_delimiter = ',')]
    checkpoints: Vec<usize>,
    /// Long run: decode steps timed before each checkpoint, rounded up to whole chunks;
    /// the latency reported is the median over the window's chunks of the mean step time
    /// (default: 4 chunks, at least 1024 steps).
    #[arg(long)]
    window: Option<usize>,
    /// Long run: reach each checkpoint's window by chunked prefill instead of decoding
    /// every token (much faster for big models; the state evolves the same way).
    #[arg(long)]
    fast_forward: bool,
    /// Long run: at every checkpoint also snapshot the session, decode this many random
    /// tokens, restore and decode them again, and fail unless the logits are the same bits
    /// (then go on from the snapshot, so the run itself is unchanged); 0 skips it.
    #[arg(long, default_value_t = 0)]
    round_trip: usize,
    /// MiB read to measure memory bandwidth (0 skips it); keep it well above the L3.
    #[arg(long, default_value_t = 1024)]
    bw_mib: usize,
    /// Seed of the prompt's token stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn run(a: &Args) -> Result<()> {
    let file = a.model.open()?;
    let model = a.cache.apply(file.model()?)?;
    let pool = Pool::new(a.threads.unwrap_or_else(default_threads))?;
    // Fault every page of the model in now, so no timed step pays for first touches.
    std::hint::black_box(file.bytes().iter().step_by(4096).fold(0u8, |s, &b| s ^ b));
    let mut report = describe(a.model.path(), &model, &pool);
    report["model_pages"] = json!(match file.pages() {
        Pages::Huge => "huge",
        Pages::Mapped => "mapped",
    });
    report["packed_at_load"] = json!(file.packed());
    if a.checkpoints.is_empty() {
        speed(a, &model, &pool, &mut report)?;
    } else {
        long_run(a, &model, &pool, &mut report)?;
    }
    // Read before the bandwidth buffer raises it.
    report["peak_rss_bytes"] = json!(status_bytes("VmHWM:"));
    if a.bw_mib > 0 {
        bandwidth(a.bw_mib, pool.threads(), &mut report);
    }
    if a.json {
        println!("{report}");
    } else {
        print_report(&report);
    }
    Ok(())
}

/// The model, the machine and the bytes one decode step reads.
fn describe(path: &std::path::Path, model: &Model<'_>, pool: &Pool) -> Value {
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
    // cache dtype, for each head of each layer. Steady state: the state is full and the window holds
    // `window_len - chunk_len + r` tokens, r = 1..=chunk_len, so on average this many.
    let (c, w) = (cfg.chunk_len as f64, cfg.window_len() as f64);
    let state_bytes = position_bytes(model) * (cfg.natural_state_len() as f64 + w - c + (c + 1.0) / 2.0);
    json!({
        "model": path.display().to_string(),
        "dtype": dtype,
        "params": params,
        "file_bytes": model.blob().len(),
        "arena_bytes": model.arena_len(),
        "threads": pool.threads(),
        "kernel_tier": crate::kernel_tier(),
        "cache": model.cache().name(),
        // Other processes' load makes numbers noisy (and 2-thread ones low) on shared machines.
        "loadavg_1m": std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split(' ').next()?.parse::<f64>().ok()),
        "weight_bytes_per_token": weight_bytes,
        "state_bytes_per_token": state_bytes.round() as u64,
    })
}

/// Bytes attention reads per position it attends to: a key and a value row, stored as the
/// cache dtype, in every head of every layer.
fn position_bytes(model: &Model<'_>) -> f64 {
    let cfg = model.config();
    let row_bytes = model.cache().row_bytes(cfg.d_qk as usize) + model.cache().row_bytes(cfg.d_v as usize);
    (cfg.n_layers * cfg.n_heads) as f64 * row_bytes as f64
}

/// Positions the step at position `t` attends to: its window's tokens, and once the
/// context outgrows the window, every state slot (taken as full).
fn positions_read(cfg: &Config, t: usize) -> usize {
    let n = t + 1;
    let window = n - bswa_begin(cfg, n);
    window + if n > cfg.window_len() { cfg.natural_state_len() } else { 0 }
}

/// A fresh session in its own arena.
struct Run<'m> {
    arena: Arena,
    model: Model<'m>,
}

impl<'m> Run<'m> {
    fn new(model: Model<'m>) -> Self {
        Run { arena: Arena::new(model.arena_len()), model }
    }

    fn session(&mut self) -> Result<Session<'m, '_>> {
        Ok(Session::new(self.model, self.arena.bytes_mut())?)
    }
}

/// An [`Exec`] that runs products on the pool and adds up the time they take, so the
/// rest of a step (attention, state updates, norms) can be told apart.
struct Timed<'p> {
    pool: &'p Pool,
    /// Nanoseconds in matrix products.
    matmul: AtomicU64,
    /// Time in the output head alone (`[vocab_len, d_model]`).
    head: AtomicU64,
    vocab_len: usize,
}

impl Exec for Timed<'_> {
    fn matmul(&self, w: &Matrix<'_>, xs: &[f32], ys: &mut [f32], act: &mut [u8]) {
        let t = Instant::now();
        self.pool.matmul(w, xs, ys, act);
        let dt = t.elapsed();
        self.matmul.fetch_add(dt.as_nanos() as u64, Ordering::Relaxed);
        if w.rows == self.vocab_len {
            self.head.fetch_add(dt.as_nanos() as u64, Ordering::Relaxed);
        }
    }

    fn matmuls(&self, xs: &[f32], products: &mut [Product<'_, '_>], act: &mut [u8]) {
        let t = Instant::now();
        self.pool.matmuls(xs, products, act);
        self.matmul.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn heads(&self, outs: &mut [f32], out_len: usize, scratch: &mut [f32], scratch_len: usize, f: &HeadFn<'_>) {
        self.pool.heads(outs, out_len, scratch, scratch_len, f);
    }

    fn pieces(&self, out: &mut [f32], piece: usize, f: &PieceFn<'_>) {
        self.pool.pieces(out, piece, f);
    }

    fn upcoming(&self, ws: &[Matrix<'_>]) {
        self.pool.upcoming(ws);
    }
}

/// The greedy pick: the first largest logit ([`kernels::argmax`]).
fn greedy(logits: &[f32]) -> u32 {
    kernels::argmax(logits).unwrap_or(0) as u32
}

/// A reproducible stream of `n` token ids below `vocab_len`.
fn token_stream(seed: u64, n: usize, vocab_len: u32) -> Vec<u32> {
    let mut rng = Pcg32::new(seed);
    (0..n).map(|_| rng.next_u32() % vocab_len).collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Prefill `--prompt-len` tokens, then decode `--gen` after `--context` tokens, `--runs`
/// times.
fn speed(a: &Args, model: &Model<'_>, pool: &Pool, report: &mut Value) -> Result<()> {
    if a.prompt_len == 0 || a.gen == 0 {
        bail!("--prompt-len and --gen must be at least 1");
    }
    let vocab_len = model.config().vocab_len;
    let prompt = token_stream(a.seed, a.prompt_len.max(a.context), vocab_len);
    let (prompt, context) = (&prompt[..a.prompt_len], &prompt[..a.context]);
    let (mut prefill_tok_s, mut decode_tok_s, mut matmul_frac, mut head_frac) = (vec![], vec![], vec![], vec![]);
    let (mut prefill_wait, mut decode_wait) = (vec![], vec![]);
    let threads = pool.threads();
    let mut run = Run::new(*model);
    for _ in 0..a.runs {
        let mut session = run.session()?;
        let (_, secs, wait) =
            timed(threads, || prefill(&mut session, prompt, Phase::Prefill, pool).context("prefill"))?;
        prefill_tok_s.push(a.prompt_len as f64 / secs);
        prefill_wait.push(wait);
        if a.context != a.prompt_len {
            session.reset();
            if !context.is_empty() {
                prefill(&mut session, context, Phase::Prefill, pool).context("prefill")?;
            }
        }

        let timed_exec =
            Timed { pool, matmul: AtomicU64::new(0), head: AtomicU64::new(0), vocab_len: vocab_len as usize };
        let mut next = if context.is_empty() { prompt[0] } else { greedy(session.logits()) };
        let (_, secs, wait) = timed(threads, || {
            for _ in 0..a.gen {
                next = session.decode_with(next, &timed_exec).map(greedy)?;
            }
            Ok(())
        })?;
        decode_tok_s.push(a.gen as f64 / secs);
        decode_wait.push(wait);
        matmul_frac.push(Duration::from_nanos(timed_exec.matmul.load(Ordering::Relaxed)).as_secs_f64() / secs);
        head_frac.push(Duration::from_nanos(timed_exec.head.load(Ordering::Relaxed)).as_secs_f64() / secs);
    }
    let runs = json!({
        "prefill_tok_s": prefill_tok_s,
        "decode_tok_s": decode_tok_s,
        "prefill_wait_fraction": prefill_wait,
        "decode_wait_fraction": decode_wait,
    });
    // What the runs would have done with their CPUs to themselves (memory contention aside).
    let adjust = |tok_s: &[f64], wait: &[f64]| -> Vec<f64> {
        tok_s.iter().zip(wait).map(|(&r, &w)| r / (1.0 - w).max(0.05)).collect()
    };
    let (mut prefill_adj, mut decode_adj) =
        (adjust(&prefill_tok_s, &prefill_wait), adjust(&decode_tok_s, &decode_wait));
    let decode = median(&mut decode_tok_s);
    report["prompt_len"] = json!(a.prompt_len);
    report["gen"] = json!(a.gen);
    report["context"] = json!(a.context);
    // The state bytes of the timed steps, on average (`state_bytes_per_token` is the steady
    // state's).
    let positions: usize = (a.context..a.context + a.gen).map(|t| positions_read(model.config(), t)).sum();
    report["decode_state_bytes_per_token"] = json!((position_bytes(model) * positions as f64 / a.gen as f64) as u64);
    report["prefill_tok_s"] = json!(median(&mut prefill_tok_s));
    report["decode_tok_s"] = json!(decode);
    report["decode_ms_per_tok"] = json!(1e3 / decode);
    report["decode_matmul_fraction"] = json!(median(&mut matmul_frac));
    report["decode_head_fraction"] = json!(median(&mut head_frac));
    report["prefill_tok_s_adj"] = json!(median(&mut prefill_adj));
    report["decode_tok_s_adj"] = json!(median(&mut decode_adj));
    report["prefill_wait_fraction"] = json!(median(&mut prefill_wait));
    report["decode_wait_fraction"] = json!(median(&mut decode_wait));
    report["runs"] = runs;
    Ok(())
}

/// Decodes to the largest checkpoint, timing a window of steps that ends at each one.
fn long_run(a: &Args, model: &Model<'_>, pool: &Pool, report: &mut Value) -> Result<()> {
    let mut checkpoints = a.checkpoints.clone();
    checkpoints.sort_unstable();
    checkpoints.dedup();
    let last = *checkpoints.last().unwrap_or(&0);
    if last > a.gen {
        bail!("checkpoint {last} is past --gen {}", a.gen);
    }
    let chunk = model.config().chunk_len as usize;
    let window = a.window.unwrap_or(1024.max(4 * chunk)).div_ceil(chunk).max(1) * chunk;
    let mut run = Run::new(*model);
    let mut session = run.session()?;
    let mut stream = Pcg32::new(a.seed);
    let vocab_len = model.config().vocab_len;
    let mut next = 0u32;
    let mut rows = Vec::new();
    let started = Instant::now();
    for &cp in &checkpoints {
        let begin = cp.saturating_sub(window);
        // Get to the window's start.
        if a.fast_forward && session.pos() + 1 < begin {
            let ff = token_stream(u64::from(stream.next_u32()), begin - 1 - session.pos(), vocab_len);
            prefill(&mut session, &ff, Phase::Prefill, pool).context("fast-forward")?;
            next = greedy(session.logits());
        }
        while session.pos() < begin {
            next = session.decode_with(next, pool).map(greedy)?;
        }
        let steps = cp - session.pos();
        // Any `chunk_len` consecutive steps hold exactly one state fold, so the median of
        // whole chunks' means counts the folds fairly and ignores a chunk that another
        // process preempted.
        let mut per_chunk = Vec::new();
        let mut slowest = 0f64;
        let (run0, wait0) = sched_ns();
        let t = Instant::now();
        while session.pos() < cp {
            let n = chunk.min(cp - session.pos());
            let tc = Instant::now();
            for _ in 0..n {
                let ts = Instant::now();
                next = session.decode_with(next, pool).map(greedy)?;
                slowest = slowest.max(ts.elapsed().as_secs_f64() * 1e3);
            }
            if n == chunk {
                per_chunk.push(tc.elapsed().as_secs_f64() * 1e3 / n as f64);
            }
        }
        let wall = t.elapsed().as_secs_f64();
        let (run1, wait1) = sched_ns();
        let wait = wait1.saturating_sub(wait0) as f64 / 1e9 / (wall * pool.threads() as f64);
        // CPU time per step (all threads): what the step cost with preemption taken out.
        let cpu = run1.saturating_sub(run0) as f64 / 1e6 / steps.max(1) as f64;
        let mean = wall * 1e3 / steps.max(1) as f64;
        // The fastest chunk did the same work as the others with the least interference
        // from other processes: on a shared machine it is the steadiest measure of cost.
        let best = per_chunk.iter().copied().fold(f64::INFINITY, f64::min).min(mean);
        let ms = if per_chunk.is_empty() { mean } else { median(&mut per_chunk) };
        let row = json!({
            "pos": cp,
            "window": steps,
            "ms_per_tok": ms,
            "mean_ms_per_tok": mean,
            "best_chunk_ms_per_tok": best,
            "cpu_ms_per_tok": cpu,
            // The step that folds a chunk into the state is the slow one.
            "max_step_ms": slowest,
            "wait_fraction": wait,
            "rss_bytes": status_bytes("VmRSS:"),
            "peak_rss_bytes": status_bytes("VmHWM:"),
            "state_slots": session.state_slots(),
        });
        if a.round_trip > 0 {
            round_trip(&mut session, pool, &token_stream(u64::from(stream.next_u32()), a.round_trip, vocab_len))?;
        }
        if std::io::stderr().is_terminal() {
            eprintln!("reached {cp} tokens after {:.0} s", started.elapsed().as_secs_f64());
        }
        rows.push(row);
    }
    let spread = |key: &str| {
        let v: Vec<f64> = rows.iter().filter_map(|r| r[key].as_f64()).collect();
        let (lo, hi) = v.iter().fold((f64::INFINITY, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        if lo > 0.0 {
            hi / lo - 1.0
        } else {
            0.0
        }
    };
    report["latency_spread"] = json!(spread("ms_per_tok"));
    report["best_chunk_latency_spread"] = json!(spread("best_chunk_ms_per_tok"));
    report["cpu_latency_spread"] = json!(spread("cpu_ms_per_tok"));
    report["rss_spread"] = json!(spread("rss_bytes"));
    report["checkpoints"] = Value::Array(rows);
    report["fast_forward"] = json!(a.fast_forward);
    report["long_run_secs"] = json!(started.elapsed().as_secs_f64());
    report["round_trips"] = json!(if a.round_trip > 0 { checkpoints.len() } else { 0 });
    Ok(())
}

/// Snapshots `session`, decodes `tokens`, restores the snapshot and decodes them again;
/// fails unless both passes give the same logits, bit for bit. Leaves the session at the
/// snapshot.
fn round_trip(session: &mut Session<'_, '_>, pool: &Pool, tokens: &[u32]) -> Result<()> {
    let mut snap = vec![0u8; session.snapshot_len()];
    session.snapshot(&mut snap)?;
    let pass = |session: &mut Session<'_, '_>| -> Result<Vec<u32>> {
        let mut bits = Vec::with_capacity(tokens.len() * session.model().config().vocab_len as usize);
        for &t in tokens {
            bits.extend(session.decode_with(t, pool)?.iter().map(|x| x.to_bits()));
        }
        Ok(bits)
    };
    let first = pass(session)?;
    session.restore(&snap)?;
    let second = pass(session)?;
    session.restore(&snap)?;
    if first != second {
        bail!("the logits after restoring the snapshot at position {} differ from the first pass", session.pos());
    }
    Ok(())
}

/// Adds up `words` (8 independent lanes, so the loop streams at load bandwidth) from four
/// equal runs read side by side, as the decode kernels read their weights, asking for the
/// line 4 KiB ahead in each run as they do: the hardware prefetchers stop at page
/// boundaries, and one run read in order overlaps less of memory's latency (this loop
/// read 10-30% slower with one run than with four).
fn sum_words(words: &[u64]) -> u64 {
    const AHEAD: usize = 4096 / 8;
    let run = words.len() / 4 / 8 * 8;
    let (runs, rest) = words.split_at(4 * run);
    let [r0, r1, r2, r3] = std::array::from_fn(|r| runs[r * run..(r + 1) * run].chunks_exact(8));
    let mut acc = [0u64; 8];
    let mut add = |line: &[u64]| {
        prefetch(line.as_ptr().wrapping_add(AHEAD));
        for (lane, &w) in acc.iter_mut().zip(line) {
            *lane = lane.wrapping_add(w);
        }
    };
    for (((l0, l1), l2), l3) in r0.zip(r1).zip(r2).zip(r3) {
        add(l0);
        add(l1);
        add(l2);
        add(l3);
    }
    rest.chunks(8).for_each(&mut add);
    acc.iter().fold(0, |s, &x| s.wrapping_add(x))
}

/// Asks for the cache line at `p` (a hint: never faults, so `p` may be past the end).
#[inline(always)]
fn prefetch(p: *const u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally (SSE, baseline on x86_64).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// GB/s of reading `buf` once, split over `threads` threads; the median of `passes`.
fn read_bandwidth(buf: &[u64], threads: usize, passes: usize) -> f64 {
    let part = buf.len().div_ceil(threads);
    let mut rates: Vec<f64> = (0..passes)
        .map(|_| {
            let t = Instant::now();
            let sum = std::thread::scope(|s| {
                let handles: Vec<_> = buf.chunks(part).map(|c| s.spawn(move || sum_words(c))).collect();
                handles.into_iter().map(|h| h.join().unwrap_or(0)).fold(0u64, u64::wrapping_add)
            });
            std::hint::black_box(sum);
            (buf.len() * 8) as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    median(&mut rates)
}

/// Measures read bandwidth from DRAM with one thread and with the run's threads, and
/// what fraction of it decoding used.
fn bandwidth(mib: usize, threads: usize, report: &mut Value) {
    let words = mib << 17;
    // Distinct values, so every page is really backed (not the shared zero page).
    let buf: Vec<u64> = (0..words as u64).collect();
    let one = read_bandwidth(&buf, 1, 5);
    let many = if threads > 1 { read_bandwidth(&buf, threads, 5) } else { one };
    report["mem_bw_1t_gb_s"] = json!(one);
    report["mem_bw_gb_s"] = json!(many);
    if let (Some(tok_s), Some(w), Some(s)) = (
        report["decode_tok_s"].as_f64(),
        report["weight_bytes_per_token"].as_f64(),
        report["decode_state_bytes_per_token"].as_f64(),
    ) {
        report["bw_fraction"] = json!(w * tok_s / 1e9 / many);
        report["bw_fraction_with_state"] = json!((w + s) * tok_s / 1e9 / many);
    }
}

/// Nanoseconds every thread of this process has spent running and waiting to run (on a
/// run queue, behind other processes), from `/proc/self/task/*/schedstat`; zeros where
/// the OS does not say.
fn sched_ns() -> (u64, u64) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return (0, 0) };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .map(|s| {
            let mut f = s.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
            (f.next().unwrap_or(0), f.next().unwrap_or(0))
        })
        .fold((0, 0), |(r, w), (r1, w1)| (r + r1, w + w1))
}

/// Measures what `f` costs: wall seconds, and the share of the CPU time the run's
/// `threads` wanted that went to other processes instead (run-queue wait / (wall x
/// threads)): near 0 on a quiet machine; past ~0.1 the wall-clock numbers are noise.
fn timed<T>(threads: usize, f: impl FnOnce() -> Result<T>) -> Result<(T, f64, f64)> {
    let (_, wait0) = sched_ns();
    let t = Instant::now();
    let out = f()?;
    let secs = t.elapsed().as_secs_f64();
    let (_, wait1) = sched_ns();
    Ok((out, secs, (wait1.saturating_sub(wait0)) as f64 / 1e9 / (secs * threads as f64)))
}

/// A `/proc/self/status` size field (`VmRSS:`) in bytes; 0 where there is none.
fn status_bytes(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn print_report(r: &Value) {
    let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    let mib = |k: &str| f(k) / (1u64 << 20) as f64;
    let s = |k: &str| r[k].as_str().unwrap_or("?").to_string();
    println!(
        "model          {} ({}, {:.1} M params, {:.1} MiB)",
        s("model"),
        s("dtype"),
        f("params") / 1e6,
        mib("file_bytes")
    );
    println!(
        "model pages    {}{}",
        s("model_pages"),
        if r["packed_at_load"] == true { ", f32 packed at load" } else { "" }
    );
    println!("threads        {}, {} kernels", r["threads"], s("kernel_tier"));
    println!(
        "bytes/token    {:.1} MiB weights + {:.1} MiB attention state",
        mib("weight_bytes_per_token"),
        mib("state_bytes_per_token")
    );
    if r.get("decode_tok_s").is_some() {
        println!("prefill        {:.1} tok/s ({} tokens)", f("prefill_tok_s"), r["prompt_len"]);
        println!(
            "decode         {:.2} tok/s ({} tokens after {} of context; {:.2} ms/token; {:.0}% in matrix \
             products, {:.0}% in the output head)",
            f("decode_tok_s"),
            r["gen"],
            r["context"],
            f("decode_ms_per_tok"),
            100.0 * f("decode_matmul_fraction"),
            100.0 * f("decode_head_fraction")
        );
        println!(
            "cpu stolen     {:.0}% of prefill, {:.0}% of decode (waiting behind other processes); \
             without it {:.1} and {:.2} tok/s",
            100.0 * f("prefill_wait_fraction"),
            100.0 * f("decode_wait_fraction"),
            f("prefill_tok_s_adj"),
            f("decode_tok_s_adj")
        );
    }
    if let Some(rows) = r["checkpoints"].as_array() {
        println!(
            "{:>10} {:>8} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
            "position", "window", "ms/token", "mean ms", "best chunk", "cpu ms", "slowest ms", "rss MiB"
        );
        for row in rows {
            let g = |k: &str| row[k].as_f64().unwrap_or(f64::NAN);
            println!(
                "{:>10} {:>8} {:>12.4} {:>12.4} {:>12.4} {:>12.4} {:>12.3} {:>12.2}",
                row["pos"].as_u64().unwrap_or(0),
                row["window"].as_u64().unwrap_or(0),
                g("ms_per_tok"),
                g("mean_ms_per_tok"),
                g("best_chunk_ms_per_tok"),
                g("cpu_ms_per_tok"),
                g("max_step_ms"),
                g("rss_bytes") / (1u64 << 20) as f64
            );
        }
        println!(
            "spread         latency {:.1}% (median chunk), {:.1}% (best chunk), {:.1}% (cpu), rss {:.1}% \
             (max/min - 1)",
            100.0 * f("latency_spread"),
            100.0 * f("best_chunk_latency_spread"),
            100.0 * f("cpu_latency_spread"),
            100.0 * f("rss_spread")
        );
    }
    println!("peak memory    {:.1} MiB (VmHWM)", mib("peak_rss_bytes"));
    if r.get("mem_bw_gb_s").is_some() {
        println!(
            "memory read    {:.2} GB/s one thread, {:.2} GB/s {} threads",
            f("mem_bw_1t_gb_s"),
            f("mem_bw_gb_s"),
            r["threads"]
        );
    }
    if r.get("bw_fraction").is_some() {
        println!(
            "bandwidth use  {:.0}% (weights), {:.0}% (weights + attention state)",
            100.0 * f("bw_fraction"),
            100.0 * f("bw_fraction_with_state")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::sum_words;

    #[test]
    fn the_bandwidth_loop_reads_every_word_once() {
        for len in [0u64, 1, 7, 31, 32, 33, 1000, 4099] {
            let words: Vec<u64> = (0..len).map(|i| i * i + 1).collect();
            let want = words.iter().fold(0u64, |s, &w| s.wrapping_add(w));
            assert_eq!(sum_words(&words), want, "{len} words");
        }
    }
}

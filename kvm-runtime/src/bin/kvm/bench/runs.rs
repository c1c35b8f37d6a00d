//! The timed runs: prefill and decode speed (`--prompt-len`, `--gen`, `--context`,
//! `--runs`), the long run to `--checkpoints` with its snapshot round trips, and what each
//! costs the machine (CPU wait, resident memory).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use kvm_core::exec::{Exec, HeadFn, PieceFn, Product};
use kvm_core::kernels;
use kvm_core::sampler::Pcg32;
use kvm_core::state::{state_slots, Phase};
use kvm_core::tensor::Matrix;
use kvm_core::{Model, Session};
use kvm_runtime::arena::Arena;
use kvm_runtime::pool::Pool;
use kvm_runtime::prefill::prefill;
use serde_json::{json, Value};

use super::{median, position_bytes, positions_read, Args, Point};

/// A fresh session in its own arena.
struct Run<'m> {
    arena: Arena,
    model: Model<'m>,
    state_len: usize,
}

impl<'m> Run<'m> {
    fn new(model: Model<'m>, state_len: usize) -> Result<Self> {
        Ok(Run { arena: Arena::try_new(model.arena_len_for(state_len)?)?, model, state_len })
    }

    fn session(&mut self) -> Result<Session<'m, '_>> {
        Ok(Session::with_state_len(self.model, self.arena.bytes_mut(), self.state_len)?)
    }
}

/// An [`Exec`] that runs products and heads on the pool and adds up the time they take
/// (the caller's wall time, fork and join included), so the rest of a step (the calling
/// thread's own work: state updates, norms, token shift) can be told apart.
struct Timed<'p> {
    pool: &'p Pool,
    /// Nanoseconds in matrix products.
    matmul: AtomicU64,
    /// Time in the output head alone (`[vocab_len, d_model]`).
    head: AtomicU64,
    /// Time in the pool's per-head and per-piece jobs (attention).
    heads: AtomicU64,
    vocab_len: usize,
}

impl<'p> Timed<'p> {
    fn new(pool: &'p Pool, vocab_len: u32) -> Self {
        let zero = || AtomicU64::new(0);
        Timed { pool, matmul: zero(), head: zero(), heads: zero(), vocab_len: vocab_len as usize }
    }

    /// The fraction of `secs` that `counter` holds.
    fn fraction(counter: &AtomicU64, secs: f64) -> f64 {
        Duration::from_nanos(counter.load(Ordering::Relaxed)).as_secs_f64() / secs
    }
}

// SAFETY: `heads` is the pool's.
unsafe impl Exec for Timed<'_> {
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
        let t = Instant::now();
        self.pool.heads(outs, out_len, scratch, scratch_len, f);
        self.heads.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn pieces(&self, out: &mut [f32], piece: usize, f: &PieceFn<'_>) {
        let t = Instant::now();
        self.pool.pieces(out, piece, f);
        self.heads.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
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

/// Prefill `p.prompt_len` tokens, then decode `p.gen` after `--context` tokens, `--runs`
/// times.
pub(super) fn speed(a: &Args, p: &Point, model: &Model<'_>, pool: &Pool, report: &mut Value) -> Result<()> {
    let vocab_len = model.config().vocab_len;
    let prompt = token_stream(a.seed, p.prompt_len.max(p.context), vocab_len);
    let (prompt, context) = (&prompt[..p.prompt_len], &prompt[..p.context]);
    let (mut decode_tok_s, mut matmul_frac, mut head_frac, mut decode_wait) = (vec![], vec![], vec![], vec![]);
    let mut prefills = Prefills::default();
    let (mut prefill_slots, mut decode_slots) = (0, 0);
    let mut run = Run::new(*model, p.state_len)?;
    for _ in 0..a.runs {
        let mut session = run.session()?;
        prefills.time(&mut session, prompt, pool)?;
        prefill_slots = session.state_slots();
        if p.context != p.prompt_len {
            session.reset();
            if !context.is_empty() {
                prefill(&mut session, context, Phase::Prefill, pool).context("prefill")?;
            }
        }
        let timed_exec = Timed::new(pool, vocab_len);
        let mut next = if context.is_empty() { prompt[0] } else { greedy(session.logits()) };
        let (_, secs, wait) = timed(pool.threads(), || {
            for _ in 0..p.gen {
                next = session.decode_with(next, &timed_exec).map(greedy)?;
            }
            Ok(())
        })?;
        decode_tok_s.push(p.gen as f64 / secs);
        decode_wait.push(wait);
        decode_slots = session.state_slots();
        matmul_frac.push(Timed::fraction(&timed_exec.matmul, secs));
        head_frac.push(Timed::fraction(&timed_exec.head, secs));
    }
    let runs = json!({
        "prefill_tok_s": prefills.tok_s,
        "decode_tok_s": decode_tok_s,
        "prefill_wait_fraction": prefills.wait,
        "decode_wait_fraction": decode_wait,
    });
    let mut decode_adj = adjust(&decode_tok_s, &decode_wait);
    let decode = median(&mut decode_tok_s);
    report["prompt_len"] = json!(p.prompt_len);
    report["gen"] = json!(p.gen);
    report["context"] = json!(p.context);
    // The state bytes of the timed steps, on average, with the slots each step reads
    // (`state_bytes_per_token` is a full state's).
    let cfg = model.config();
    let slots = state_slots(cfg, p.state_len).skip(p.context);
    let positions: usize = (p.context..p.context + p.gen).zip(slots).map(|(t, s)| positions_read(cfg, s, t)).sum();
    report["decode_state_bytes_per_token"] = json!((position_bytes(model) * positions as f64 / p.gen as f64) as u64);
    // The slots the state holds after the timed prompt and after the timed decode (the
    // last decoded token read them).
    report["prefill_state_slots"] = json!(prefill_slots);
    report["decode_state_slots"] = json!(decode_slots);
    report["decode_tok_s"] = json!(decode);
    report["decode_ms_per_tok"] = json!(1e3 / decode);
    report["decode_matmul_fraction"] = json!(median(&mut matmul_frac));
    report["decode_head_fraction"] = json!(median(&mut head_frac));
    prefills.report(pool.threads(), report);
    report["decode_tok_s_adj"] = json!(median(&mut decode_adj));
    report["decode_wait_fraction"] = json!(median(&mut decode_wait));
    report["runs"] = runs;
    Ok(())
}

/// What the rates of runs would have been with their CPUs to themselves (memory
/// contention aside), from the fraction of the time they waited for one.
fn adjust(tok_s: &[f64], wait: &[f64]) -> Vec<f64> {
    tok_s.iter().zip(wait).map(|(&r, &w)| r / (1.0 - w).max(0.05)).collect()
}

/// The timed prompts of [`speed`]'s runs, one value a run in each field.
#[derive(Default)]
struct Prefills {
    tok_s: Vec<f64>,
    /// The fraction of the time the threads waited for a CPU.
    wait: Vec<f64>,
    /// Fractions of the wall time in the matrix products and in attention's jobs (the
    /// rest is the calling thread's serial work).
    matmul: Vec<f64>,
    attention: Vec<f64>,
    /// On a pool of several threads ([`Pool::profiled`]), fractions of the wall time: the
    /// caller's own work outside split jobs (the workers idle; jobs too small to split
    /// among it, `unsplit`), its wait at the joins,
    /// and a worker's time in parts; and all threads' seconds in parts.
    serial: Vec<f64>,
    unsplit: Vec<f64>,
    join: Vec<f64>,
    worker_busy: Vec<f64>,
    parts_s: Vec<f64>,
}

impl Prefills {
    /// Prefills `prompt` into a fresh `session` and keeps its figures.
    fn time(&mut self, session: &mut Session<'_, '_>, prompt: &[u32], pool: &Pool) -> Result<()> {
        let exec = Timed::new(pool, session.model().config().vocab_len);
        let (timed, profile) = pool
            .profiled(|| timed(pool.threads(), || prefill(session, prompt, Phase::Prefill, &exec).context("prefill")));
        let (_, secs, wait) = timed?;
        self.tok_s.push(prompt.len() as f64 / secs);
        self.wait.push(wait);
        self.matmul.push(Timed::fraction(&exec.matmul, secs));
        self.attention.push(Timed::fraction(&exec.heads, secs));
        let share = |ns: u64| ns as f64 / 1e9 / secs;
        self.serial.push(1.0 - share(profile.job_ns));
        self.unsplit.push(share(profile.unsplit_ns));
        self.join.push(share(profile.join_ns));
        self.worker_busy.push(share(profile.worker_ns) / (pool.threads() - 1).max(1) as f64);
        self.parts_s.push((profile.caller_ns + profile.worker_ns) as f64 / 1e9);
        Ok(())
    }

    /// The medians into `report`; the pool's split only for a pool of several threads.
    fn report(mut self, threads: usize, report: &mut Value) {
        report["prefill_tok_s_adj"] = json!(median(&mut adjust(&self.tok_s, &self.wait)));
        report["prefill_tok_s"] = json!(median(&mut self.tok_s));
        report["prefill_wait_fraction"] = json!(median(&mut self.wait));
        report["prefill_matmul_fraction"] = json!(median(&mut self.matmul));
        report["prefill_attention_fraction"] = json!(median(&mut self.attention));
        if threads > 1 {
            report["prefill_serial_fraction"] = json!(median(&mut self.serial));
            report["prefill_unsplit_fraction"] = json!(median(&mut self.unsplit));
            report["prefill_join_fraction"] = json!(median(&mut self.join));
            report["prefill_worker_busy_fraction"] = json!(median(&mut self.worker_busy));
            report["prefill_parts_thread_s"] = json!(median(&mut self.parts_s));
        }
    }
}

/// Decodes to the largest checkpoint, timing a window of steps that ends at each one.
pub(super) fn long_run(a: &Args, p: &Point, model: &Model<'_>, pool: &Pool, report: &mut Value) -> Result<()> {
    let mut checkpoints = a.checkpoints.clone();
    checkpoints.sort_unstable();
    checkpoints.dedup();
    let last = *checkpoints.last().unwrap_or(&0);
    if last > p.gen {
        bail!("checkpoint {last} is past --gen {}", p.gen);
    }
    let chunk = model.config().chunk_len as usize;
    let window = a.window.unwrap_or(1024.max(4 * chunk)).div_ceil(chunk).max(1) * chunk;
    let mut run = Run::new(*model, p.state_len)?;
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
        let row = timed_window(&mut session, &mut next, cp, chunk, pool)?;
        if a.round_trip > 0 {
            round_trip(&mut session, pool, &token_stream(u64::from(stream.next_u32()), a.round_trip, vocab_len))?;
        }
        if std::io::stderr().is_terminal() {
            eprintln!("reached {cp} tokens after {:.0} s", started.elapsed().as_secs_f64());
        }
        rows.push(row);
    }
    add_spreads(report, &rows);
    report["checkpoints"] = Value::Array(rows);
    report["fast_forward"] = json!(a.fast_forward);
    report["long_run_secs"] = json!(started.elapsed().as_secs_f64());
    report["round_trips"] = json!(if a.round_trip > 0 { checkpoints.len() } else { 0 });
    Ok(())
}

/// Decodes from the session's position to checkpoint `cp`, timing the steps: the
/// checkpoint's row (latencies, memory, state slots).
fn timed_window(session: &mut Session<'_, '_>, next: &mut u32, cp: usize, chunk: usize, pool: &Pool) -> Result<Value> {
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
            *next = session.decode_with(*next, pool).map(greedy)?;
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
    Ok(json!({
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
    }))
}

/// How far the checkpoints' latencies and memory spread (max / min - 1).
fn add_spreads(report: &mut Value, rows: &[Value]) {
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
}

/// Snapshots `session`, decodes `tokens`, restores the snapshot and decodes them again;
/// fails unless both passes give the same logits, bit for bit. Leaves the session at the
/// snapshot.
fn round_trip(session: &mut Session<'_, '_>, pool: &Pool, tokens: &[u32]) -> Result<()> {
    let mut snap = kvm_runtime::arena::zeroed::<u8>(session.snapshot_len())?;
    session.snapshot(&mut snap)?;
    let pass = |session: &mut Session<'_, '_>| -> Result<Vec<u32>> {
        // Every token's logits, a number the file's vocabulary sizes: reserved where
        // memory can be refused.
        let len = tokens.len().saturating_mul(session.model().config().vocab_len as usize);
        let mut bits = kvm_runtime::arena::zeroed::<u32>(len)?;
        bits.clear();
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

/// Starts a new peak for `VmHWM` at the current resident size (Linux's `clear_refs` 5), so
/// each run of a sweep reports its own peak rather than the largest so far; where the OS
/// does not offer it, the peak stays the process's.
pub(super) fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").ok();
}

/// A `/proc/self/status` size field (`VmRSS:`) in bytes; 0 where there is none.
pub(super) fn status_bytes(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

//! The reports as text, or as a table of every run (`--json` prints the same values as
//! one JSON object per run).

use serde_json::Value;

/// `--output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Md,
    Csv,
    Json,
    Text,
}

/// One table of every run, as llama-bench prints it: a row per test (`pp512` prefill,
/// `tg128` decode, `tg128 @ d512` decode after 512 tokens of context), or in a long run
/// a row per checkpoint.
pub(super) fn print_table(reports: &[Value], format: Format) {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let long = reports.iter().any(|r| r["checkpoints"].is_array());
    let head: &[&str] = if long {
        &["model", "dtype", "cache", "threads", "position", "ms/token", "best chunk ms", "slots", "rss MiB"]
    } else {
        &["model", "dtype", "params", "cache", "threads", "test", "tok/s", "slots", "peak MiB"]
    };
    let num = |x: &Value, digits: usize| x.as_f64().map_or_else(|| "?".into(), |v| format!("{v:.digits$}"));
    let mib = |x: &Value| num(&Value::from(x.as_f64().unwrap_or(f64::NAN) / (1u64 << 20) as f64), 1);
    for r in reports {
        let s = |k: &str| r[k].as_str().unwrap_or("?").to_string();
        let common = [s("model"), s("dtype")];
        if long {
            for c in r["checkpoints"].as_array().into_iter().flatten() {
                let mut row = common.to_vec();
                row.extend([s("cache"), r["threads"].to_string(), c["pos"].to_string()]);
                row.extend([num(&c["ms_per_tok"], 4), num(&c["best_chunk_ms_per_tok"], 4)]);
                row.extend([c["state_slots"].to_string(), mib(&c["rss_bytes"])]);
                rows.push(row);
            }
            continue;
        }
        let params = format!("{:.2} M", r["params"].as_f64().unwrap_or(0.0) / 1e6);
        let context = r["context"].as_u64().unwrap_or(0);
        let depth = if context > 0 { format!(" @ d{context}") } else { String::new() };
        // The slots a test's last token read: a growable state's size at that depth.
        for (test, rate, slots) in [
            (format!("pp{}", r["prompt_len"]), &r["prefill_tok_s"], &r["prefill_state_slots"]),
            (format!("tg{}{depth}", r["gen"]), &r["decode_tok_s"], &r["decode_state_slots"]),
        ] {
            let mut row = common.to_vec();
            row.extend([
                params.clone(),
                s("cache"),
                r["threads"].to_string(),
                test,
                num(rate, 2),
                slots.to_string(),
                mib(&r["peak_rss_bytes"]),
            ]);
            rows.push(row);
        }
    }
    match format {
        Format::Csv => {
            let field =
                |f: &str| if f.contains([',', '"']) { format!("\"{}\"", f.replace('"', "\"\"")) } else { f.into() };
            println!("{}", head.join(","));
            for row in &rows {
                println!("{}", row.iter().map(|f| field(f)).collect::<Vec<_>>().join(","));
            }
        }
        _ => {
            let widths: Vec<usize> = (0..head.len())
                .map(|i| rows.iter().map(|r| r[i].len()).chain([head[i].len()]).max().unwrap_or(0))
                .collect();
            let line = |cells: Vec<String>| {
                let cells: Vec<String> = cells.iter().zip(&widths).map(|(c, &w)| format!("{c:>w$}")).collect();
                println!("| {} |", cells.join(" | "));
            };
            line(head.iter().map(|h| h.to_string()).collect());
            println!("|{}|", widths.iter().map(|&w| format!("{}:", "-".repeat(w + 1))).collect::<Vec<_>>().join("|"));
            rows.into_iter().for_each(line);
        }
    }
}

pub(super) fn print_report(r: &Value) {
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
    println!("threads        {}, {} kernels, {} streaming", r["threads"], s("kernel_tier"), s("kernel_streaming"));
    println!(
        "bytes/token    {:.1} MiB weights + {:.1} MiB attention state",
        mib("weight_bytes_per_token"),
        mib("state_bytes_per_token")
    );
    if r.get("decode_tok_s").is_some() {
        print_speed(r);
    }
    if r.get("decode_state_slots").is_some() {
        println!(
            "state          {} slots after the prompt, {} at the last decoded token (room for {})",
            r["prefill_state_slots"], r["decode_state_slots"], r["state_len"]
        );
    }
    if let Some(rows) = r["checkpoints"].as_array() {
        print_checkpoints(r, rows);
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
    if r.get("fma_peak_gflops").is_some() {
        println!(
            "FMA peak       {:.1} GFLOP/s one thread, {:.1} GFLOP/s {} threads ({} kernels)",
            f("fma_peak_1t_gflops"),
            f("fma_peak_gflops"),
            r["threads"],
            s("kernel_tier")
        );
    }
    if r.get("fma_fraction").is_some() {
        println!(
            "compute use    {:.0}% (prefill's matrix products, {:.1} GFLOP/s at {:.1} MFLOP a token)",
            100.0 * f("fma_fraction"),
            f("prefill_gflops"),
            f("flops_per_token") / 1e6
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

/// The report's prefill and decode rates, and the share of each the CPU was stolen.
fn print_speed(r: &Value) {
    let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    println!(
        "prefill        {:.1} tok/s ({} tokens; {:.0}% in matrix products, {:.0}% in attention's jobs)",
        f("prefill_tok_s"),
        r["prompt_len"],
        100.0 * f("prefill_matmul_fraction"),
        100.0 * f("prefill_attention_fraction")
    );
    if r.get("prefill_join_fraction").is_some() {
        println!(
            "prefill split  {:.0}% the calling thread alone ({:.0}% in jobs too small to split), {:.0}% its \
             waits at joins; a worker {:.0}% in parts; {:.3} s of parts on all threads",
            100.0 * f("prefill_serial_fraction"),
            100.0 * f("prefill_unsplit_fraction"),
            100.0 * f("prefill_join_fraction"),
            100.0 * f("prefill_worker_busy_fraction"),
            f("prefill_parts_thread_s")
        );
    }
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

/// The long run's table, one row per checkpoint, and how far its rows spread.
fn print_checkpoints(r: &Value, rows: &[Value]) {
    let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
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

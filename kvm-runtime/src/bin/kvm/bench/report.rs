//! The report as text (`--json` prints the same values as one JSON object).

use serde_json::Value;

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

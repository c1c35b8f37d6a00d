//! The bandwidth probe: this machine's DRAM read rate, measured in the same run, with one
//! thread and with a run's threads, and what fraction of it decoding used.

use std::time::Instant;

use anyhow::{anyhow, Result};
use serde_json::{json, Value};

use super::median;

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

/// Read bandwidth from DRAM in GB/s, with one thread and with `threads`, from a buffer of
/// `mib` MiB.
///
/// # Errors
/// When the buffer cannot be allocated.
pub(super) fn bandwidth(mib: usize, threads: usize) -> Result<(f64, f64)> {
    let words = mib << 17;
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(words).map_err(|_| anyhow!("--bw-mib {mib}: no memory for the probe's buffer"))?;
    // Distinct values, so every page is really backed (not the shared zero page).
    buf.extend(0..words as u64);
    let one = read_bandwidth(&buf, 1, 5);
    let many = if threads > 1 { read_bandwidth(&buf, threads, 5) } else { one };
    Ok((one, many))
}

/// Adds a run's bandwidth (`(one thread, its threads)`, from [`bandwidth`]) to its
/// report, with what fraction of it decoding used.
pub(super) fn add_bandwidth(report: &mut Value, (one, many): (f64, f64)) {
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

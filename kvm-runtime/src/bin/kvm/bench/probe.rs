//! The bandwidth probe: a roofline for decode, measured in the same run: the best rate at
//! which one thread and a run's threads read a buffer of the step's own weight bytes in the
//! decode kernels' patterns, and what fraction of it decoding used.

use std::time::Instant;

use anyhow::{anyhow, Result};
use serde_json::{json, Value};

/// Adds up `words` (8 independent lanes, so the loop streams at load bandwidth) from
/// `RUNS` equal runs read side by side, as the decode kernels read their weights (one run a
/// row of a tile), asking for the line 4 KiB ahead in each run as they do: the hardware
/// prefetchers stop at page boundaries, and one run read in order overlaps less of
/// memory's latency (this loop read 10-30% slower with one run than with four).
fn sum_words<const RUNS: usize>(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { sum_words_avx2::<RUNS>(words) };
    }
    let acc = sum_runs::<RUNS, _>(words, [0u64; 8], |mut acc, line| {
        for (lane, &w) in acc.iter_mut().zip(line) {
            *lane = lane.wrapping_add(w);
        }
        acc
    });
    acc.iter().fold(0, |s, &x| s.wrapping_add(x))
}

/// [`sum_words`] with 256-bit loads into two register accumulators: at the line rate of a
/// core whose scalar loop is the limit (on a Xeon the scalar probe read 7 GB/s where a
/// decode step read 12).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_words_avx2<const RUNS: usize>(words: &[u64]) -> u64 {
    use std::arch::x86_64::{__m256i, _mm256_add_epi64, _mm256_loadu_si256, _mm256_setzero_si256, _mm256_storeu_si256};
    let zero = (_mm256_setzero_si256(), _mm256_setzero_si256());
    let (a, b) = sum_runs::<RUNS, _>(words, zero, |(a, b), line| {
        // SAFETY: `line` is 8 u64s, read unaligned.
        unsafe {
            let p = line.as_ptr().cast::<__m256i>();
            (_mm256_add_epi64(a, _mm256_loadu_si256(p)), _mm256_add_epi64(b, _mm256_loadu_si256(p.add(1))))
        }
    });
    let mut lanes = [0u64; 8];
    // SAFETY: `lanes` holds two vectors' u64s.
    unsafe {
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), a);
        _mm256_storeu_si256(lanes.as_mut_ptr().add(4).cast(), b);
    }
    lanes.iter().fold(0, |s, &x| s.wrapping_add(x))
}

/// The walk of [`sum_words`]: `RUNS` runs a line at a time each, `add` folding a line of 8
/// words into `acc`, the rest (zero-padded to a line) in order.
#[inline(always)]
fn sum_runs<const RUNS: usize, A>(words: &[u64], mut acc: A, add: impl Fn(A, &[u64]) -> A) -> A {
    const AHEAD: usize = 4096 / 8;
    let run = words.len() / RUNS / 8 * 8;
    let (runs, rest) = words.split_at(RUNS * run);
    for at in (0..run).step_by(8) {
        for r in 0..RUNS {
            let line = &runs[r * run + at..r * run + at + 8];
            prefetch(line.as_ptr().wrapping_add(AHEAD));
            acc = add(acc, line);
        }
    }
    for line in rest.chunks(8) {
        let mut full = [0u64; 8];
        full[..line.len()].copy_from_slice(line);
        acc = add(acc, &full);
    }
    acc
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

/// GB/s of reading `buf` once, split over `threads` threads, in the best pass of the
/// decode kernels' read patterns (4, 8 and 16 runs side by side: the tiles' rows): a
/// roofline, which a decode step's rate stays below on a shared machine too (the median
/// of the passes did not: a slow pass or two pulled it under a fast step's).
fn read_bandwidth(buf: &[u64], threads: usize, passes: usize) -> f64 {
    let patterns: [fn(&[u64]) -> u64; 3] = [sum_words::<4>, sum_words::<8>, sum_words::<16>];
    patterns.into_iter().map(|sum| pattern_bandwidth(buf, threads, passes, sum)).fold(0.0, f64::max)
}

/// GB/s of reading `buf` with `sum`, split over `threads` threads; the best of `passes`.
/// A pass reads the buffer at least [`PASS_BYTES`] in all (a small one again and again,
/// as a small model's step reads its weights from the caches), on the calling thread
/// alone for one thread, so that starting threads costs no pass its rate.
fn pattern_bandwidth(buf: &[u64], threads: usize, passes: usize, sum_words: fn(&[u64]) -> u64) -> f64 {
    let part = buf.len().div_ceil(threads).max(1);
    let reps = PASS_BYTES.div_ceil(buf.len().max(1) * 8);
    let read = |c: &[u64]| (0..reps).fold(0u64, |s, _| s.wrapping_add(sum_words(std::hint::black_box(c))));
    (0..passes)
        .map(|_| {
            let t = Instant::now();
            let sum = if threads == 1 {
                read(buf)
            } else {
                std::thread::scope(|s| {
                    let handles: Vec<_> = buf.chunks(part).map(|c| s.spawn(move || read(c))).collect();
                    handles.into_iter().map(|h| h.join().unwrap_or(0)).fold(0u64, u64::wrapping_add)
                })
            };
            std::hint::black_box(sum);
            (reps * buf.len() * 8) as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

/// Bytes a pass of the probe reads at least: 64 MiB, tens of milliseconds.
const PASS_BYTES: usize = 64 << 20;

/// Read bandwidth in GB/s, with one thread and with `threads`, from a buffer of `mib` MiB
/// (from DRAM, or the caches that hold it).
///
/// # Errors
/// When the buffer cannot be allocated.
pub(super) fn bandwidth(mib: usize, threads: usize) -> Result<(f64, f64)> {
    let words = mib << 17;
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(words).map_err(|_| anyhow!("--bw-mib {mib}: no memory for the probe's buffer"))?;
    // Distinct values, so every page is really backed (not the shared zero page).
    buf.extend(0..words as u64);
    let one = read_bandwidth(&buf, 1, 7);
    let many = if threads > 1 { read_bandwidth(&buf, threads, 7) } else { one };
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
        for len in [0u64, 1, 7, 31, 32, 33, 127, 129, 1000, 4099] {
            let words: Vec<u64> = (0..len).map(|i| i * i + 1).collect();
            let want = words.iter().fold(0u64, |s, &w| s.wrapping_add(w));
            assert_eq!(sum_words::<4>(&words), want, "{len} words");
            assert_eq!(sum_words::<8>(&words), want, "{len} words");
            assert_eq!(sum_words::<16>(&words), want, "{len} words");
            let portable =
                super::sum_runs::<16, _>(&words, 0u64, |s, line| line.iter().fold(s, |s, &w| s.wrapping_add(w)));
            assert_eq!(portable, want, "{len} words");
        }
    }
}

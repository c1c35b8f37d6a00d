//! The compute probe: a roofline for prefill, measured in the same run. Prefill reads each
//! weight once per batch of hundreds of tokens, so its limit is the FMA units, not memory:
//! the probe times independent chains of fused multiply-adds in the running kernel tier's
//! vectors ([`kernels::fma_chains`]) on one thread and on a run's threads, and the report
//! sets the matrix FLOPs a prefill token costs against it (`fma_fraction`).

use std::time::Instant;

use kvm_core::kernels;
use kvm_core::Model;
use serde_json::{json, Value};

/// The FLOPs of one token's matrix products in prefill: `2 * rows * cols` for every matrix
/// of every layer. Not the embedding (a row is looked up) nor the output head, which
/// prefill runs for the prompt's last token only (`2 * vocab_len * d_model` once a
/// prompt: 0.09% of a 512-token prompt of paper-120m), nor attention's dot products.
pub(super) fn flops_per_token(model: &Model<'_>) -> u64 {
    model
        .tensors()
        .filter(|e| e.role.is_matrix() && e.role.is_layer())
        .map(|e| 2 * u64::from(e.rows) * u64::from(e.cols))
        .sum()
}

/// Multiply-adds one pass of the probe does on each thread: 2^27, about 2-3 ms of a
/// vector tier (shorter than a scheduler's slice, so that on a shared machine some passes
/// run whole on a core) and 30-70 ms of the scalar one.
const PASS_FMAS: u64 = 1 << 27;

/// Passes the probe takes the best of: a shared machine slows some.
const PASSES: usize = 15;

/// The FMA peak of `threads` threads running at once, in GFLOP/s (a multiply-add is two):
/// each thread's best of [`PASSES`] passes of [`PASS_FMAS`] of the running tier's
/// multiply-adds ([`kernels::fma_chains`]), summed. Each thread times its own passes, so
/// starting the threads costs no pass its rate.
fn peak_gflops(threads: usize) -> f64 {
    let best = || {
        (0..PASSES)
            .map(|_| {
                let t = Instant::now();
                let fmas = kernels::fma_chains(PASS_FMAS);
                2.0 * fmas as f64 / t.elapsed().as_secs_f64() / 1e9
            })
            .fold(0.0, f64::max)
    };
    if threads == 1 {
        return best();
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(best)).collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
    })
}

/// The FMA peak of the running tier in GFLOP/s, with one thread and with `threads`.
pub(super) fn fma_peak(threads: usize) -> (f64, f64) {
    let one = peak_gflops(1);
    let many = if threads > 1 { peak_gflops(threads) } else { one };
    (one, many)
}

/// Adds a run's FMA peak (`(one thread, its threads)`, from [`fma_peak`]) to its report,
/// with the rate prefill's matrix products ran at and what fraction of the peak that is.
pub(super) fn add_fma_peak(report: &mut Value, (one, many): (f64, f64)) {
    report["fma_peak_1t_gflops"] = json!(one);
    report["fma_peak_gflops"] = json!(many);
    if let (Some(tok_s), Some(flops)) = (report["prefill_tok_s"].as_f64(), report["flops_per_token"].as_f64()) {
        let gflops = tok_s * flops / 1e9;
        report["prefill_gflops"] = json!(gflops);
        report["fma_fraction"] = json!(gflops / many);
    }
}

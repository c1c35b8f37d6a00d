//! The float batch product (prefill's) at paper-120m's shapes, timed in every tier the CPU
//! supports: for each dtype, `[rows, cols]` and tier the best of several products of a
//! 256-token batch in the thread's CPU time, in GFLOP/s (two a multiply-add), beside `kvm
//! bench`'s FMA peak.
//!
//! ```sh
//! cargo run -p kvm-core --release --features std --example gemm_speed [f32|f16|f32p ...]
//! ```

use std::time::Instant;

use kvm_core::kernels::{force_tier, matmul, matmul_scratch_len, tier, Tier};
use kvm_core::quant::{quantize_matrix, DType};
use kvm_core::tensor::Matrix;

// The benches' inputs (kvm-test-support's `values`), included as a file so this example
// depends on kvm-core alone, as matvec_speed does.
#[path = "../../tests/support/src/values.rs"]
mod values;
use values::values;

/// Seconds of CPU time this thread has run (`CLOCK_THREAD_CPUTIME_ID`; elsewhere than
/// Linux the wall clock): a shared machine's other processes then take no product's time,
/// only its caches.
fn cpu_seconds(start: Instant) -> f64 {
    #[cfg(target_os = "linux")]
    {
        #[repr(C)]
        struct Timespec {
            sec: i64,
            nsec: i64,
        }
        extern "C" {
            fn clock_gettime(clock: i32, t: *mut Timespec) -> i32;
        }
        const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
        let mut t = Timespec { sec: 0, nsec: 0 };
        // SAFETY: libc's clock_gettime (std links libc on Linux) writes one timespec.
        if unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0 {
            return t.sec as f64 + t.nsec as f64 / 1e9;
        }
    }
    start.elapsed().as_secs_f64()
}

/// GFLOP/s of the best of 15 products of `w` with `n` tokens, in this thread's CPU time.
fn gflops(w: &Matrix<'_>, n: usize) -> f64 {
    let xs = values(n * w.cols, 7);
    let (mut ys, mut act) = (vec![0f32; n * w.rows], vec![0u8; matmul_scratch_len(w.cols, n)]);
    let start = Instant::now();
    let best = (0..15)
        .map(|_| {
            let t = cpu_seconds(start);
            matmul(w, &xs, &mut ys, &mut act);
            cpu_seconds(start) - t
        })
        .fold(f64::INFINITY, f64::min);
    2.0 * (n * w.rows * w.cols) as f64 / best / 1e9
}

fn main() {
    let names: Vec<String> = std::env::args().skip(1).collect();
    let dtypes: Vec<DType> = if names.is_empty() {
        vec![DType::F32, DType::F16, DType::F32P]
    } else {
        names.iter().map(|n| DType::from_name(n).expect("a dtype")).collect()
    };
    #[cfg(not(feature = "std"))]
    let tiers = vec![tier::COMPILED];
    #[cfg(feature = "std")]
    let tiers: Vec<Tier> = Tier::ALL.into_iter().filter(|&t| t != Tier::Scalar && tier::supported(t)).collect();
    for dtype in dtypes {
        for (rows, cols) in [(768, 768), (3072, 768), (768, 3072)] {
            let bytes = dtype.matrix_bytes(rows, cols).expect("whole blocks");
            let mut data = vec![0u8; bytes];
            quantize_matrix(dtype, cols, &values(rows * cols, 1), &mut data).expect("shapes fit");
            let w = Matrix { dtype, rows, cols, data: &data };
            for &t in &tiers {
                // SAFETY: `supported` checked the CPU.
                unsafe { force_tier(t) };
                println!(
                    "{:>5} [{rows:>5}, {cols:>5}] x 256 {:>7}: {:6.1} GFLOP/s",
                    dtype.name(),
                    t.name(),
                    gflops(&w, 256)
                );
            }
        }
    }
}

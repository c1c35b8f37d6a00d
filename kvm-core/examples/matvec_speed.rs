//! Decode's weight products at paper-120m's shapes (`d_model` 768, `d_ff` 3072, a vocab of
//! 50304), timed in every tier this build holds with no run-time check: the scalar one and
//! the compiled one ([`tier::COMPILED`]). Written for wasm, where the tier is fixed at
//! build time, so the two wasm builds compare side by side:
//!
//! ```sh
//! export CARGO_TARGET_WASM32_WASIP1_RUNNER="node $PWD/scripts/wasi-run.mjs"
//! cargo run -p kvm-core --release --example matvec_speed --target wasm32-wasip1
//! CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS="-C target-feature=+simd128" \
//!     cargo run -p kvm-core --release --example matvec_speed --target wasm32-wasip1
//! ```
//!
//! It prints, for each dtype, shape and tier, the microseconds of one product and the
//! weight bytes it streams per second.

use std::time::{Duration, Instant};

use kvm_core::kernels::{act_scratch_len, force_tier, matvec, tier, Tier};
use kvm_core::quant::{quantize_matrix, DType};
use kvm_core::tensor::Matrix;
use values::values;

// The benches' inputs (kvm-test-support's `values`), included as a file: this example,
// also built for wasm32-wasip1, depends on kvm-core alone, not on the test-support crate
// and what it pulls in (kvm-runtime, kvm-export, safetensors).
#[path = "../../tests/support/src/values.rs"]
mod values;

/// Microseconds per product of `w` with one input, over at least a quarter second.
fn time(w: &Matrix<'_>) -> f64 {
    let x = values(w.cols, 7);
    let (mut y, mut act) = (vec![0f32; w.rows], vec![0u8; act_scratch_len(w.cols)]);
    matvec(w, &x, &mut y, &mut act);
    let (start, mut n) = (Instant::now(), 0u32);
    while start.elapsed() < Duration::from_millis(250) {
        matvec(w, &x, &mut y, &mut act);
        n += 1;
    }
    start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

fn main() {
    // `force_tier` needs the CPU to support the tier: the scalar one always does, and
    // `COMPILED` by construction.
    let tiers: Vec<Tier> =
        if tier::COMPILED == Tier::Scalar { vec![Tier::Scalar] } else { vec![Tier::Scalar, tier::COMPILED] };
    // [rows, cols]: the MLP's up and down products, then the vocabulary head.
    for dtype in [DType::Q8_0, DType::Q8_0x16, DType::Q4_0, DType::F16] {
        for (rows, cols) in [(3072, 768), (768, 3072), (50304, 768)] {
            let bytes = dtype.matrix_bytes(rows, cols).expect("whole blocks and groups");
            let mut data = vec![0u8; bytes];
            quantize_matrix(dtype, cols, &values(rows * cols, 1), &mut data).expect("shapes fit");
            let w = Matrix { dtype, rows, cols, data: &data };
            for &t in &tiers {
                // SAFETY: see `tiers`.
                unsafe { force_tier(t) };
                let us = time(&w);
                println!("{dtype:?} [{rows}, {cols}] {t}: {us:.0} us, {:.2} GB/s", bytes as f64 / us / 1e3);
            }
        }
    }
}

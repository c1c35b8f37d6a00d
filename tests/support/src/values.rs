//! Deterministic test values, without dependencies: the benches (`benches/kernels.rs`,
//! through this crate) and `kvm-core/examples/{matvec,gemm}_speed.rs` (which include this
//! file with `#[path]`, to depend on kvm-core alone) use the same inputs.

/// `n` deterministic values in `[-1, 1)` from `seed` (xorshift32).
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

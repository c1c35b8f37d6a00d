//! The FMA probe's arithmetic: independent chains of fused multiply-adds in the running
//! tier's vectors (zmm for AVX-512, ymm for AVX2, q registers for NEON, one f32 elsewhere),
//! so that a caller timing [`fma_chains`] measures the peak rate of the units the batch
//! product runs on (`kvm bench`'s `fma_peak_gflops`, the roofline of prefill).

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::tier::{tier, Tier};
use core::hint::black_box;

/// Runs about `fmas` multiply-adds (lanes times chain steps) in independent chains of the
/// running tier's vectors and returns how many it ran: whole steps of all its chains, so
/// fewer than one step's lanes short of `fmas`.
pub fn fma_chains(fmas: u64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    match tier() {
        // SAFETY: the tier runs, so the CPU has its features (the invariant of `tier`).
        Tier::Avx512 => return unsafe { x86::chains_avx512(fmas) },
        // SAFETY: as above.
        Tier::Avx2 => return unsafe { x86::chains_avx2(fmas) },
        _ => {}
    }
    #[cfg(target_arch = "aarch64")]
    if matches!(tier(), Tier::Neon | Tier::NeonDot) {
        return arm::chains_neon(fmas);
    }
    chains_scalar(fmas)
}

/// The value each chain multiplies by: just below one, with [`ADD`] it keeps every chain
/// finite and normal (each tends to `ADD / (1 - MUL)`).
const MUL: f32 = 0.999_999;
/// The value each chain adds.
const ADD: f32 = 1e-3;

/// 8 chains of one f32 each, a multiply and an add a step (counted as a multiply-add, as
/// the scalar tier's kernels do theirs), as the compiler builds the scalar tier.
fn chains_scalar(fmas: u64) -> u64 {
    const CHAINS: usize = 8;
    let steps = fmas / CHAINS as u64;
    let mut acc = [0f32; CHAINS];
    let (mul, add) = (black_box(MUL), black_box(ADD));
    for _ in 0..steps {
        for a in acc.iter_mut() {
            *a = *a * mul + add;
        }
    }
    black_box(acc);
    steps * CHAINS as u64
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{black_box, ADD, MUL};
    use core::arch::x86_64::*;

    /// 24 chains of 16 lanes: 24 of the 32 zmm registers, more than FMA latency times
    /// throughput on any AVX-512 core (4 cycles x 2 a cycle on Ice Lake).
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn chains_avx512(fmas: u64) -> u64 {
        const CHAINS: usize = 24;
        let steps = fmas / (CHAINS * 16) as u64;
        let (mul, add) = (_mm512_set1_ps(black_box(MUL)), _mm512_set1_ps(black_box(ADD)));
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..steps {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, mul, add);
            }
        }
        black_box(acc);
        steps * (CHAINS * 16) as u64
    }

    /// 12 chains of 8 lanes: 12 of the 16 ymm registers, two more holding the multiplier
    /// and the addend (8 chains hide FMA latency on two ports).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn chains_avx2(fmas: u64) -> u64 {
        const CHAINS: usize = 12;
        let steps = fmas / (CHAINS * 8) as u64;
        let (mul, add) = (_mm256_set1_ps(black_box(MUL)), _mm256_set1_ps(black_box(ADD)));
        let mut acc = [_mm256_setzero_ps(); CHAINS];
        for _ in 0..steps {
            for a in acc.iter_mut() {
                *a = _mm256_fmadd_ps(*a, mul, add);
            }
        }
        black_box(acc);
        steps * (CHAINS * 8) as u64
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use super::{black_box, ADD, MUL};
    use core::arch::aarch64::*;

    /// 16 chains of 4 lanes (16 of the 32 q registers).
    pub(super) fn chains_neon(fmas: u64) -> u64 {
        const CHAINS: usize = 16;
        let steps = fmas / (CHAINS * 4) as u64;
        // SAFETY: Advanced SIMD is baseline on aarch64.
        unsafe {
            let (mul, add) = (vdupq_n_f32(black_box(MUL)), vdupq_n_f32(black_box(ADD)));
            let mut acc = [vdupq_n_f32(0.0); CHAINS];
            for _ in 0..steps {
                for a in acc.iter_mut() {
                    *a = vfmaq_f32(add, *a, mul);
                }
            }
            black_box(acc);
        }
        steps * (CHAINS * 4) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each tier's chains run whole steps of their lanes: what was asked, less than one
    /// step short (a step of AVX-512's chains is 24 x 16 multiply-adds). Called directly,
    /// not by switching the tier, which other tests running alongside read.
    #[test]
    fn the_chains_run_what_they_count() {
        let whole = |ran: u64, fmas: u64, step: u64| ran <= fmas && fmas - ran < step && ran.is_multiple_of(step);
        for fmas in [0, 1, 383, 384, 1000, 100_000] {
            assert!(whole(chains_scalar(fmas), fmas, 8), "{fmas}");
            let ran = fma_chains(fmas);
            assert!(ran <= fmas && fmas - ran < 24 * 16, "{fmas}: {ran}");
            #[cfg(target_arch = "x86_64")]
            {
                use super::super::tier::supported;
                if supported(Tier::Avx2) {
                    // SAFETY: the CPU has AVX2 and FMA.
                    assert!(whole(unsafe { x86::chains_avx2(fmas) }, fmas, 12 * 8), "{fmas}");
                }
                if supported(Tier::Avx512) {
                    // SAFETY: the CPU has AVX-512 F.
                    assert!(whole(unsafe { x86::chains_avx512(fmas) }, fmas, 24 * 16), "{fmas}");
                }
            }
            #[cfg(target_arch = "aarch64")]
            assert!(whole(arm::chains_neon(fmas), fmas, 16 * 4), "{fmas}");
        }
    }
}

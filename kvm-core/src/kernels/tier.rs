//! Which kernel tier runs: chosen at compile time from `target_feature`, switchable at run
//! time by a caller that has checked the CPU.
//!
//! The choice lives in one atomic so that `static` state and `no_std` targets need no
//! initialisation. Nothing here logs: the std runtime reports what it switched on.

#[cfg(test)]
extern crate std;

use core::fmt;
use core::sync::atomic::{AtomicU8, Ordering};

/// A set of kernels and the CPU features it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
#[repr(u8)]
pub enum Tier {
    /// Portable Rust; the reference every other tier is tested against.
    Scalar = 0,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2 = 1,
    /// x86_64 AVX2 tier plus AVX-512 F/BW/VL and VNNI.
    Avx512 = 2,
    /// aarch64 Advanced SIMD.
    Neon = 3,
    /// aarch64 Advanced SIMD with the `dotprod` extension (`sdot`).
    NeonDot = 4,
    /// 32-bit Arm with the DSP extension (Cortex-M4/M7/M33): `smlad` integer products.
    Dsp = 5,
    /// Armv8.1-M Helium (MVE), Cortex-M55: compiled only with `-C target-cpu=cortex-m55`
    /// (or `-C target-feature=+mve`), which the crate's build script sees as `kvm_mve`.
    Helium = 6,
    /// WebAssembly SIMD (`simd128`): compiled only with `-C target-feature=+simd128`, as
    /// WebAssembly has no run-time detection (an engine without it refuses the module).
    Simd128 = 7,
}

impl Tier {
    /// Every tier, best last within each architecture.
    pub const ALL: [Tier; 8] =
        [Tier::Scalar, Tier::Avx2, Tier::Avx512, Tier::Neon, Tier::NeonDot, Tier::Dsp, Tier::Helium, Tier::Simd128];

    /// The name `KVM_KERNELS` takes (`avx2`).
    pub const fn name(self) -> &'static str {
        match self {
            Tier::Scalar => "scalar",
            Tier::Avx2 => "avx2",
            Tier::Avx512 => "avx512",
            Tier::Neon => "neon",
            Tier::NeonDot => "neondot",
            Tier::Dsp => "dsp",
            Tier::Helium => "helium",
            Tier::Simd128 => "simd128",
        }
    }

    /// Parses a [`Tier::name`].
    pub fn from_name(s: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.name() == s)
    }

    /// Whether this build holds the tier's kernels (they exist for its architecture only).
    pub const fn is_compiled(self) -> bool {
        match self {
            Tier::Scalar => true,
            Tier::Avx2 | Tier::Avx512 => cfg!(target_arch = "x86_64"),
            Tier::Neon | Tier::NeonDot => cfg!(target_arch = "aarch64"),
            Tier::Dsp => cfg!(kvm_arm_dsp),
            Tier::Helium => cfg!(all(target_arch = "arm", kvm_mve)),
            Tier::Simd128 => cfg!(all(target_arch = "wasm32", target_feature = "simd128")),
        }
    }

    const fn from_u8(v: u8) -> Option<Tier> {
        match v {
            0 => Some(Tier::Scalar),
            1 => Some(Tier::Avx2),
            2 => Some(Tier::Avx512),
            3 => Some(Tier::Neon),
            4 => Some(Tier::NeonDot),
            5 => Some(Tier::Dsp),
            6 => Some(Tier::Helium),
            7 => Some(Tier::Simd128),
            _ => None,
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The best tier the compile-time target features guarantee (`-C target-cpu=native` on an
/// AVX-512 machine gives [`Tier::Avx512`] with no run-time check). Arm's DSP extension is
/// not a stable `target_feature`; the crate's build script sets `kvm_arm_dsp` when the
/// target's code generation has it (`thumbv7em`, or `thumbv8m.main` with
/// `-C target-cpu=cortex-m33`), and `kvm_mve` for Helium (`-C target-cpu=cortex-m55`):
/// microcontrollers have no run-time detection, nor has WebAssembly ([`Tier::Simd128`] with
/// `-C target-feature=+simd128`).
pub const COMPILED: Tier = if cfg!(all(target_arch = "arm", kvm_mve)) {
    Tier::Helium
} else if cfg!(all(target_arch = "wasm32", target_feature = "simd128")) {
    Tier::Simd128
} else if cfg!(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c",
    target_feature = "avx512f",
    target_feature = "avx512bw",
    target_feature = "avx512vl",
    target_feature = "avx512vnni"
)) {
    Tier::Avx512
} else if cfg!(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")) {
    Tier::Avx2
} else if cfg!(all(target_arch = "aarch64", target_feature = "neon", target_feature = "dotprod")) {
    Tier::NeonDot
} else if cfg!(all(target_arch = "aarch64", target_feature = "neon")) {
    Tier::Neon
} else if cfg!(kvm_arm_dsp) {
    Tier::Dsp
} else {
    Tier::Scalar
};

/// How the float decode tiles read their weight rows from memory (x86_64; the other
/// architectures have one way). Decode streams every weight once per token, and which
/// access pattern memory serves fastest is the core's, not the instruction set's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum Streaming {
    /// Eight runs of rows side by side, each prefetched 4 KiB ahead in software: Intel's
    /// cores, whose hardware prefetchers follow one stream per page and ramp up slowly
    /// (docs/perf.md, "Kernels").
    Software = 0,
    /// Four runs and no software prefetch: AMD's Zen, whose hardware prefetchers follow
    /// them, and on which the software prefetches slowed f16 and f32 decode by a fifth.
    Hardware = 1,
}

impl Streaming {
    /// The name `KVM_STREAMING` takes (`software`, `hardware`).
    pub const fn name(self) -> &'static str {
        match self {
            Streaming::Software => "software",
            Streaming::Hardware => "hardware",
        }
    }

    /// Parses a [`Streaming::name`].
    pub fn from_name(s: &str) -> Option<Streaming> {
        [Streaming::Software, Streaming::Hardware].into_iter().find(|x| x.name() == s)
    }
}

/// The active [`Streaming`] (any value is safe: it only picks tile shapes and hints).
static STREAMING: AtomicU8 = AtomicU8::new(UNSET);

/// How the float decode tiles stream their rows: the one last set, else (with `std`) the
/// CPU's vendor's ([`Streaming::Hardware`] on AMD), else [`Streaming::Software`].
#[inline]
pub fn streaming() -> Streaming {
    match STREAMING.load(Ordering::Relaxed) {
        0 => Streaming::Software,
        1 => Streaming::Hardware,
        _ => {
            let s = detect_streaming();
            STREAMING.store(s as u8, Ordering::Relaxed);
            s
        }
    }
}

/// Makes every later float decode tile stream as `s` says.
pub fn set_streaming(s: Streaming) {
    STREAMING.store(s as u8, Ordering::Relaxed);
}

/// [`Streaming::Hardware`] on an AMD x86_64 CPU, else [`Streaming::Software`].
#[cold]
fn detect_streaming() -> Streaming {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `cpuid` leaf 0 (the vendor) exists on every x86_64 CPU. (Safe to call
        // from Rust 1.87 on; unsafe in the 1.85 the workspace still builds with.)
        #[allow(unused_unsafe)]
        let id = unsafe { core::arch::x86_64::__cpuid(0) };
        // "AuthenticAMD" in ebx, edx, ecx.
        if [id.ebx, id.edx, id.ecx] == [0x6874_7541, 0x6974_6E65, 0x444D_4163] {
            return Streaming::Hardware;
        }
    }
    Streaming::Software
}

/// Not yet chosen: with `std` the first [`tier`] call detects the CPU.
const UNSET: u8 = u8::MAX;

/// The active tier. Invariant: only ever holds a tier the CPU supports.
static ACTIVE: AtomicU8 = AtomicU8::new(if cfg!(feature = "std") { UNSET } else { COMPILED as u8 });

/// The tier the kernels dispatch on: the one last forced, else (with `std`) the best the
/// CPU has, else [`COMPILED`].
#[inline]
pub fn tier() -> Tier {
    match Tier::from_u8(ACTIVE.load(Ordering::Relaxed)) {
        Some(t) => t,
        None => first_use(),
    }
}

#[cfg(feature = "std")]
#[cold]
fn first_use() -> Tier {
    let t = detect();
    ACTIVE.store(t as u8, Ordering::Relaxed);
    t
}

#[cfg(not(feature = "std"))]
fn first_use() -> Tier {
    COMPILED
}

/// Makes every later kernel call use `t`; a tier of another architecture means
/// [`Tier::Scalar`].
///
/// # Safety
/// The CPU running any later kernel call supports `t`, as when `t` is [`COMPILED`] or
/// `supported(t)` holds (with `std`): the kernels execute its instructions unchecked.
pub unsafe fn force_tier(t: Tier) {
    let t = if t.is_compiled() { t } else { Tier::Scalar };
    ACTIVE.store(t as u8, Ordering::Relaxed);
}

/// Whether the running CPU supports `t`.
#[cfg(any(feature = "std", test))]
pub fn supported(t: Tier) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma") && has!("f16c");
        match t {
            Tier::Scalar => true,
            Tier::Avx2 => avx2,
            Tier::Avx512 => avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni"),
            Tier::Neon | Tier::NeonDot | Tier::Dsp | Tier::Helium | Tier::Simd128 => false,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        match t {
            Tier::Scalar => true,
            Tier::Neon => has!("neon"),
            Tier::NeonDot => has!("neon") && has!("dotprod"),
            Tier::Avx2 | Tier::Avx512 | Tier::Dsp | Tier::Helium | Tier::Simd128 => false,
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        // The dsp tier runs on every core that compiles it, Helium's among them; simd128
        // on every engine that loaded the module.
        t == Tier::Scalar || t == COMPILED || (t == Tier::Dsp && cfg!(kvm_arm_dsp))
    }
}

/// The best tier the running CPU supports.
#[cfg(feature = "std")]
pub fn detect() -> Tier {
    [Tier::Avx512, Tier::Avx2, Tier::NeonDot, Tier::Neon, Tier::Helium, Tier::Dsp, Tier::Simd128]
        .into_iter()
        .find(|&t| supported(t))
        .unwrap_or(Tier::Scalar)
}

/// Why [`init_from_env`] refused `KVM_KERNELS`.
#[cfg(feature = "std")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum TierError {
    /// The value is not a [`Tier::name`] (or not UTF-8).
    UnknownName,
    /// The CPU lacks the named tier.
    Unsupported(Tier),
    /// `KVM_STREAMING` is not a [`Streaming::name`] (or not UTF-8).
    UnknownStreaming,
}

#[cfg(feature = "std")]
impl fmt::Display for TierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TierError::UnknownName => {
                f.write_str("KVM_KERNELS must be one of scalar, avx2, avx512, neon, neondot, dsp, helium, simd128")
            }
            TierError::Unsupported(t) => write!(f, "KVM_KERNELS={t}: this CPU does not support it"),
            TierError::UnknownStreaming => f.write_str("KVM_STREAMING must be software or hardware"),
        }
    }
}

#[cfg(feature = "std")]
impl core::error::Error for TierError {}

/// Activates the tier named by `KVM_KERNELS` (`scalar|avx2|avx512|neon|neondot|dsp|helium|simd128`), or the
/// detected best when it is unset or empty, and returns it; CI uses it to run every tier on
/// one machine. `KVM_STREAMING` (`software|hardware`), when set, overrides the CPU's
/// [`Streaming`].
///
/// # Errors
/// [`TierError::UnknownName`] for any other value, [`TierError::Unsupported`] for a tier the
/// CPU lacks, [`TierError::UnknownStreaming`] for a `KVM_STREAMING` of neither name; the
/// active tier and streaming are then left as they were.
#[cfg(feature = "std")]
pub fn init_from_env() -> Result<Tier, TierError> {
    let t = match std::env::var_os("KVM_KERNELS") {
        None => detect(),
        Some(v) if v.is_empty() => detect(),
        Some(v) => {
            let t = v.to_str().and_then(Tier::from_name).ok_or(TierError::UnknownName)?;
            if !supported(t) {
                return Err(TierError::Unsupported(t));
            }
            t
        }
    };
    let streaming = match std::env::var_os("KVM_STREAMING") {
        Some(v) if !v.is_empty() => Some(v.to_str().and_then(Streaming::from_name).ok_or(TierError::UnknownStreaming)?),
        _ => None,
    };
    // SAFETY: `t` is supported: detected, or checked just above.
    unsafe { force_tier(t) };
    if let Some(s) = streaming {
        set_streaming(s);
    }
    Ok(t)
}

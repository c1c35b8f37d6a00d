//! The dispatch table (tract's kernel table): each tier's entry points, built by one
//! constructor from the tier's type ([`Table::of`]) and its tile shapes, picked once per call
//! from the active [`Tier`].

#[cfg(target_arch = "aarch64")]
use super::aarch64;
#[cfg(any(kvm_arm_dsp, kvm_mve, kvm_armv6m))]
use super::arm;
#[cfg(target_arch = "x86_64")]
use super::attend::AttendMany;
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
use super::attend::{self, Attend, Exp};
use super::scalar;
use super::tier::Tier;
#[cfg(target_arch = "x86_64")]
use super::tier::{streaming, Streaming};
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
use super::traits::Stored;
use super::traits::{Attention, Decode, Kernels, Table};
use super::walk::{self, prepared, rows, run};
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
use super::wasm32;
#[cfg(target_arch = "x86_64")]
use super::x86_64;
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
use half::f16;

impl<T: 'static> Attention<T> {
    /// One query at a time: `dots` and `weighted_sum`, no multi-query kernels.
    const fn single(
        dots: unsafe fn(&[T], &[f32], &mut [f32]),
        weighted_sum: unsafe fn(&[f32], &[T], &mut [f32]),
    ) -> Self {
        Attention { dots, weighted_sum, dots_many: None, weighted_sum_many: None }
    }
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64", all(target_arch = "wasm32", target_feature = "simd128")))]
impl<T: Stored + 'static> Attention<T> {
    /// A SIMD tier's one-query entries: [`attend`]'s drivers over `A`'s tiles, weighted
    /// sums `V` vectors of columns wide.
    const fn of<A: Attend<T>, const V: usize>() -> Self {
        Attention::single(attend::dots::<A, T>, attend::weighted_sum::<A, T, V>)
    }

    /// [`Attention::of`] with `A`'s multi-query tiles too: dots in tiles of `R` rows x `Q`
    /// queries, weighted sums of four queries `MV` vectors of columns wide.
    #[cfg(target_arch = "x86_64")]
    const fn many<A: AttendMany<T>, const V: usize, const R: usize, const Q: usize, const MV: usize>() -> Self {
        Attention {
            dots_many: Some(attend::dots_many::<A, T, R, Q>),
            weighted_sum_many: Some(attend::weighted_sum_many::<A, T, V, MV>),
            ..Attention::of::<A, V>()
        }
    }
}

/// The [`Decode`] entries of tier `K` with `RF`-row float tiles and `RQ`-row integer ones.
const fn decode<K: Kernels, const RF: usize, const RQ: usize>() -> Decode {
    Decode { matvec: run::<K, RF, RQ, 1>, matvec_prepared: prepared::<K, RF, RQ, 1>, rows: rows::<K, RF, RQ> }
}

impl Table {
    /// Tier `K`'s table: its products, one token in tiles of `RF` rows (float weights) and
    /// `RQ` (integer ones), a batch through the same tiles a token at a time, its activation
    /// quantizer and row decoder; the rest the scalar tier's, for a tier to replace where it
    /// has its own (a batch's token tiles, the integer numerics' tile, softmax, attention).
    const fn of<K: Kernels, const RF: usize, const RQ: usize>() -> Table {
        Table {
            decode: decode::<K, RF, RQ>(),
            matmul: run::<K, RF, RQ, 1>,
            quantize_act: K::quantize_act,
            dequant_row: K::dequant_row,
            max: scalar::max,
            find: scalar::find,
            exp_sub: scalar::exp_sub,
            narrow_f16: scalar::narrow_f16,
            matvec_i8: walk::matvec_i8::<scalar::Scalar, 4>,
            f32: Attention::single(scalar::dots, scalar::weighted_sum),
            f16: Attention::single(scalar::dots, scalar::weighted_sum),
            i8: Attention::single(scalar::dots, scalar::weighted_sum),
        }
    }

    /// `self` with SIMD tier `A`'s softmax exponentials and one-query attention
    /// ([`Attention::of`], weighted sums `V` vectors of columns wide).
    #[cfg(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        all(target_arch = "wasm32", target_feature = "simd128")
    ))]
    const fn attend<A: Exp + Attend<f32> + Attend<f16> + Attend<i8>, const V: usize>(self) -> Table {
        Table {
            exp_sub: attend::exp_sub::<A>,
            f32: Attention::of::<A, V>(),
            f16: Attention::of::<A, V>(),
            i8: Attention::of::<A, V>(),
            ..self
        }
    }

    /// [`Table::attend`] with `A`'s multi-query tiles too ([`Attention::many`]).
    #[cfg(target_arch = "x86_64")]
    const fn attend_many<
        A: Exp + AttendMany<f32> + AttendMany<f16> + AttendMany<i8>,
        const V: usize,
        const R: usize,
        const Q: usize,
        const MV: usize,
    >(
        self,
    ) -> Table {
        Table {
            f32: Attention::many::<A, V, R, Q, MV>(),
            f16: Attention::many::<A, V, R, Q, MV>(),
            i8: Attention::many::<A, V, R, Q, MV>(),
            ..self.attend::<A, V>()
        }
    }
}

// Tile shapes (rows for float, rows for integer weights; tokens for matmul): each
// activation load serves a tile's rows, which stream from as many runs of the matrix;
// AVX2's tiles stop where its 16 registers would spill (docs/perf.md, "Kernels").
// Attention's (`attend`, `attend_many`): weighted sums 8 vectors of columns wide (one
// pass over the rows for a 128-wide head on AVX-512), 4 on NEON (its f16 loads give
// pairs); multi-query dots in 2 x 2 tiles on AVX2 (a dot's 16 lanes take two of its 16
// registers) and 4 x 4 on AVX-512, four queries' sums over 2 and 4 vectors.
// The integer numerics' products (`walk::matvec_i8`) take 8 rows on x86_64, as the
// float decode tiles, each its own run of the matrix (an i8 row has no blocks to
// interleave); NEON's 4, as its other tiles.
const SCALAR_ENTRIES: Table = Table {
    // Cores without SIMD take a tile in assembly, where the compiler's spills cost
    // about twice the instructions (`arm::v6m`, `riscv32`).
    #[cfg(kvm_armv6m)]
    matvec_i8: walk::matvec_i8::<arm::v6m::V6m, 4>,
    #[cfg(target_arch = "riscv32")]
    matvec_i8: walk::matvec_i8::<super::riscv32::Rv32, 4>,
    ..Table::of::<scalar::Scalar, 1, 1>()
};
static SCALAR: Table = SCALAR_ENTRIES;

// The float decode tiles take 4 rows, not 8, where the hardware prefetchers stream
// them (`Streaming::Hardware`): 4 runs were 1.2x as fast as 8 for f16 on Zen 5.
#[cfg(target_arch = "x86_64")]
static AVX2_HW: Table = Table { decode: decode::<x86_64::avx2::Avx2, 4, 4>(), ..AVX2_ENTRIES };
#[cfg(target_arch = "x86_64")]
static AVX512_HW: Table = Table { decode: decode::<x86_64::avx512::Avx512, 4, 16>(), ..AVX512_ENTRIES };
#[cfg(target_arch = "x86_64")]
static AVX2: Table = AVX2_ENTRIES;
#[cfg(target_arch = "x86_64")]
static AVX512: Table = AVX512_ENTRIES;
#[cfg(target_arch = "x86_64")]
const AVX2_ENTRIES: Table = Table {
    matmul: run::<x86_64::avx2::Avx2, 2, 2, 4>,
    matvec_i8: walk::matvec_i8::<x86_64::avx2::Avx2, 8>,
    max: x86_64::avx2::max,
    find: x86_64::avx2::find,
    narrow_f16: x86_64::avx2::narrow_f16,
    ..Table::of::<x86_64::avx2::Avx2, 8, 4>().attend_many::<x86_64::avx2::Avx2, 8, 2, 2, 2>()
};
#[cfg(target_arch = "x86_64")]
const AVX512_ENTRIES: Table = Table {
    matmul: run::<x86_64::avx512::Avx512, 4, 4, 4>,
    matvec_i8: walk::matvec_i8::<x86_64::avx512::Avx512, 8>,
    max: x86_64::avx512::max,
    find: x86_64::avx512::find,
    narrow_f16: x86_64::avx2::narrow_f16,
    ..Table::of::<x86_64::avx512::Avx512, 8, 16>().attend_many::<x86_64::avx512::Avx512, 8, 4, 4, 4>()
};

// The two NEON tiers differ only in their integer block products; attention and softmax
// are the same code, `Neon`'s.
#[cfg(target_arch = "aarch64")]
static NEON: Table = Table {
    matmul: run::<aarch64::neon::Neon, 4, 4, 4>,
    matvec_i8: walk::matvec_i8::<aarch64::neon::Neon, 4>,
    max: aarch64::neon::max,
    find: aarch64::neon::find,
    narrow_f16: aarch64::neon::narrow_f16,
    ..Table::of::<aarch64::neon::Neon, 4, 4>().attend::<aarch64::neon::Neon, 4>()
};
#[cfg(target_arch = "aarch64")]
static NEON_DOT: Table = Table {
    matmul: run::<aarch64::neon::NeonDot, 4, 4, 4>,
    matvec_i8: walk::matvec_i8::<aarch64::neon::NeonDot, 4>,
    max: aarch64::neon::max,
    find: aarch64::neon::find,
    narrow_f16: aarch64::neon::narrow_f16,
    ..Table::of::<aarch64::neon::NeonDot, 4, 4>().attend::<aarch64::neon::Neon, 4>()
};

// Scalar but for the integer formats (one-row float tiles, four-row integer ones),
// their activation quantizer and attention over f32 rows (see `arm::dsp`, `arm::fpu`).
#[cfg(kvm_arm_dsp)]
static DSP: Table = Table {
    matvec_i8: walk::matvec_i8::<arm::dsp_int::DspInt, 4>,
    f32: Attention::single(arm::fpu::dots, arm::fpu::weighted_sum),
    ..Table::of::<arm::dsp::Dsp, 1, 4>()
};

// Integer products and attention over f32 rows; the float kernels are the scalar ones
// (see `arm::helium`).
#[cfg(all(target_arch = "arm", kvm_mve))]
static HELIUM: Table = Table {
    #[cfg(kvm_arm_dsp)]
    matvec_i8: walk::matvec_i8::<arm::dsp_int::DspInt, 4>,
    f32: Attention::single(arm::fpu::dots, arm::fpu::weighted_sum),
    ..Table::of::<arm::helium::Helium, 1, 1>()
};

// simd128: 4-row tiles as NEON's (engines give a wasm function about 16 vector
// registers).
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
static SIMD128: Table = Table {
    matvec_i8: walk::matvec_i8::<wasm32::Simd128, 4>,
    max: wasm32::max,
    find: wasm32::find,
    ..Table::of::<wasm32::Simd128, 4, 4>().attend::<wasm32::Simd128, 4>()
};

/// The table of `tier`; a tier of another architecture gets the scalar one.
pub(super) fn table(tier: Tier) -> &'static Table {
    match tier {
        #[cfg(all(target_arch = "arm", kvm_mve))]
        Tier::Helium => &HELIUM,
        #[cfg(kvm_arm_dsp)]
        Tier::Dsp => &DSP,
        #[cfg(target_arch = "x86_64")]
        Tier::Avx2 if streaming() == Streaming::Hardware => &AVX2_HW,
        #[cfg(target_arch = "x86_64")]
        Tier::Avx2 => &AVX2,
        #[cfg(target_arch = "x86_64")]
        Tier::Avx512 if streaming() == Streaming::Hardware => &AVX512_HW,
        #[cfg(target_arch = "x86_64")]
        Tier::Avx512 => &AVX512,
        #[cfg(target_arch = "aarch64")]
        Tier::Neon => &NEON,
        #[cfg(target_arch = "aarch64")]
        Tier::NeonDot => &NEON_DOT,
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Tier::Simd128 => &SIMD128,
        _ => &SCALAR,
    }
}

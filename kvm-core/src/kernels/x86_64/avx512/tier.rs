//! The AVX-512 tier's type: what it supplies to the matrix products' and attention's drivers.

use super::float::{dequant_f32p_shuffle, dequant_f32p_vbmi, has_vbmi, Float, Packed};
use super::quant::{Interleaved, Quant};
use crate::kernels::attend::Isa;
use crate::kernels::gemm;
use crate::kernels::traits::{Kernels, RunFn, BF16, F16, F32};
use crate::kernels::x86_64::avx2::{self, Q4, Q8};
use crate::quant::DType;

/// The AVX-512 tier.
pub(crate) struct Avx512;

impl Kernels for Avx512 {
    type F32 = Float<F32>;
    type F16 = Float<F16>;
    type BF16 = Float<BF16>;
    type Q8_0 = Quant<Q8>;
    type Q4_0 = Quant<Q4>;
    type Q4_0x16 = Interleaved<Q4>;
    type Q8_0x16 = Interleaved<Q8>;
    type F32P = Packed;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        // SAFETY: this tier includes the AVX2 one.
        unsafe { avx2::quantize_act(x, out) }
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        // SAFETY: (every arm) this tier includes the AVX2 one; `has_vbmi` checked VBMI.
        unsafe {
            match dtype {
                DType::F32P if has_vbmi() => dequant_f32p_vbmi(row, out),
                DType::F32P => dequant_f32p_shuffle(row, out),
                _ => avx2::dequant_row(dtype, row, out),
            }
        }
    }

    const GEMM: Option<RunFn> = Some(gemm::run::<Self>);
}

impl Isa for Avx512 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn enable<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

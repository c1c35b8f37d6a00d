//! The AVX2 tier's type: what it supplies to the matrix products' and attention's drivers.

use super::float::{Float, Packed};
use super::quant::{Interleaved, Quant, Q4, Q8};
use super::rows::{dequant_row, quantize_act};
use crate::kernels::attend::Isa;
use crate::kernels::gemm;
use crate::kernels::traits::{Kernels, RunFn, BF16, F16, F32};
use crate::quant::DType;

/// The AVX2 tier.
pub(crate) struct Avx2;

impl Kernels for Avx2 {
    type F32 = Float<F32>;
    type F16 = Float<F16>;
    type BF16 = Float<BF16>;
    type Q8_0 = Quant<Q8>;
    type Q4_0 = Quant<Q4>;
    type Q4_0x16 = Interleaved<Q4>;
    type Q8_0x16 = Interleaved<Q8>;
    type F32P = Packed;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        // SAFETY: the caller guarantees AVX2/FMA/F16C.
        unsafe { quantize_act(x, out) }
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        // SAFETY: the caller guarantees AVX2/FMA/F16C.
        unsafe { dequant_row(dtype, row, out) }
    }

    const GEMM: Option<RunFn> = Some(gemm::run::<Self>);
}

impl Isa for Avx2 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn enable<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

//! The NEON tiers' types: what they supply to the matrix products' and attention's drivers.

use super::float::{Float, Packed};
use super::quant::{Interleaved, Mull, Quant, SDot, Q4, Q8};
use super::rows::{dequant_row, quantize_act};
use crate::kernels::attend::Isa;
use crate::kernels::gemm;
use crate::kernels::{Kernels, BF16, F16, F32};
use crate::quant::DType;

/// The NEON tier.
pub(crate) struct Neon;

/// The NEON + dotprod tier.
pub(crate) struct NeonDot;

impl Kernels for Neon {
    type F32 = Float<F32>;
    type F16 = Float<F16>;
    type BF16 = Float<BF16>;
    type Q8_0 = Quant<Q8, Mull>;
    type Q4_0 = Quant<Q4, Mull>;
    type Q4_0x16 = Interleaved<Q4, Mull>;
    type Q8_0x16 = Interleaved<Q8, Mull>;
    type F32P = Packed;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        // SAFETY: the caller guarantees NEON.
        unsafe { quantize_act(x, out) }
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        // SAFETY: the caller guarantees NEON.
        unsafe { dequant_row(dtype, row, out) }
    }

    const GEMM: Option<gemm::RunFn> = Some(gemm::run::<Self>);
}

impl Kernels for NeonDot {
    type F32 = Float<F32>;
    type F16 = Float<F16>;
    type BF16 = Float<BF16>;
    type Q8_0 = Quant<Q8, SDot>;
    type Q4_0 = Quant<Q4, SDot>;
    type Q4_0x16 = Interleaved<Q4, SDot>;
    type Q8_0x16 = Interleaved<Q8, SDot>;
    type F32P = Packed;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        // SAFETY: the caller guarantees NEON.
        unsafe { quantize_act(x, out) }
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        // SAFETY: the caller guarantees NEON.
        unsafe { dequant_row(dtype, row, out) }
    }

    const GEMM: Option<gemm::RunFn> = Some(gemm::run::<Self>);
}

impl Isa for Neon {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn enable<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

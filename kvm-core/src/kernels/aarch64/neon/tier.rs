//! The NEON tiers' types: what they supply to the matrix products' and attention's drivers.

use super::float::{Float, Packed};
use super::quant::{Interleaved, Mull, Quant, SDot, Q4, Q8};
use super::rows::{dequant_row, quantize_act};
use crate::kernels::attend::Isa;
use core::marker::PhantomData;

use crate::kernels::gemm::{self, Gemm};
use crate::kernels::traits::{GroupKernel, Kernel, Kernels, RunFn, BF16, F16, F32};
use crate::quant::DType;

/// A NEON tier whose integer block products are `D`'s: [`Mull`] ([`Neon`]) or [`SDot`]
/// ([`NeonDot`]); everything else is the same code.
pub(crate) struct NeonTier<D>(PhantomData<D>);

/// The NEON tier.
pub(crate) type Neon = NeonTier<Mull>;

/// The NEON + dotprod tier.
pub(crate) type NeonDot = NeonTier<SDot>;

impl<D> Kernels for NeonTier<D>
where
    Quant<Q8, D>: Kernel<Act = u8>,
    Quant<Q4, D>: Kernel<Act = u8>,
    Interleaved<Q4, D>: GroupKernel,
    Interleaved<Q8, D>: GroupKernel,
    Self: Gemm,
{
    type F32 = Float<F32>;
    type F16 = Float<F16>;
    type BF16 = Float<BF16>;
    type Q8_0 = Quant<Q8, D>;
    type Q4_0 = Quant<Q4, D>;
    type Q4_0x16 = Interleaved<Q4, D>;
    type Q8_0x16 = Interleaved<Q8, D>;
    type F32P = Packed;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        // SAFETY: the caller guarantees NEON.
        unsafe { quantize_act(x, out) }
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        // SAFETY: the caller guarantees NEON.
        unsafe { dequant_row(dtype, row, out) }
    }

    const GEMM: Option<RunFn> = Some(gemm::run::<Self>);
}

impl Isa for Neon {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn enable<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

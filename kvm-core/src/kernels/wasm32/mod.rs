//! The WebAssembly SIMD tier (`simd128`), compiled in with `-C target-feature=+simd128`:
//! WebAssembly has no run-time feature detection, so a module either uses it throughout or
//! not at all (the scalar wasm build serves engines without it).
//!
//! Float weights widen 8 at a time to two f32x4 and meet the activation in separate
//! multiplies and adds (`simd128` has no FMA); f16 widens in integer operations, as
//! [`Stored::widen`](crate::kernels::Stored::widen) does, since the instruction set has no
//! f16 conversion. Integer formats take a whole block's `i8 x i8` products in
//! `i16x8.extmul` pairs (at most 2 * 128 * 127, which fits i16) widened pairwise into i32
//! lanes; each block's exact sum is then scaled and added as [`scalar::sum_blocks`] says,
//! so the bits are the scalar tier's; the row-interleaved groups meet a broadcast quad of
//! the activation with 4 bytes of each of 4 rows. The integer numerics' product widens i8
//! weights to i16 and meets the input in `i32x4.dot_i16x8_s`. Attention's dots and
//! weighted sums and softmax's exponentials run the scalar tier's operations 4 lanes at a
//! time, in its order; softmax's maximum and its position take 16 and 4 lanes at a time.
//! The float tiles, as every SIMD tier's, differ from the oracle's in-order sum only in
//! summation order (the conformance suite's budget); everything else gives its bits.
//!
//! [`scalar::sum_blocks`]: crate::kernels::scalar::sum_blocks

mod attention;
mod float;
mod groups;
mod quant;

pub(crate) use attention::{find, max};

use crate::kernels::attend::Isa;
use crate::kernels::scalar;
use crate::kernels::traits::{Kernels, BF16, F16, F32};
use crate::quant::DType;

/// The simd128 tier.
pub(crate) struct Simd128;

impl Kernels for Simd128 {
    type F32 = float::Float<F32>;
    type F16 = float::Float<F16>;
    type BF16 = float::Float<BF16>;
    type Q8_0 = quant::Quant<quant::Q8>;
    type Q4_0 = quant::Quant<quant::Q4>;
    type Q4_0x16 = groups::Interleaved<groups::Q4x16>;
    type Q8_0x16 = groups::Interleaved<groups::Q8x16>;
    // f32p and row decoding are the scalar tier's.
    type F32P = scalar::Float<crate::kernels::traits::F32P>;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        quant::quantize_act(x, out)
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        scalar::dequant_row(dtype, row, out)
    }
}

impl Isa for Simd128 {
    /// The whole module is compiled with `simd128`: nothing to enable.
    #[inline(always)]
    unsafe fn enable<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

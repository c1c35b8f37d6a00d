//! The NEON tiers: Advanced SIMD (every aarch64 CPU) and, with the `dotprod` extension
//! (Cortex-A55/A76 and later, Apple M1, Neoverse N1), `sdot` for the integer formats.
//!
//! Float weights widen 8 at a time to two f32x4 and meet the activation in FMAs; f16
//! widens with `fcvtl`, written as inline assembly because the f16 vector intrinsics need a
//! newer compiler than the crate's MSRV; f32p weights rebuild 4 at a time from their bytes
//! (a table lookup) and exponent nibbles ([`Packed`](float::Packed)). A batch of tokens (prefill) meets
//! float weights in [`gemm`](crate::kernels::gemm)'s product, one tile for both tiers: a quad of a row's weights
//! in a register, each lane against a column's vectors of tokens in FMAs by element
//! ([`gemm_tile`](gemm::gemm_tile)).
//!
//! Integer formats take `i8 x i8` products of a whole block: `smull` + `smlal2` pairs (at
//! most 2 * 128 * 127, which fits i16) widened into i32 lanes, or four `sdot`-accumulated
//! byte quads per lane. q4_0x16 and q8_0x16 groups hold 4 rows of 4 bytes in a vector, so
//! the activation quad they meet is one lane: `sdot` by element, or that quad broadcast for
//! the widening multiplies ([`Interleaved`](quant::Interleaved)). The two tiers share everything but that one
//! step, and give the scalar tier's bits (see [`Quant`](quant::Quant)).
//! The integer numerics' product ([`int`]), widening multiplies of i8 weights by the
//! i16 input, is the same in both.

mod attention;
mod float;
mod gemm;
mod int;
mod quant;
mod rows;
mod softmax;
mod tier;

pub(crate) use rows::narrow_f16;
pub(crate) use softmax::{find, max};
pub(crate) use tier::{Neon, NeonDot};

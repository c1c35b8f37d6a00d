//! The AVX-512 tier: the AVX2 tier plus AVX-512 F/BW/VL and VNNI (Ice Lake, Sapphire
//! Rapids, Zen 4).
//!
//! Floats use 16-lane vectors. Integer formats run the AVX2 tier's tile (its 8-lane float
//! steps are the ones every tier shares) with exact block sums from VNNI: `vpdpbusd` does
//! `maddubs` + `madd` in one instruction, two blocks at a time; having no 16-bit
//! saturation, it takes every format's weights biased to unsigned. Activation quantization
//! and row decoding are the AVX2 ones. f32p weights rebuild 16 at a time ([`Packed`](float::Packed)): a
//! byte spread (one `vpermb` where the CPU has VBMI), a lookup of their exponent nibbles
//! in a 16-entry table per row, one ternary-logic merge.
//! The integer numerics' product ([`int`]) widens 32 i8 weights at a time to meet the i16
//! input in VNNI's `vpdpwssd`.

mod attention;
mod float;
mod gemm;
mod int;
mod quant;
mod softmax;
mod tier;

pub(crate) use softmax::{find, max};
pub(crate) use tier::Avx512;

//! The AVX2 tier: AVX2 + FMA + F16C (x86_64 since Haswell and Zen 1).
//!
//! Float weights widen 8 at a time to f32 lanes and meet the activation in an FMA; f32p
//! weights rebuild 8 at a time from their bytes and exponent nibbles ([`Packed`](float::Packed)).
//! Integer weights use ggml's sign trick: `maddubs` multiplies unsigned by signed bytes, so
//! `w * a` is computed as `|w| * (a * sign(w))`. A weight of -128 stays exact (its
//! magnitude is read unsigned) and the activation quantizer never emits -128, so the
//! integer block sums equal the scalar ones bit for bit.
//! Row-interleaved q4_0x16 and q8_0x16 groups ([`Interleaved`](quant::Interleaved)) put one row in each i32
//! lane instead, so their block sums need no folding.
//! The integer numerics' product ([`int`]) widens 16 i8 weights at a time to meet the i16
//! input in `madd`.

mod attention;
mod float;
mod gemm;
mod int;
mod quant;
mod rows;
mod softmax;
mod tier;

// What the AVX-512 tier builds on, and the table's entries.
pub(crate) use attention::fold8;
pub(crate) use quant::{quant_tile, Blocks32, GroupSums, Q4, Q8};
pub(crate) use rows::{dequant_row, narrow_f16, quantize_act};
pub(crate) use softmax::{find, max};
pub(crate) use tier::Avx2;

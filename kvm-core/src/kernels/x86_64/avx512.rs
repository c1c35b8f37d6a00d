//! The AVX-512 tier: the AVX2 tier plus AVX-512 F/BW/VL and VNNI (Ice Lake, Sapphire
//! Rapids, Zen 4).
//!
//! Floats use 16-lane vectors. Integer formats run the AVX2 tier's tile (256-bit, so its
//! float steps are the ones every tier shares) but let VNNI's `vpdpbusd` do `maddubs` +
//! `madd` in one instruction; having no 16-bit saturation, it takes every format's weights
//! biased to unsigned. Activation quantization
//! and row decoding are the AVX2 ones.

use core::arch::x86_64::*;
use core::marker::PhantomData;

use super::avx2::{self, prefetch, quant_tile, BlockDot, Blocks32, Q4, Q8};
use crate::kernels::{scalar, FloatType, Kernel, Kernels, BF16, F16, F32};
use crate::quant::DType;

/// The AVX-512 tier.
pub(crate) struct Avx512;

impl Kernels for Avx512 {
    type F32 = Float<F32>;
    type F16 = Float<F16>;
    type BF16 = Float<BF16>;
    type Q8_0 = Quant<Q8>;
    type Q4_0 = Quant<Q4>;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        // SAFETY: this tier includes the AVX2 one.
        unsafe { avx2::quantize_act(x, out) }
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        // SAFETY: this tier includes the AVX2 one.
        unsafe { avx2::dequant_row(dtype, row, out) }
    }
}

/// A float dtype whose 16 consecutive weights widen to one vector.
pub(super) trait Widen16: FloatType {
    /// # Safety
    /// The tier's features are present; `p` points at 16 readable weights.
    unsafe fn load16(p: *const u8) -> __m512;
}

impl Widen16 for F32 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn load16(p: *const u8) -> __m512 {
        // SAFETY: 64 readable bytes; `loadu` needs no alignment.
        unsafe { _mm512_loadu_ps(p.cast()) }
    }
}

impl Widen16 for F16 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn load16(p: *const u8) -> __m512 {
        // SAFETY: 32 readable bytes.
        _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.cast()) })
    }
}

impl Widen16 for BF16 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn load16(p: *const u8) -> __m512 {
        // SAFETY: 32 readable bytes. bf16 is the top half of an f32.
        let h = unsafe { _mm256_loadu_si256(p.cast()) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
}

/// Float kernel: `R x T` accumulators of 16 lanes, the `cols % 16` tail in scalar.
pub(crate) struct Float<W>(PhantomData<W>);

impl<W: Widen16> Kernel for Float<W> {
    type Act = f32;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[f32]; T], cols: usize) -> [[f32; T]; R] {
        let es = W::DTYPE.block_bytes();
        let body = cols - cols % 16;
        let ahead = R * w[0].len();
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        let mut c = 0;
        while c < body {
            let mut x = [_mm512_setzero_ps(); T];
            for t in 0..T {
                // SAFETY: `a[t]` holds `cols > c + 15` floats.
                x[t] = unsafe { _mm512_loadu_ps(a[t].as_ptr().add(c)) };
            }
            for r in 0..R {
                // SAFETY: `w[r]` holds `cols` weights of `es` bytes.
                let p = unsafe { w[r].as_ptr().add(c * es) };
                if (c * es) % 64 == 0 {
                    prefetch(p, ahead);
                }
                // SAFETY: as above.
                let wv = unsafe { W::load16(p) };
                for t in 0..T {
                    acc[r][t] = _mm512_fmadd_ps(wv, x[t], acc[r][t]);
                }
            }
            c += 16;
        }
        let mut out = [[0.0; T]; R];
        for r in 0..R {
            for t in 0..T {
                out[r][t] =
                    _mm512_reduce_add_ps(acc[r][t]) + scalar::dot_row(W::DTYPE, &w[r][body * es..], &a[t][body..]);
            }
        }
        out
    }
}

/// `vpdpbusd` on biased weights, its accumulator starting at `-BIAS * sum(a)` (found once
/// per activation block with another `vpdpbusd`), so the i32 sums are exact without the
/// AVX2 tier's sign juggling.
pub(crate) struct Vnni;

impl BlockDot for Vnni {
    #[inline(always)]
    unsafe fn prep<B: Blocks32>(av: __m256i) -> __m256i {
        // SAFETY: AVX-512 VNNI is enabled in the (inlining) caller.
        unsafe {
            let bias = _mm256_set1_epi8(B::BIAS as u8 as i8);
            let corr = _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, av);
            _mm256_sub_epi32(_mm256_setzero_si256(), corr)
        }
    }

    #[inline(always)]
    unsafe fn dot<B: Blocks32>(p: *const u8, av: __m256i, init: __m256i) -> __m256i {
        // SAFETY: AVX-512 VNNI is enabled in the (inlining) caller; `p` is forwarded.
        unsafe { _mm256_dpbusd_epi32(init, B::load_biased(p), av) }
    }
}

/// Integer kernel of this tier: the AVX2 tier's [`quant_tile`] with [`Vnni`].
pub(crate) struct Quant<B>(PhantomData<B>);

impl<B: Blocks32> Kernel for Quant<B> {
    type Act = u8;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[u8]; T], cols: usize) -> [[f32; T]; R] {
        // SAFETY: forwarded; the tier's features are enabled here.
        unsafe { quant_tile::<B, Vnni, R, T>(w, a, cols) }
    }
}

//! The AVX2 tier's row conversions: the q8 activation quantizer, row decoding, f16 narrowing.

use super::float::{dequant_f32p, Widen8};
use super::quant::{scale, Blocks32, Q4, Q8};
use crate::kernels::scalar;
use crate::kernels::traits::{FloatType, BF16, F16, F32};
use crate::quant::{DType, QK};
use core::arch::x86_64::*;
use half::f16;

/// [`scalar::quantize_act`] 32 values at a time, with the same operations in the same
/// order per value, hence the same bytes.
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
    let cols = x.len();
    debug_assert_eq!(out.len(), crate::kernels::traits::act_scratch_len(cols));
    let sign = _mm256_set1_ps(-0.0);
    // `packs` interleaves 128-bit lanes; this puts the 8 groups of 4 back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (b, xs) in x.chunks_exact(QK).enumerate() {
        // SAFETY: `xs` holds 32 floats.
        let v: [__m256; 4] = core::array::from_fn(|i| unsafe { _mm256_loadu_ps(xs.as_ptr().add(8 * i)) });
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
        );
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let (d, inv) = scalar::act_scale(amax);
        let inv = _mm256_set1_ps(inv);
        let q: [__m256i; 4] = core::array::from_fn(|i| {
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v[i], inv));
            _mm256_cvtps_epi32(r)
        });
        let q16 = [_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])];
        let q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16[0], q16[1]), order);
        // SAFETY: `out` holds `cols` values then `cols / QK` scales.
        unsafe {
            _mm256_storeu_si256(out.as_mut_ptr().add(b * QK).cast(), q8);
            out.as_mut_ptr().add(cols + 4 * b).cast::<[u8; 4]>().write(d.to_le_bytes());
        }
    }
}

/// Row decode: floats widen 8 at a time (tail in scalar), blocks 32 at a time.
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
    debug_assert_eq!(dtype.row_bytes(out.len()), Some(row.len()));
    // SAFETY: (all arms) `row` holds `out.len()` weights of `dtype`.
    unsafe {
        match dtype {
            DType::F32 => widen_row::<F32>(row, out),
            DType::F16 => widen_row::<F16>(row, out),
            DType::BF16 => widen_row::<BF16>(row, out),
            DType::Q8_0 | DType::Q8_0x16 => blocks_row::<Q8>(row, out),
            DType::Q4_0 | DType::Q4_0x16 => blocks_row::<Q4>(row, out),
            DType::F32P => dequant_f32p(row, out),
            DType::I8 | DType::I32 => crate::kernels::scalar::dequant_row(dtype, row, out),
        }
    }
}

/// # Safety
/// AVX2, FMA and F16C are present; `row` holds `out.len()` weights.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn widen_row<W: Widen8 + FloatType>(row: &[u8], out: &mut [f32]) {
    let es = W::DTYPE.block_bytes();
    let body = out.len() - out.len() % 8;
    for (c, o) in out[..body].chunks_exact_mut(8).enumerate() {
        // SAFETY: 8 weights at `8 * c`; `o` holds 8 floats.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), W::load8(row.as_ptr().add(8 * c * es))) };
    }
    scalar::dequant_row(W::DTYPE, &row[body * es..], &mut out[body..]);
}

/// # Safety
/// AVX2, FMA and F16C are present; `row` holds `out.len() / QK` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn blocks_row<B: Blocks32>(row: &[u8], out: &mut [f32]) {
    let bb = B::DTYPE.block_bytes();
    for (b, o) in out.chunks_exact_mut(QK).enumerate() {
        // SAFETY: block `b` exists; `o` holds 32 floats.
        unsafe {
            let p = row.as_ptr().add(b * bb);
            let (q, d) = (B::load32(p), _mm256_set1_ps(scale(p)));
            let halves = [_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q)];
            for (i, h) in halves.into_iter().enumerate() {
                for (j, e) in [h, _mm_srli_si128::<8>(h)].into_iter().enumerate() {
                    let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e));
                    _mm256_storeu_ps(o.as_mut_ptr().add(16 * i + 8 * j), _mm256_mul_ps(d, v));
                }
            }
        }
    }
}

/// [`scalar::narrow_f16`] 8 values per `vcvtps2ph` (the same rounding, bit for bit).
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn narrow_f16(x: &[f32], out: &mut [f16]) {
    let n = x.len().min(out.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: 8 floats readable at `x[i..]`, 8 halves writable at `out[i..]`.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.as_ptr().add(i)));
            _mm_storeu_si128(out.as_mut_ptr().add(i).cast(), h);
        }
        i += 8;
    }
    scalar::narrow_f16(&x[i..n], &mut out[i..n]);
}

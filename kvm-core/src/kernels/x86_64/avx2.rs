//! The AVX2 tier: AVX2 + FMA + F16C (x86_64 since Haswell and Zen 1).
//!
//! Float weights widen 8 at a time to f32 lanes and meet the activation in an FMA.
//! Integer weights use ggml's sign trick: `maddubs` multiplies unsigned by signed bytes, so
//! `w * a` is computed as `|w| * (a * sign(w))`. A weight of -128 stays exact (its
//! magnitude is read unsigned) and the activation quantizer never emits -128, so the
//! integer block sums equal the scalar ones bit for bit.

use core::arch::x86_64::*;
use core::marker::PhantomData;

use crate::kernels::{scalar, FloatType, Kernel, Kernels, BF16, F16, F32};
use crate::quant::{DType, QK};

/// The AVX2 tier.
pub(crate) struct Avx2;

impl Kernels for Avx2 {
    type F32 = Float<F32>;
    type F16 = Float<F16>;
    type BF16 = Float<BF16>;
    type Q8_0 = Quant<Q8>;
    type Q4_0 = Quant<Q4>;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        // SAFETY: the caller guarantees AVX2/FMA/F16C.
        unsafe { quantize_act(x, out) }
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        // SAFETY: the caller guarantees AVX2/FMA/F16C.
        unsafe { dequant_row(dtype, row, out) }
    }
}

/// A float dtype whose 8 consecutive weights widen to one vector.
pub(super) trait Widen8: FloatType {
    /// # Safety
    /// AVX2, FMA and F16C are present; `p` points at 8 readable weights.
    unsafe fn load8(p: *const u8) -> __m256;
}

impl Widen8 for F32 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 32 readable bytes; `loadu` needs no alignment.
        unsafe { _mm256_loadu_ps(p.cast()) }
    }
}

impl Widen8 for F16 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 16 readable bytes.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) })
    }
}

impl Widen8 for BF16 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 16 readable bytes. bf16 is the top half of an f32.
        let h = unsafe { _mm_loadu_si128(p.cast()) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    }
}

/// Sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Prefetches the cache line `ahead` bytes past `p` (a hint: never faults).
///
/// A tile reads several short rows side by side, which the hardware stream prefetcher
/// does not follow (it tracks about one stream per 4 KiB page); without this, weights
/// coming from DRAM arrive at half the bandwidth. Tiles ask for the same position in the
/// next tile's rows (`ahead = R * row bytes`, rows being contiguous).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn prefetch(p: *const u8, ahead: usize) {
    // `wrapping_add`: the address may lie past the end of the matrix, which is fine for a
    // hint but not for `add`.
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead).cast())
}

/// Float kernel: `R x T` accumulators of 8 lanes, the `cols % 8` tail in scalar.
pub(crate) struct Float<W>(PhantomData<W>);

impl<W: Widen8> Kernel for Float<W> {
    type Act = f32;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[f32]; T], cols: usize) -> [[f32; T]; R] {
        let es = W::DTYPE.block_bytes();
        let body = cols - cols % 8;
        let ahead = R * w[0].len();
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        let mut c = 0;
        while c < body {
            let mut x = [_mm256_setzero_ps(); T];
            for t in 0..T {
                // SAFETY: `a[t]` holds `cols > c + 7` floats.
                x[t] = unsafe { _mm256_loadu_ps(a[t].as_ptr().add(c)) };
            }
            for r in 0..R {
                // SAFETY: `w[r]` holds `cols` weights of `es` bytes.
                let p = unsafe { w[r].as_ptr().add(c * es) };
                if (c * es) % 64 == 0 {
                    prefetch(p, ahead);
                }
                // SAFETY: as above.
                let wv = unsafe { W::load8(p) };
                for t in 0..T {
                    acc[r][t] = _mm256_fmadd_ps(wv, x[t], acc[r][t]);
                }
            }
            c += 8;
        }
        let mut out = [[0.0; T]; R];
        for r in 0..R {
            for t in 0..T {
                out[r][t] = hsum(acc[r][t]) + scalar::dot_row(W::DTYPE, &w[r][body * es..], &a[t][body..]);
            }
        }
        out
    }
}

/// An integer format whose blocks widen to 32 bytes, with an f16 scale first.
pub(super) trait Blocks32 {
    const DTYPE: DType;
    /// What [`Blocks32::load_biased`] adds to every weight to make it unsigned.
    const BIAS: i32;

    /// The 32 weights of the block at `p`, as i8.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present; `p` points at one whole block.
    unsafe fn load32(p: *const u8) -> __m256i;

    /// The 32 weights plus [`Blocks32::BIAS`], as u8: the unsigned operand of
    /// `maddubs`/`vpdpbusd` with no sign juggling; `BIAS * sum(a)` is taken off after.
    ///
    /// # Safety
    /// As [`Blocks32::load32`].
    unsafe fn load_biased(p: *const u8) -> __m256i;
}

/// q8_0 blocks.
pub(crate) struct Q8;
/// q4_0 blocks.
pub(crate) struct Q4;

impl Blocks32 for Q8 {
    const DTYPE: DType = DType::Q8_0;
    const BIAS: i32 = 128;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load32(p: *const u8) -> __m256i {
        // SAFETY: a block is the 2 scale bytes then 32 weights.
        unsafe { _mm256_loadu_si256(p.add(2).cast()) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_biased(p: *const u8) -> __m256i {
        // SAFETY: forwarded. Flipping the top bit adds 128 to an i8 read as u8.
        _mm256_xor_si256(unsafe { Self::load32(p) }, _mm256_set1_epi8(i8::MIN))
    }
}

impl Blocks32 for Q4 {
    const DTYPE: DType = DType::Q4_0;
    const BIAS: i32 = 8;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load32(p: *const u8) -> __m256i {
        // SAFETY: forwarded.
        _mm256_sub_epi8(unsafe { Self::load_biased(p) }, _mm256_set1_epi8(8))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_biased(p: *const u8) -> __m256i {
        // SAFETY: a block is the 2 scale bytes then 16 bytes of nibbles, which already
        // hold the weights plus 8.
        let q = unsafe { _mm_loadu_si128(p.add(2).cast()) };
        let m = _mm_set1_epi8(15);
        let lo = _mm_and_si128(q, m);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), m);
        _mm256_set_m128i(hi, lo)
    }
}

/// The f16 scale at the start of the block at `p`.
///
/// # Safety
/// F16C is present; `p` points at 2 readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scale(p: *const u8) -> f32 {
    // SAFETY: 2 readable bytes.
    let bits = u16::from_le_bytes(unsafe { p.cast::<[u8; 2]>().read() });
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The f16 scales of `R <= 4` rows' blocks at byte `off`, converted at once, in lanes
/// `0..R`.
///
/// # Safety
/// F16C is present; every `w[r]` holds 2 bytes at `off`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scales<const R: usize>(w: [&[u8]; R], off: usize) -> __m128 {
    let bits = |r: usize| {
        if r < R {
            // SAFETY: 2 readable bytes per row.
            i16::from_le_bytes(unsafe { w[r].as_ptr().add(off).cast::<[u8; 2]>().read() })
        } else {
            0
        }
    };
    _mm_cvtph_ps(_mm_setr_epi16(bits(0), bits(1), bits(2), bits(3), 0, 0, 0, 0))
}

/// Block `b`'s scale in a q8 activation of `cols` values.
///
/// # Safety
/// `a` is a whole activation of `cols` values and `b < cols / QK`.
#[inline]
pub(super) unsafe fn act_scale(a: &[u8], cols: usize, b: usize) -> f32 {
    // SAFETY: the scales follow the `cols` values.
    f32::from_le_bytes(unsafe { a.as_ptr().add(cols + 4 * b).cast::<[u8; 4]>().read() })
}

/// Integer kernel: per block, exact i32 sums of 8 lanes scaled by `d_w * d_a` into f32
/// accumulators. Formats whose biased weights keep `maddubs`' i16 pair sums exact (q4_0:
/// `2 * 15 * 127`) take the bias route, the others (q8_0: `2 * 255 * 127` would saturate)
/// the sign trick.
pub(crate) struct Quant<B>(PhantomData<B>);

impl<B: Blocks32> Kernel for Quant<B> {
    type Act = u8;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[u8]; T], cols: usize) -> [[f32; T]; R] {
        const { assert!(R <= 4, "one f16 conversion covers 4 rows") };
        let bb = B::DTYPE.block_bytes();
        let ahead = R * w[0].len();
        let ones = _mm256_set1_epi16(1);
        let biased = const { 2 * (2 * B::BIAS - 1) * 127 <= i16::MAX as i32 };
        let bias = _mm256_set1_epi8(B::BIAS as i8);
        let lane: [__m256i; R] = core::array::from_fn(|r| _mm256_set1_epi32(r as i32));
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        for b in 0..cols / QK {
            let mut av = [_mm256_setzero_si256(); T];
            let mut ad = [_mm_setzero_ps(); T];
            let mut corr = [_mm256_setzero_si256(); T];
            for t in 0..T {
                // SAFETY: `a[t]` is a whole activation of `cols` values.
                unsafe {
                    av[t] = _mm256_loadu_si256(a[t].as_ptr().add(b * QK).cast());
                    ad[t] = _mm_set1_ps(act_scale(a[t], cols, b));
                }
                if biased {
                    corr[t] = _mm256_madd_epi16(_mm256_maddubs_epi16(bias, av[t]), ones);
                }
            }
            // SAFETY: `w[r]` holds `cols / QK` blocks.
            let dw = unsafe { scales(w, b * bb) };
            for r in 0..R {
                // SAFETY: as above.
                let p = unsafe { w[r].as_ptr().add(b * bb) };
                prefetch(p, ahead);
                let (wv, uw) = if biased {
                    // SAFETY: as above.
                    (_mm256_setzero_si256(), unsafe { B::load_biased(p) })
                } else {
                    // SAFETY: as above.
                    let wv = unsafe { B::load32(p) };
                    (wv, _mm256_sign_epi8(wv, wv))
                };
                for t in 0..T {
                    let s32 = if biased {
                        _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(uw, av[t]), ones), corr[t])
                    } else {
                        _mm256_madd_epi16(_mm256_maddubs_epi16(uw, _mm256_sign_epi8(av[t], wv)), ones)
                    };
                    let d = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_mul_ps(dw, ad[t])), lane[r]);
                    acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s32), acc[r][t]);
                }
            }
        }
        let mut out = [[0.0; T]; R];
        for r in 0..R {
            for t in 0..T {
                out[r][t] = hsum(acc[r][t]);
            }
        }
        out
    }
}

/// [`scalar::quantize_act`] 32 values at a time, with the same operations in the same
/// order per value, hence the same bytes.
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
    let cols = x.len();
    debug_assert_eq!(out.len(), crate::kernels::act_scratch_len(cols));
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
pub(super) unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
    debug_assert_eq!(dtype.row_bytes(out.len()), Some(row.len()));
    // SAFETY (all arms): `row` holds `out.len()` weights of `dtype`.
    unsafe {
        match dtype {
            DType::F32 => widen_row::<F32>(row, out),
            DType::F16 => widen_row::<F16>(row, out),
            DType::BF16 => widen_row::<BF16>(row, out),
            DType::Q8_0 => blocks_row::<Q8>(row, out),
            DType::Q4_0 => blocks_row::<Q4>(row, out),
        }
    }
}

/// # Safety
/// AVX2, FMA and F16C are present; `row` holds `out.len()` weights.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_row<W: Widen8>(row: &[u8], out: &mut [f32]) {
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
unsafe fn blocks_row<B: Blocks32>(row: &[u8], out: &mut [f32]) {
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

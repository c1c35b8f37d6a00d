//! The AVX2 tier's float weights: exact widening loads 8 at a time, and the f32 / f16 / bf16 and
//! f32p tiles.

use crate::kernels::scalar;
use crate::kernels::traits::{FloatType, Kernel, BF16, F16, F32, I8};
use crate::quant::{f32p_row, BlockF32P, QK};
use core::arch::x86_64::*;
use core::marker::PhantomData;

/// An element type whose 8 consecutive values widen exactly to one vector: the float
/// dtypes of weight rows, and the attention state's rows ([`StoredType`](crate::kernels::traits::StoredType), the q8 cache's
/// [`I8`] included).
pub(crate) trait Widen8 {
    /// # Safety
    /// AVX2, FMA and F16C are present; `p` points at 8 readable values.
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

impl Widen8 for I8 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 8 readable bytes; i8 widens exactly.
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(unsafe { _mm_loadl_epi64(p.cast()) }))
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
pub(crate) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// `f32p` kernel: `R x T` accumulators of 8 lanes. A block's 32 weights rebuild as four
/// vectors: a permute and a byte shuffle spread 8 weights' 3 bytes into their lanes (the
/// top byte twice, so the sign lands in bit 31), and each exponent nibble `d` becomes
/// `(base - d) << 23` (zero for 15). The spilled weights of the head are added in scalar.
pub(crate) struct Packed;

impl Kernel for Packed {
    type Act = f32;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[f32]; T], cols: usize) -> [[f32; T]; R] {
        let mut base = [_mm256_setzero_si256(); R];
        let mut spills = [&[][..]; R];
        let mut blocks = [core::ptr::null::<u8>(); R];
        let mut nb = cols / QK;
        for r in 0..R {
            let (e, s, b) = f32p_row(w[r], cols);
            (base[r], spills[r], blocks[r], nb) = (f32p_base(e), s, b.as_ptr().cast(), nb.min(b.len()));
        }
        let hints = crate::kernels::x86_64::software_streams();
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        for b in 0..nb {
            for r in 0..R {
                // SAFETY: every row has `nb` blocks.
                let p = unsafe { blocks[r].add(b * size_of::<BlockF32P>()) };
                if hints {
                    crate::kernels::x86_64::prefetch_packed::<R>(p);
                }
                // SAFETY: a whole block.
                let ws = unsafe { f32p_block(p, base[r]) };
                for (g, wv) in ws.into_iter().enumerate() {
                    for t in 0..T {
                        // SAFETY: `a[t]` holds `cols` floats, whole blocks.
                        let x = unsafe { _mm256_loadu_ps(a[t].as_ptr().add(b * QK + 8 * g)) };
                        acc[r][t] = _mm256_fmadd_ps(wv, x, acc[r][t]);
                    }
                }
            }
        }
        let mut out = [[0.0; T]; R];
        for r in 0..R {
            for t in 0..T {
                out[r][t] = hsum(acc[r][t]) + scalar::f32p_spill_dot(spills[r], a[t]);
            }
        }
        out
    }
}

/// An f32p row's base exponent in every lane's exponent field, for [`f32p_block`].
#[inline(always)]
pub(super) fn f32p_base(base: u32) -> __m256i {
    // SAFETY: AVX, enabled in the (inlining) caller.
    unsafe { _mm256_set1_epi32((base << 23) as i32) }
}

/// The 32 weights of the f32p block at `p` as four vectors of 8 (its head's spills not
/// applied), under the row's `base` ([`f32p_base`]). A permute and a byte shuffle spread 8
/// weights' 3 bytes into their lanes (the top byte twice, so the sign lands in bit 31),
/// and each exponent nibble `d` becomes `(base - d) << 23` (zero for 15).
///
/// # Safety
/// AVX2 is enabled in the (inlining) caller; `p` points at a whole block (112 bytes).
#[inline(always)]
pub(super) unsafe fn f32p_block(p: *const u8, base: __m256i) -> [__m256; 4] {
    // SAFETY: the block's 112 bytes are readable: 8 at 96 and 104, 32 at 0, 24, 48 and 72.
    unsafe {
        // Each 128-bit lane gets 4 weights' 12 bytes; dword `j` takes weight `j`'s 3 and
        // its byte 2 again.
        let spread = _mm256_setr_epi32(0, 1, 2, 0, 3, 4, 5, 0);
        let bytes = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 11));
        let keep = _mm256_set1_epi32(0x807F_FFFF_u32 as i32);
        let (field, fifteen) = (_mm256_set1_epi32(0x7F80_0000), _mm256_set1_epi32(15));
        let nib = [
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(96).cast())),
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(104).cast())),
        ];
        // Weights 0..8 and 8..16 are the low nibbles, 16..24 and 24..32 the high.
        let ds = [
            _mm256_and_si256(nib[0], fifteen),
            _mm256_and_si256(nib[1], fifteen),
            _mm256_srli_epi32::<4>(nib[0]),
            _mm256_srli_epi32::<4>(nib[1]),
        ];
        // (Loops, not `array::from_fn`: a closure would not inherit the caller's features,
        // and its intrinsics would stay calls.)
        let mut out = [_mm256_setzero_ps(); 4];
        for (g, (o, d)) in out.iter_mut().zip(ds).enumerate() {
            let raw = _mm256_loadu_si256(p.add(24 * g).cast());
            let m = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(raw, spread), bytes);
            let e = _mm256_and_si256(_mm256_sub_epi32(base, _mm256_slli_epi32::<23>(d)), field);
            let e = _mm256_andnot_si256(_mm256_cmpeq_epi32(d, fifteen), e);
            *o = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(m, keep), e));
        }
        out
    }
}

/// Decodes an f32p row (`out.len()` weights): its blocks 32 weights at a time, then its
/// spills, as [`scalar::dequant_row`] does.
///
/// # Safety
/// AVX2 is present; `row` holds `out.len()` weights of f32p.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequant_f32p(row: &[u8], out: &mut [f32]) {
    let (base, spills, blocks) = f32p_row(row, out.len());
    let base = f32p_base(base);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        // SAFETY: a whole block; `o` holds 32 values.
        unsafe {
            for (g, v) in f32p_block((b as *const BlockF32P).cast(), base).into_iter().enumerate() {
                _mm256_storeu_ps(o.as_mut_ptr().add(8 * g), v);
            }
        }
    }
    scalar::apply_f32p_spills(spills, out);
}

/// Float kernel: `R x T` accumulators of 8 lanes, the `cols % 8` tail in scalar.
pub(crate) struct Float<W>(PhantomData<W>);

impl<W: Widen8 + FloatType> Kernel for Float<W> {
    type Act = f32;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[f32]; T], cols: usize) -> [[f32; T]; R] {
        let es = W::DTYPE.block_bytes();
        let body = cols - cols % 8;
        let hints = crate::kernels::x86_64::software_streams();
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
                if hints && (c * es) % 64 == 0 {
                    crate::kernels::x86_64::prefetch(p, crate::kernels::x86_64::tile_ahead::<R>());
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
                // The `cols % lanes` tail (none for the usual widths: skip the call).
                let tail = if body < cols { scalar::dot_row(W::DTYPE, &w[r][body * es..], &a[t][body..]) } else { 0.0 };
                out[r][t] = hsum(acc[r][t]) + tail;
            }
        }
        out
    }
}

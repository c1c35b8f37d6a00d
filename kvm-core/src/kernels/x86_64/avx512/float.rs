//! The AVX-512 tier's float weights: exact widening loads 16 at a time, the f32 / f16 / bf16
//! tiles, and f32p rebuilt 16 at a time (a byte spread, `vpermb` where the CPU has VBMI).

use crate::kernels::scalar;
use crate::kernels::traits::{FloatType, Kernel, BF16, F16, F32, I8};
use crate::kernels::x86_64::{prefetch, prefetch_packed, tile_ahead};
use crate::quant::{f32p_row, BlockF32P, QK};
use core::arch::x86_64::*;
use core::marker::PhantomData;

/// An element type whose 16 consecutive values widen exactly to one vector: the float
/// dtypes of weight rows, and the attention state's rows ([`StoredType`](crate::kernels::traits::StoredType), the q8 cache's
/// [`I8`] included).
pub(crate) trait Widen16 {
    /// # Safety
    /// The tier's features are present; `p` points at 16 readable values.
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

impl Widen16 for I8 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn load16(p: *const u8) -> __m512 {
        // SAFETY: 16 readable bytes; i8 widens exactly.
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(p.cast()) }))
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

impl<W: Widen16 + FloatType> Kernel for Float<W> {
    type Act = f32;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[f32]; T], cols: usize) -> [[f32; T]; R] {
        let es = W::DTYPE.block_bytes();
        let body = cols - cols % 16;
        let hints = crate::kernels::x86_64::software_streams();
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
                if hints && (c * es) % 64 == 0 {
                    prefetch(p, tile_ahead::<R>());
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
                // The `cols % lanes` tail (none for the usual widths: skip the call).
                let tail = if body < cols { scalar::dot_row(W::DTYPE, &w[r][body * es..], &a[t][body..]) } else { 0.0 };
                out[r][t] = _mm512_reduce_add_ps(acc[r][t]) + tail;
            }
        }
        out
    }
}

/// `f32p` kernel: [`packed`] with VBMI's one-instruction byte spread where the CPU has
/// it, else with a permute and a shuffle. (Paper-120m f32p decode, one thread: 1.035x as
/// fast with VBMI, median of five interleaved rounds.)
pub(crate) struct Packed;

impl Kernel for Packed {
    type Act = f32;

    #[inline]
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[f32]; T], cols: usize) -> [[f32; T]; R] {
        // SAFETY: (both arms) the caller guarantees the tier; `has_vbmi` the rest.
        unsafe {
            if has_vbmi() {
                packed_vbmi::<R, T>(w, a, cols)
            } else {
                packed_shuffle::<R, T>(w, a, cols)
            }
        }
    }
}

/// Whether the CPU has AVX-512 VBMI (Ice Lake, Sapphire Rapids and Zen 4 do; Cascade Lake,
/// which has VNNI, does not): from the target features, else with `std` from the CPU.
#[inline]
pub(super) fn has_vbmi() -> bool {
    #[cfg(feature = "std")]
    let detected = std::is_x86_feature_detected!("avx512vbmi");
    #[cfg(not(feature = "std"))]
    let detected = false;
    cfg!(target_feature = "avx512vbmi") || detected
}

/// How 16 f32p weights' 3 bytes each (48 of a 64-byte load) spread into 16 dwords, the
/// byte at 2 also at 3 so that its top bit lands on the sign.
pub(crate) trait Spread {
    /// # Safety
    /// The tier's features (and the implementation's) are enabled in the (inlining)
    /// caller.
    unsafe fn spread(raw: __m512i) -> __m512i;
}

/// A permute gathers each 128-bit lane's 4 weights into its first 12 bytes, then a
/// shuffle spreads them (AVX-512 F/BW).
pub(crate) struct Shuffle;

impl Spread for Shuffle {
    #[inline(always)]
    unsafe fn spread(raw: __m512i) -> __m512i {
        // SAFETY: forwarded.
        unsafe {
            let gather = _mm512_setr_epi32(0, 1, 2, 0, 3, 4, 5, 0, 6, 7, 8, 0, 9, 10, 11, 0);
            let bytes = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 11));
            _mm512_shuffle_epi8(_mm512_permutexvar_epi32(gather, raw), bytes)
        }
    }
}

/// One `vpermb` (AVX-512 VBMI).
pub(crate) struct Vbmi;

impl Spread for Vbmi {
    #[inline(always)]
    unsafe fn spread(raw: __m512i) -> __m512i {
        // Byte 4j + k of the result is byte 3j + min(k, 2) of `raw`.
        const INDEX: [u8; 64] = {
            let mut ix = [0u8; 64];
            let mut i = 0;
            while i < 64 {
                let k = if i % 4 == 3 { 2 } else { i % 4 };
                ix[i] = (3 * (i / 4) + k) as u8;
                i += 1;
            }
            ix
        };
        // SAFETY: 64 readable bytes; the rest forwarded.
        unsafe { _mm512_permutexvar_epi8(_mm512_loadu_si512(INDEX.as_ptr().cast()), raw) }
    }
}

/// [`packed`] with [`Shuffle`].
///
/// # Safety
/// As [`Kernel::tile`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn packed_shuffle<const R: usize, const T: usize>(
    w: [&[u8]; R],
    a: [&[f32]; T],
    cols: usize,
) -> [[f32; T]; R] {
    // SAFETY: forwarded, with the features enabled here.
    unsafe { packed::<Shuffle, R, T>(w, a, cols) }
}

/// [`packed`] with [`Vbmi`].
///
/// # Safety
/// As [`Kernel::tile`], and the CPU has VBMI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) unsafe fn packed_vbmi<const R: usize, const T: usize>(
    w: [&[u8]; R],
    a: [&[f32]; T],
    cols: usize,
) -> [[f32; T]; R] {
    // SAFETY: forwarded, with the features enabled here.
    unsafe { packed::<Vbmi, R, T>(w, a, cols) }
}

/// The `f32p` tile with byte spread `S`: `R x T` accumulators of 16 lanes, each block's
/// 32 weights rebuilt as two vectors ([`f32p_block`]). The spilled weights of the head
/// are added in scalar.
///
/// # Safety
/// As [`Kernel::tile`]; the tier's and `S`'s features are enabled in the (inlining) caller.
#[inline(always)]
pub(super) unsafe fn packed<S: Spread, const R: usize, const T: usize>(
    w: [&[u8]; R],
    a: [&[f32]; T],
    cols: usize,
) -> [[f32; T]; R] {
    // SAFETY: the caller enables the features; the loads stay inside the rows and `a`.
    unsafe {
        let mut table = [_mm512_setzero_si512(); R];
        let mut spills = [&[][..]; R];
        let mut blocks = [core::ptr::null::<u8>(); R];
        let mut nb = cols / QK;
        for r in 0..R {
            let (base, s, b) = f32p_row(w[r], cols);
            (spills[r], blocks[r], nb) = (s, b.as_ptr().cast(), nb.min(b.len()));
            table[r] = f32p_table(base);
        }
        let hints = crate::kernels::x86_64::software_streams();
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        for b in 0..nb {
            let mut x = [[_mm512_setzero_ps(); 2]; T];
            for t in 0..T {
                // `a[t]` holds `cols` floats, whole blocks.
                x[t] = [0, 16].map(|h| _mm512_loadu_ps(a[t].as_ptr().add(b * QK + h)));
            }
            for r in 0..R {
                // Every row has `nb` blocks.
                let p = blocks[r].add(b * size_of::<BlockF32P>());
                if hints {
                    prefetch_packed::<R>(p);
                }
                for (h, wv) in f32p_block::<S>(p, table[r]).into_iter().enumerate() {
                    for t in 0..T {
                        acc[r][t] = _mm512_fmadd_ps(wv, x[t][h], acc[r][t]);
                    }
                }
            }
        }
        let mut out = [[0.0; T]; R];
        for r in 0..R {
            for t in 0..T {
                out[r][t] = _mm512_reduce_add_ps(acc[r][t]) + scalar::f32p_spill_dot(spills[r], a[t]);
            }
        }
        out
    }
}

/// An f32p row's exponent fields by nibble: entry `d` is `(base - d) << 23` in the
/// exponent bits, entry 15 zero.
#[inline(always)]
pub(super) fn f32p_table(base: u32) -> __m512i {
    // SAFETY: register-only AVX-512 F, enabled in the (inlining) caller.
    unsafe {
        let steps = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0);
        let e = _mm512_sub_epi32(_mm512_set1_epi32((base << 23) as i32), _mm512_slli_epi32::<23>(steps));
        _mm512_maskz_and_epi32(0x7FFF, e, _mm512_set1_epi32(0x7F80_0000))
    }
}

/// The 32 weights of the f32p block at `p` as two vectors of 16 (its head's spills not
/// applied), with byte spread `S` and the row's [`f32p_table`]: the bytes spread into
/// their lanes, a lookup of their exponent nibbles in the table fills bits 23..31.
///
/// # Safety
/// The tier's and `S`'s features are enabled in the (inlining) caller; `p` points at a
/// whole block (112 bytes).
#[inline(always)]
pub(super) unsafe fn f32p_block<S: Spread>(p: *const u8, table: __m512i) -> [__m512; 2] {
    // SAFETY: the block's 112 bytes are readable: 16 at 96, 64 at 0 and at 48.
    unsafe {
        let keep = _mm512_set1_epi32(0x807F_FFFF_u32 as i32);
        let nib = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(96).cast()));
        // The permute reads the low 4 bits of each index: the low nibbles, then the high.
        let ds = [nib, _mm512_srli_epi32::<4>(nib)];
        // (A loop, not `array::from_fn`: a closure would not inherit the caller's
        // features, and its intrinsics would stay calls.)
        let mut out = [_mm512_setzero_ps(); 2];
        for (h, (o, d)) in out.iter_mut().zip(ds).enumerate() {
            let m = S::spread(_mm512_loadu_si512(p.add(48 * h).cast()));
            let e = _mm512_permutexvar_epi32(d, table);
            // (m & keep) | e
            *o = _mm512_castsi512_ps(_mm512_ternarylogic_epi32::<0xEA>(m, keep, e));
        }
        out
    }
}

/// Decodes an f32p row (`out.len()` weights) with byte spread `S`: its blocks 32 weights
/// at a time, then its spills, as [`scalar::dequant_row`] does.
///
/// # Safety
/// The tier's and `S`'s features are enabled in the (inlining) caller; `row` holds
/// `out.len()` weights of f32p.
#[inline(always)]
pub(super) unsafe fn dequant_f32p<S: Spread>(row: &[u8], out: &mut [f32]) {
    let (base, spills, blocks) = f32p_row(row, out.len());
    let table = f32p_table(base);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        // SAFETY: a whole block; `o` holds 32 values.
        unsafe {
            for (h, v) in f32p_block::<S>((b as *const BlockF32P).cast(), table).into_iter().enumerate() {
                _mm512_storeu_ps(o.as_mut_ptr().add(16 * h), v);
            }
        }
    }
    scalar::apply_f32p_spills(spills, out);
}

/// [`dequant_f32p`] with [`Shuffle`].
///
/// # Safety
/// As [`Kernels::dequant_row`](crate::kernels::traits::Kernels::dequant_row).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dequant_f32p_shuffle(row: &[u8], out: &mut [f32]) {
    // SAFETY: forwarded, with the features enabled here.
    unsafe { dequant_f32p::<Shuffle>(row, out) }
}

/// [`dequant_f32p`] with [`Vbmi`].
///
/// # Safety
/// As [`Kernels::dequant_row`](crate::kernels::traits::Kernels::dequant_row), and the CPU has VBMI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) unsafe fn dequant_f32p_vbmi(row: &[u8], out: &mut [f32]) {
    // SAFETY: forwarded, with the features enabled here.
    unsafe { dequant_f32p::<Vbmi>(row, out) }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec;

    use super::*;
    use crate::kernels::tests::values;
    use crate::kernels::tier::{supported, Tier};
    use crate::quant::{quantize_matrix, DType};

    /// Both byte spreads give the same bits (the rest of the kernel is shared).
    #[test]
    fn vbmi_and_shuffle_spreads_agree() {
        if !supported(Tier::Avx512) || !std::is_x86_feature_detected!("avx512vbmi") {
            return;
        }
        let (rows, cols) = (8, 224);
        let mut src = values(rows * cols, 3);
        src[5] = 1e-30; // a spill
        let mut bytes = vec![0u8; DType::F32P.matrix_bytes(rows, cols).unwrap()];
        quantize_matrix(DType::F32P, cols, &src, &mut bytes).unwrap();
        let w: [&[u8]; 8] = core::array::from_fn(|r| &bytes[r * bytes.len() / rows..][..bytes.len() / rows]);
        let (x0, x1) = (values(cols, 4), values(cols, 5));
        // SAFETY: both tiers' features were checked above.
        let (a, b) = unsafe { (packed_shuffle::<8, 2>(w, [&x0, &x1], cols), packed_vbmi::<8, 2>(w, [&x0, &x1], cols)) };
        for (ra, rb) in a.iter().zip(&b) {
            for (u, v) in ra.iter().zip(rb) {
                assert_eq!(u.to_bits(), v.to_bits());
            }
        }
    }
}

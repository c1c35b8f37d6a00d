//! The AVX-512 tier: the AVX2 tier plus AVX-512 F/BW/VL and VNNI (Ice Lake, Sapphire
//! Rapids, Zen 4).
//!
//! Floats use 16-lane vectors. Integer formats run the AVX2 tier's tile (its 8-lane float
//! steps are the ones every tier shares) with exact block sums from VNNI: `vpdpbusd` does
//! `maddubs` + `madd` in one instruction, two blocks at a time; having no 16-bit
//! saturation, it takes every format's weights biased to unsigned. Activation quantization
//! and row decoding are the AVX2 ones. f32p weights rebuild 16 at a time ([`Packed`]): a
//! byte spread (one `vpermb` where the CPU has VBMI), a lookup of their exponent nibbles
//! in a 16-entry table per row, one ternary-logic merge.

use core::arch::x86_64::*;
use core::marker::PhantomData;

use super::avx2::{self, quant_tile, Blocks32, GroupSums, Q4, Q8};
use super::{prefetch, prefetch_ahead, prefetch_packed, tile_ahead};
use crate::kernels::attend::{self, Attend, AttendMany, Exp, Isa};
use crate::kernels::gemm::{self, Gemm, BLOCK};
use crate::kernels::{scalar, FloatType, GroupKernel, Kernel, Kernels, StoredType, BF16, F16, F32, I8};
use crate::quant::{f32p_row, BlockF32P, DType, GroupQ4_0x16, GroupQ8_0x16, QK, X16};

/// The AVX-512 tier.
pub(crate) struct Avx512;

impl Kernels for Avx512 {
    type F32 = Float<F32>;
    type F16 = Float<F16>;
    type BF16 = Float<BF16>;
    type Q8_0 = Quant<Q8>;
    type Q4_0 = Quant<Q4>;
    type Q4_0x16 = Interleaved<Q4>;
    type Q8_0x16 = Interleaved<Q8>;
    type F32P = Packed;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        // SAFETY: this tier includes the AVX2 one.
        unsafe { avx2::quantize_act(x, out) }
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        // SAFETY: (every arm) this tier includes the AVX2 one; `has_vbmi` checked VBMI.
        unsafe {
            match dtype {
                DType::F32P if has_vbmi() => dequant_f32p_vbmi(row, out),
                DType::F32P => dequant_f32p_shuffle(row, out),
                _ => avx2::dequant_row(dtype, row, out),
            }
        }
    }

    const GEMM: Option<gemm::RunFn> = Some(gemm::run::<Self>);
}

impl Gemm for Avx512 {
    const LANES: usize = 16;

    /// 24 of the 32 registers accumulate (12 for a single vector of tokens, which leaves
    /// FMA latency hidden by 12 independent sums).
    fn rows(vecs: usize) -> usize {
        match vecs {
            1 | 2 => 12,
            3 => 8,
            _ => 6,
        }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tile(w: &[*const f32], xt: *const f32, cols: usize, vecs: usize, out: &mut [f32]) {
        // SAFETY: (every arm) forwarded; `rows(vecs)` pointers.
        unsafe {
            match vecs {
                1 => gemm_tile::<12, 1>(w, xt, cols, out),
                2 => gemm_tile::<12, 2>(w, xt, cols, out),
                3 => gemm_tile::<8, 3>(w, xt, cols, out),
                _ => gemm_tile::<6, 4>(w, xt, cols, out),
            }
        }
    }

    /// 16 tokens at a time: a 16 x 16 transpose of the rows (those past `rows` zero),
    /// then each token's `rows` values in one masked store.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn store(out: &[f32], width: usize, rows: usize, n: usize, ys: &mut [f32], ld: usize) {
        let mask: __mmask16 = (1 << rows.min(16)) - 1;
        for t0 in (0..n).step_by(16) {
            // (Whole loops with a test inside, not `take`: unrolled, the 16 vectors stay in
            // registers.)
            let mut r16 = [_mm512_setzero_ps(); 16];
            for (r, v) in r16.iter_mut().enumerate() {
                if r < rows {
                    // SAFETY: row `r < rows` holds `width >= t0 + 16` values (`width` is
                    // whole vectors of 16).
                    *v = unsafe { _mm512_loadu_ps(out.as_ptr().add(r * width + t0)) };
                }
            }
            for (j, v) in transpose16(r16).into_iter().enumerate() {
                if t0 + j < n {
                    // SAFETY: token `t0 + j < n` has `rows` values at `(t0 + j) * ld`.
                    unsafe { _mm512_mask_storeu_ps(ys.as_mut_ptr().add((t0 + j) * ld), mask, v) };
                }
            }
        }
    }

    /// 16 x 16 blocks in 64 shuffles each; the columns past the last whole 16 as the
    /// default does.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn transpose(xs: &[f32], cols: usize, xt: &mut [f32]) {
        let n = xs.len() / cols;
        let body = cols - cols % 16;
        for t0 in (0..BLOCK).step_by(16) {
            for c0 in (0..body).step_by(16) {
                // Token `t0 + i`'s 16 values from column `c0`, zero past the last token.
                let mut rows = [_mm512_setzero_ps(); 16];
                for (i, row) in rows.iter_mut().enumerate() {
                    if t0 + i < n {
                        // SAFETY: token `t0 + i < n` holds `cols >= c0 + 16` values.
                        *row = unsafe { _mm512_loadu_ps(xs.as_ptr().add((t0 + i) * cols + c0)) };
                    }
                }
                for (j, col) in transpose16(rows).into_iter().enumerate() {
                    // SAFETY: `xt` holds `cols * BLOCK` values, 64-byte aligned, and
                    // `t0 + 16 <= BLOCK`.
                    unsafe { _mm512_store_ps(xt.as_mut_ptr().add((c0 + j) * BLOCK + t0), col) };
                }
            }
        }
        gemm::transpose_columns(xs, cols, body, xt);
    }
}

/// The transpose of a 16 x 16 block: `out[j]` lane `i` is `rows[i]` lane `j`. Pairs of
/// rows interleave, then quads within 128-bit lanes, then lanes across vectors twice.
#[inline(always)]
fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    let (mut a, mut b) = (r, r);
    // SAFETY: register-only AVX-512 F shuffles, enabled in the (inlining) caller.
    unsafe {
        // a[2i], a[2i + 1]: rows 2i and 2i + 1 interleaved, columns 4L, 4L + 1 (low) and
        // 4L + 2, 4L + 3 (high) of each 128-bit lane L.
        for i in 0..8 {
            a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // b[4g + k], lane L: rows 4g..4g + 4 at column 4L + k.
        for g in 0..4 {
            let (lo, hi) = ([a[4 * g], a[4 * g + 2]], [a[4 * g + 1], a[4 * g + 3]]);
            b[4 * g] = _mm512_shuffle_ps::<0x44>(lo[0], lo[1]);
            b[4 * g + 1] = _mm512_shuffle_ps::<0xEE>(lo[0], lo[1]);
            b[4 * g + 2] = _mm512_shuffle_ps::<0x44>(hi[0], hi[1]);
            b[4 * g + 3] = _mm512_shuffle_ps::<0xEE>(hi[0], hi[1]);
        }
        // c[4k..4k + 4], for column offset k: groups 0 and 1, then 2 and 3, side by side,
        // lanes 0-1 of each, then lanes 2-3.
        for k in 0..4 {
            let (g01, g23) = ([b[k], b[4 + k]], [b[8 + k], b[12 + k]]);
            a[4 * k] = _mm512_shuffle_f32x4::<0x44>(g01[0], g01[1]);
            a[4 * k + 1] = _mm512_shuffle_f32x4::<0xEE>(g01[0], g01[1]);
            a[4 * k + 2] = _mm512_shuffle_f32x4::<0x44>(g23[0], g23[1]);
            a[4 * k + 3] = _mm512_shuffle_f32x4::<0xEE>(g23[0], g23[1]);
        }
        // Column 4L + k: lane L of groups 0..4.
        for k in 0..4 {
            let (lo, hi) = ([a[4 * k], a[4 * k + 2]], [a[4 * k + 1], a[4 * k + 3]]);
            b[k] = _mm512_shuffle_f32x4::<0x88>(lo[0], lo[1]);
            b[4 + k] = _mm512_shuffle_f32x4::<0xDD>(lo[0], lo[1]);
            b[8 + k] = _mm512_shuffle_f32x4::<0x88>(hi[0], hi[1]);
            b[12 + k] = _mm512_shuffle_f32x4::<0xDD>(hi[0], hi[1]);
        }
    }
    b
}

/// [`Gemm::tile`] of `R` rows by `V` vectors of tokens.
///
/// # Safety
/// As [`Gemm::tile`], with the tier's features enabled in the (inlining) caller.
#[inline(always)]
unsafe fn gemm_tile<const R: usize, const V: usize>(w: &[*const f32], xt: *const f32, cols: usize, out: &mut [f32]) {
    let w: [*const f32; R] = core::array::from_fn(|r| w[r]);
    // SAFETY: the caller enables the features; `xt` holds `cols` aligned columns of
    // `BLOCK >= 16 * V` tokens, each row `cols` f32 and `out` `R * V * 16` values.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        for c in 0..cols {
            let mut x = [_mm512_setzero_ps(); V];
            for (v, x) in x.iter_mut().enumerate() {
                *x = _mm512_load_ps(xt.add(c * BLOCK + 16 * v));
            }
            for r in 0..R {
                let b = _mm512_set1_ps(w[r].add(c).read_unaligned());
                for v in 0..V {
                    acc[r][v] = _mm512_fmadd_ps(b, x[v], acc[r][v]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (v, &acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add((r * V + v) * 16), acc);
            }
        }
    }
}

/// An element type whose 16 consecutive values widen exactly to one vector: the float
/// dtypes of weight rows, and the attention state's rows ([`StoredType`], the q8 cache's
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
        let hints = super::software_streams();
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
fn has_vbmi() -> bool {
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
unsafe fn packed_shuffle<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[f32]; T], cols: usize) -> [[f32; T]; R] {
    // SAFETY: forwarded, with the features enabled here.
    unsafe { packed::<Shuffle, R, T>(w, a, cols) }
}

/// [`packed`] with [`Vbmi`].
///
/// # Safety
/// As [`Kernel::tile`], and the CPU has VBMI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn packed_vbmi<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[f32]; T], cols: usize) -> [[f32; T]; R] {
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
unsafe fn packed<S: Spread, const R: usize, const T: usize>(
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
        let hints = super::software_streams();
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
fn f32p_table(base: u32) -> __m512i {
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
unsafe fn f32p_block<S: Spread>(p: *const u8, table: __m512i) -> [__m512; 2] {
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
unsafe fn dequant_f32p<S: Spread>(row: &[u8], out: &mut [f32]) {
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
/// As [`Kernels::dequant_row`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dequant_f32p_shuffle(row: &[u8], out: &mut [f32]) {
    // SAFETY: forwarded, with the features enabled here.
    unsafe { dequant_f32p::<Shuffle>(row, out) }
}

/// [`dequant_f32p`] with [`Vbmi`].
///
/// # Safety
/// As [`Kernels::dequant_row`], and the CPU has VBMI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn dequant_f32p_vbmi(row: &[u8], out: &mut [f32]) {
    // SAFETY: forwarded, with the features enabled here.
    unsafe { dequant_f32p::<Vbmi>(row, out) }
}

/// `vpdpbusd` on biased weights, its accumulator starting at `-BIAS * sum(a)` (found once
/// per activation with another `vpdpbusd`), so the i32 sums are exact without the AVX2
/// tier's sign juggling. Two blocks share a 512-bit vector, and the group's 64 lanes fold
/// to 8 block sums with two-source permutes (which, unlike `hadd`, reach all 32 registers).
pub(crate) struct Vnni;

impl GroupSums for Vnni {
    #[inline(always)]
    unsafe fn sums<B: Blocks32, const R: usize, const T: usize>(
        w: [&[u8]; R],
        a: [&[u8]; T],
        b0: usize,
        n: usize,
    ) -> [[__m256i; T]; R] {
        // SAFETY: the caller enables the tier's features; pairs read only blocks `< b0 + n`.
        unsafe {
            // Lanes 0..4 of each 8-lane block plus lanes 4..8: four blocks of 4 lanes.
            let i = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
            let x = pair::<B, R, T>(w, a, b0, 0, n);
            let y = pair::<B, R, T>(w, a, b0, 2, n);
            let lo = fold(x, y, i, _mm512_set1_epi32(4));
            let x = pair::<B, R, T>(w, a, b0, 4, n);
            let y = pair::<B, R, T>(w, a, b0, 6, n);
            let hi = fold(x, y, i, _mm512_set1_epi32(4));
            // Then lanes 0..2 plus 2..4: eight blocks of 2 lanes.
            let i = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
            let two = fold(lo, hi, i, _mm512_set1_epi32(2));
            let mut s = [[_mm256_setzero_si256(); T]; R];
            for r in 0..R {
                for t in 0..T {
                    // Each 64-bit lane holds one block's 2 lanes: add the high one to the
                    // low one and keep the low halves.
                    let v = two[r][t];
                    s[r][t] = _mm512_cvtepi64_epi32(_mm512_add_epi32(v, _mm512_srli_epi64::<32>(v)));
                }
            }
            s
        }
    }
}

/// `u` and `v` (16 lanes each) folded to 16 lanes: lanes `i` of the pair plus lanes
/// `i + step`, for every `R x T`.
///
/// # Safety
/// AVX-512 F is enabled in the (inlining) caller.
#[inline(always)]
unsafe fn fold<const R: usize, const T: usize>(
    u: [[__m512i; T]; R],
    v: [[__m512i; T]; R],
    i: __m512i,
    step: __m512i,
) -> [[__m512i; T]; R] {
    // SAFETY: forwarded.
    unsafe {
        let j = _mm512_add_epi32(i, step);
        let mut out = [[_mm512_setzero_si512(); T]; R];
        for r in 0..R {
            for t in 0..T {
                out[r][t] = _mm512_add_epi32(
                    _mm512_permutex2var_epi32(u[r][t], i, v[r][t]),
                    _mm512_permutex2var_epi32(u[r][t], j, v[r][t]),
                );
            }
        }
        out
    }
}

/// The 8 i32 lanes of blocks `b0 + j` (low half) and `b0 + j + 1` (high half) for each
/// of `R x T` pairs; blocks at or past `b0 + n` are zero.
///
/// # Safety
/// As [`GroupSums::sums`].
#[inline(always)]
unsafe fn pair<B: Blocks32, const R: usize, const T: usize>(
    w: [&[u8]; R],
    a: [&[u8]; T],
    b0: usize,
    j: usize,
    n: usize,
) -> [[__m512i; T]; R] {
    let bb = B::DTYPE.block_bytes();
    // SAFETY: the caller enables the features; reads stay inside blocks `< b0 + n`.
    unsafe {
        let mut s = [[_mm512_setzero_si512(); T]; R];
        if j >= n {
            return s;
        }
        let (b, both) = (b0 + j, j + 1 < n);
        let bias = _mm512_set1_epi8(B::BIAS as u8 as i8);
        let mut av = [_mm512_setzero_si512(); T];
        let mut init = [_mm512_setzero_si512(); T];
        for t in 0..T {
            let p = a[t].as_ptr().add(b * QK);
            av[t] =
                if both { _mm512_loadu_si512(p.cast()) } else { _mm512_zextsi256_si512(_mm256_loadu_si256(p.cast())) };
            init[t] =
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, av[t]));
        }
        for r in 0..R {
            let p = w[r].as_ptr().add(b * bb);
            prefetch(p, tile_ahead::<R>());
            let lo = _mm512_zextsi256_si512(B::load_biased(p));
            let wv = if both {
                prefetch(p.add(bb), tile_ahead::<R>());
                _mm512_inserti64x4::<1>(lo, B::load_biased(p.add(bb)))
            } else {
                lo
            };
            for t in 0..T {
                s[r][t] = _mm512_dpbusd_epi32(init[t], wv, av[t]);
            }
        }
        s
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

/// The blocks of an interleaved dtype as [`Interleaved`] reads them.
pub(crate) trait X16Blocks {
    /// Bytes of one group block (16 scales, then the quant bytes).
    const GROUP_BYTES: usize;
    /// What [`X16Blocks::load`] adds to every weight to make it unsigned.
    const BIAS: u8;

    /// The quant bytes of one group block at `q`, biased to unsigned, as 8 vectors:
    /// lane `r` of vector `k` holds row `r`'s weights `4k..4k + 4`.
    ///
    /// # Safety
    /// The tier's features are enabled in the caller; `q` points at the block's quant bytes.
    unsafe fn load(q: *const u8) -> [__m512i; 8];
}

impl X16Blocks for Q4 {
    const GROUP_BYTES: usize = core::mem::size_of::<GroupQ4_0x16>();
    const BIAS: u8 = 8;

    #[inline(always)]
    unsafe fn load(q: *const u8) -> [__m512i; 8] {
        // SAFETY: 4 pieces of 64 bytes; the caller enables the features.
        unsafe {
            let m = _mm512_set1_epi8(15);
            // Byte k of each row's piece v: weight 4v + k (low nibble), 16 + 4v + k (high).
            let mut w = [_mm512_setzero_si512(); 8];
            for v in 0..4 {
                let x = _mm512_loadu_si512(q.add(64 * v).cast());
                w[v] = _mm512_and_si512(x, m);
                w[4 + v] = _mm512_and_si512(_mm512_srli_epi16::<4>(x), m);
            }
            w
        }
    }
}

impl X16Blocks for Q8 {
    const GROUP_BYTES: usize = core::mem::size_of::<GroupQ8_0x16>();
    const BIAS: u8 = 128;

    #[inline(always)]
    unsafe fn load(q: *const u8) -> [__m512i; 8] {
        // SAFETY: 8 pieces of 64 bytes; the caller enables the features. Flipping the top
        // bit adds 128 to an i8 read as u8.
        unsafe {
            core::array::from_fn(|v| {
                _mm512_xor_si512(_mm512_loadu_si512(q.add(64 * v).cast()), _mm512_set1_epi8(i8::MIN))
            })
        }
    }
}

/// q4_0x16 and q8_0x16 groups: one lane per row, so a block's 16 exact row sums come out
/// of 8 `vpdpbusd`s with no folding, and the canonical sum's 8 accumulators are 8 vectors
/// (accumulator `b % 8` of all 16 rows), summed in the scalar tree at the end.
pub(crate) struct Interleaved<B>(PhantomData<B>);

impl<B: X16Blocks> GroupKernel for Interleaved<B> {
    const SIDE_BY_SIDE: bool = true;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn group<const T: usize>(g: &[u8], a: [&[u8]; T], cols: usize) -> [[f32; X16]; T] {
        let mut out = [[0.0; X16]; T];
        // Two tokens at a time keep 16 accumulators in registers; the group's bytes are
        // in L1 for the next pair.
        let mut t = 0;
        while t < T {
            if t + 1 < T {
                // SAFETY: forwarded.
                [[out[t], out[t + 1]]] = unsafe { x16::<B, 1, 2>([g], [a[t], a[t + 1]], cols) };
                t += 2;
            } else {
                // SAFETY: forwarded.
                [[out[t]]] = unsafe { x16::<B, 1, 1>([g], [a[t]], cols) };
                t += 1;
            }
        }
        out
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn streams<const S: usize>(g: [&[u8]; S], a: &[u8], cols: usize) -> [[f32; X16]; S] {
        // SAFETY: forwarded.
        unsafe { x16::<B, S, 1>(g, [a], cols) }.map(|[y]| y)
    }
}

/// [`Interleaved`] for `S` groups side by side (block `b` of each in turn) and `T`
/// tokens: `out[s][t]`.
///
/// # Safety
/// As [`GroupKernel::group`] for each group, with this tier's features enabled in the caller.
#[inline(always)]
unsafe fn x16<B: X16Blocks, const S: usize, const T: usize>(
    g: [&[u8]; S],
    a: [&[u8]; T],
    cols: usize,
) -> [[[f32; X16]; T]; S] {
    let nb = cols / QK;
    let gb = B::GROUP_BYTES;
    debug_assert!(g.iter().all(|g| g.len() == nb * gb));
    // SAFETY: each `g[s]` holds `nb` blocks of a group and each `a[t]` a whole activation
    // (`cols` values, then `nb` f32 scales); the features are enabled in the caller.
    unsafe {
        let bias = _mm256_set1_epi8(B::BIAS as i8);
        let mut acc = [[[_mm512_setzero_ps(); 8]; T]; S];
        for b in 0..nb {
            // Per token: the block's activations, the biased weights' offset -BIAS * sum(a)
            // and the block's scale.
            let pa: [*const u8; T] = core::array::from_fn(|t| a[t].as_ptr().add(b * QK));
            let mut start = [_mm512_setzero_si512(); T];
            let mut da = [_mm512_setzero_ps(); T];
            for t in 0..T {
                let c = _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, _mm256_loadu_si256(pa[t].cast()));
                let c = _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256::<1>(c));
                let c = _mm_add_epi32(c, _mm_shuffle_epi32::<0b0100_1110>(c));
                let c = _mm_add_epi32(c, _mm_shuffle_epi32::<0b1011_0001>(c));
                start[t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_broadcastd_epi32(c));
                da[t] = _mm512_set1_ps(a[t].as_ptr().add(cols + 4 * b).cast::<f32>().read_unaligned());
            }
            for s in 0..S {
                let wb = g[s].as_ptr().add(b * gb);
                prefetch_ahead(wb, gb);
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(wb.cast()));
                let w = B::load(wb.add(2 * X16));
                for t in 0..T {
                    let quad = |k: usize| _mm512_set1_epi32(pa[t].add(4 * k).cast::<i32>().read_unaligned());
                    // Two independent chains of 4, added exactly.
                    let mut s0 = start[t];
                    let mut s1 = _mm512_setzero_si512();
                    for v in 0..4 {
                        s0 = _mm512_dpbusd_epi32(s0, w[v], quad(v));
                        s1 = _mm512_dpbusd_epi32(s1, w[4 + v], quad(4 + v));
                    }
                    let term = _mm512_mul_ps(_mm512_mul_ps(dw, da[t]), _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)));
                    acc[s][t][b % 8] = _mm512_add_ps(acc[s][t][b % 8], term);
                }
            }
        }
        let mut out = [[[0.0; X16]; T]; S];
        for s in 0..S {
            for t in 0..T {
                let k = &acc[s][t];
                let sum = _mm512_add_ps(
                    _mm512_add_ps(_mm512_add_ps(k[0], k[1]), _mm512_add_ps(k[2], k[3])),
                    _mm512_add_ps(_mm512_add_ps(k[4], k[5]), _mm512_add_ps(k[6], k[7])),
                );
                _mm512_storeu_ps(out[s][t].as_mut_ptr(), sum);
            }
        }
        out
    }
}

impl Isa for Avx512 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn enable<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

/// Attention's tiles: a dot's 16 canonical lanes as one vector; weighted sums of 16
/// columns per vector, up to 8 vectors held across all the rows (one pass for a 128-wide
/// head); f16 rows widen exactly (`vcvtph2ps`, 16 from 32 bytes) and multiplies and adds
/// stay separate, so the bits are the scalar ones.
impl<T: StoredType<Float: Widen16>> Attend<T> for Avx512 {
    const SUM_COLUMNS: usize = 16;

    #[inline(always)]
    fn prefetch_rows(rows: &[T]) {
        prefetch_ahead(rows.as_ptr().cast(), size_of_val(rows));
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dot_rows<const R: usize>(rows: &[T], x: &[f32]) -> [f32; R] {
        let d = x.len();
        let body = d - d % scalar::DOT_LANES;
        let mut acc = [_mm512_setzero_ps(); R];
        let mut c = 0;
        while c < body {
            // SAFETY: columns `c..c + 16` exist in `x` and in every row.
            let v = unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) };
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                let w = unsafe { T::Float::load16(rows[r * d + c..r * d + c + 16].as_ptr().cast()) };
                *a = _mm512_add_ps(*a, _mm512_mul_ps(w, v));
            }
            c += 16;
        }
        let mut out = [0f32; R];
        for (r, (o, a)) in out.iter_mut().zip(acc).enumerate() {
            *o = scalar::dot_tail(fold_lanes(a), &rows[r * d + body..(r + 1) * d], &x[body..]);
        }
        out
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn sum_columns<const V: usize>(p: &[f32], rows: &[T], d: usize, c: usize, out: &mut [f32]) {
        let o = out[c..c + 16 * V].as_mut_ptr();
        let mut acc = [_mm512_setzero_ps(); V];
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `o` holds 16 V floats.
            *a = unsafe { _mm512_loadu_ps(o.add(16 * k)) };
        }
        for (j, &pj) in p.iter().enumerate() {
            let pj = _mm512_set1_ps(pj);
            let r = rows[j * d + c..j * d + c + 16 * V].as_ptr();
            super::prefetch_ahead(r.cast(), 16 * V * size_of::<T>());
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: `r` holds 16 V elements.
                *a = _mm512_add_ps(*a, _mm512_mul_ps(pj, unsafe { T::Float::load16(r.add(16 * k).cast()) }));
            }
        }
        for (k, a) in acc.iter().enumerate() {
            // SAFETY: as the loads.
            unsafe { _mm512_storeu_ps(o.add(16 * k), *a) };
        }
    }
}

/// Multi-query tiles of 4 rows x 4 queries (each row read once per 4 queries, each query
/// once per 4 rows), and sums of four queries over 64 columns.
impl<T: StoredType<Float: Widen16>> AttendMany<T> for Avx512 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dots_tile<const R: usize, const Q: usize>(
        rows: &[T],
        xs: &[f32],
        d: usize,
        n: usize,
        (i0, j0): (usize, usize),
        out: &mut [f32],
    ) {
        let body = d - d % scalar::DOT_LANES;
        let (rows, xs) = (&rows[j0 * d..(j0 + R) * d], &xs[i0 * d..(i0 + Q) * d]);
        // Raw pointers in the loop: slices checked per load cost LLVM the registers (it spilled
        // accumulators and copied the rest every round).
        let (rp, xp) = (rows.as_ptr(), xs.as_ptr());
        let mut acc = [[_mm512_setzero_ps(); Q]; R];
        let mut c = 0;
        while c < body {
            // SAFETY: columns `c..c + 16` exist in every query and row (`c + 16 <= body <= d`).
            let x: [__m512; Q] = core::array::from_fn(|q| unsafe { _mm512_loadu_ps(xp.add(q * d + c)) });
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                let w = unsafe { T::Float::load16(rp.add(r * d + c).cast()) };
                for (a, &x) in acc.iter_mut().zip(&x) {
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(w, x));
                }
            }
            c += 16;
        }
        if R == 4 && Q == 4 && body == d {
            // The sixteen folds at once: lane 4 q + r holds row r's dot with query q.
            let sums = fold16(core::array::from_fn(|k| acc[k / 4][k % 4]));
            for q in 0..4 {
                let o = &mut out[(i0 + q) * n + j0..(i0 + q) * n + j0 + 4];
                let lanes = match q {
                    0 => _mm512_extractf32x4_ps::<0>(sums),
                    1 => _mm512_extractf32x4_ps::<1>(sums),
                    2 => _mm512_extractf32x4_ps::<2>(sums),
                    _ => _mm512_extractf32x4_ps::<3>(sums),
                };
                // SAFETY: `o` holds 4 floats.
                unsafe { _mm_storeu_ps(o.as_mut_ptr(), lanes) };
            }
            return;
        }
        for (r, acc) in acc.iter().enumerate() {
            for (q, &a) in acc.iter().enumerate() {
                let (row, x) = (&rows[r * d + body..(r + 1) * d], &xs[q * d + body..(q + 1) * d]);
                out[(i0 + q) * n + j0 + r] = scalar::dot_tail(fold_lanes(a), row, x);
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn sum_many<const Q: usize, const V: usize>(
        p: [&[f32]; Q],
        rows: &[T],
        d: usize,
        c: usize,
        outs: &mut [f32],
    ) {
        let n = p.first().map_or(0, |p| p.len());
        assert!(c + 16 * V <= d && outs.len() >= Q * d && rows.len() >= n * d && p.iter().all(|p| p.len() == n));
        let (o, r, p) = (outs.as_mut_ptr(), rows.as_ptr(), p.map(<[f32]>::as_ptr));
        // Every access: columns `[c, c + 16 V)` exist in each query's output and in
        // each of the `n` rows, and each query has `n` scores (asserted above).
        // SAFETY: see above.
        let mut acc: [[__m512; V]; Q] =
            core::array::from_fn(|q| core::array::from_fn(|k| unsafe { _mm512_loadu_ps(o.add(q * d + c + 16 * k)) }));
        for j in 0..n {
            // SAFETY: see above.
            let v: [__m512; V] =
                core::array::from_fn(|k| unsafe { T::Float::load16(r.add(j * d + c + 16 * k).cast()) });
            for (acc, p) in acc.iter_mut().zip(&p) {
                // SAFETY: see above.
                let pj = _mm512_set1_ps(unsafe { *p.add(j) });
                for (a, &v) in acc.iter_mut().zip(&v) {
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(pj, v));
                }
            }
        }
        for (q, acc) in acc.iter().enumerate() {
            for (k, &a) in acc.iter().enumerate() {
                // SAFETY: see above.
                unsafe { _mm512_storeu_ps(o.add(q * d + c + 16 * k), a) };
            }
        }
    }
}

/// [`scalar::exp_sub`] 16 lanes at a time, operation for operation (bit-identical), the
/// values left over 8 at a time as the AVX2 tier takes them.
impl Exp for Avx512 {
    const LANES: usize = 16;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn exp_sub_lanes(x: &mut [f32], max: f32) {
        let m = _mm512_set1_ps(max);
        // SAFETY: `x` holds 16 floats.
        unsafe { _mm512_storeu_ps(x.as_mut_ptr(), exp16(_mm512_sub_ps(_mm512_loadu_ps(x.as_ptr()), m))) };
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn exp_sub_tail(x: &mut [f32], max: f32) {
        // SAFETY: this tier includes the AVX2 one.
        unsafe { attend::exp_sub_in::<avx2::Avx2>(x, max) }
    }
}

/// [`scalar::max`] in four registers of 16 running maxima (`vmaxps` keeps its second
/// operand when the first is NaN, so NaNs never enter them).
///
/// # Safety
/// The tier's features are present.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn max(x: &[f32]) -> f32 {
    let mut acc = [_mm512_set1_ps(f32::NEG_INFINITY); 4];
    let mut chunks = x.chunks_exact(64);
    for c in &mut chunks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `c` holds 64 floats.
            *a = _mm512_max_ps(unsafe { _mm512_loadu_ps(c.as_ptr().add(16 * k)) }, *a);
        }
    }
    let a = _mm512_max_ps(_mm512_max_ps(acc[0], acc[1]), _mm512_max_ps(acc[2], acc[3]));
    // SAFETY: this tier includes the AVX2 one.
    _mm512_reduce_max_ps(a).max(unsafe { avx2::max(chunks.remainder()) })
}

/// [`scalar::find`] 16 lanes at a time.
///
/// # Safety
/// The tier's features are present.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn find(x: &[f32], v: f32) -> Option<usize> {
    let m = _mm512_set1_ps(v);
    let mut chunks = x.chunks_exact(16);
    for (i, c) in (&mut chunks).enumerate() {
        // SAFETY: `c` holds 16 floats.
        let mask = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(unsafe { _mm512_loadu_ps(c.as_ptr()) }, m);
        if mask != 0 {
            return Some(16 * i + mask.trailing_zeros() as usize);
        }
    }
    // SAFETY: as above.
    unsafe { avx2::find(chunks.remainder(), v) }.map(|j| x.len() / 16 * 16 + j)
}

/// [`scalar::exp_approx`] of 16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn exp16(x: __m512) -> __m512 {
    use scalar::exp;
    // `max(a, b)` is `a > b ? a : b` and `min(a, b)` is `a < b ? a : b`: the scalar clamps,
    // NaN included.
    let x = _mm512_max_ps(_mm512_set1_ps(exp::LO), x);
    let x = _mm512_min_ps(_mm512_set1_ps(exp::HI), x);
    let t = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(exp::LOG2E)), _mm512_set1_ps(0.5));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(t);
    let r = _mm512_sub_ps(
        _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(exp::LN2_HI))),
        _mm512_mul_ps(n, _mm512_set1_ps(exp::LN2_LO)),
    );
    let mut p = _mm512_set1_ps(exp::P[0]);
    for &c in &exp::P[1..] {
        p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
    }
    let y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0));
    let two_n = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)));
    _mm512_mul_ps(y, _mm512_castsi512_ps(two_n))
}

/// [`scalar::fold_lanes`] of sixteen vectors at once, transposed: each level adds the
/// halves of two vectors' groups in one instruction (45 in all, against 7 a vector
/// folded alone). Lane `4 b + j` of the result is the fold of `a[4 j + b]`; every add
/// takes the lower lanes first, as the scalar fold does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn fold16(a: [__m512; 16]) -> __m512 {
    // a[l] + a[l + 8]: vectors 2j and 2j + 1 in the low and high eight lanes.
    let b: [__m512; 8] = core::array::from_fn(|j| {
        let (x, y) = (a[2 * j], a[2 * j + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(x, y), _mm512_shuffle_f32x4::<0xEE>(x, y))
    });
    // a[l] + a[l + 4]: vector 4i + k in 128-bit block k.
    let c: [__m512; 4] = core::array::from_fn(|i| {
        let (x, y) = (b[2 * i], b[2 * i + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(x, y), _mm512_shuffle_f32x4::<0xDD>(x, y))
    });
    // a[l] + a[l + 2], then a[0] + a[1], within each block.
    let d: [__m512; 2] = core::array::from_fn(|i| {
        let (x, y) = (c[2 * i], c[2 * i + 1]);
        _mm512_add_ps(_mm512_shuffle_ps::<0x44>(x, y), _mm512_shuffle_ps::<0xEE>(x, y))
    });
    _mm512_add_ps(_mm512_shuffle_ps::<0x88>(d[0], d[1]), _mm512_shuffle_ps::<0xDD>(d[0], d[1]))
}

/// [`scalar::fold_lanes`] of one vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn fold_lanes(a: __m512) -> f32 {
    let half =
        _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a))));
    avx2::fold8(half)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec;

    use super::*;
    use crate::kernels::tests::values;
    use crate::kernels::tier::{supported, Tier};
    use crate::quant::quantize_matrix;

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

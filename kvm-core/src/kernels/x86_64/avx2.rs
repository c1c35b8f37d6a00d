//! The AVX2 tier: AVX2 + FMA + F16C (x86_64 since Haswell and Zen 1).
//!
//! Float weights widen 8 at a time to f32 lanes and meet the activation in an FMA; f32p
//! weights rebuild 8 at a time from their bytes and exponent nibbles ([`Packed`]).
//! Integer weights use ggml's sign trick: `maddubs` multiplies unsigned by signed bytes, so
//! `w * a` is computed as `|w| * (a * sign(w))`. A weight of -128 stays exact (its
//! magnitude is read unsigned) and the activation quantizer never emits -128, so the
//! integer block sums equal the scalar ones bit for bit.
//! Row-interleaved q4_0x16 and q8_0x16 groups ([`Interleaved`]) put one row in each i32
//! lane instead, so their block sums need no folding.

use core::arch::x86_64::*;
use core::marker::PhantomData;

use half::f16;

use super::prefetch_ahead;
use crate::kernels::attend::{Attend, AttendMany, Exp, Isa};
use crate::kernels::gemm::{self, Gemm, BLOCK};
use crate::kernels::{scalar, FloatType, GroupKernel, Kernel, Kernels, StoredType, BF16, F16, F32, I8};
use crate::quant::{f32p_row, BlockF32P, DType, GroupQ4_0x16, GroupQ8_0x16, QK, X16};

/// The AVX2 tier.
pub(crate) struct Avx2;

impl Kernels for Avx2 {
    type F32 = Float<F32>;
    type F16 = Float<F16>;
    type BF16 = Float<BF16>;
    type Q8_0 = Quant<Q8>;
    type Q4_0 = Quant<Q4>;
    type Q4_0x16 = Interleaved<Q4>;
    type Q8_0x16 = Interleaved<Q8>;
    type F32P = Packed;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        // SAFETY: the caller guarantees AVX2/FMA/F16C.
        unsafe { quantize_act(x, out) }
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        // SAFETY: the caller guarantees AVX2/FMA/F16C.
        unsafe { dequant_row(dtype, row, out) }
    }

    const GEMM: Option<gemm::RunFn> = Some(gemm::run::<Self>);
}

impl Gemm for Avx2 {
    const LANES: usize = 8;

    /// 6 rows by 2 vectors of tokens: 12 accumulators, 2 token vectors and a broadcast
    /// weight in the 16 registers.
    fn rows(_vecs: usize) -> usize {
        6
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile(w: &[*const f32], xt: *const f32, cols: usize, vecs: usize, out: &mut [f32]) {
        let w: [*const f32; 6] = core::array::from_fn(|r| w[r]);
        let width = vecs * 8;
        for v0 in (0..vecs).step_by(2) {
            // SAFETY: (both arms) `xt` holds `BLOCK >= width` tokens per column; the
            // rest forwarded.
            unsafe {
                if v0 + 2 <= vecs {
                    gemm_tile::<2>(w, xt.add(8 * v0), cols, &mut out[8 * v0..], width);
                } else {
                    gemm_tile::<1>(w, xt.add(8 * v0), cols, &mut out[8 * v0..], width);
                }
            }
        }
    }

    /// 8 tokens by up to 8 rows at a time: an 8 x 8 transpose (rows past `rows` zero),
    /// then each token's values in one masked store.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store(out: &[f32], width: usize, rows: usize, n: usize, ys: &mut [f32], ld: usize) {
        for r0 in (0..rows).step_by(8) {
            let real = (rows - r0).min(8);
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(real as i32), lanes);
            for t0 in (0..n).step_by(8) {
                // (Whole loops with a test inside, not `take`: unrolled, the 8 vectors stay
                // in registers.)
                let mut r8 = [_mm256_setzero_ps(); 8];
                for (r, v) in r8.iter_mut().enumerate() {
                    if r < real {
                        // SAFETY: row `r0 + r < rows` holds `width >= t0 + 8` values
                        // (`width` is whole vectors of 8).
                        *v = unsafe { _mm256_loadu_ps(out.as_ptr().add((r0 + r) * width + t0)) };
                    }
                }
                for (j, v) in transpose8(r8).into_iter().enumerate() {
                    if t0 + j < n {
                        // SAFETY: token `t0 + j < n` has `rows` values at `(t0 + j) * ld`.
                        unsafe { _mm256_maskstore_ps(ys.as_mut_ptr().add((t0 + j) * ld + r0), mask, v) };
                    }
                }
            }
        }
    }

    /// 8 x 8 blocks in 24 shuffles each; the columns past the last whole 8 as the default
    /// does.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn transpose(xs: &[f32], cols: usize, xt: &mut [f32]) {
        let n = xs.len() / cols;
        let body = cols - cols % 8;
        for t0 in (0..BLOCK).step_by(8) {
            for c0 in (0..body).step_by(8) {
                // Token `t0 + i`'s 8 values from column `c0`, zero past the last token.
                let mut rows = [_mm256_setzero_ps(); 8];
                for (i, row) in rows.iter_mut().enumerate() {
                    if t0 + i < n {
                        // SAFETY: token `t0 + i < n` holds `cols >= c0 + 8` values.
                        *row = unsafe { _mm256_loadu_ps(xs.as_ptr().add((t0 + i) * cols + c0)) };
                    }
                }
                for (j, col) in transpose8(rows).into_iter().enumerate() {
                    // SAFETY: `xt` holds `cols * BLOCK` values, 64-byte aligned, and
                    // `t0 + 8 <= BLOCK`.
                    unsafe { _mm256_store_ps(xt.as_mut_ptr().add((c0 + j) * BLOCK + t0), col) };
                }
            }
        }
        gemm::transpose_columns(xs, cols, body, xt);
    }
}

/// [`Gemm::tile`] of 6 rows by `V` vectors of tokens, into `out` at a row stride of
/// `width` values.
///
/// # Safety
/// As [`Gemm::tile`] for `V` vectors, with AVX2 and FMA enabled in the (inlining) caller.
#[inline(always)]
unsafe fn gemm_tile<const V: usize>(w: [*const f32; 6], xt: *const f32, cols: usize, out: &mut [f32], width: usize) {
    // SAFETY: the caller enables the features; `xt` holds `cols` columns of `BLOCK >= 8 *
    // V` tokens (32-byte aligned: columns are 64-byte aligned and `8 * v0` floats in),
    // each row `cols` f32 and `out` `5 * width + 8 * V` values.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); V]; 6];
        for c in 0..cols {
            let mut x = [_mm256_setzero_ps(); V];
            for (v, x) in x.iter_mut().enumerate() {
                *x = _mm256_load_ps(xt.add(c * BLOCK + 8 * v));
            }
            for r in 0..6 {
                let b = _mm256_set1_ps(w[r].add(c).read_unaligned());
                for v in 0..V {
                    acc[r][v] = _mm256_fmadd_ps(b, x[v], acc[r][v]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (v, &acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(r * width + 8 * v), acc);
            }
        }
    }
}

/// The transpose of an 8 x 8 block: `out[j]` lane `i` is `rows[i]` lane `j`. Pairs of
/// rows interleave, then quads within 128-bit lanes, then the lanes of two quads meet.
#[inline(always)]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let mut a = r;
    let mut b = r;
    // SAFETY: register-only AVX shuffles, enabled in the (inlining) caller.
    unsafe {
        // a[2i], a[2i + 1]: rows 2i and 2i + 1 interleaved, columns 4L, 4L + 1 (low) and
        // 4L + 2, 4L + 3 (high) of each 128-bit lane L.
        for i in 0..4 {
            a[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            a[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // b[4g + k], lane L: rows 4g..4g + 4 at column 4L + k.
        for g in 0..2 {
            let (lo, hi) = ([a[4 * g], a[4 * g + 2]], [a[4 * g + 1], a[4 * g + 3]]);
            b[4 * g] = _mm256_shuffle_ps::<0x44>(lo[0], lo[1]);
            b[4 * g + 1] = _mm256_shuffle_ps::<0xEE>(lo[0], lo[1]);
            b[4 * g + 2] = _mm256_shuffle_ps::<0x44>(hi[0], hi[1]);
            b[4 * g + 3] = _mm256_shuffle_ps::<0xEE>(hi[0], hi[1]);
        }
        // Column 4L + k: lane L of both quads.
        for k in 0..4 {
            a[k] = _mm256_permute2f128_ps::<0x20>(b[k], b[4 + k]);
            a[4 + k] = _mm256_permute2f128_ps::<0x31>(b[k], b[4 + k]);
        }
    }
    a
}

/// An element type whose 8 consecutive values widen exactly to one vector: the float
/// dtypes of weight rows, and the attention state's rows ([`StoredType`], the q8 cache's
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
pub(super) fn hsum(v: __m256) -> f32 {
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
        let hints = super::software_streams();
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        for b in 0..nb {
            for r in 0..R {
                // SAFETY: every row has `nb` blocks.
                let p = unsafe { blocks[r].add(b * size_of::<BlockF32P>()) };
                if hints {
                    super::prefetch_packed::<R>(p);
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
fn f32p_base(base: u32) -> __m256i {
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
unsafe fn f32p_block(p: *const u8, base: __m256i) -> [__m256; 4] {
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
unsafe fn dequant_f32p(row: &[u8], out: &mut [f32]) {
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
        let hints = super::software_streams();
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
                    super::prefetch(p, super::tile_ahead::<R>());
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

/// The exact i32 sums of 8 lanes for one weight block and one activation block, in a tier.
pub(super) trait BlockDot {
    /// Per-activation-block work shared by every row (the bias correction).
    ///
    /// # Safety
    /// The tier's features are enabled in the (inlining) caller.
    unsafe fn prep<B: Blocks32>(av: __m256i) -> __m256i;

    /// Lanes summing to `w . a` for the block at `p`, with `av` the activation block.
    ///
    /// # Safety
    /// As [`BlockDot::prep`]; `p` points at one whole block.
    unsafe fn dot<B: Blocks32>(p: *const u8, av: __m256i, prep: __m256i) -> __m256i;
}

/// `maddubs` + `madd`: formats whose biased weights keep `maddubs`' i16 pair sums exact
/// (q4_0: `2 * 15 * 127`) take the bias route, the others (q8_0: `2 * 255 * 127` would
/// saturate) the sign trick.
pub(crate) struct Maddubs;

impl BlockDot for Maddubs {
    #[inline(always)]
    unsafe fn prep<B: Blocks32>(av: __m256i) -> __m256i {
        // SAFETY: AVX2 is enabled in the (inlining) caller.
        unsafe {
            if biased::<B>() {
                _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(B::BIAS as i8), av), _mm256_set1_epi16(1))
            } else {
                _mm256_setzero_si256()
            }
        }
    }

    #[inline(always)]
    unsafe fn dot<B: Blocks32>(p: *const u8, av: __m256i, corr: __m256i) -> __m256i {
        // SAFETY: AVX2 is enabled in the (inlining) caller; `p` is forwarded.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            if biased::<B>() {
                let uw = B::load_biased(p);
                _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(uw, av), ones), corr)
            } else {
                let wv = B::load32(p);
                _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv)), ones)
            }
        }
    }
}

/// Whether `B`'s biased weights times activations fit `maddubs`' i16 pair sums.
#[inline(always)]
const fn biased<B: Blocks32>() -> bool {
    2 * (2 * B::BIAS - 1) * 127 <= i16::MAX as i32
}

/// The f16 scales of blocks `b0..b0 + n` (`n <= 8`) of row `w`, converted at once, in
/// lanes `0..n` (the others zero). F16C converts exactly, as the scalar tier does.
///
/// # Safety
/// F16C is enabled in the caller; `w` holds blocks `b0..b0 + n` of `bb` bytes.
#[inline(always)]
unsafe fn weight_scales(w: &[u8], bb: usize, b0: usize, n: usize) -> __m256 {
    let bits = |j: usize| {
        if j < n {
            // SAFETY: block `b0 + j` exists.
            i16::from_le_bytes(unsafe { w.as_ptr().add((b0 + j) * bb).cast::<[u8; 2]>().read() })
        } else {
            0
        }
    };
    // SAFETY: F16C is enabled in the caller.
    unsafe { _mm256_cvtph_ps(_mm_setr_epi16(bits(0), bits(1), bits(2), bits(3), bits(4), bits(5), bits(6), bits(7))) }
}

/// The scales of blocks `b0..b0 + n` (`n <= 8`) of a q8 activation of `cols` values, in
/// lanes `0..n` (the others zero).
///
/// # Safety
/// AVX is enabled in the caller; `a` is a whole activation and holds those blocks.
#[inline(always)]
unsafe fn act_scales(a: &[u8], cols: usize, b0: usize, n: usize) -> __m256 {
    // SAFETY: the scales follow the `cols` values, 4 bytes each.
    unsafe {
        let p = a.as_ptr().add(cols + 4 * b0);
        if n == 8 {
            _mm256_loadu_ps(p.cast())
        } else {
            let mut d = [0.0f32; 8];
            for (j, d) in d.iter_mut().enumerate().take(n) {
                *d = f32::from_le_bytes(p.add(4 * j).cast::<[u8; 4]>().read());
            }
            _mm256_loadu_ps(d.as_ptr())
        }
    }
}

/// The lanes of blocks `b0 + j` and `b0 + j + 1`, for each of `R x T` pairs, pairwise
/// added: `hadd(s_j, s_j+1)`. Blocks at or past `b0 + n` count as zero.
///
/// # Safety
/// As [`quant_tile`]; the rows and activations hold blocks `b0..b0 + n`.
#[inline(always)]
unsafe fn pair<B: Blocks32, D: BlockDot, const R: usize, const T: usize>(
    w: [&[u8]; R],
    a: [&[u8]; T],
    b0: usize,
    j: usize,
    n: usize,
) -> [[__m256i; T]; R] {
    let bb = B::DTYPE.block_bytes();
    // SAFETY: the caller enables the features; every read is inside a block `< b0 + n`.
    unsafe {
        let mut s = [[[_mm256_setzero_si256(); T]; R]; 2];
        for (k, sk) in s.iter_mut().enumerate() {
            if j + k >= n {
                break;
            }
            let b = b0 + j + k;
            let mut av = [_mm256_setzero_si256(); T];
            let mut prep = [_mm256_setzero_si256(); T];
            for t in 0..T {
                av[t] = _mm256_loadu_si256(a[t].as_ptr().add(b * QK).cast());
                prep[t] = D::prep::<B>(av[t]);
            }
            for r in 0..R {
                let p = w[r].as_ptr().add(b * bb);
                super::prefetch(p, super::tile_ahead::<R>());
                for t in 0..T {
                    sk[r][t] = D::dot::<B>(p, av[t], prep[t]);
                }
            }
        }
        let mut h = [[_mm256_setzero_si256(); T]; R];
        for r in 0..R {
            for t in 0..T {
                h[r][t] = _mm256_hadd_epi32(s[0][r][t], s[1][r][t]);
            }
        }
        h
    }
}

/// Blocks `b0 + j..b0 + j + 4` folded to `[s_j, s_j+1, s_j+2, s_j+3]` with each block's
/// lanes 0..4 summed, then the same with lanes 4..8 summed.
///
/// # Safety
/// As [`pair`].
#[inline(always)]
unsafe fn quad<B: Blocks32, D: BlockDot, const R: usize, const T: usize>(
    w: [&[u8]; R],
    a: [&[u8]; T],
    b0: usize,
    j: usize,
    n: usize,
) -> [[__m256i; T]; R] {
    // SAFETY: forwarded.
    unsafe {
        let x = pair::<B, D, R, T>(w, a, b0, j, n);
        let y = pair::<B, D, R, T>(w, a, b0, j + 2, n);
        let mut q = [[_mm256_setzero_si256(); T]; R];
        for r in 0..R {
            for t in 0..T {
                q[r][t] = _mm256_hadd_epi32(x[r][t], y[r][t]);
            }
        }
        q
    }
}

/// How a tier finds the exact block sums of a group of 8 blocks.
pub(super) trait GroupSums {
    /// `out[r][t]` lane `j`: the exact i32 dot product of block `b0 + j` of `w[r]` and
    /// `a[t]` for `j < n` (`n <= 8`), zero for the others.
    ///
    /// # Safety
    /// The tier's features are enabled in the (inlining) caller; the rows and
    /// activations hold blocks `b0..b0 + n`.
    unsafe fn sums<B: Blocks32, const R: usize, const T: usize>(
        w: [&[u8]; R],
        a: [&[u8]; T],
        b0: usize,
        n: usize,
    ) -> [[__m256i; T]; R];
}

impl<D: BlockDot> GroupSums for D {
    #[inline(always)]
    unsafe fn sums<B: Blocks32, const R: usize, const T: usize>(
        w: [&[u8]; R],
        a: [&[u8]; T],
        b0: usize,
        n: usize,
    ) -> [[__m256i; T]; R] {
        // SAFETY: forwarded; the caller enables the features.
        unsafe {
            let lo = quad::<B, D, R, T>(w, a, b0, 0, n);
            let hi = quad::<B, D, R, T>(w, a, b0, 4, n);
            let mut s = [[_mm256_setzero_si256(); T]; R];
            for r in 0..R {
                for t in 0..T {
                    let (l, h) = (lo[r][t], hi[r][t]);
                    s[r][t] = _mm256_add_epi32(
                        _mm256_permute2x128_si256::<0x20>(l, h),
                        _mm256_permute2x128_si256::<0x31>(l, h),
                    );
                }
            }
            s
        }
    }
}

/// Adds the terms of blocks `b0..b0 + n` (`n <= 8`, lane `j` for block `b0 + j`) into
/// `acc`.
///
/// # Safety
/// As [`GroupSums::sums`].
#[inline(always)]
unsafe fn group<B: Blocks32, G: GroupSums, const R: usize, const T: usize>(
    w: [&[u8]; R],
    a: [&[u8]; T],
    cols: usize,
    b0: usize,
    n: usize,
    acc: &mut [[__m256; T]; R],
) {
    let bb = B::DTYPE.block_bytes();
    // SAFETY: forwarded; the caller enables the features.
    unsafe {
        let isum = G::sums::<B, R, T>(w, a, b0, n);
        let mut da = [_mm256_setzero_ps(); T];
        for t in 0..T {
            da[t] = act_scales(a[t], cols, b0, n);
        }
        for r in 0..R {
            let dw = weight_scales(w[r], bb, b0, n);
            for t in 0..T {
                let term = _mm256_mul_ps(_mm256_mul_ps(dw, da[t]), _mm256_cvtepi32_ps(isum[r][t]));
                acc[r][t] = _mm256_add_ps(acc[r][t], term);
            }
        }
    }
}

/// The integer tile of both x86 tiers: the canonical sum of [`scalar::sum_blocks`], 8
/// blocks a step. The 8 i32 lanes of each block's dot product fold, 8 blocks side by side,
/// into one vector of exact block sums (a `hadd` tree; integer adds are exact in any
/// order); lane `k` of the f32 accumulator is the scalar tier's `acc[k]`, fed
/// `(d_w * d_a) * isum` with two multiplies and an add (no FMA).
///
/// # Safety
/// As [`Kernel::tile`], with AVX2/FMA/F16C and `G`'s features enabled in the caller.
#[inline(always)]
pub(super) unsafe fn quant_tile<B: Blocks32, G: GroupSums, const R: usize, const T: usize>(
    w: [&[u8]; R],
    a: [&[u8]; T],
    cols: usize,
) -> [[f32; T]; R] {
    let nb = cols / QK;
    // SAFETY: the caller enables the features; groups stay inside the `nb` blocks.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        let mut b0 = 0;
        while b0 + 8 <= nb {
            group::<B, G, R, T>(w, a, cols, b0, 8, &mut acc);
            b0 += 8;
        }
        if b0 < nb {
            group::<B, G, R, T>(w, a, cols, b0, nb - b0, &mut acc);
        }
        let mut out = [[0.0; T]; R];
        for r in 0..R {
            for t in 0..T {
                out[r][t] = reduce_lanes(acc[r][t]);
            }
        }
        out
    }
}

/// [`scalar::reduce_lanes`] of the 8 lanes: two `hadd`s make `(a0 + a1) + (a2 + a3)` in
/// the low half and `(a4 + a5) + (a6 + a7)` in the high half, then one add.
///
/// # Safety
/// AVX is enabled in the (inlining) caller.
#[inline(always)]
pub(super) unsafe fn reduce_lanes(v: __m256) -> f32 {
    // SAFETY: AVX is enabled in the (inlining) caller.
    unsafe {
        let h = _mm256_hadd_ps(v, v);
        let h = _mm256_hadd_ps(h, h);
        _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h)))
    }
}

/// Integer kernel of this tier: [`quant_tile`] with [`Maddubs`].
pub(crate) struct Quant<B>(PhantomData<B>);

impl<B: Blocks32> Kernel for Quant<B> {
    type Act = u8;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[u8]; T], cols: usize) -> [[f32; T]; R] {
        // SAFETY: forwarded; the tier's features are enabled here.
        unsafe { quant_tile::<B, Maddubs, R, T>(w, a, cols) }
    }
}

/// q4_0x16 and q8_0x16 groups: one i32 lane per row, so a vector holds 8 rows (half a
/// group) and a block's 8 exact row sums need no folding ([`X16Half::row_sums`]); the
/// canonical sum's 8 accumulators are 8 vectors per half (accumulator `b % 8` of its 8
/// rows), summed in the scalar tree at the end.
///
/// Both halves of a block share the activation's quads, prep and scale, so one pass does
/// both and the accumulators (16 per token) live in memory: 16 registers cannot hold them
/// and a block's working set, and each is touched only once per 8 blocks.
pub(crate) struct Interleaved<B>(PhantomData<B>);

/// An interleaved dtype as [`Interleaved`] reads it: half a group block at a time, piece
/// `v` of the half (`[8 rows][4 bytes]`, 32 of its 64 bytes) one vector with a row in each
/// i32 lane.
pub(crate) trait X16Half {
    /// Bytes of one group block (16 scales, then the quant bytes).
    const GROUP_BYTES: usize;
    /// A half block's weights, decoded once for all the tokens of a pass.
    type Weights;
    /// What an activation block brings to every row's sums, found once per block and token.
    type Prep: Copy;

    /// The prep of the activation block at `pa`.
    ///
    /// # Safety
    /// AVX2 is enabled in the (inlining) caller; `pa` points at 32 readable bytes.
    unsafe fn prep(pa: *const u8) -> Self::Prep;

    /// The weights of the half whose piece 0 is at `q` (the others follow 64 bytes apart).
    ///
    /// # Safety
    /// As [`X16Half::prep`]; `q` points into a whole group block.
    unsafe fn weights(q: *const u8) -> Self::Weights;

    /// `[8]` i32: each row's exact block sum `sum w * a` against the activation block at
    /// `pa`.
    ///
    /// # Safety
    /// As [`X16Half::prep`]; `w` and `prep` come from the two above.
    unsafe fn row_sums(w: &Self::Weights, pa: *const u8, prep: Self::Prep) -> __m256i;
}

/// Activations `4k..4k + 4` of the block at `pa` in every i32 lane (every row's lane).
///
/// # Safety
/// AVX is enabled in the (inlining) caller; `pa` points at 32 readable bytes, `k < 8`.
#[inline(always)]
unsafe fn act_quad(pa: *const u8, k: usize) -> __m256i {
    // SAFETY: bytes `4k..4k + 4` are readable.
    unsafe { _mm256_set1_epi32(pa.add(4 * k).cast::<i32>().read_unaligned()) }
}

/// `maddubs` takes the biased nibbles (unsigned, 0..=15) as they are: a pair sum is at
/// most `2 * 15 * 128` and the 8 of an i16 lane (one per activation quad) at most `30720`,
/// so they add up exactly in i16. Taking off `8 * a` for the lane's 16 weights (at most
/// `16 * 8 * 128 = 16384`, [`bias16`]) leaves its exact `sum (w - 8) * a`, at most
/// `16 * 8 * 128` too, and one `madd` joins a row's two lanes into its block sum.
impl X16Half for Q4 {
    const GROUP_BYTES: usize = core::mem::size_of::<GroupQ4_0x16>();
    /// `[8]`: vector `k` holds the 8 rows' weights `4k..4k + 4` plus 8, a byte each.
    type Weights = [__m256i; 8];
    /// [`bias16`].
    type Prep = __m256i;

    #[inline(always)]
    unsafe fn prep(pa: *const u8) -> __m256i {
        // SAFETY: forwarded.
        unsafe { bias16(pa) }
    }

    #[inline(always)]
    unsafe fn weights(q: *const u8) -> [__m256i; 8] {
        // SAFETY: 4 pieces; AVX2 is enabled in the caller.
        unsafe {
            let m = _mm256_set1_epi8(15);
            // Byte k of a row's piece v: weight 4v + k (low nibble), 16 + 4v + k (high).
            let mut nib = [_mm256_setzero_si256(); 8];
            for v in 0..4 {
                let x = _mm256_loadu_si256(q.add(64 * v).cast());
                nib[v] = _mm256_and_si256(x, m);
                nib[4 + v] = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m);
            }
            nib
        }
    }

    #[inline(always)]
    unsafe fn row_sums(nib: &[__m256i; 8], pa: *const u8, bias: __m256i) -> __m256i {
        // SAFETY: forwarded; AVX2 is enabled in the caller.
        unsafe {
            // Two independent i16 chains of 4.
            let mut s0 = _mm256_setzero_si256();
            let mut s1 = _mm256_setzero_si256();
            for v in 0..4 {
                s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(nib[v], act_quad(pa, v)));
                s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(nib[4 + v], act_quad(pa, 4 + v)));
            }
            _mm256_madd_epi16(_mm256_sub_epi16(_mm256_add_epi16(s0, s1), bias), _mm256_set1_epi16(1))
        }
    }
}

/// The sign trick, `w * a = |w| * (a * sign(w))`: `maddubs` reads `|w|` unsigned (128 for
/// -128, still right) against the activation with `w`'s sign moved onto it (the quantizer
/// never emits -128, so negating one stays in i8). A pair sum is at most `2 * 128 * 127 =
/// 32512`, exact in i16, but two could overflow: each piece's `madd` widens to i32 first.
impl X16Half for Q8 {
    const GROUP_BYTES: usize = core::mem::size_of::<GroupQ8_0x16>();
    /// `[8]` u8: vector `k` holds `|w|` of the 8 rows' weights `4k..4k + 4`; and piece 0's
    /// address: each token loads the signed weights again (from L1) rather than have them
    /// take 8 more of the 16 registers.
    type Weights = ([__m256i; 8], *const u8);
    /// Nothing: the weights need no bias.
    type Prep = ();

    #[inline(always)]
    unsafe fn prep(_: *const u8) {}

    #[inline(always)]
    unsafe fn weights(q: *const u8) -> ([__m256i; 8], *const u8) {
        // SAFETY: 8 pieces; AVX2 is enabled in the caller.
        unsafe {
            let mut mag = [_mm256_setzero_si256(); 8];
            for (v, m) in mag.iter_mut().enumerate() {
                *m = _mm256_abs_epi8(_mm256_loadu_si256(q.add(64 * v).cast()));
            }
            (mag, q)
        }
    }

    #[inline(always)]
    unsafe fn row_sums((mag, q): &([__m256i; 8], *const u8), pa: *const u8, (): ()) -> __m256i {
        // SAFETY: forwarded; AVX2 is enabled in the caller.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            // [8] i32: piece v's 4 products of each row.
            let piece = |v: usize| {
                let signed = _mm256_sign_epi8(act_quad(pa, v), _mm256_loadu_si256(q.add(64 * v).cast()));
                _mm256_madd_epi16(_mm256_maddubs_epi16(mag[v], signed), ones)
            };
            // Two independent i32 chains of 4.
            let mut s0 = _mm256_setzero_si256();
            let mut s1 = _mm256_setzero_si256();
            for v in 0..4 {
                s0 = _mm256_add_epi32(s0, piece(v));
                s1 = _mm256_add_epi32(s1, piece(4 + v));
            }
            _mm256_add_epi32(s0, s1)
        }
    }
}

/// Tokens [`Interleaved`] takes per pass over a group, sharing each decoded half block: 2
/// beat both 1 (decoding twice as often) and 4 (spilling the nibbles) for q4_0x16 in
/// `benches/kernels.rs`; q8_0x16 showed no clear winner.
const X16_TOKENS: usize = 2;

impl<B: X16Half> GroupKernel for Interleaved<B> {
    const SIDE_BY_SIDE: bool = true;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const T: usize>(g: &[u8], a: [&[u8]; T], cols: usize) -> [[f32; X16]; T] {
        const N: usize = X16_TOKENS;
        let mut out = [[0.0; X16]; T];
        // The first pass prefetches; the group is in L1 or L2 for the others.
        let mut t = 0;
        while t < T {
            if t + N <= T {
                // SAFETY: forwarded; the features are enabled here.
                let [o] = unsafe { x16::<B, 1, N>([g], core::array::from_fn(|j| a[t + j]), cols, t == 0) };
                out[t..t + N].copy_from_slice(&o);
                t += N;
            } else {
                // SAFETY: as above.
                [[out[t]]] = unsafe { x16::<B, 1, 1>([g], [a[t]], cols, t == 0) };
                t += 1;
            }
        }
        out
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn streams<const S: usize>(g: [&[u8]; S], a: &[u8], cols: usize) -> [[f32; X16]; S] {
        // SAFETY: forwarded; the features are enabled here.
        unsafe { x16::<B, S, 1>(g, [a], cols, true) }.map(|[y]| y)
    }
}

/// [`Interleaved`] for `S` groups side by side (block `b` of each in turn) and `T`
/// tokens, block by block, both halves of each: `out[s][t]`; `fetch`: prefetch the weights
/// ahead.
///
/// # Safety
/// As [`GroupKernel::group`] for each group, with AVX2/FMA/F16C enabled in the caller.
#[inline(always)]
unsafe fn x16<B: X16Half, const S: usize, const T: usize>(
    g: [&[u8]; S],
    a: [&[u8]; T],
    cols: usize,
    fetch: bool,
) -> [[[f32; X16]; T]; S] {
    let nb = cols / QK;
    let gb = B::GROUP_BYTES;
    debug_assert!(g.iter().all(|g| g.len() == nb * gb));
    // SAFETY: each `g[s]` holds `nb` blocks of a group and each `a[t]` a whole activation
    // (`cols` values, then `nb` f32 scales); the features are enabled in the caller.
    unsafe {
        // [group][half][token][b % 8]
        let mut acc = [[[[_mm256_setzero_ps(); 8]; T]; 2]; S];
        for b in 0..nb {
            let pa: [*const u8; T] = core::array::from_fn(|t| a[t].as_ptr().add(b * QK));
            let prep: [B::Prep; T] = core::array::from_fn(|t| B::prep(pa[t]));
            let da: [__m256; T] = core::array::from_fn(|t| {
                _mm256_set1_ps(a[t].as_ptr().add(cols + 4 * b).cast::<f32>().read_unaligned())
            });
            for (g, acc) in g.iter().zip(acc.iter_mut()) {
                let wb = g.as_ptr().add(b * gb);
                if fetch {
                    prefetch_ahead(wb, gb);
                }
                for (h, acc) in acc.iter_mut().enumerate() {
                    // The half's 8 scales: [8] f16 -> [8] f32 (exact).
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(wb.add(16 * h).cast()));
                    let w = B::weights(wb.add(2 * X16 + 32 * h));
                    for t in 0..T {
                        let isum = B::row_sums(&w, pa[t], prep[t]);
                        let term = _mm256_mul_ps(_mm256_mul_ps(dw, da[t]), _mm256_cvtepi32_ps(isum));
                        acc[t][b % 8] = _mm256_add_ps(acc[t][b % 8], term);
                    }
                }
            }
        }
        let mut out = [[[0.0; X16]; T]; S];
        for (out, acc) in out.iter_mut().zip(&acc) {
            for (h, acc) in acc.iter().enumerate() {
                for (out, k) in out.iter_mut().zip(acc) {
                    let sum = _mm256_add_ps(
                        _mm256_add_ps(_mm256_add_ps(k[0], k[1]), _mm256_add_ps(k[2], k[3])),
                        _mm256_add_ps(_mm256_add_ps(k[4], k[5]), _mm256_add_ps(k[6], k[7])),
                    );
                    _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), sum);
                }
            }
        }
        out
    }
}

/// What the nibbles' bias adds to [`Interleaved<Q4>`]'s i16 lanes for the activation block
/// at `pa`: `8 * (a_4k + a_4k+1)` summed over the 8 quads `k` in the even lanes, `8 *
/// (a_4k+2 + a_4k+3)` in the odd ones (each at most `16 * 8 * 128 = 16384`).
///
/// # Safety
/// AVX2 is enabled in the (inlining) caller; `pa` points at 32 readable bytes.
#[inline(always)]
unsafe fn bias16(pa: *const u8) -> __m256i {
    // SAFETY: forwarded.
    unsafe {
        // [16] i16: 8 * (a_2i + a_2i+1); lane parity picks the pair within a quad.
        let p = _mm256_maddubs_epi16(_mm256_set1_epi8(8), _mm256_loadu_si256(pa.cast()));
        // Fold lanes i + 8, i + 4, i + 2 onto lane i: each keeps its parity.
        let p = _mm_add_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p));
        let p = _mm_add_epi16(p, _mm_shuffle_epi32::<0b0100_1110>(p));
        let p = _mm_add_epi16(p, _mm_shuffle_epi32::<0b1011_0001>(p));
        _mm256_broadcastsi128_si256(p)
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
    // SAFETY: (all arms) `row` holds `out.len()` weights of `dtype`.
    unsafe {
        match dtype {
            DType::F32 => widen_row::<F32>(row, out),
            DType::F16 => widen_row::<F16>(row, out),
            DType::BF16 => widen_row::<BF16>(row, out),
            DType::Q8_0 | DType::Q8_0x16 => blocks_row::<Q8>(row, out),
            DType::Q4_0 | DType::Q4_0x16 => blocks_row::<Q4>(row, out),
            DType::F32P => dequant_f32p(row, out),
        }
    }
}

/// # Safety
/// AVX2, FMA and F16C are present; `row` holds `out.len()` weights.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_row<W: Widen8 + FloatType>(row: &[u8], out: &mut [f32]) {
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

impl Isa for Avx2 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn enable<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

/// Attention's tiles: a dot's 16 canonical lanes as two vectors; weighted sums of 8
/// columns per vector, up to 8 vectors held across all the rows; f16 rows widen exactly
/// (`vcvtph2ps`) and multiplies and adds stay separate, so the bits are the scalar ones.
impl<T: StoredType<Float: Widen8>> Attend<T> for Avx2 {
    const SUM_COLUMNS: usize = 8;

    #[inline(always)]
    fn prefetch_rows(rows: &[T]) {
        prefetch_ahead(rows.as_ptr().cast(), size_of_val(rows));
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_rows<const R: usize>(rows: &[T], x: &[f32]) -> [f32; R] {
        let d = x.len();
        let body = d - d % scalar::DOT_LANES;
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut c = 0;
        while c < body {
            // SAFETY: columns `c..c + 16` exist in `x` and in every row.
            let v = unsafe { [_mm256_loadu_ps(x.as_ptr().add(c)), _mm256_loadu_ps(x.as_ptr().add(c + 8))] };
            for (r, a) in acc.iter_mut().enumerate() {
                let p = rows[r * d + c..r * d + c + 16].as_ptr();
                // SAFETY: `p` holds 16 elements.
                let w = unsafe { [T::Float::load8(p.cast()), T::Float::load8(p.add(8).cast())] };
                a[0] = _mm256_add_ps(a[0], _mm256_mul_ps(w[0], v[0]));
                a[1] = _mm256_add_ps(a[1], _mm256_mul_ps(w[1], v[1]));
            }
            c += 16;
        }
        let mut out = [0f32; R];
        for (r, (o, a)) in out.iter_mut().zip(acc).enumerate() {
            *o = scalar::dot_tail(fold8(_mm256_add_ps(a[0], a[1])), &rows[r * d + body..(r + 1) * d], &x[body..]);
        }
        out
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum_columns<const V: usize>(p: &[f32], rows: &[T], d: usize, c: usize, out: &mut [f32]) {
        let o = out[c..c + 8 * V].as_mut_ptr();
        let mut acc = [_mm256_setzero_ps(); V];
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `o` holds 8 V floats.
            *a = unsafe { _mm256_loadu_ps(o.add(8 * k)) };
        }
        for (j, &pj) in p.iter().enumerate() {
            let pj = _mm256_set1_ps(pj);
            let r = rows[j * d + c..j * d + c + 8 * V].as_ptr();
            super::prefetch_ahead(r.cast(), 8 * V * size_of::<T>());
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: `r` holds 8 V elements.
                *a = _mm256_add_ps(*a, _mm256_mul_ps(pj, unsafe { T::Float::load8(r.add(8 * k).cast()) }));
            }
        }
        for (k, a) in acc.iter().enumerate() {
            // SAFETY: as the loads.
            unsafe { _mm256_storeu_ps(o.add(8 * k), *a) };
        }
    }
}

/// Multi-query tiles of 2 rows x 2 queries (a dot's 16 lanes take two registers, so that
/// is what 16 registers hold), and sums of four queries over 16 columns (8 accumulators).
impl<T: StoredType<Float: Widen8>> AttendMany<T> for Avx2 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
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
        // Raw pointers in the loop, as in the AVX-512 tile (slices checked per load spill).
        let (rp, xp) = (rows.as_ptr(), xs.as_ptr());
        let mut acc = [[[_mm256_setzero_ps(); 2]; Q]; R];
        let mut c = 0;
        while c < body {
            // SAFETY: columns `c..c + 16` exist in every query and row (`c + 16 <= body <= d`).
            let x: [[__m256; 2]; Q] = core::array::from_fn(|q| unsafe {
                let p = xp.add(q * d + c);
                [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))]
            });
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                let p = unsafe { rp.add(r * d + c) };
                // SAFETY: `p` holds 16 elements.
                let w = unsafe { [T::Float::load8(p.cast()), T::Float::load8(p.add(8).cast())] };
                for (a, x) in acc.iter_mut().zip(&x) {
                    a[0] = _mm256_add_ps(a[0], _mm256_mul_ps(w[0], x[0]));
                    a[1] = _mm256_add_ps(a[1], _mm256_mul_ps(w[1], x[1]));
                }
            }
            c += 16;
        }
        for (r, acc) in acc.iter().enumerate() {
            for (q, a) in acc.iter().enumerate() {
                let (row, x) = (&rows[r * d + body..(r + 1) * d], &xs[q * d + body..(q + 1) * d]);
                out[(i0 + q) * n + j0 + r] = scalar::dot_tail(fold8(_mm256_add_ps(a[0], a[1])), row, x);
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum_many<const Q: usize, const V: usize>(
        p: [&[f32]; Q],
        rows: &[T],
        d: usize,
        c: usize,
        outs: &mut [f32],
    ) {
        let n = p.first().map_or(0, |p| p.len());
        assert!(c + 8 * V <= d && outs.len() >= Q * d && rows.len() >= n * d && p.iter().all(|p| p.len() == n));
        let (o, r, p) = (outs.as_mut_ptr(), rows.as_ptr(), p.map(<[f32]>::as_ptr));
        // Every access: columns `[c, c + 8 V)` exist in each query's output and in
        // each of the `n` rows, and each query has `n` scores (asserted above).
        // SAFETY: see above.
        let mut acc: [[__m256; V]; Q] =
            core::array::from_fn(|q| core::array::from_fn(|k| unsafe { _mm256_loadu_ps(o.add(q * d + c + 8 * k)) }));
        for j in 0..n {
            // SAFETY: see above.
            let v: [__m256; V] = core::array::from_fn(|k| unsafe { T::Float::load8(r.add(j * d + c + 8 * k).cast()) });
            for (acc, p) in acc.iter_mut().zip(&p) {
                // SAFETY: see above.
                let pj = _mm256_set1_ps(unsafe { *p.add(j) });
                for (a, &v) in acc.iter_mut().zip(&v) {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(pj, v));
                }
            }
        }
        for (q, acc) in acc.iter().enumerate() {
            for (k, &a) in acc.iter().enumerate() {
                // SAFETY: see above.
                unsafe { _mm256_storeu_ps(o.add(q * d + c + 8 * k), a) };
            }
        }
    }
}

/// [`scalar::exp_sub`] 8 lanes at a time, operation for operation (bit-identical).
impl Exp for Avx2 {
    const LANES: usize = 8;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn exp_sub_lanes(x: &mut [f32], max: f32) {
        let m = _mm256_set1_ps(max);
        // SAFETY: `x` holds 8 floats.
        unsafe { _mm256_storeu_ps(x.as_mut_ptr(), exp8(_mm256_sub_ps(_mm256_loadu_ps(x.as_ptr()), m))) };
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

/// [`scalar::max`] in four registers of 8 running maxima (`maxps` keeps its second
/// operand when the first is NaN, so NaNs never enter them).
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn max(x: &[f32]) -> f32 {
    let mut acc = [_mm256_set1_ps(f32::NEG_INFINITY); 4];
    let mut chunks = x.chunks_exact(32);
    for c in &mut chunks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `c` holds 32 floats.
            *a = _mm256_max_ps(unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * k)) }, *a);
        }
    }
    let a = _mm256_max_ps(_mm256_max_ps(acc[0], acc[1]), _mm256_max_ps(acc[2], acc[3]));
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), a) };
    lanes.into_iter().fold(scalar::max(chunks.remainder()), f32::max)
}

/// [`scalar::find`] 8 lanes at a time.
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn find(x: &[f32], v: f32) -> Option<usize> {
    let m = _mm256_set1_ps(v);
    let mut chunks = x.chunks_exact(8);
    for (i, c) in (&mut chunks).enumerate() {
        // SAFETY: `c` holds 8 floats.
        let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(unsafe { _mm256_loadu_ps(c.as_ptr()) }, m);
        let mask = _mm256_movemask_ps(eq);
        if mask != 0 {
            return Some(8 * i + mask.trailing_zeros() as usize);
        }
    }
    scalar::find(chunks.remainder(), v).map(|j| x.len() / 8 * 8 + j)
}

/// [`scalar::exp_approx`] of 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp8(x: __m256) -> __m256 {
    use scalar::exp;
    // `max(a, b)` is `a > b ? a : b` and `min(a, b)` is `a < b ? a : b`: the scalar clamps,
    // NaN included.
    let x = _mm256_max_ps(_mm256_set1_ps(exp::LO), x);
    let x = _mm256_min_ps(_mm256_set1_ps(exp::HI), x);
    let n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(exp::LOG2E)), _mm256_set1_ps(0.5)));
    let r = _mm256_sub_ps(
        _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(exp::LN2_HI))),
        _mm256_mul_ps(n, _mm256_set1_ps(exp::LN2_LO)),
    );
    let mut p = _mm256_set1_ps(exp::P[0]);
    for &c in &exp::P[1..] {
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0));
    let two_n = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(y, _mm256_castsi256_ps(two_n))
}

/// Lanes `l + 4`, `+ 2`, `+ 1` of an 8-lane vector folded as [`scalar::fold_lanes`] does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn fold8(v: __m256) -> f32 {
    let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps::<0b01>(h, h)))
}

//! The AVX2 tier's integer weights: q8_0 and q4_0 block sums with `maddubs` (ggml's sign
//! trick), and the row-interleaved q4_0x16 / q8_0x16 groups, one row per i32 lane.

use crate::kernels::traits::{GroupKernel, Kernel};
use crate::kernels::x86_64::prefetch_ahead;
use crate::quant::{DType, GroupQ4_0x16, GroupQ8_0x16, QK, X16};
use core::arch::x86_64::*;
use core::marker::PhantomData;

/// An integer format whose blocks widen to 32 bytes, with an f16 scale first.
pub(crate) trait Blocks32 {
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
pub(crate) unsafe fn scale(p: *const u8) -> f32 {
    // SAFETY: 2 readable bytes.
    let bits = u16::from_le_bytes(unsafe { p.cast::<[u8; 2]>().read() });
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The exact i32 sums of 8 lanes for one weight block and one activation block, in a tier.
pub(crate) trait BlockDot {
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
pub(super) const fn biased<B: Blocks32>() -> bool {
    2 * (2 * B::BIAS - 1) * 127 <= i16::MAX as i32
}

/// The f16 scales of blocks `b0..b0 + n` (`n <= 8`) of row `w`, converted at once, in
/// lanes `0..n` (the others zero). F16C converts exactly, as the scalar tier does.
///
/// # Safety
/// F16C is enabled in the caller; `w` holds blocks `b0..b0 + n` of `bb` bytes.
#[inline(always)]
pub(super) unsafe fn weight_scales(w: &[u8], bb: usize, b0: usize, n: usize) -> __m256 {
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
pub(super) unsafe fn act_scales(a: &[u8], cols: usize, b0: usize, n: usize) -> __m256 {
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
pub(super) unsafe fn pair<B: Blocks32, D: BlockDot, const R: usize, const T: usize>(
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
                crate::kernels::x86_64::prefetch(p, crate::kernels::x86_64::tile_ahead::<R>());
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
pub(super) unsafe fn quad<B: Blocks32, D: BlockDot, const R: usize, const T: usize>(
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
pub(crate) trait GroupSums {
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
pub(super) unsafe fn group<B: Blocks32, G: GroupSums, const R: usize, const T: usize>(
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
pub(crate) unsafe fn quant_tile<B: Blocks32, G: GroupSums, const R: usize, const T: usize>(
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
pub(crate) unsafe fn reduce_lanes(v: __m256) -> f32 {
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
pub(super) unsafe fn act_quad(pa: *const u8, k: usize) -> __m256i {
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
pub(super) const X16_TOKENS: usize = 2;

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
pub(super) unsafe fn x16<B: X16Half, const S: usize, const T: usize>(
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
pub(super) unsafe fn bias16(pa: *const u8) -> __m256i {
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

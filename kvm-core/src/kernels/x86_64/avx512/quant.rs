//! The AVX-512 tier's integer weights: the AVX2 tile with exact block sums from VNNI
//! (`vpdpbusd`), and the row-interleaved q4_0x16 / q8_0x16 groups.

use crate::kernels::traits::{GroupKernel, Kernel};
use crate::kernels::x86_64::avx2::{quant_tile, Blocks32, GroupSums, Q4, Q8};
use crate::kernels::x86_64::{prefetch, prefetch_ahead, tile_ahead};
use crate::quant::{GroupQ4_0x16, GroupQ8_0x16, QK, X16};
use core::arch::x86_64::*;
use core::marker::PhantomData;

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
pub(super) unsafe fn fold<const R: usize, const T: usize>(
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
pub(super) unsafe fn pair<B: Blocks32, const R: usize, const T: usize>(
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
pub(super) unsafe fn x16<B: X16Blocks, const S: usize, const T: usize>(
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

//! The scalar tier: the reference every other tier is tested against, and the kernels of
//! targets without SIMD (Cortex-M, RISC-V).
//!
//! [`dot_row`] is the exact oracle (f32 products of the decoded weights); the integer
//! formats run [`dot_q8_0`]/[`dot_q4_0`] against a q8-quantized activation
//! ([`quantize_act`]), which every SIMD tier reproduces bit for bit: same activation bytes,
//! same exact integer block sums, same f32 operations on them in the same order.

use core::marker::PhantomData;
#[cfg(test)]
use core::mem::MaybeUninit;

use half::f16;

use super::traits::{FloatType, GroupKernel, Kernel, Kernels, Stored, BF16, F16, F32, F32P};
use crate::quant::{
    bf16_le, f16_le, f32p_row, BlockQ4_0, BlockQ8_0, DType, F32PSpill, Group, GroupQ4_0x16, GroupQ8_0x16, I8Head,
    RowGroup, FX, QK, X16,
};

/// Exact dot product of one encoded row with `x` (f32 products, summed in order). A row of
/// an interleaved dtype comes in its plain form ([`DType::Q4_0x16`] as q4_0, [`DType::Q8_0x16`]
/// as q8_0).
pub fn dot_row(dtype: DType, row: &[u8], x: &[f32]) -> f32 {
    match dtype {
        DType::I8 | DType::I32 => {
            let (head, w) = int_row(dtype, row);
            w.zip(x).map(|(q, &v)| q as f32 * v).sum::<f32>() * head
        }
        DType::F32 => row.chunks_exact(4).zip(x).map(|(b, &v)| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * v).sum(),
        DType::F16 => row.chunks_exact(2).zip(x).map(|(b, &v)| f16_le([b[0], b[1]]) * v).sum(),
        DType::BF16 => row.chunks_exact(2).zip(x).map(|(b, &v)| bf16_le([b[0], b[1]]) * v).sum(),
        DType::Q8_0 | DType::Q8_0x16 => {
            let blocks: &[BlockQ8_0] = bytemuck::cast_slice(row);
            blocks
                .iter()
                .zip(x.chunks_exact(QK))
                .map(|(b, xs)| {
                    let s: f32 = b.qs.iter().zip(xs).map(|(&q, &v)| q as f32 * v).sum();
                    f16_le(b.d) * s
                })
                .sum()
        }
        DType::Q4_0 | DType::Q4_0x16 => {
            let blocks: &[BlockQ4_0] = bytemuck::cast_slice(row);
            blocks
                .iter()
                .zip(x.chunks_exact(QK))
                .map(|(b, xs)| {
                    let mut s = 0.0f32;
                    for (i, &q) in b.qs.iter().enumerate() {
                        s += ((q & 15) as i32 - 8) as f32 * xs[i];
                        s += ((q >> 4) as i32 - 8) as f32 * xs[i + QK / 2];
                    }
                    f16_le(b.d) * s
                })
                .sum()
        }
        DType::F32P => {
            let (base, spills, blocks) = f32p_row(row, x.len());
            let packed: f32 = blocks
                .iter()
                .zip(x.chunks_exact(QK))
                .flat_map(|(b, xs)| xs.iter().enumerate().map(move |(i, &v)| b.weight(i, base) * v))
                .sum();
            packed + f32p_spill_dot(spills, x)
        }
    }
}

/// `sum w * x[col]` over an `f32p` row's spilled weights, in order (a column past `x`
/// adds nothing). Every tier adds it to its sum of the row's blocks.
#[inline]
pub fn f32p_spill_dot(spills: &[F32PSpill], x: &[f32]) -> f32 {
    spills
        .iter()
        .map(|s| {
            x.get(u32::from_le_bytes(s.col) as usize).map_or(0.0, |&v| f32::from_bits(u32::from_le_bytes(s.bits)) * v)
        })
        .sum()
}

/// Below this block magnitude an activation block quantizes to zero: its reciprocal scale
/// would overflow, and its products are far below f32 resolution of any real sum.
pub const ACT_TINY: f32 = 1e-30;

/// Scale and reciprocal scale of an activation block whose largest magnitude is `amax`
/// (every tier computes them with exactly these operations).
#[inline]
pub fn act_scale(amax: f32) -> (f32, f32) {
    if amax < ACT_TINY {
        (0.0, 0.0)
    } else {
        (amax / 127.0, 127.0 / amax)
    }
}

/// Rounds to the nearest integer, ties to even, for `|v| <= 2^22`: adding 1.5 * 2^23 pushes
/// the fraction out of the mantissa. SIMD conversions round the same way, which a
/// `round` (ties away) would not.
#[inline]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// Quantizes one activation `x` (`[cols]`, `cols % QK == 0`) into `out`
/// (`[act_scratch_len(cols)]`): `cols` i8 values in `[-127, 127]`, then one little-endian
/// f32 scale per block (`x ~ d * q`, `d = amax / 127`). Finite inputs only.
///
/// The scale stays f32 (ggml stores f16) since it never leaves the scratch.
pub fn quantize_act(x: &[f32], out: &mut [u8]) {
    let (qs, ds) = out.split_at_mut(x.len());
    for ((xs, q), d) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(ds.chunks_exact_mut(4)) {
        let amax = xs.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
        let (scale, inv) = act_scale(amax);
        d.copy_from_slice(&scale.to_le_bytes());
        for (q, &v) in q.iter_mut().zip(xs) {
            *q = round_even(v * inv) as i8 as u8;
        }
    }
}

/// Splits a q8 activation of `cols` values into its values and its scale bytes.
#[inline]
fn act_parts(act: &[u8], cols: usize) -> (&[i8], &[u8]) {
    let (qs, ds) = act.split_at(cols);
    (bytemuck::cast_slice(qs), ds)
}

/// Lanes of the canonical block sum ([`sum_blocks`]).
pub const LANES: usize = 8;

/// The canonical sum of a row's per-block terms, which every tier reproduces bit for bit:
/// term `b` goes into accumulator `b % 8` (each starting at `+0.0`), then the 8 are summed
/// in a fixed tree ([`reduce_lanes`]). It is what 8-lane SIMD does naturally, so the SIMD
/// tiers pay nothing for agreeing with the scalar one.
#[inline]
pub fn sum_blocks(terms: impl Iterator<Item = f32>) -> f32 {
    let mut acc = [0.0f32; LANES];
    for (b, term) in terms.enumerate() {
        acc[b % LANES] += term;
    }
    reduce_lanes(acc)
}

/// `((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))`: the final step of [`sum_blocks`].
#[inline]
pub fn reduce_lanes(a: [f32; LANES]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// Row `r`'s [`reduce_lanes`] of lane-major accumulators (`[8][16]`) when only lanes
/// `0..used` hold terms and the others would be `+0.0`, with those additions left out. That
/// changes at most the sign of a zero: adding `+0.0` leaves anything else as it is (NaNs
/// and infinities included), and a lane that is `0.0 + term` or more terms is never
/// `-0.0`, nor is any sum of such lanes, so then the value is the same.
///
/// # Safety
/// Lanes `0..used` of row `r` are initialized.
#[cfg(test)]
#[inline(always)]
pub(crate) unsafe fn reduce_used(acc: &[[MaybeUninit<f32>; X16]; LANES], r: usize, used: usize) -> f32 {
    // SAFETY: only lanes below `used` are read.
    let a = |l: usize| unsafe { acc[l][r].assume_init() };
    match used {
        0 => 0.0,
        1 => a(0),
        2 => a(0) + a(1),
        3 => (a(0) + a(1)) + a(2),
        4 => (a(0) + a(1)) + (a(2) + a(3)),
        5 => ((a(0) + a(1)) + (a(2) + a(3))) + a(4),
        6 => ((a(0) + a(1)) + (a(2) + a(3))) + (a(4) + a(5)),
        7 => ((a(0) + a(1)) + (a(2) + a(3))) + ((a(4) + a(5)) + a(6)),
        _ => reduce_lanes(core::array::from_fn(a)),
    }
}

/// Block `b`'s term: `(d_w * d_a) * isum`, two f32 multiplies and no FMA.
#[inline]
pub fn block_term(dw: [u8; 2], da: &[u8], isum: i32) -> f32 {
    f16_le(dw) * f32::from_le_bytes([da[0], da[1], da[2], da[3]]) * isum as f32
}

/// The exact integer dot product of a q8_0 block's weights with a q8 activation block.
#[inline(always)]
fn isum_q8_0(qs: &[i8], q: &[i8]) -> i32 {
    qs.iter().zip(q).map(|(&w, &a)| w as i32 * a as i32).sum()
}

/// Reference q8_0 row . q8 activation: exact integer block sums, each scaled by
/// `d_w * d_a`, summed as [`sum_blocks`] says.
pub fn dot_q8_0(row: &[u8], act: &[u8], cols: usize) -> f32 {
    let blocks: &[BlockQ8_0] = bytemuck::cast_slice(row);
    let (qs, ds) = act_parts(act, cols);
    sum_blocks(
        blocks
            .iter()
            .zip(qs.chunks_exact(QK).zip(ds.chunks_exact(4)))
            .map(|(b, (q, d))| block_term(b.d, d, isum_q8_0(&b.qs, q))),
    )
}

/// The exact integer dot product of a q4_0 block with a q8 activation block, the block's
/// nibble byte `i` (`qs[i]`) read as `qs(i)`.
#[inline(always)]
fn isum_q4_0(qs: impl Fn(usize) -> u8, q: &[i8]) -> i32 {
    let (lo, hi) = q.split_at(QK / 2);
    (0..QK / 2)
        .map(|i| {
            let w = qs(i);
            ((w & 15) as i32 - 8) * lo[i] as i32 + ((w >> 4) as i32 - 8) * hi[i] as i32
        })
        .sum()
}

/// Reference q4_0 row . q8 activation, as [`dot_q8_0`].
pub fn dot_q4_0(row: &[u8], act: &[u8], cols: usize) -> f32 {
    let blocks: &[BlockQ4_0] = bytemuck::cast_slice(row);
    let (qs, ds) = act_parts(act, cols);
    sum_blocks(
        blocks
            .iter()
            .zip(qs.chunks_exact(QK).zip(ds.chunks_exact(4)))
            .map(|(b, (q, d))| block_term(b.d, d, isum_q4_0(|i| b.qs[i], q))),
    )
}

/// Reference rows of one row group of an interleaved dtype (`[cols / 32]` blocks) . q8
/// activation: exactly the plain dtype's dot product ([`dot_q4_0`], [`dot_q8_0`]) of each of
/// the 16 rows. `isums(g, q)` gives a group block's 16 exact integer sums with activation
/// block `q`, running across the rows piece by piece, the order the group stores them in
/// (on a Cortex-M4F fewer instructions than row by row).
fn dot_group<Q, const P: usize>(
    group: &[Group<Q, P>],
    act: &[u8],
    cols: usize,
    isums: impl Fn(&Group<Q, P>, &[i8]) -> [i32; X16],
) -> [f32; X16] {
    let (qs, ds) = act_parts(act, cols);
    let mut acc = [[0.0f32; LANES]; X16];
    for (b, (g, (q, d))) in group.iter().zip(qs.chunks_exact(QK).zip(ds.chunks_exact(4))).enumerate() {
        let isum = isums(g, q);
        for (r, acc) in acc.iter_mut().enumerate() {
            // `sum_blocks`' accumulator `b % 8`, for row r.
            acc[b % LANES] += block_term(g.d[r], d, isum[r]);
        }
    }
    acc.map(reduce_lanes)
}

/// Reference rows of one q4_0x16 row group . q8 activation: exactly [`dot_q4_0`] of each
/// of the 16 rows, the integer sums running across the rows piece by piece.
pub fn dot_q4_0x16(group: &[GroupQ4_0x16], act: &[u8], cols: usize) -> [f32; X16] {
    dot_group(group, act, cols, |g, q| {
        let (lo, hi) = q.split_at(QK / 2);
        let mut isum = [0i32; X16];
        for (v, piece) in g.qs.iter().enumerate() {
            // Piece v: nibble bytes 4v..4v + 4 (weights 4v + k low, 16 + 4v + k high).
            let (lo, hi) = (&lo[4 * v..4 * v + 4], &hi[4 * v..4 * v + 4]);
            for (s, w) in isum.iter_mut().zip(piece) {
                for k in 0..4 {
                    *s += ((w[k] & 15) as i32 - 8) * lo[k] as i32 + ((w[k] >> 4) as i32 - 8) * hi[k] as i32;
                }
            }
        }
        isum
    })
}

/// Reference rows of one q8_0x16 row group . q8 activation: exactly [`dot_q8_0`] of each
/// of the 16 rows, the integer sums running across the rows piece by piece. (Compilers do not
/// vectorize this as they do [`dot_q8_0`]'s 32 contiguous products: on x86 the scalar tier
/// reads row-major q8_0 about twice as fast.)
pub fn dot_q8_0x16(group: &[GroupQ8_0x16], act: &[u8], cols: usize) -> [f32; X16] {
    dot_group(group, act, cols, |g, q| {
        let mut isum = [0i32; X16];
        for (piece, q) in g.qs.iter().zip(q.chunks_exact(4)) {
            for (s, w) in isum.iter_mut().zip(piece) {
                *s += isum_q8_0(w, q);
            }
        }
        isum
    })
}

/// Decodes row `r` of one row group of an interleaved dtype into `out` (`[cols]`).
pub fn dequant_group<G: RowGroup>(group: &[G], r: usize, out: &mut [f32]) {
    for (g, o) in group.iter().zip(out.chunks_exact_mut(QK)) {
        dequant_row(G::PLAIN, bytemuck::bytes_of(&g.block(r)), o);
    }
}

/// The reference tile of [`super::matvec_i8`] (walked by `walk::matvec_i8`, four rows at a
/// time: each input value loaded once for them, which on a core without SIMD leaves a
/// load, a multiply and an add a product), each row's products summed exactly: i32
/// partial sums of 512 (below 2^31 in magnitude for the quantizer's weights; a file's
/// -128 can wrap one, alike in every tier), added in i64.
impl super::traits::IntKernel for Scalar {
    const LANES: usize = 1;
    const SPARSE: bool = true;

    unsafe fn sums<const R: usize>(q: [&[i8]; R], x: &[i16]) -> [i32; R] {
        // Four columns a turn, so that each pointer steps once for 4 R products.
        const COLS: usize = 4;
        let mut a = [0i32; R];
        let body = x.len() / COLS * COLS;
        for (c, v) in x[..body].chunks_exact(COLS).enumerate() {
            for (a, q) in a.iter_mut().zip(q) {
                let w = &q[c * COLS..][..COLS];
                for (&w, &v) in w.iter().zip(v) {
                    *a = a.wrapping_add(i32::from(w) * i32::from(v));
                }
            }
        }
        for (a, q) in a.iter_mut().zip(q) {
            *a = a.wrapping_add(dot_i8(&q[body..], &x[body..]));
        }
        a
    }
}

/// `sum q * x` of one row (at most 512 products).
#[inline]
pub(crate) fn dot_i8(q: &[i8], x: &[i16]) -> i32 {
    q.iter().zip(x).fold(0i32, |a, (&w, &v)| a.wrapping_add(i32::from(w) * i32::from(v)))
}

/// An integer-mode row's scale and integer weights: an [`DType::I8`] row's `m * 2^-sh`
/// (exact in f32) and its i8s, or an [`DType::I32`] vector's `2^-FX` and its i32s.
fn int_row(dtype: DType, row: &[u8]) -> (f32, impl Iterator<Item = i32> + '_) {
    let (scale, body, width) = if dtype == DType::I8 {
        let (head, body) = row.split_at(core::mem::size_of::<I8Head>());
        let (m, sh) = bytemuck::pod_read_unaligned::<I8Head>(head).scale();
        (m as f32 * libm::exp2f(-(sh as f32)), body, 1)
    } else {
        (1.0 / (1u32 << FX) as f32, row, 4)
    };
    let w = body.chunks_exact(width).map(|b| match b {
        &[q] => i32::from(q as i8),
        b => i32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    });
    (scale, w)
}

/// Reference row decode: `out[c] = w[c]` for one row of `dtype` (of an interleaved dtype,
/// in its plain form).
pub fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
    match dtype {
        DType::I8 | DType::I32 => {
            let (scale, w) = int_row(dtype, row);
            for (o, q) in out.iter_mut().zip(w) {
                *o = q as f32 * scale;
            }
        }
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::F16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16_le([b[0], b[1]]);
            }
        }
        DType::BF16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16_le([b[0], b[1]]);
            }
        }
        DType::Q8_0 | DType::Q8_0x16 => {
            let blocks: &[BlockQ8_0] = bytemuck::cast_slice(row);
            for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
                let d = f16_le(b.d);
                for (o, &q) in o.iter_mut().zip(&b.qs) {
                    *o = d * q as f32;
                }
            }
        }
        DType::Q4_0 | DType::Q4_0x16 => {
            let blocks: &[BlockQ4_0] = bytemuck::cast_slice(row);
            for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
                let d = f16_le(b.d);
                for (i, &q) in b.qs.iter().enumerate() {
                    o[i] = d * ((q & 15) as i32 - 8) as f32;
                    o[i + QK / 2] = d * ((q >> 4) as i32 - 8) as f32;
                }
            }
        }
        DType::F32P => {
            let (base, spills, blocks) = f32p_row(row, out.len());
            for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
                for (i, o) in o.iter_mut().enumerate() {
                    *o = b.weight(i, base);
                }
            }
            apply_f32p_spills(spills, out);
        }
    }
}

/// Writes an f32p row's spilled weights into its decoded row `out`.
pub fn apply_f32p_spills(spills: &[F32PSpill], out: &mut [f32]) {
    for s in spills {
        if let Some(o) = out.get_mut(u32::from_le_bytes(s.col) as usize) {
            *o = f32::from_bits(u32::from_le_bytes(s.bits));
        }
    }
}

/// Lanes of [`dots`]' canonical order.
pub const DOT_LANES: usize = 16;

/// `out[i] = rows[i] . x` for the `rows.len() / x.len()` rows (`[n, x.len()]`) in one
/// canonical order every tier reproduces: lane `l` sums the products of columns
/// `l, l + 16, ...` (multiply, then add), the 16 lanes fold in halves (`l + 8`, `+ 4`,
/// `+ 2`, `+ 1`), then the `len % 16` tail adds in column order. Attention scores and
/// the state's similarities use it, so a model with integer weights decodes the same bits
/// on every CPU. f16 rows widen exactly to f32 first, so they follow the same order.
pub fn dots<T: Stored>(rows: &[T], x: &[f32], out: &mut [f32]) {
    let d = x.len();
    if d == 0 {
        out.fill(0.0);
        return;
    }
    for (row, o) in rows.chunks_exact(d).zip(out.iter_mut()) {
        let mut acc = [0f32; DOT_LANES];
        let body = d - d % DOT_LANES;
        for (r, v) in row[..body].chunks_exact(DOT_LANES).zip(x[..body].chunks_exact(DOT_LANES)) {
            for l in 0..DOT_LANES {
                acc[l] += r[l].widen() * v[l];
            }
        }
        *o = dot_tail(fold_lanes(acc), &row[body..], &x[body..]);
    }
}

/// The halving fold of [`dots`]' 16 lanes.
#[inline]
pub fn fold_lanes(mut a: [f32; DOT_LANES]) -> f32 {
    let mut half = DOT_LANES / 2;
    while half > 0 {
        for l in 0..half {
            a[l] += a[l + half];
        }
        half /= 2;
    }
    a[0]
}

/// [`dots`]' tail: `sum` plus the products of the last `len % 16` columns, in order.
#[inline]
pub fn dot_tail<T: Stored>(mut sum: f32, row: &[T], x: &[f32]) -> f32 {
    for (r, v) in row.iter().zip(x) {
        sum += r.widen() * v;
    }
    sum
}

/// Softmax's exponential: Cody-Waite reduction `x = n ln2 + r`, `|r| <= ln2 / 2`, then
/// Cephes' degree-7 polynomial for `e^r` (within 2 ulp of `expf`) and the power of two
/// built in the exponent bits. Inputs are clamped to `[EXP_LO, EXP_HI]` (the result
/// stays normal); NaN stays NaN. Each SIMD tier runs these very operations (separate
/// multiplies and adds, the same order), so every tier gives these bits.
pub mod exp {
    pub const LO: f32 = -87.0;
    pub const HI: f32 = 88.0;
    pub const LOG2E: f32 = core::f32::consts::LOG2_E;
    /// `ln 2 = LN2_HI + LN2_LO`, `LN2_HI` exact in 9 bits so `n * LN2_HI` is exact.
    pub const LN2_HI: f32 = 0.693_359_4;
    pub const LN2_LO: f32 = -2.121_944_4e-4;
    /// `e^r ~ 1 + r + r^2 (P[0] r^5 + ... + P[5])`.
    pub const P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
}

/// `e^x` as every tier computes it (see [`exp`]).
#[inline]
pub fn exp_approx(x: f32) -> f32 {
    let x = if exp::LO > x { exp::LO } else { x };
    let x = if x > exp::HI { exp::HI } else { x };
    let n = floor_clamped(x * exp::LOG2E + 0.5);
    let r = (x - n * exp::LN2_HI) - n * exp::LN2_LO;
    let mut p = exp::P[0];
    for &c in &exp::P[1..] {
        p = p * r + c;
    }
    let y = (p * r * r + r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `floorf(y)` for [`exp_approx`]'s `y` (in `[-125, 128]`, never `-0.0`; NaN gives 0,
/// which leaves the result NaN): with a floating-point unit, truncation toward zero, one
/// less where that rounded a negative value up, two conversions and a compare where
/// `libm`'s `floorf` takes apart the bits in about 20 instructions; without one (RISC-V
/// without F, Cortex-M0+/M3), where conversions are library calls, `floorf` itself.
#[inline(always)]
fn floor_clamped(y: f32) -> f32 {
    const HARD_FLOAT: bool =
        cfg!(any(target_arch = "x86_64", target_arch = "aarch64", target_abi = "eabihf", target_feature = "f"));
    if !HARD_FLOAT {
        return libm::floorf(y);
    }
    let t = y as i32 as f32;
    if t > y {
        t - 1.0
    } else {
        t
    }
}

/// `out[i] = f16(x[i])`, rounded to nearest even (overflow to infinity, NaNs quieted):
/// `half`'s conversion, one value at a time. The oracle of the tiers' `vcvtps2ph`.
pub fn narrow_f16(x: &[f32], out: &mut [f16]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f16::from_f32(v);
    }
}

/// The f32 value of the f16 with bits `h`, exactly, as `vcvtph2ps` / `fcvtl` give it
/// (NaNs quieted): the scalar tier's widening of f16 cache rows ([`Stored::widen`]).
#[inline(always)]
pub fn widen_f16(h: u16) -> f32 {
    f16::from_bits(h).widen()
}

/// The largest of `x`, NaNs ignored (as `f32::max` does; `-inf` if none is left), in
/// [`LANES`] running maxima, which the compiler keeps in one vector register (a single
/// running maximum would serialise on its latency): the same value. Out of line: inlined
/// at every softmax, its unrolled lanes grew the Cortex-M4F firmware's `.text` by KBs.
#[inline(never)]
pub fn max(x: &[f32]) -> f32 {
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut acc = [f32::NEG_INFINITY; LANES];
    for c in chunks {
        for i in 0..LANES {
            acc[i] = acc[i].max(c[i]);
        }
    }
    acc.into_iter().fold(tail, f32::max)
}

/// The first position of `v` in `x` (`-0.0` and `0.0` are equal, NaN equals nothing).
pub fn find(x: &[f32], v: f32) -> Option<usize> {
    x.iter().position(|&y| y == v)
}

/// `x[i] = e^(x[i] - max)` ([`exp_approx`]): softmax's exponentials.
pub fn exp_sub(x: &mut [f32], max: f32) {
    for v in x {
        *v = exp_approx(*v - max);
    }
}

/// `out[c] += sum_j p[j] * rows[j][c]` over the `p.len()` rows of `rows` (`[n, out.len()]`),
/// row by row: each column sums its terms in row order with separate multiplies and adds,
/// which every tier reproduces bit for bit (it is attention's read of the values).
pub fn weighted_sum<T: Stored>(p: &[f32], rows: &[T], out: &mut [f32]) {
    weighted_sum_columns(p, rows, 0, out);
}

/// Columns `[c0, out.len())` of [`weighted_sum`]: the SIMD tiers' tail.
pub(crate) fn weighted_sum_columns<T: Stored>(p: &[f32], rows: &[T], c0: usize, out: &mut [f32]) {
    let d = out.len();
    if c0 >= d {
        return;
    }
    for (&pj, row) in p.iter().zip(rows.chunks_exact(d)) {
        for (o, &v) in out[c0..].iter_mut().zip(&row[c0..]) {
            *o += pj * v.widen();
        }
    }
}

/// The scalar tier.
#[derive(Debug)]
pub(crate) struct Scalar;

/// `out[r][t] = dot(w[r], a[t])`, one pair at a time.
#[inline]
fn tile_with<A, const R: usize, const T: usize>(
    w: [&[u8]; R],
    a: [&[A]; T],
    dot: impl Fn(&[u8], &[A]) -> f32,
) -> [[f32; T]; R] {
    core::array::from_fn(|r| core::array::from_fn(|t| dot(w[r], a[t])))
}

/// Scalar kernel of the float dtype `D`.
pub(crate) struct Float<D>(PhantomData<D>);

impl<D: FloatType> Kernel for Float<D> {
    type Act = f32;

    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[f32]; T], _cols: usize) -> [[f32; T]; R] {
        tile_with(w, a, |w, x| dot_row(D::DTYPE, w, x))
    }
}

/// Scalar q8_0 kernel.
pub(crate) struct Q8_0;

impl Kernel for Q8_0 {
    type Act = u8;

    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[u8]; T], cols: usize) -> [[f32; T]; R] {
        tile_with(w, a, |w, a| dot_q8_0(w, a, cols))
    }
}

/// Scalar q4_0 kernel.
pub(crate) struct Q4_0;

impl Kernel for Q4_0 {
    type Act = u8;

    unsafe fn tile<const R: usize, const T: usize>(w: [&[u8]; R], a: [&[u8]; T], cols: usize) -> [[f32; T]; R] {
        tile_with(w, a, |w, a| dot_q4_0(w, a, cols))
    }
}

/// Scalar q4_0x16 kernel: the group's rows as [`dot_q4_0x16`].
pub(crate) struct Q4_0x16;

impl GroupKernel for Q4_0x16 {
    unsafe fn group<const T: usize>(g: &[u8], a: [&[u8]; T], cols: usize) -> [[f32; X16]; T] {
        let g: &[GroupQ4_0x16] = bytemuck::cast_slice(g);
        core::array::from_fn(|t| dot_q4_0x16(g, a[t], cols))
    }
}

/// Scalar q8_0x16 kernel: the group's rows as [`dot_q8_0x16`].
pub(crate) struct Q8_0x16;

impl GroupKernel for Q8_0x16 {
    unsafe fn group<const T: usize>(g: &[u8], a: [&[u8]; T], cols: usize) -> [[f32; X16]; T] {
        let g: &[GroupQ8_0x16] = bytemuck::cast_slice(g);
        core::array::from_fn(|t| dot_q8_0x16(g, a[t], cols))
    }
}

impl Kernels for Scalar {
    type F32 = Float<F32>;
    type F16 = Float<F16>;
    type BF16 = Float<BF16>;
    type Q8_0 = Q8_0;
    type Q4_0 = Q4_0;
    type Q4_0x16 = Q4_0x16;
    type Q8_0x16 = Q8_0x16;
    type F32P = Float<F32P>;

    unsafe fn quantize_act(x: &[f32], out: &mut [u8]) {
        quantize_act(x, out)
    }

    unsafe fn dequant_row(dtype: DType, row: &[u8], out: &mut [f32]) {
        dequant_row(dtype, row, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`floor_clamped`] is `floorf` on every value [`exp_approx`] gives it: around every
    /// integer of the range (the integer itself and the floats next to it), halves, tiny
    /// magnitudes, and a dense sweep of the inputs.
    #[test]
    fn floor_clamped_is_floorf() {
        let check = |y: f32| assert_eq!(floor_clamped(y).to_bits(), libm::floorf(y).to_bits(), "floor({y:e})");
        for k in -130..=130 {
            let k = k as f32;
            for y in [k, k + 0.5, k - 0.5, f32::from_bits(k.to_bits() + 1), f32::from_bits(k.to_bits().wrapping_sub(1))]
            {
                if !y.is_nan() && (y != 0.0 || y.is_sign_positive()) {
                    check(y);
                }
            }
        }
        for y in [1e-30, -1e-30, f32::from_bits(1), -f32::from_bits(1), 0.0] {
            check(y);
        }
        for i in 0..=1_000_000 {
            let x = exp::LO + (exp::HI - exp::LO) * i as f32 / 1_000_000.0;
            check(x * exp::LOG2E + 0.5);
        }
    }
}

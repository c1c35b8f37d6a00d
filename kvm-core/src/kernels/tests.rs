//! The cross-tier conformance suite: every tier the CPU has against the scalar oracle, on
//! odd lengths, every dtype and layout, and extreme values.

extern crate std;

use std::vec;
use std::vec::Vec;

use super::table::table;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::traits::Kernels;
use super::traits::{Attention, DotsMany, WeightedSumMany};
use super::*;
use crate::quant::{quantize_matrix, RowGroup};

/// Deterministic values in `[-1, 1)` (xorshift32) with a larger outlier every 37th, as
/// real weights and activations have.
pub(crate) fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let u = (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
            if i % 37 == 5 {
                8.0 * u
            } else {
                u
            }
        })
        .collect()
}

/// A `[rows, cols]` matrix of `dtype` filled with [`values`].
fn encode(dtype: DType, rows: usize, cols: usize, seed: u32) -> Vec<u8> {
    let src: Vec<f32> = (0..rows).flat_map(|r| values(cols, seed + r as u32)).collect();
    let mut bytes = vec![0u8; dtype.matrix_bytes(rows, cols).unwrap()];
    quantize_matrix(dtype, cols, &src, &mut bytes).unwrap();
    bytes
}

/// Row `r` of `w` in its plain (row-major) form.
fn plain_row(w: &Matrix<'_>, r: usize) -> Vec<u8> {
    let rb = w.row_bytes();
    fn blocks<G: RowGroup>(w: &Matrix<'_>, r: usize) -> Vec<u8> {
        let rb = w.row_bytes();
        let groups: &[G] = bytemuck::cast_slice(&w.data[r / X16 * X16 * rb..(r / X16 + 1) * X16 * rb]);
        groups.iter().flat_map(|g| bytemuck::bytes_of(&g.block(r % X16)).to_vec()).collect()
    }
    match w.dtype {
        DType::Q4_0x16 => blocks::<GroupQ4_0x16>(w, r),
        DType::Q8_0x16 => blocks::<GroupQ8_0x16>(w, r),
        _ => w.data[r * rb..(r + 1) * rb].to_vec(),
    }
}

const ROWS: [usize; 9] = [1, 2, 3, 4, 5, 7, 9, 17, 33];
const TOKENS: [usize; 7] = [1, 2, 3, 4, 5, 7, 17];

/// Row counts to test: around every tile height, or whole groups around the
/// [`STREAMS`] a single token reads side by side.
fn rows_of(dtype: DType) -> Vec<usize> {
    match dtype.group_rows() {
        1 => ROWS.to_vec(),
        g => [1, 2, 3, 4, 5, 9].map(|n| n * g).to_vec(),
    }
}

/// Columns to test: odd lengths for floats (SIMD body plus scalar tail), 32 k for blocks.
fn cols_of(dtype: DType) -> &'static [usize] {
    match dtype.block_len() {
        1 => &[1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 255, 1023],
        // 1, 3, 7, 8, 9, 13, 32 blocks: whole groups of 8 and every kind of remainder.
        _ => &[32, 96, 224, 256, 288, 416, 1024],
    }
}

/// The scalar tier's `ys` (`[n, rows]`) for `xs` (`[n, cols]`), pair by pair.
/// Interleaved dtypes give their plain form's results: q4_0x16 and q8_0x16 are checked
/// against the q4_0 and q8_0 oracles on the de-interleaved rows.
fn reference(w: &Matrix<'_>, xs: &[f32]) -> Vec<f32> {
    let mut act = vec![0u8; act_scratch_len(w.cols)];
    let mut ys = Vec::new();
    for x in xs.chunks_exact(w.cols) {
        if w.dtype.quantizes_act() {
            scalar::quantize_act(x, &mut act);
        }
        for r in 0..w.rows {
            let row = plain_row(w, r);
            ys.push(match w.dtype {
                DType::Q8_0 | DType::Q8_0x16 => scalar::dot_q8_0(&row, &act, w.cols),
                DType::Q4_0 | DType::Q4_0x16 => scalar::dot_q4_0(&row, &act, w.cols),
                float => scalar::dot_row(float, &row, x),
            });
        }
    }
    ys
}

/// `sum_c |w[r, c] x[c]|` for every token and row: the scale of a dot product's
/// rounding error.
fn magnitudes(w: &Matrix<'_>, xs: &[f32]) -> Vec<f32> {
    let mut row = vec![0.0; w.cols];
    let mut out = Vec::new();
    for x in xs.chunks_exact(w.cols) {
        for r in 0..w.rows {
            scalar::dequant_row(w.dtype, &plain_row(w, r), &mut row);
            out.push(row.iter().zip(x).map(|(a, b)| (a * b).abs()).sum());
        }
    }
    out
}

/// Float tiers differ from the reference only in summation order (and FMA's single
/// rounding): a few ulps of the magnitude.
const BUDGET: f32 = 1e-5;

/// Integer formats: every tier gives the reference's bits exactly.
fn assert_bits(got: &[f32], want: &[f32], what: &dyn core::fmt::Display) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: [{i}] {g} vs {w}");
    }
}

/// [`assert_bits`] for integer dtypes, [`assert_close`] for float ones.
fn assert_matches(dtype: DType, got: &[f32], want: &[f32], mag: &[f32], what: &dyn core::fmt::Display) {
    if dtype.quantizes_act() {
        assert_bits(got, want, what);
    } else {
        assert_close(got, want, mag, what);
    }
}

fn assert_close(got: &[f32], want: &[f32], mag: &[f32], what: &dyn core::fmt::Display) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, ((g, w), m)) in got.iter().zip(want).zip(mag).enumerate() {
        assert!((g - w).abs() <= BUDGET * m + f32::MIN_POSITIVE, "{what}: [{i}] {g} vs {w} (magnitude {m})");
    }
}

/// `matvec`, `matmul` (with scratch for 1, 3 and all tokens) and `dequant_row` through
/// the public dispatch, against the scalar reference, for every dtype and shape: integer
/// formats bit for bit, float ones within [`BUDGET`].
fn suite(t: Tier) {
    for dtype in DType::ALL {
        for &cols in cols_of(dtype) {
            for rows in rows_of(dtype) {
                let bytes = encode(dtype, rows, cols, (rows * cols) as u32);
                let w = Matrix::new(dtype, rows, cols, &bytes).unwrap();
                let x = values(cols, 7);
                let mut y = vec![f32::NAN; rows];
                let mut act = vec![0u8; act_scratch_len(cols)];
                matvec(&w, &x, &mut y, &mut act);
                let what = format_args!("{t} matvec {dtype:?} [{rows}, {cols}]");
                assert_matches(dtype, &y, &reference(&w, &x), &magnitudes(&w, &x), &what);
                // The same product on an input quantized beforehand: the same bits.
                let mut prepared = vec![f32::NAN; rows];
                let mut act = vec![0u8; act_scratch_len(cols)];
                if dtype.quantizes_act() {
                    quantize_act(&x, &mut act);
                }
                matvec_prepared(&w, &x, &act, &mut prepared);
                assert_bits(&prepared, &y, &format_args!("{t} matvec_prepared {dtype:?} [{rows}, {cols}]"));
                let mut out = vec![f32::NAN; cols];
                dequant_row(&w, rows - 1, &mut out);
                let mut want = vec![0.0; cols];
                scalar::dequant_row(dtype, &plain_row(&w, rows - 1), &mut want);
                assert_eq!(out, want, "{t} dequant_row {dtype:?} [{rows}, {cols}]");
            }
            let rows = 5usize.next_multiple_of(dtype.group_rows());
            let bytes = encode(dtype, rows, cols, cols as u32);
            let w = Matrix::new(dtype, rows, cols, &bytes).unwrap();
            for n in TOKENS {
                let xs = values(n * cols, n as u32);
                let (want, mag) = (reference(&w, &xs), magnitudes(&w, &xs));
                for group in [1, 3, n] {
                    let mut ys = vec![f32::NAN; n * rows];
                    let mut act = vec![0u8; act_scratch_len(cols) * group];
                    matmul(&w, &xs, &mut ys, &mut act);
                    let what = format_args!("{t} matmul {dtype:?} [{rows}, {cols}] x {n} tokens, {group} at a time");
                    assert_matches(dtype, &ys, &want, &mag, &what);
                }
            }
        }
    }
}

/// f32p rows with every spill slot used (weights far below the row's largest, a
/// subnormal) and zeros of both signs: products within [`BUDGET`] of the reference,
/// rows decoded to the source's bits.
fn f32p_spills_zeros_and_subnormals(t: Tier) {
    use crate::quant::{f32p_slots, f32p_spills};
    let (rows, cols) = (9, 96);
    let mut src = Vec::new();
    for r in 0..rows {
        let mut row = values(cols, 40 + r as u32);
        (row[3], row[50], row[95]) = (0.0, -0.0, -0.0);
        row[10 + r] = -1e-41; // subnormal
        let mut c = 20;
        while f32p_spills(&row) < f32p_slots(cols) {
            row[c] = 3e-9 * (c as f32 - 40.0);
            c += 7;
        }
        src.extend(row);
    }
    let mut bytes = vec![0u8; DType::F32P.matrix_bytes(rows, cols).unwrap()];
    quantize_matrix(DType::F32P, cols, &src, &mut bytes).unwrap();
    let w = Matrix::new(DType::F32P, rows, cols, &bytes).unwrap();
    // One token, one tile, and tiles then single tokens.
    for n in [1, 3, 9] {
        let xs = values(n * cols, 9);
        let mut ys = vec![f32::NAN; n * rows];
        matmul(&w, &xs, &mut ys, &mut []);
        let what = format_args!("{t} f32p with spills x {n} tokens");
        assert_close(&ys, &reference(&w, &xs), &magnitudes(&w, &xs), &what);
    }
    let mut out = vec![f32::NAN; cols];
    for r in 0..rows {
        dequant_row(&w, r, &mut out);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&out), bits(&src[r * cols..(r + 1) * cols]), "{t} f32p row {r}");
    }
}

/// Tier `K` (`tier`, if the CPU supports it) runs its batch kernel, given the scratch,
/// from [`gemm::MIN_TOKENS`] on, and leaves a smaller batch, or one with too little
/// scratch, to decode's tiles.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn takes_batches_with_scratch<K: Kernels>(tier: Tier) {
    if !tier::supported(tier) {
        return;
    }
    let (rows, cols) = (7, 40);
    let w: Vec<u8> = values(rows * cols, 1).iter().flat_map(|v| v.to_le_bytes()).collect();
    let ran = |n: usize, scratch: usize| {
        let (xs, mut ys) = (values(n * cols, 2), vec![0f32; n * rows]);
        let mut s = vec![0u8; scratch];
        let gemm = K::GEMM.expect("a batch kernel");
        // SAFETY: `supported` checked the CPU; the shapes are whole.
        unsafe { gemm(&Matrix { dtype: DType::F32, rows, cols, data: &w }, &xs, &mut ys, rows, &mut s) }
    };
    let n = gemm::MIN_TOKENS;
    assert!(ran(n, gemm::scratch_len(cols, n)), "{tier}");
    assert!(!ran(n - 1, gemm::scratch_len(cols, n)), "{tier}");
    assert!(!ran(n, gemm::scratch_len(cols, n) / 2), "{tier}");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn x86_tiers_take_batches_with_scratch() {
    use super::x86_64::{avx2::Avx2, avx512::Avx512};
    takes_batches_with_scratch::<Avx2>(Tier::Avx2);
    takes_batches_with_scratch::<Avx512>(Tier::Avx512);
}

#[cfg(target_arch = "aarch64")]
#[test]
fn neon_tiers_take_batches_with_scratch() {
    use super::aarch64::neon::{Neon, NeonDot};
    takes_batches_with_scratch::<Neon>(Tier::Neon);
    takes_batches_with_scratch::<NeonDot>(Tier::NeonDot);
}

/// Batches of float weights with [`matmul_scratch_len`] bytes of scratch, which lets a
/// tier with a batch kernel ([`gemm`]) run it: within [`BUDGET`] of the reference for
/// batch sizes around its threshold and its blocks, odd rows and columns, and an f32p
/// matrix with spills; and each token's results the same bits in any batch of at least
/// [`gemm::MIN_TOKENS`] tokens and however the rows are split.
fn float_batches(t: Tier) {
    let ns = [gemm::MIN_TOKENS - 1, gemm::MIN_TOKENS, 9, 16, 17, 63, 64, 65, 130];
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F32P] {
        let cols_all: &[usize] = if dtype.block_len() == 1 { &[1, 3, 16, 17, 33, 100, 255] } else { &[32, 96, 288] };
        for &cols in cols_all {
            for rows in [1, 5, 7, 13, 25] {
                let bytes = encode(dtype, rows, cols, (rows + cols) as u32);
                let w = Matrix::new(dtype, rows, cols, &bytes).unwrap();
                for n in ns {
                    let xs = values(n * cols, n as u32);
                    let ys = batch(&w, &xs);
                    let what = format_args!("{t} batch {dtype:?} [{rows}, {cols}] x {n} tokens");
                    assert_close(&ys, &reference(&w, &xs), &magnitudes(&w, &xs), &what);
                    if n < gemm::MIN_TOKENS {
                        continue;
                    }
                    // The last MIN_TOKENS tokens alone: the same bits.
                    let tail = batch(&w, &xs[(n - gemm::MIN_TOKENS) * cols..]);
                    assert_bits(
                        &tail,
                        &ys[(n - gemm::MIN_TOKENS) * rows..],
                        &format_args!("{what}: the last tokens alone"),
                    );
                    // The rows in two parts: the same bits.
                    let k = rows / 2;
                    let (top, bottom) = (batch(&w.row_range(0, k), &xs), batch(&w.row_range(k, rows), &xs));
                    let joined: Vec<f32> = (0..n)
                        .flat_map(|i| {
                            top[i * k..(i + 1) * k].iter().chain(&bottom[i * (rows - k)..(i + 1) * (rows - k)])
                        })
                        .copied()
                        .collect();
                    assert_bits(&joined, &ys, &format_args!("{what}: rows split at {k}"));
                }
            }
        }
    }
    batch_sums_in_canonical_order(t);
    // f32p with every spill slot used, as in `f32p_spills_zeros_and_subnormals`.
    let (rows, cols) = (9, 96);
    let src: Vec<f32> = (0..rows)
        .flat_map(|r| {
            let mut row = values(cols, 60 + r as u32);
            let mut c = 20 + r;
            while crate::quant::f32p_spills(&row) < crate::quant::f32p_slots(cols) {
                row[c] = 3e-9 * (c as f32 - 40.0);
                c += 7;
            }
            row
        })
        .collect();
    let mut bytes = vec![0u8; DType::F32P.matrix_bytes(rows, cols).unwrap()];
    quantize_matrix(DType::F32P, cols, &src, &mut bytes).unwrap();
    let w = Matrix::new(DType::F32P, rows, cols, &bytes).unwrap();
    let xs = values(20 * cols, 3);
    assert_close(
        &batch(&w, &xs),
        &reference(&w, &xs),
        &magnitudes(&w, &xs),
        &format_args!("{t} batch f32p with spills"),
    );
}

/// `matmul` of `w` and `xs` with all the scratch it can use.
/// The batch product's canonical sums, its scalar reference: each output a chain of fused
/// multiply-adds over the columns in order from zero, the weights decoded exactly.
fn chained(w: &Matrix<'_>, xs: &[f32]) -> Vec<f32> {
    let mut row = vec![0.0; w.cols];
    let mut ys = vec![0.0; xs.len() / w.cols * w.rows];
    for r in 0..w.rows {
        scalar::dequant_row(w.dtype, &plain_row(w, r), &mut row);
        for (t, x) in xs.chunks_exact(w.cols).enumerate() {
            ys[t * w.rows + r] = row.iter().zip(x).fold(0.0, |acc, (&a, &b)| libm::fmaf(a, b, acc));
        }
    }
    ys
}

/// Tier `t`'s batch product gives [`chained`]'s bits, on odd shapes: columns past one and
/// several chunks of the K-blocking and not a multiple of any vector, rows past a panel and
/// not a multiple of any tile, tokens not a multiple of a block or of a vector. (Tiers
/// without one run batches through decode's tiles, which sum in lanes.)
fn batch_sums_in_canonical_order(t: Tier) {
    if !matches!(t, Tier::Avx2 | Tier::Avx512 | Tier::Neon | Tier::NeonDot) {
        return;
    }
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F32P] {
        let cols_all: &[usize] = if dtype.block_len() == 1 { &[255, 257, 517, 1031] } else { &[288, 544] };
        for &cols in cols_all {
            for (rows, n) in [(7, 9), (53, 67), (13, 130)] {
                let bytes = encode(dtype, rows, cols, (3 * rows + cols) as u32);
                let w = Matrix::new(dtype, rows, cols, &bytes).unwrap();
                let xs = values(n * cols, (n + cols) as u32);
                let what = format_args!("{t} batch {dtype:?} [{rows}, {cols}] x {n} tokens, canonical sums");
                assert_bits(&batch(&w, &xs), &chained(&w, &xs), &what);
            }
        }
    }
}

fn batch(w: &Matrix<'_>, xs: &[f32]) -> Vec<f32> {
    let n = xs.len() / w.cols;
    let mut ys = vec![f32::NAN; n * w.rows];
    let mut act = vec![0u8; matmul_scratch_len(w.cols, n)];
    matmul(w, xs, &mut ys, &mut act);
    ys
}

fn supported_tiers() -> impl Iterator<Item = Tier> {
    Tier::ALL.into_iter().filter(|&t| tier::supported(t))
}

/// A simd128 build runs the simd128 tier by default and tests it here.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[test]
fn simd128_is_the_compiled_tier_and_tested() {
    assert_eq!(tier::COMPILED, Tier::Simd128);
    assert!(supported_tiers().any(|t| t == Tier::Simd128));
}

#[test]
fn every_supported_tier_matches_scalar() {
    let before = tier();
    for t in supported_tiers() {
        // SAFETY: the CPU supports `t`.
        unsafe { force_tier(t) };
        assert_eq!(tier(), t);
        // Both ways of streaming the float decode tiles' rows (tile heights and prefetch
        // hints, never the bits).
        let before = streaming();
        for s in [Streaming::Software, Streaming::Hardware] {
            set_streaming(s);
            suite(t);
        }
        set_streaming(before);
        f32p_spills_zeros_and_subnormals(t);
        float_batches(t);
    }
    #[cfg(feature = "std")]
    env_selects_tier();
    // SAFETY: it was active before.
    unsafe { force_tier(before) };
}

/// `KVM_KERNELS` through `init_from_env`; runs inside the one test that switches the
/// process-wide tier, so that no other test sees it change.
#[cfg(feature = "std")]
fn env_selects_tier() {
    let set = |v: Option<&str>| match v {
        Some(v) => std::env::set_var("KVM_KERNELS", v),
        None => std::env::remove_var("KVM_KERNELS"),
    };
    set(Some("scalar"));
    assert_eq!(init_from_env(), Ok(Tier::Scalar));
    assert_eq!(tier(), Tier::Scalar);
    set(Some("sse9"));
    assert_eq!(init_from_env(), Err(TierError::UnknownName));
    assert_eq!(tier(), Tier::Scalar, "a refused value leaves the tier alone");
    if let Some(missing) = Tier::ALL.into_iter().find(|&t| !tier::supported(t)) {
        set(Some(missing.name()));
        assert_eq!(init_from_env(), Err(TierError::Unsupported(missing)));
    }
    set(None);
    assert_eq!(init_from_env(), Ok(detect()));
    assert_eq!(tier(), detect());
    // KVM_STREAMING picks how float decode tiles stream; a bad value changes nothing.
    let before = streaming();
    std::env::set_var("KVM_STREAMING", "hardware");
    assert_eq!(init_from_env(), Ok(detect()));
    assert_eq!(streaming(), Streaming::Hardware);
    std::env::set_var("KVM_STREAMING", "fast");
    assert_eq!(init_from_env(), Err(TierError::UnknownStreaming));
    assert_eq!(streaming(), Streaming::Hardware);
    std::env::remove_var("KVM_STREAMING");
    set_streaming(before);
}

#[test]
fn simd_activation_quantizers_match_scalar_bytes() {
    let mut x = values(32 * 37, 11);
    // A zero block, a tiny one and exact ties (x * 127 / amax = k + 0.5).
    x[32..64].fill(0.0);
    x[64..96].fill(1e-35);
    for (i, v) in x[96..128].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) + 0.5;
    }
    x[127] = 127.0;
    let mut want = vec![0u8; act_scratch_len(x.len())];
    scalar::quantize_act(&x, &mut want);
    assert_eq!(&want[96..99], &[(-16i8) as u8, (-14i8) as u8, (-14i8) as u8], "ties go to even");
    for t in supported_tiers() {
        let mut got = vec![0xAAu8; want.len()];
        // SAFETY: the CPU supports `t`; the table is called directly.
        unsafe { (table(t).quantize_act)(&x, &mut got) };
        assert_eq!(got, want, "{t}");
    }
}

/// `weighted_sum` and `dots` entries over rows stored as `T` give the scalar tier's bits
/// on the widened rows, on odd widths and lengths, and dots stay within [`BUDGET`] of
/// the f64 sums.
fn check_stored_entries<T: Stored>(t: Tier, entries: &Attention<T>, store: fn(f32) -> T) {
    let (weighted_sum, dots) = (entries.weighted_sum, entries.dots);
    let stored = |n: usize, seed: u32| -> (Vec<T>, Vec<f32>) {
        let rows: Vec<T> = values(n, seed).into_iter().map(store).collect();
        let wide = rows.iter().map(|r| r.widen()).collect();
        (rows, wide)
    };
    let name = core::any::type_name::<T>();
    for d in [1, 3, 4, 7, 8, 15, 16, 17, 31, 33, 64, 65, 127, 128, 129, 200, 257] {
        for n in [0, 1, 2, 5, 9] {
            let (p, (rows, wide)) = (values(n, d as u32), stored(n * d, 3 + n as u32));
            let start = values(d, 99);
            let (mut want, mut got) = (start.clone(), start.clone());
            scalar::weighted_sum(&p, &wide, &mut want);
            // SAFETY: the CPU supports `t`; the table is called directly.
            unsafe { weighted_sum(&p, &rows, &mut got) };
            assert_bits(&got, &want, &format_args!("{t} weighted_sum {name} [{n}, {d}]"));
        }
    }
    for d in [1, 3, 15, 16, 17, 31, 32, 33, 64, 127, 128, 129] {
        for n in [0, 1, 3, 4, 5, 9, 16, 17, 37] {
            let ((rows, wide), x) = (stored(n * d, d as u32), values(d, 5 + n as u32));
            let (mut want, mut got) = (vec![f32::NAN; n], vec![f32::NAN; n]);
            scalar::dots(&wide, &x, &mut want);
            // SAFETY: as above.
            unsafe { dots(&rows, &x, &mut got) };
            assert_bits(&got, &want, &format_args!("{t} dots {name} [{n}, {d}]"));
            let exact: Vec<f32> = wide
                .chunks_exact(d)
                .map(|r| r.iter().zip(&x).map(|(a, b)| (a * b) as f64).sum::<f64>() as f32)
                .collect();
            let mag: Vec<f32> =
                wide.chunks_exact(d).map(|r| r.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum()).collect();
            assert_close(&got, &exact, &mag, &format_args!("{t} dots {name} [{n}, {d}] vs f64"));
        }
    }
}

/// i8 values spread over their range, from [`values`].
fn to_i8(x: f32) -> i8 {
    (x * 15.0).clamp(-127.0, 127.0) as i8
}

/// Attention's helpers: `dots`, `weighted_sum` (over f32 rows, the f16 cache's rows and
/// the q8 cache's values) and `exp_sub` give the scalar tier's bits in every tier (they
/// keep its operations and order), on odd widths and lengths.
#[test]
fn attention_helpers_match_scalar_bits() {
    for t in supported_tiers() {
        let tb = table(t);
        check_stored_entries(t, &tb.f32, |x| x);
        check_stored_entries(t, &tb.f16, f16::from_f32);
        check_stored_entries(t, &tb.i8, to_i8);
        for len in [0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 100, 769] {
            // From far below the clamp to above it, through 0.
            let mut want: Vec<f32> = values(len, len as u32).iter().map(|v| v * 30.0 - 8.0).collect();
            want.iter_mut().step_by(5).for_each(|v| *v *= 4.0);
            let mut got = want.clone();
            scalar::exp_sub(&mut want, 2.5);
            // SAFETY: as above.
            unsafe { (tb.exp_sub)(&mut got, 2.5) };
            assert_bits(&got, &want, &format_args!("{t} exp_sub [{len}]"));
        }
    }
}

/// `max` and `find` agree with a running maximum and the first position of it in every
/// tier, and so does `argmax`, on odd lengths: NaNs skipped, the first of ties, zeros of
/// both signs equal, and no position when nothing is above `-inf`.
#[test]
fn maxima_and_their_first_positions_match_a_running_maximum() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let mut cases: Vec<Vec<f32>> = [0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 100, 769, 50_304]
        .iter()
        .map(|&len| {
            // Values that repeat (ties of the largest), with a NaN every 7th.
            let mut x: Vec<f32> = (0..len).map(|i| ((i * 7919) % 1009) as f32 - 500.0).collect();
            x.iter_mut().step_by(7).for_each(|v| *v = nan);
            x
        })
        .collect();
    cases.extend([
        vec![nan; 9],
        vec![-inf, nan, -inf],
        vec![-1.0, -0.0, 0.0, -0.0],
        vec![2.0; 40],
        (0..70).map(|i| if i == 66 { inf } else { i as f32 }).collect(),
    ]);
    for t in supported_tiers() {
        let tb = table(t);
        for x in &cases {
            let running = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let first = x.iter().position(|&v| v == running);
            // SAFETY: as above.
            let (max, found) = unsafe { ((tb.max)(x), (tb.find)(x, running)) };
            assert!(max == running, "{t} max of {} values: {max} != {running}", x.len());
            assert_eq!(found, first, "{t} find of {} values", x.len());
        }
    }
    for x in &cases {
        let best = (0..x.len()).filter(|&i| x[i] > f32::NEG_INFINITY).fold(None, |b: Option<usize>, i| {
            if b.is_none_or(|b| x[i] > x[b]) {
                Some(i)
            } else {
                b
            }
        });
        assert_eq!(argmax(x), best, "argmax of {} values", x.len());
    }
}

/// Every tier narrows to f16 with [`scalar::narrow_f16`]'s bits (`half`'s), on odd
/// lengths: normals, subnormals and underflow, ties, overflow, infinities and NaNs.
#[test]
fn narrow_f16_matches_scalar_bits() {
    // Each of these and its negation.
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let (snan, payload) = (f32::from_bits(0x7f80_0001), f32::from_bits(0x7fc1_2345));
    let magnitudes = [
        0.0, 1.0, 1.5, 65504.0, 65519.99, 65520.0, 1e9, 3.4e38, inf, nan, snan, payload, 6.1e-5, 5.96e-8, 2.98e-8,
        2.99e-8, 1e-10, 3e-6, 1.2e-38, 1.0004883, 1.0014648, 2049.0, 2051.0,
    ];
    let specials: Vec<f32> = magnitudes.iter().flat_map(|&v| [v, -v]).collect();
    for t in supported_tiers() {
        let tb = table(t);
        for len in [0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 769] {
            let mut x: Vec<f32> = values(len, len as u32 + 7).iter().map(|v| v * 3e4).collect();
            // Small magnitudes too (subnormal f16s), and the specials at odd places.
            x.iter_mut().skip(1).step_by(4).for_each(|v| *v *= 1e-9);
            for (v, &s) in x.iter_mut().skip(2).step_by(3).zip(specials.iter().cycle()) {
                *v = s;
            }
            let (mut want, mut got) = (vec![f16::ZERO; len], vec![f16::ZERO; len]);
            scalar::narrow_f16(&x, &mut want);
            // SAFETY: `supported_tiers` yields only tiers this CPU runs.
            unsafe { (tb.narrow_f16)(&x, &mut got) };
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{t} narrow_f16 [{len}] at {i}: {} from {}", g, x[i]);
            }
        }
    }
}

/// Multi-query kernels give [`dots`]' bits for every query, f32, f16 and i8 rows, on
/// odd shapes; the public function handles empty rows and zero widths.
#[test]
fn dots_many_matches_dots_per_query() {
    fn check<T: Stored>(t: Tier, f: Option<DotsMany<T>>, conv: fn(f32) -> T) {
        let Some(f) = f else { return };
        for d in [1, 3, 15, 16, 17, 33, 128, 129] {
            for (m, n) in [(1, 1), (3, 5), (4, 4), (5, 9), (8, 3), (9, 8), (12, 7), (16, 17)] {
                let rows: Vec<T> = values(n * d, d as u32).into_iter().map(conv).collect();
                let xs = values(m * d, 7 + m as u32);
                let mut want = vec![f32::NAN; m * n];
                for (x, o) in xs.chunks_exact(d).zip(want.chunks_exact_mut(n)) {
                    scalar::dots(&rows, x, o);
                }
                let mut got = vec![f32::NAN; m * n];
                // SAFETY: the CPU supports `t`; `d > 0` and there are rows.
                unsafe { f(&rows, &xs, d, &mut got) };
                assert_bits(&got, &want, &format_args!("{t} dots_many [{m} x {n}, {d}]"));
            }
        }
    }
    for t in supported_tiers() {
        check(t, table(t).f32.dots_many, |x| x);
        check(t, table(t).f16.dots_many, f16::from_f32);
        check(t, table(t).i8.dots_many, to_i8);
    }
    let mut out = [1.0f32; 4];
    dots_many::<f32>(&[], &[0.5; 6], 3, &mut out);
    assert_eq!(out, [1.0; 4], "no rows: nothing written");
    dots_many::<f32>(&[], &[], 0, &mut out);
    assert_eq!(out, [0.0; 4], "zero width: empty sums");
}

/// Multi-query weighted sums give [`scalar::weighted_sum`]'s bits for every query, f32,
/// f16 and i8 rows, on odd shapes (widths around the 16- and 64-column tiles, query
/// counts around the groups of four, scores strided past their rows); the public
/// function handles zero widths and no rows.
#[test]
fn weighted_sum_many_matches_weighted_sum_per_query() {
    fn check<T: Stored>(t: Tier, f: Option<WeightedSumMany<T>>, conv: fn(f32) -> T) {
        let Some(f) = f else { return };
        for d in [1, 3, 15, 16, 17, 33, 64, 65, 80, 128, 129] {
            for (m, n) in [(1, 1), (3, 5), (4, 4), (5, 9), (8, 3), (9, 8)] {
                let rows: Vec<T> = values(n * d, d as u32).into_iter().map(conv).collect();
                let stride = n + 3;
                let ps = values(m * stride, 11 + m as u32);
                let start = values(m * d, 13);
                let mut want = start.clone();
                for (i, o) in want.chunks_exact_mut(d).enumerate() {
                    scalar::weighted_sum(&ps[i * stride..i * stride + n], &rows, o);
                }
                let mut got = start.clone();
                // SAFETY: the CPU supports `t`; `d > 0`; `ps` holds every query's scores.
                unsafe { f(&ps, stride, &rows, d, &mut got) };
                assert_bits(&got, &want, &format_args!("{t} weighted_sum_many [{m} x {n}, {d}]"));
            }
        }
    }
    for t in supported_tiers() {
        check(t, table(t).f32.weighted_sum_many, |x| x);
        check(t, table(t).f16.weighted_sum_many, f16::from_f32);
        check(t, table(t).i8.weighted_sum_many, to_i8);
    }
    let mut out = [1.0f32; 4];
    weighted_sum_many::<f32>(&[0.5; 4], 2, &[], 2, &mut out);
    assert_eq!(out, [1.0; 4], "no rows: nothing added");
    weighted_sum_many::<f32>(&[], 0, &[], 0, &mut out);
    assert_eq!(out, [1.0; 4], "zero width: nothing added");
}

/// The scalar tier's f16 widening is exact for every one of the 65536 bit patterns
/// (what `half` and the F16C/fcvtl instructions give, quiet NaNs included).
#[test]
fn widen_f16_is_exact_for_every_bit_pattern() {
    for h in 0..=u16::MAX {
        let (got, want) = (scalar::widen_f16(h), f16::from_bits(h).to_f32());
        assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}: {got} vs {want}");
    }
}

#[test]
fn exp_approx_is_within_two_ulp_of_expf() {
    let mut worst = 0f32;
    for i in 0..=200_000 {
        let x = -87.0 + 175.0 * i as f32 / 200_000.0;
        let (got, want) = (scalar::exp_approx(x), libm::expf(x));
        let ulp = f32::from_bits(want.to_bits() + 1) - want;
        worst = worst.max((got - want).abs() / ulp);
    }
    assert!(worst <= 2.0, "worst error {worst} ulp");
    assert_eq!(scalar::exp_approx(0.0), 1.0);
    assert_eq!(scalar::exp_approx(-1000.0), scalar::exp_approx(scalar::exp::LO));
    assert!(scalar::exp_approx(f32::NAN).is_nan());
    assert!(scalar::exp_approx(f32::INFINITY).is_finite());
}

#[test]
fn q8_activation_error_is_half_a_step() {
    let cols = 1024;
    let x = values(cols, 5);
    let mut act = vec![0u8; act_scratch_len(cols)];
    scalar::quantize_act(&x, &mut act);
    for dtype in [DType::Q8_0, DType::Q4_0] {
        let bytes = encode(dtype, 4, cols, 9);
        let w = Matrix::new(dtype, 4, cols, &bytes).unwrap();
        let rb = w.row_bytes();
        let mut row = vec![0.0; cols];
        for (r, (want, mag)) in reference(&w, &x).iter().zip(magnitudes(&w, &x)).enumerate() {
            let bytes = &bytes[r * rb..][..rb];
            scalar::dequant_row(dtype, bytes, &mut row);
            // Each activation moves by at most half its block's step d_a.
            let bound: f32 = row
                .chunks_exact(QK)
                .zip(x.chunks_exact(QK))
                .map(|(w, x)| {
                    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    w.iter().map(|v| v.abs()).sum::<f32>() * amax / 127.0 * 0.5
                })
                .sum();
            let exact = scalar::dot_row(dtype, bytes, &x);
            let err = (want - exact).abs();
            assert!(err <= bound * 1.001 + BUDGET * mag, "{dtype:?} row {r}: {want} vs {exact}, bound {bound}");
            // Rounding errors largely cancel: far below the worst case.
            assert!(err <= 0.2 * bound, "{dtype:?} row {r}: error {err}, worst case {bound}");
        }
    }
}

/// Files may hold q8_0 weights of -128 (our quantizer never writes them): the sign
/// trick and the biased dots must keep them exact, against activations of +-127.
#[test]
fn extreme_q8_0_weights_stay_exact() {
    let (rows, cols) = (5, 256);
    let mut bytes = encode(DType::Q8_0, rows, cols, 3);
    for (i, b) in bytes.iter_mut().enumerate() {
        let in_block = i % 34;
        if in_block >= 2 {
            *b = [0x80, 0x7f, 0x80, 0x81][(i / 34 + in_block) % 4];
        }
    }
    let w = Matrix::new(DType::Q8_0, rows, cols, &bytes).unwrap();
    let x: Vec<f32> = (0..cols).map(|c| if c % 3 == 0 { -1.0 } else { 1.0 }).collect();
    let want = reference(&w, &x);
    for t in supported_tiers() {
        let mut y = vec![f32::NAN; rows];
        let mut act = vec![0u8; act_scratch_len(cols)];
        // SAFETY: the CPU supports `t`; the table is called directly, not installed.
        unsafe { (table(t).decode.matvec)(&w, &x, &mut y, &mut act) };
        assert_bits(&y, &want, &format_args!("{t} q8_0 extremes"));
    }
}

/// Raw `[rows, nb blocks]` of `dtype` with adversarial contents: scales from the
/// largest f16 down to subnormals, zeros and negatives; weights at both ends of their
/// range (q8_0's -128, which our quantizer never writes, included) and zero blocks.
fn adversarial_weights(dtype: DType, rows: usize, nb: usize, seed: u32) -> Vec<u8> {
    const SCALES: [u16; 8] = [0x7bff, 0x0001, 0x03ff, 0x3c00, 0xbc00, 0x0000, 0x8000, 0x5a1f];
    let bb = dtype.block_bytes();
    let mut bits = values(rows * nb * bb, seed).into_iter().map(|v| v.to_bits() >> 7);
    let mut out = vec![0u8; rows * nb * bb];
    for (i, block) in out.chunks_exact_mut(bb).enumerate() {
        let pick = bits.next().unwrap_or(0);
        let d = if i % 3 == 0 { SCALES[pick as usize % 8] } else { 0x2000 | (pick as u16 & 0x3fff) };
        block[..2].copy_from_slice(&d.to_le_bytes());
        for q in &mut block[2..] {
            let r = bits.next().unwrap_or(0);
            *q = match (i % 5, r % 4) {
                (0, _) => 0,
                (1, _) if dtype == DType::Q8_0 => [0x80, 0x7f][r as usize % 2],
                (1, _) => [0x00, 0xff, 0x0f, 0xf0][r as usize % 4],
                (_, 0) => 0x80,
                _ => (r >> 3) as u8,
            };
        }
    }
    out
}

/// Activations of `n` tokens with large magnitudes, zero and tiny blocks, and ties.
fn adversarial_activations(n: usize, cols: usize, seed: u32) -> Vec<f32> {
    let mut x = values(n * cols, seed);
    for (b, block) in x.chunks_exact_mut(QK).enumerate() {
        match b % 6 {
            0 => block.iter_mut().for_each(|v| *v *= 3.0e4),
            1 => block.fill(0.0),
            2 => block.iter_mut().for_each(|v| *v *= 1e-36),
            3 => block.iter_mut().enumerate().for_each(|(i, v)| *v = i as f32 - 15.5),
            _ => {}
        }
    }
    x
}

/// Every tier's integer matvec and matmul (1, 3 or all tokens per group) give the
/// scalar reference's bits, on odd block counts, every small tile remainder and
/// adversarial data: the canonical order of `scalar::sum_blocks` holds everywhere.
#[test]
fn integer_tiers_are_bit_identical() {
    for dtype in [DType::Q8_0, DType::Q4_0] {
        for nb in [1, 3, 7, 8, 9, 17, 24, 100] {
            let cols = nb * QK;
            for rows in (1..=9).chain([17, 33]) {
                let seed = (nb * 31 + rows) as u32;
                let plain = encode(dtype, rows, cols, seed);
                let wild = adversarial_weights(dtype, rows, nb, seed);
                for (kind, bytes) in [("plain", &plain), ("adversarial", &wild)] {
                    let w = Matrix::new(dtype, rows, cols, bytes).unwrap();
                    let tokens: &[usize] = if rows % 4 == 1 { &[1, 2, 3, 4, 5, 7, 8, 16, 17] } else { &[1, 4, 5] };
                    for &n in tokens {
                        let xs = if kind == "plain" {
                            values(n * cols, seed + n as u32)
                        } else {
                            adversarial_activations(n, cols, seed + n as u32)
                        };
                        let want = reference(&w, &xs);
                        for t in supported_tiers() {
                            for group in [1, 3, n] {
                                let mut ys = vec![f32::NAN; n * rows];
                                let mut act = vec![0u8; act_scratch_len(cols) * group];
                                // SAFETY: the CPU supports `t`; the table is called directly.
                                unsafe { (table(t).matmul)(&w, &xs, &mut ys, &mut act) };
                                let what = format_args!("{t} {kind} {dtype:?} [{rows}, {nb} blocks] x {n}/{group}");
                                assert_bits(&ys, &want, &what);
                            }
                            let mut y = vec![f32::NAN; rows];
                            let mut act = vec![0u8; act_scratch_len(cols)];
                            // SAFETY: as above.
                            unsafe { (table(t).decode.matvec)(&w, &xs[..cols], &mut y, &mut act) };
                            assert_bits(&y, &want[..rows], &format_args!("{t} {kind} {dtype:?} matvec [{rows}, {nb}]"));
                        }
                    }
                }
            }
        }
    }
}

/// `plain` (row-major blocks of `dtype.plain()`, `[rows, nb]`) stored as `dtype`'s groups.
fn interleave(dtype: DType, plain: &[u8], nb: usize) -> Vec<u8> {
    fn store<G: RowGroup>(plain: &[u8], nb: usize, out: &mut [u8]) {
        let bb = G::PLAIN.block_bytes();
        let g: &mut [G] = bytemuck::cast_slice_mut(out);
        for (i, block) in plain.chunks_exact(bb).enumerate() {
            let (r, b) = (i / nb, i % nb);
            g[r / X16 * nb + b].set_block(r % X16, bytemuck::from_bytes(block));
        }
    }
    let mut out = vec![0u8; plain.len()];
    match dtype {
        DType::Q4_0x16 => store::<GroupQ4_0x16>(plain, nb, &mut out),
        DType::Q8_0x16 => store::<GroupQ8_0x16>(plain, nb, &mut out),
        _ => unreachable!("{dtype:?} is not interleaved"),
    }
    out
}

/// Interleaved dtypes on adversarial data (extreme scales, quants at both ends, a row
/// of nothing but the largest magnitude, 15 or -128, against activations of +-127,
/// which fill the widening kernels' i16 lanes nearly to the brim): every tier gives the
/// plain dtype's reference bits.
#[test]
fn interleaved_dtypes_are_bit_identical_on_extremes() {
    for dtype in [DType::Q4_0x16, DType::Q8_0x16] {
        let flat = dtype.plain();
        for nb in [1, 7, 8, 9, 17] {
            let cols = nb * QK;
            for groups in [1, 2, 5, 9] {
                let rows = groups * X16;
                let seed = (nb * 7 + groups) as u32;
                let mut plain = adversarial_weights(flat, rows, nb, seed);
                let rb = flat.row_bytes(cols).unwrap();
                for block in plain[3 * rb..4 * rb].chunks_exact_mut(flat.block_bytes()) {
                    block[2..].fill(if flat == DType::Q8_0 { 0x80 } else { 0xff });
                }
                let bytes = interleave(dtype, &plain, nb);
                let w = Matrix::new(dtype, rows, cols, &bytes).unwrap();
                for n in [1, 2, 5] {
                    let mut xs = adversarial_activations(n, cols, seed + n as u32);
                    // The last token: blocks of all -1 or all 1, quantized to -127 or 127.
                    for (b, block) in xs[(n - 1) * cols..].chunks_exact_mut(QK).enumerate() {
                        block.fill(if b % 3 == 0 { 1.0 } else { -1.0 });
                    }
                    let want = reference(&w, &xs);
                    for t in supported_tiers() {
                        for group in [1, n] {
                            let mut ys = vec![f32::NAN; n * rows];
                            let mut act = vec![0u8; act_scratch_len(cols) * group];
                            // SAFETY: the CPU supports `t`; the table is called directly.
                            unsafe { (table(t).matmul)(&w, &xs, &mut ys, &mut act) };
                            assert_bits(&ys, &want, &format_args!("{t} {dtype:?} [{rows}, {nb} blocks] x {n}/{group}"));
                        }
                        let mut y = vec![f32::NAN; rows];
                        let mut act = vec![0u8; act_scratch_len(cols)];
                        let x = &xs[(n - 1) * cols..];
                        // SAFETY: as above.
                        unsafe { (table(t).decode.matvec)(&w, x, &mut y, &mut act) };
                        assert_bits(&y, &want[(n - 1) * rows..], &format_args!("{t} {dtype:?} matvec [{rows}, {nb}]"));
                    }
                }
            }
        }
    }
}

/// The canonical order itself: 8 lanes, block `b` in lane `b % 8`, then the fixed tree.
#[test]
fn canonical_block_sum_order() {
    let terms = [1.0e8f32, 1.0, -1.0e8, 1.0, 3.0, 0.5, 0.25, 0.125, 1.0, 2.0];
    let mut acc = [0.0f32; 8];
    for (b, &t) in terms.iter().enumerate() {
        acc[b % 8] += t;
    }
    let want = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    assert_eq!(scalar::sum_blocks(terms.into_iter()).to_bits(), want.to_bits());
    assert_eq!(scalar::sum_blocks(core::iter::empty()).to_bits(), 0.0f32.to_bits());
}

/// A debug build stops at the shape; a release build writes nothing. (Where a panic aborts,
/// as on wasm32-wasip1, a debug build's assertion cannot be caught.)
#[test]
#[cfg_attr(all(panic = "abort", debug_assertions), ignore = "the assertion would abort the test binary")]
fn quantizing_an_activation_of_the_wrong_shape_writes_nothing() {
    let x = values(64, 1);
    for (values, bytes) in [(64, act_scratch_len(64) - 1), (40, 100)] {
        let mut act = vec![0xAAu8; bytes];
        let run = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| quantize_act(&x[..values], &mut act)));
        assert_eq!(run.is_err(), cfg!(debug_assertions), "{values} values into {bytes} bytes");
        assert!(act.iter().all(|&b| b == 0xAA), "{values} values into {bytes} bytes");
    }
}

#[test]
fn prefetching_changes_nothing() {
    let v = values(1000, 3);
    for access in [Access::Read, Access::Write, Access::Later] {
        for (start, len) in [(0, 0), (0, 1), (1, 17), (3, 997), (999, 1)] {
            prefetch_lines(&v[start..start + len], access);
        }
        prefetch_lines::<f16>(&[], access);
    }
    assert_eq!(v, values(1000, 3));
    // Addresses that point at nothing: a freed buffer's, and the null page.
    let freed = {
        let v = vec![0u8; 1 << 16];
        v.as_ptr() as usize
    };
    prefetch_later(freed, 1 << 16);
    prefetch_later(0, 4096);
}

#[test]
fn empty_shapes() {
    for dtype in DType::ALL {
        let w = Matrix::new(dtype, 0, 64, &[]).unwrap();
        let mut act = vec![0u8; act_scratch_len(64)];
        matvec(&w, &values(64, 1), &mut [], &mut act);
        matmul(&w, &values(128, 1), &mut [], &mut act);
    }
    let w = Matrix::new(DType::F32, 3, 0, &[]).unwrap();
    let mut y = [f32::NAN; 3];
    matvec(&w, &[], &mut y, &mut []);
    assert_eq!(y, [0.0; 3]);
    // Interleaved dtypes hold whole groups of rows only.
    let bytes = vec![0u8; 17 * DType::Q4_0x16.row_bytes(64).unwrap()];
    assert!(Matrix::new(DType::Q4_0x16, 17, 64, &bytes).is_err());
    assert!(Matrix::new(DType::Q4_0, 17, 64, &bytes).is_ok());
}

#[test]
fn scratch_lengths() {
    assert_eq!(act_scratch_len(768), 768 + 24 * 4);
    assert_eq!(matmul_scratch_len(768, 3), 3 * act_scratch_len(768));
    // From gemm::MIN_TOKENS on, room to transpose the batch for float weights.
    assert_eq!(matmul_scratch_len(768, 1000), gemm::scratch_len(768, 1000));
    assert!(gemm::scratch_len(768, 1000) >= 4 * 768 * 1000);
}

#[test]
fn compiled_tier_is_supported() {
    assert!(tier::supported(tier::COMPILED));
    for t in Tier::ALL {
        assert_eq!(Tier::from_name(t.name()), Some(t));
    }
    assert_eq!(Tier::from_name("sse"), None);
}

/// The integer numerics' product of every tier the CPU has against an exact i64
/// reference, on every row count around the tiles, widths around the vectors' (an i8 row
/// holds whole words: multiples of 4, each a SIMD body and a scalar tail) and past one or
/// two 512-product partial sums, extreme weights and inputs, and input exponents either
/// side of the rows' shifts.
#[test]
fn integer_products_are_exact_in_every_tier() {
    let widths = [4usize, 12, 28, 36, 60, 68, 508, 516, 1020, 1028];
    let odd = widths.into_iter().flat_map(|cols| (1..=9).map(move |rows| (rows, cols)));
    let shapes: Vec<(usize, usize)> =
        odd.chain([(1, 4), (3, 32), (5, 132), (7, 1028), (9, 2052), (4, 512), (13, 516), (17, 1536)]).collect();
    for t in supported_tiers() {
        for &(rows, cols) in &shapes {
            let src = values(rows * cols, (rows * 7 + cols) as u32);
            let mut data = vec![0u8; DType::I8.matrix_bytes(rows, cols).unwrap()];
            quantize_matrix(DType::I8, cols, &src, &mut data).unwrap();
            // Some rows at the extremes of the weights.
            let rb = DType::I8.row_bytes(cols).unwrap();
            for q in data[4..rb].iter_mut().step_by(3) {
                *q = 0x81; // -127
            }
            let w = Matrix::new(DType::I8, rows, cols, &data).unwrap();
            let dense: Vec<i16> = values(cols, cols as u32)
                .iter()
                .enumerate()
                .map(|(i, &v)| match i % 11 {
                    0 => i16::MIN,
                    1 => i16::MAX,
                    _ => (v * 4000.0) as i16,
                })
                .collect();
            // Mostly zero, as relu(h)^2 is: the sparse tiers' listed columns (none at all
            // for the last).
            let sparse: Vec<i16> = dense.iter().enumerate().map(|(i, &v)| if i % 4 == 1 { v } else { 0 }).collect();
            for xs in [dense, sparse, vec![0; cols]] {
                for s in [0, 3, 40] {
                    let mut got = vec![0i32; rows];
                    // SAFETY: the CPU supports `t`.
                    unsafe { (table(t).matvec_i8)(&w, &xs, s, &mut got) };
                    for (r, &g) in got.iter().enumerate() {
                        let (scale, q) = crate::quant::i8_row(&data, rb, r);
                        let acc: i64 = q.iter().zip(&xs).map(|(&a, &b)| i64::from(a) * i64::from(b)).sum();
                        let want = crate::fixed::requant(acc, scale, s);
                        assert_eq!(g, want, "{t:?} [{rows}, {cols}] row {r}, s {s}");
                    }
                }
            }
        }
    }
}

/// A file's -128 weights against `i16::MIN` inputs fill a 512-product partial sum to 2^31,
/// which wraps in i32 (the scalar oracle's sums do; the quantizer never writes -128):
/// every tier gives the oracle's bits, on one, two and a part of partial sums.
#[test]
fn integer_products_wrap_as_the_oracle_in_every_tier() {
    for (rows, cols) in [(5usize, 512usize), (6, 1024), (9, 1040)] {
        let rb = DType::I8.row_bytes(cols).unwrap();
        let mut data = vec![0x80u8; rows * rb]; // -128
        for (r, row) in data.chunks_exact_mut(rb).enumerate() {
            // m = 2^14 + r, sh = 40: heads the validator takes.
            row[..4].copy_from_slice(&[(r as u8), 0x40, 40, 0]);
        }
        let w = Matrix::new(DType::I8, rows, cols, &data).unwrap();
        let xs = vec![i16::MIN; cols];
        let mut want = vec![0i32; rows];
        // SAFETY: every CPU runs the scalar tier.
        unsafe { (table(Tier::Scalar).matvec_i8)(&w, &xs, 0, &mut want) };
        for t in supported_tiers() {
            let mut got = vec![0i32; rows];
            // SAFETY: the CPU supports `t`.
            unsafe { (table(t).matvec_i8)(&w, &xs, 0, &mut got) };
            assert_eq!(got, want, "{t:?} [{rows}, {cols}]");
        }
    }
}

//! The float product of a batch of tokens (prefill), register-tiled over tokens: the
//! driver every SIMD tier shares, which transposes the batch's activations once and hands
//! the tier's [`Gemm`] kernel tiles of weight rows by vectors of tokens.
//!
//! Decode reads every weight once per token, and its tiles ([`super::walk`]) sum each
//! row's products across vector lanes. Prefill reads each weight once per batch and is
//! bound by the FMA units instead, which such dot-product tiles keep waiting (two loads and
//! a horizontal sum at the end for every few products). Here a vector holds one value for
//! each of `LANES` tokens instead: `xt` is the batch transposed (`[cols, BLOCK]` per block
//! of [`BLOCK`] tokens), and each weight, broadcast, meets a whole vector of tokens in one
//! fused multiply-add. A tile of `R` rows by `V` vectors keeps `R * V` accumulators in
//! registers for the whole row and loads `V` vectors and `R` weights per column.
//!
//! The walk goes down the rows a panel of [`PANEL`] rows at a time, each weight read from
//! memory once per batch: f32 weights in place, other float dtypes decoded a panel's rows
//! at a time into scratch. Within a panel the columns go in chunks of [`Gemm::KC`]
//! (K-blocking): every tile of the panel meets every block of the batch over one chunk
//! before the next chunk starts, so the chunk's part of the transposed batch (`KC` columns
//! of every token) stays in L2 for all the panel's tiles, and its part of one block in L1
//! for a tile's passes over it, where whole rows of it came from L3 or memory for each
//! tile (a `[768, 3072]` down-projection of 256 tokens reads 3 MiB of them). A tile's sums
//! wait in scratch between chunks and go on from there. Results then gather in a staging
//! panel and go to the output a token's row at a time.
//!
//! Each output is one lane's sum over the columns in order (a fused multiply-add per
//! column, the chunks' sums carried on unchanged), so it does not depend on the batch's
//! size, the tile, the chunk or how the pool splits the rows: a token gets the same bits
//! in any batch of at least [`MIN_TOKENS`], on every tier (decode's tiles, which sum in
//! lanes, give slightly different ones).

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::prefetch::{prefetch_lines, Access};
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::traits::Kernels;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::quant::DType;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::tensor::Matrix;

/// Tokens in a block of the transposed batch: the most a tile takes at a time.
pub(crate) const BLOCK: usize = 64;

/// Rows a tier's tile takes at most ([`Gemm::rows`]).
pub(crate) const MAX_ROWS: usize = 12;

/// Rows a tier's tile takes at least ([`Gemm::rows`]): it bounds the tiles of a panel,
/// whose sums wait in scratch between column chunks.
const MIN_ROWS: usize = 6;

/// Tokens from which a batch of float weights runs here rather than in decode's tiles: below
/// it, too many vector lanes would hold no token.
pub(crate) const MIN_TOKENS: usize = 8;

/// Rows whose results gather in a staging panel (`[n, PANEL]`) before they go to the
/// output: rows of a token 12 KB apart (as the up-projection's are) fall into the same
/// few cache sets, and tiles of 6 or 12 rows writing a few of their values at a time
/// evicted each other's lines (the 3072-row product ran at 0.84x). A multiple of every
/// tile height ([`Gemm::rows`]) and of a cache line's 16 values.
const PANEL: usize = 48;

/// Bytes of scratch [`run`] needs for `n` tokens of `cols` values: the transposed batch,
/// a panel's decoded rows, its tiles' sums, the staging panel, and room to align them to
/// a cache line.
pub(crate) const fn scratch_len(cols: usize, n: usize) -> usize {
    let tokens = n.div_ceil(BLOCK) * BLOCK;
    4 * (tokens * cols + PANEL * cols + sums_len(tokens) + tokens * PANEL) + 64
}

/// f32s of a panel's tile sums for `tokens` tokens (whole blocks): room for
/// `MAX_ROWS * BLOCK` sums for each of its tiles (at most `PANEL / MIN_ROWS`, rounded up)
/// and each block.
const fn sums_len(tokens: usize) -> usize {
    PANEL.div_ceil(MIN_ROWS) * (tokens / BLOCK) * MAX_ROWS * BLOCK
}

/// A tier's part of the batch product.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) trait Gemm: Kernels {
    /// f32 lanes of the tier's vectors.
    const LANES: usize;

    /// Columns of a chunk (K-blocking, [`run`]): `KC * BLOCK` f32s of one block, which a
    /// tile reads once per pass over its vectors of tokens, and `KC` KiB of a 256-token
    /// batch, which every tile of a panel reads.
    const KC: usize = 256;

    /// Rows of the tile that takes `vecs` vectors of tokens (`1..=BLOCK / LANES`), at
    /// most [`MAX_ROWS`].
    fn rows(vecs: usize) -> usize;

    /// `out[r * vecs * LANES + t] = sum_c w[r][c] * xt[c * BLOCK + t]` for every row
    /// `r < rows(vecs)` and token `t < vecs * LANES`, summed over `c` in order with fused
    /// multiply-adds, starting from zero, or with `carry` from the sums `out` holds (a
    /// chunk of columns going on from the chunks before it).
    ///
    /// # Safety
    /// The CPU supports the tier; `w` holds `rows(vecs)` pointers to `cols` readable f32
    /// each (not necessarily aligned); `xt` points at `cols * BLOCK` readable f32,
    /// 64-byte aligned; `out` holds `rows(vecs) * vecs * LANES` values.
    unsafe fn tile(w: &[*const f32], xt: *const f32, cols: usize, vecs: usize, out: &mut [f32], carry: bool);

    /// `ys[t * ld + r] = out[r * width + t]` for the `rows` rows and `n` tokens of a
    /// tile's results: the transpose back into the batch's layout.
    ///
    /// # Safety
    /// The CPU supports the tier; `out` holds `rows` rows of `width >= n` values (and
    /// `MAX_ROWS * BLOCK` in all), `ys` holds `(n - 1) * ld + rows` values.
    unsafe fn store(out: &[f32], width: usize, rows: usize, n: usize, ys: &mut [f32], ld: usize) {
        for t in 0..n {
            for (r, y) in ys[t * ld..][..rows].iter_mut().enumerate() {
                *y = out[r * width + t];
            }
        }
    }

    /// `xt[c * BLOCK + t] = xs[t * cols + c]` for the `xs.len() / cols <= BLOCK` tokens
    /// of `xs`, and zero for the tokens after them.
    ///
    /// # Safety
    /// The CPU supports the tier; `xt` holds `cols * BLOCK` values, 64-byte aligned.
    unsafe fn transpose(xs: &[f32], cols: usize, xt: &mut [f32]) {
        transpose_columns(xs, cols, 0, xt);
    }
}

/// [`Gemm::transpose`] of the columns from `c0` on: a tier's tail past its whole blocks.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) fn transpose_columns(xs: &[f32], cols: usize, c0: usize, xt: &mut [f32]) {
    let n = xs.len() / cols;
    for (c, col) in xt.chunks_exact_mut(BLOCK).enumerate().skip(c0) {
        for (t, v) in col.iter_mut().enumerate() {
            *v = if t < n { xs[t * cols + c] } else { 0.0 };
        }
    }
}

/// `ys[t * ld + r] = w[r] . xs[t]` for the float weights `w` and every token of `xs`
/// (`[n, cols]`) with tier `G`, if the batch is large enough and `scratch` holds
/// [`scratch_len`] bytes; returns whether it ran.
///
/// # Safety
/// The CPU supports `G`'s tier; `w` is whole (`rows * dtype.row_bytes(cols)` bytes) of a
/// float dtype, and `ys` holds `n` rows of `ld >= rows` values.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(super) unsafe fn run<G: Gemm>(w: &Matrix<'_>, xs: &[f32], ys: &mut [f32], ld: usize, scratch: &mut [u8]) -> bool {
    let (dtype, cols, rows) = (w.dtype, w.cols, w.rows);
    let Some(rb) = dtype.row_bytes(cols).filter(|&rb| rb > 0 && w.data.len() >= rows * rb) else { return false };
    let w = &w.data[..rows * rb];
    let n = xs.len() / cols;
    // The first block's tile height, which every block's tile has at least (`rows` falls
    // with `vecs`): a tile's rows meet every block.
    let tile0 = G::rows(n.min(BLOCK).div_ceil(G::LANES));
    if n < MIN_TOKENS || rows == 0 || ys.len() < n * ld || ld < rows || tile0 < MIN_ROWS {
        return false;
    }
    // SAFETY: any bytes are valid f32s.
    let (_, floats, _) = unsafe { scratch.align_to_mut::<f32>() };
    let skip = floats.as_ptr().align_offset(64).min(floats.len());
    let tokens = n.div_ceil(BLOCK) * BLOCK;
    let Some((xt, rest)) = floats[skip..].split_at_mut_checked(tokens * cols) else { return false };
    let Some((decoded, rest)) = rest.split_at_mut_checked(PANEL * cols) else { return false };
    let Some((sums, rest)) = rest.split_at_mut_checked(sums_len(tokens)) else { return false };
    let Some(panel) = rest.get_mut(..tokens * PANEL) else { return false };
    for (xs, xt) in xs.chunks(BLOCK * cols).zip(xt.chunks_exact_mut(BLOCK * cols)) {
        // SAFETY: the caller guarantees the tier; `xt` is a block, 64-byte aligned
        // (`skip`, and `BLOCK * 4` is a multiple of 64).
        unsafe { G::transpose(xs, cols, xt) };
    }
    let in_place = dtype == DType::F32;
    for p0 in (0..rows).step_by(PANEL) {
        let p1 = (p0 + PANEL).min(rows);
        if !in_place {
            for (r, out) in decoded.chunks_exact_mut(cols).take(p1 - p0).enumerate() {
                // SAFETY: the caller guarantees the tier; the row is whole.
                unsafe { G::dequant_row(dtype, &w[(p0 + r) * rb..][..rb], out) };
            }
        }
        // Row `r` of the panel, `cols` f32 in place or decoded.
        let row = |r: usize| -> *const f32 {
            if in_place {
                w[(p0 + r) * rb..].as_ptr().cast()
            } else {
                decoded[r * cols..].as_ptr()
            }
        };
        // The next panel's weights, into L2 while this one runs: they come from memory.
        let next = (p1 * rb).min(w.len());
        prefetch_lines(&w[next..(next + PANEL * rb).min(w.len())], Access::Later);
        for k0 in (0..cols).step_by(G::KC) {
            let kc = G::KC.min(cols - k0);
            for (i, r0) in (0..p1 - p0).step_by(tile0).enumerate() {
                let real = tile0.min(p1 - p0 - r0);
                // The rows past the panel's end repeat its last one, their sums dropped.
                let ptrs: [*const f32; MAX_ROWS] = core::array::from_fn(|r| row(r0 + r.min(real - 1)).wrapping_add(k0));
                for (b, xt) in xt.chunks_exact(BLOCK * cols).enumerate() {
                    let vecs = (n - b * BLOCK).min(BLOCK).div_ceil(G::LANES);
                    let tile = G::rows(vecs);
                    let out = &mut sums[(i * (tokens / BLOCK) + b) * MAX_ROWS * BLOCK..][..tile * vecs * G::LANES];
                    // SAFETY: the caller guarantees the tier; each pointer is `kc` f32 of a
                    // whole row from column `k0`, `xt` a 64-byte aligned block from column
                    // `k0` (`BLOCK` f32 a column) and `out` `tile * vecs * LANES` values,
                    // the sums of the chunks before this one when `k0 > 0`.
                    unsafe { G::tile(&ptrs[..tile], xt[k0 * BLOCK..].as_ptr(), kc, vecs, out, k0 > 0) };
                }
            }
        }
        for (i, r0) in (0..p1 - p0).step_by(tile0).enumerate() {
            let real = tile0.min(p1 - p0 - r0);
            for b in 0..tokens / BLOCK {
                let (t0, nb) = (b * BLOCK, (n - b * BLOCK).min(BLOCK));
                let width = nb.div_ceil(G::LANES) * G::LANES;
                let out = &sums[(i * (tokens / BLOCK) + b) * MAX_ROWS * BLOCK..][..MAX_ROWS * BLOCK];
                // SAFETY: as above; `out` holds `tile >= real` rows of `width >= nb`, and
                // `panel` `n` rows of `PANEL >= r0 + real` from token `t0`.
                unsafe { G::store(out, width, real, nb, &mut panel[t0 * PANEL + r0..], PANEL) };
            }
        }
        for (t, y) in ys.chunks_exact_mut(ld).take(n).enumerate() {
            y[p0..p1].copy_from_slice(&panel[t * PANEL..][..p1 - p0]);
        }
    }
    true
}

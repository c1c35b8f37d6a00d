//! How the splittable work of a forward pass runs: the [`Exec`] trait (matrix products,
//! per-head and per-piece work, weight prefetch hints), [`Serial`] on the calling thread;
//! the std runtime plugs in a thread pool.

use crate::kernels;
use crate::tensor::Matrix;

/// One head's work: `(head, out_h, scratch_h)`.
pub type HeadFn<'f> = dyn Fn(usize, &mut [f32], &mut [f32]) + Sync + 'f;

/// Work on one piece of an output: `(index, piece)`.
pub type PieceFn<'f> = dyn Fn(usize, &mut [f32]) + Sync + 'f;

/// Runs the matrix products and the other splittable work of a forward pass. [`Serial`]
/// runs them on the calling thread; the std runtime plugs in a thread pool. No method has
/// a default, so a wrapper (a timer, say) must forward each one and cannot fall back to
/// serial work unnoticed.
///
/// # Safety
/// [`Exec::heads`] calls `f` exactly once for each head `h < outs.len() / out_len` and
/// for no other `h`: the forward pass hands each call its head's own rows of the layer
/// state on that promise.
pub unsafe trait Exec {
    /// `ys[t] = w xs[t]` for every token `t`: `xs: [n, w.cols]`, `ys: [n, w.rows]`;
    /// `act` is kernel scratch of at least [`kernels::matmul_scratch_len`]`(w.cols, 1)`.
    fn matmul(&self, w: &Matrix<'_>, xs: &[f32], ys: &mut [f32], act: &mut [u8]);

    /// Every product's `y[t] = w xs[t]`, for matrices that read the same input (equal
    /// `cols`): one job, so the input is quantized once and a pool splits all the products'
    /// rows together, waiting once instead of once per matrix.
    fn matmuls(&self, xs: &[f32], products: &mut [Product<'_, '_>], act: &mut [u8]);

    /// Runs `f(h, out_h, scratch_h)` once for every head `h`, where `out_h` and
    /// `scratch_h` are the `h`-th `out_len`- and `scratch_len`-long pieces of `outs` and
    /// `scratch`; the heads are independent, so an implementation may run them in
    /// parallel (never one head twice: see the trait's safety section).
    fn heads(&self, outs: &mut [f32], out_len: usize, scratch: &mut [f32], scratch_len: usize, f: &HeadFn<'_>);

    /// Runs `f(i, piece_i)` for every `piece`-long piece of `out` (the last may be
    /// shorter); the pieces are independent, so an implementation may run them in parallel.
    fn pieces(&self, out: &mut [f32], piece: usize, f: &PieceFn<'_>);

    /// The matrices the next products read, in order, announced before work that is not a
    /// product (a layer's attention, norms, sampling): an implementation whose threads
    /// would wait through that work may load their first bytes into cache instead, where
    /// memory would otherwise be idle. A hint: results never depend on it.
    fn upcoming(&self, ws: &[Matrix<'_>]);
}

/// One product of [`Exec::matmuls`]: `y = w x` for every token (`y: [n, w.rows]`).
#[derive(Debug)]
pub struct Product<'w, 'y> {
    pub w: Matrix<'w>,
    pub y: &'y mut [f32],
}

impl Default for Product<'_, '_> {
    /// The empty product.
    fn default() -> Self {
        Product { w: Matrix::default(), y: &mut [] }
    }
}

impl Product<'_, '_> {
    /// The input of [`Exec::matmuls`] made once for all `products`, when they can share
    /// it: one token (`xs` is `cols` long) for products of `cols` columns each, quantized
    /// into `act` if any product is of an integer format. `None` when each product must
    /// run on its own (several tokens, other widths, `act` too short).
    pub fn shared_input<'a>(xs: &[f32], products: &[Product<'_, '_>], act: &'a mut [u8]) -> Option<&'a [u8]> {
        let cols = xs.len();
        if products.iter().any(|p| p.w.cols != cols) {
            return None;
        }
        let act = act.get_mut(..kernels::act_scratch_len(cols))?;
        if products.iter().any(|p| p.w.dtype.quantizes_act()) {
            kernels::quantize_act(xs, act);
        }
        Some(act)
    }
}

/// Every product on the calling thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct Serial;

// SAFETY: `heads` runs `f` once for each piece, in order.
unsafe impl Exec for Serial {
    #[inline]
    fn matmul(&self, w: &Matrix<'_>, xs: &[f32], ys: &mut [f32], act: &mut [u8]) {
        if xs.len() == w.cols {
            kernels::matvec(w, xs, ys, act)
        } else {
            kernels::matmul(w, xs, ys, act)
        }
    }

    fn matmuls(&self, xs: &[f32], products: &mut [Product<'_, '_>], act: &mut [u8]) {
        match Product::shared_input(xs, products, act) {
            Some(act) => products.iter_mut().for_each(|p| kernels::matvec_prepared(&p.w, xs, act, p.y)),
            None => products.iter_mut().for_each(|p| self.matmul(&p.w, xs, p.y, act)),
        }
    }

    fn heads(&self, outs: &mut [f32], out_len: usize, scratch: &mut [f32], scratch_len: usize, f: &HeadFn<'_>) {
        for (h, (out, s)) in outs.chunks_exact_mut(out_len).zip(scratch.chunks_exact_mut(scratch_len)).enumerate() {
            f(h, out, s);
        }
    }

    fn pieces(&self, out: &mut [f32], piece: usize, f: &PieceFn<'_>) {
        for (i, p) in out.chunks_mut(piece.max(1)).enumerate() {
            f(i, p);
        }
    }

    /// Nothing: the calling thread is the only one, and it is busy with the work between.
    fn upcoming(&self, _ws: &[Matrix<'_>]) {}
}

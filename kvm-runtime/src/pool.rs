//! Multithreaded matrix products: an [`Exec`] that splits every product's output rows
//! across a persistent thread pool (no per-token thread spawning).

use std::cell::RefCell;

use kvm_core::kernels::{self, Matrix};
use kvm_core::model::{Exec, HeadFn, Serial};
use rayon::prelude::*;

/// Weights per worker below which splitting a product costs more than it saves.
const MIN_WEIGHTS_PER_THREAD: usize = 64 * 1024;

thread_local! {
    /// Each worker's kernel scratch (quantized activations), grown once and reused.
    static ACT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A pool of `threads` workers running the products of a forward pass.
#[derive(Debug)]
pub struct Pool {
    pool: Option<rayon::ThreadPool>,
    threads: usize,
}

impl Pool {
    /// A pool of `threads` workers (1 = run on the caller's thread, no pool).
    ///
    /// # Errors
    /// If the operating system refuses the threads.
    pub fn new(threads: usize) -> anyhow::Result<Self> {
        let threads = threads.max(1);
        let pool = if threads > 1 { Some(rayon::ThreadPoolBuilder::new().num_threads(threads).build()?) } else { None };
        Ok(Pool { pool, threads })
    }

    /// The number of workers.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` on one of the pool's workers. A forward pass run this way does its serial
    /// parts (attention, norms) on a worker instead of on a third thread beside the
    /// workers, so `threads` threads share `threads` cores.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }
}

/// The default thread count: the cores the process may run on.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

impl Exec for Pool {
    fn heads(&self, outs: &mut [f32], out_len: usize, scratch: &mut [f32], scratch_len: usize, f: &HeadFn<'_>) {
        // A head reads about `scratch_len` keys and values of `out_len` floats each;
        // below a few thousand multiply-adds per head a thread hand-off costs more.
        let work = scratch_len * out_len;
        match &self.pool {
            Some(pool) if work >= MIN_WEIGHTS_PER_THREAD / 4 => pool.install(|| {
                outs.par_chunks_exact_mut(out_len)
                    .zip(scratch.par_chunks_exact_mut(scratch_len))
                    .enumerate()
                    .for_each(|(h, (out, s))| f(h, out, s));
            }),
            _ => Serial.heads(outs, out_len, scratch, scratch_len, f),
        }
    }

    fn matmul(&self, w: &Matrix<'_>, xs: &[f32], ys: &mut [f32], act: &mut [u8]) {
        let Some(pool) = &self.pool else { return Serial.matmul(w, xs, ys, act) };
        let parts = self.threads.min(w.rows * w.cols / MIN_WEIGHTS_PER_THREAD).min(w.rows);
        if parts < 2 {
            return Serial.matmul(w, xs, ys, act);
        }
        let n = xs.len() / w.cols;
        let per = w.rows.div_ceil(parts);
        let need = kernels::matmul_scratch_len(w.cols, n);
        let with_act = |f: &mut dyn FnMut(&mut [u8])| {
            ACT.with(|a| {
                let mut a = a.borrow_mut();
                if a.len() < need {
                    a.resize(need, 0);
                }
                f(&mut a[..need]);
            })
        };
        pool.install(|| {
            if n == 1 {
                // One token: each worker writes its own contiguous slice of y.
                ys.par_chunks_mut(per).enumerate().for_each(|(p, y)| {
                    let part = w.row_range(p * per, p * per + y.len());
                    with_act(&mut |a| kernels::matvec(&part, xs, y, a));
                });
            } else {
                // Many tokens: y is [n, rows], so each worker fills an [n, rows_part] block
                // that is then scattered into place.
                let blocks: Vec<(usize, Vec<f32>)> = (0..parts)
                    .into_par_iter()
                    .map(|p| {
                        let (r0, r1) = (p * per, ((p + 1) * per).min(w.rows));
                        let part = w.row_range(r0, r1);
                        let mut out = vec![0f32; n * (r1 - r0)];
                        with_act(&mut |a| kernels::matmul(&part, xs, &mut out, a));
                        (r0, out)
                    })
                    .collect();
                for (r0, block) in blocks {
                    let width = block.len() / n;
                    for (t, row) in block.chunks_exact(width).enumerate() {
                        ys[t * w.rows + r0..t * w.rows + r0 + width].copy_from_slice(row);
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_core::quant::{quantize_row, DType};

    fn matrix_bytes(dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
        let row_bytes = dtype.row_bytes(cols).unwrap();
        let mut out = vec![0u8; rows * row_bytes];
        for (r, dst) in out.chunks_exact_mut(row_bytes).enumerate() {
            let src: Vec<f32> = (0..cols).map(|c| ((r * 31 + c * 17) % 97) as f32 / 97.0 - 0.5).collect();
            quantize_row(dtype, &src, dst).unwrap();
        }
        out
    }

    #[test]
    fn split_products_equal_serial_ones_exactly() {
        let pool = Pool::new(3).unwrap();
        for dtype in [DType::F32, DType::Q8_0, DType::Q4_0] {
            let (rows, cols) = (1000, 256);
            let data = matrix_bytes(dtype, rows, cols);
            let w = Matrix::new(dtype, rows, cols, &data).unwrap();
            for n in [1, 5] {
                let xs: Vec<f32> = (0..n * cols).map(|i| (i % 13) as f32 / 13.0 - 0.4).collect();
                let mut act = vec![0u8; kernels::matmul_scratch_len(cols, n)];
                let (mut serial, mut split) = (vec![0f32; n * rows], vec![0f32; n * rows]);
                Serial.matmul(&w, &xs, &mut serial, &mut act);
                pool.matmul(&w, &xs, &mut split, &mut act);
                assert_eq!(serial, split, "{} n={n}", dtype.name());
            }
        }
    }

    #[test]
    fn heads_run_once_each_on_their_own_pieces() {
        let pool = Pool::new(2).unwrap();
        let (heads, out_len, scratch_len) = (6, 128, 768);
        let mut outs = vec![0f32; heads * out_len];
        let mut scratch = vec![0f32; heads * scratch_len];
        pool.heads(&mut outs, out_len, &mut scratch, scratch_len, &|h, out, s| {
            assert_eq!((out.len(), s.len()), (out_len, scratch_len));
            out.fill(h as f32 + 1.0);
            s[0] = 1.0;
        });
        for (h, out) in outs.chunks_exact(out_len).enumerate() {
            assert!(out.iter().all(|&v| v == h as f32 + 1.0));
        }
        assert_eq!(scratch.iter().sum::<f32>(), heads as f32);
    }
}

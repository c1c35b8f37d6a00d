//! Multithreaded matrix products: an [`Exec`] that splits every product's output rows
//! across a persistent thread pool (no per-token thread spawning).

use std::cell::RefCell;

use kvm_core::kernels::{self, Matrix};
use kvm_core::model::{Exec, Serial};
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
}

/// The default thread count: the cores the process may run on.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

impl Exec for Pool {
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

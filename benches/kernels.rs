//! Kernel throughput per dtype and tier, single thread, in bytes of weights per second.
//!
//! `cargo bench --bench kernels` (add a filter such as `matvec/768x768/q8_0` to narrow);
//! `attention/` times the attention helpers (scores, exponentials, value sums) over f32
//! and f16 (`_f16`) state rows.
//! Shapes are `[rows, cols]`: a `d_model` projection, the `d_ff` up-projection and the
//! GPT-2-sized lm head, whose weights no cache holds. `matmul` counts the weights once per
//! token, so its GB/s compare directly with `matvec`'s.
//!
//! The clock is the benchmark thread's CPU time (unix only): the build machines are shared, and
//! wall time there mostly measures the neighbours. Memory stalls still count, so
//! bandwidth-bound kernels are timed honestly.

use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use half::f16;
use kvm_core::kernels::{self, act_scratch_len, matmul_scratch_len, tier, Stored, Tier};
use kvm_core::quant::{quantize_matrix, quantize_row, DType};
use kvm_core::tensor::Matrix;
use kvm_test_support::values;

const DTYPES: [DType; 8] = DType::ALL;

/// A cache line, so that buffers start where model tensors do (the format aligns them to
/// 64 bytes; a plain `Vec` would make every 64-byte load straddle two lines).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// `len` zeroed bytes starting on a cache line.
struct Aligned {
    lines: Vec<Line>,
    len: usize,
}

impl Aligned {
    fn zeroed(len: usize) -> Self {
        Aligned { lines: vec![Line([0; 64]); len.div_ceil(64)], len }
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: `lines` holds at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed uniquely.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast(), self.len) }
    }
    fn floats_mut(&mut self) -> &mut [f32] {
        // SAFETY: a line is 4-aligned and any bytes are a valid f32.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast(), self.len / 4) }
    }
    fn halves(&self) -> &[f16] {
        // SAFETY: a line is 2-aligned and any bytes are a valid f16.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.len / 2) }
    }
}

/// `[n]` values from [`values`], cache-line aligned.
fn aligned_values(n: usize, seed: u32) -> Aligned {
    let mut a = Aligned::zeroed(4 * n);
    a.floats_mut().copy_from_slice(&values(n, seed));
    a
}

/// A `[rows, cols]` matrix of `dtype`, encoded (row-interleaved dtypes a group of rows at
/// a time; `rows` is a whole number of groups).
fn weights(dtype: DType, rows: usize, cols: usize) -> Aligned {
    let (rb, g) = (dtype.row_bytes(cols).expect("whole blocks"), dtype.group_rows());
    let group = values(cols, 1).repeat(g);
    let mut w = Aligned::zeroed(rows * rb);
    for chunk in w.bytes_mut().chunks_exact_mut(g * rb) {
        quantize_matrix(dtype, cols, &group, chunk).expect("whole groups");
    }
    w
}

fn tiers() -> Vec<Tier> {
    Tier::ALL.into_iter().filter(|&t| tier::supported(t)).collect()
}

/// CPU time of the calling thread (`CLOCK_THREAD_CPUTIME_ID`), formatted as durations.
struct ThreadTime(WallTime);

impl ThreadTime {
    fn now() -> Duration {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid out-pointer; this clock exists on every Linux.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime");
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }
}

impl Measurement for ThreadTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        Self::now()
    }
    fn end(&self, start: Duration) -> Duration {
        Self::now() - start
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        self.0.formatter()
    }
}

type Bench = Criterion<ThreadTime>;

fn bench_matvec(c: &mut Bench) {
    for (rows, cols) in [(768, 768), (3072, 768), (50304, 768)] {
        let mut g = c.benchmark_group(format!("matvec/{rows}x{cols}"));
        if rows > 10_000 {
            g.sample_size(10).measurement_time(Duration::from_secs(3));
        }
        let mut x = aligned_values(cols, 2);
        let x = x.floats_mut();
        let mut y = vec![0.0; rows];
        let mut act = vec![0u8; act_scratch_len(cols)];
        for dtype in DTYPES {
            let bytes = weights(dtype, rows, cols);
            let w = Matrix::new(dtype, rows, cols, bytes.bytes()).expect("shape");
            g.throughput(Throughput::Bytes(w.data.len() as u64));
            for t in tiers() {
                // SAFETY: `supported` checked the CPU.
                unsafe { tier::force_tier(t) };
                g.bench_function(BenchmarkId::new(dtype.name(), t), |b| {
                    b.iter(|| kernels::matvec(&w, x, &mut y, &mut act))
                });
            }
        }
        g.finish();
    }
}

/// Matrix products over a batch of tokens: 16 (the integer formats' group) and a whole
/// prefill batch of 256, on a `d_model` projection, the up- and down-projections, and
/// a matrix no L3 holds (24576 x 768, as a model's weights come from memory);
/// throughput in multiply-adds (weights times tokens).
fn bench_matmul(c: &mut Bench) {
    for (rows, cols, n) in [(3072, 768, 16), (768, 768, 256), (3072, 768, 256), (768, 3072, 256), (24576, 768, 256)] {
        let mut g = c.benchmark_group(format!("matmul/{rows}x{cols}x{n}"));
        let mut xs = aligned_values(n * cols, 3);
        let xs = xs.floats_mut();
        let mut ys = vec![0.0; n * rows];
        let mut act = vec![0u8; matmul_scratch_len(cols, n)];
        for dtype in DTYPES {
            let bytes = weights(dtype, rows, cols);
            let w = Matrix::new(dtype, rows, cols, bytes.bytes()).expect("shape");
            g.throughput(Throughput::Elements((n * rows * cols) as u64));
            for t in tiers() {
                // SAFETY: `supported` checked the CPU.
                unsafe { tier::force_tier(t) };
                g.bench_function(BenchmarkId::new(dtype.name(), t), |b| {
                    b.iter(|| kernels::matmul(&w, xs, &mut ys, &mut act))
                });
            }
        }
        g.finish();
    }
}

/// Attention's helpers on one head of paper-120m: the scores of a query against 640 keys
/// of 128 (256 state slots + a 384-token window), the scores of a prefill segment's 8
/// queries against them, their softmax exponentials, and the sum of 640 values (for one
/// query and for the 8), with the state in f32 and in f16; bytes are the keys or values
/// read.
fn bench_attention(c: &mut Bench) {
    let (n, d) = (640, 128);
    let mut g = c.benchmark_group(format!("attention/{n}x{d}"));
    let mut keys = aligned_values(n * d, 4);
    let keys = keys.floats_mut();
    let mut halves = Aligned::zeroed(2 * n * d);
    quantize_row(DType::F16, keys, halves.bytes_mut()).expect("row length");
    let q = values(d, 5);
    let qs = values(8 * d, 7);
    let mut many = vec![0.0; 8 * n];
    let mut scores = values(n, 6);
    let mut out = vec![0.0; d];
    for t in tiers() {
        // SAFETY: `supported` checked the CPU.
        unsafe { tier::force_tier(t) };
        bench_rows(&mut g, t, "", keys, &q, &mut scores, &mut out);
        bench_rows(&mut g, t, "_f16", halves.halves(), &q, &mut scores, &mut out);
        g.bench_function(BenchmarkId::new("dots_many8_f16", t), |b| {
            b.iter(|| kernels::dots_many(halves.halves(), &qs, d, &mut many))
        });
        let mut outs = vec![0.0; 8 * d];
        g.bench_function(BenchmarkId::new("weighted_sum_many8_f16", t), |b| {
            b.iter(|| kernels::weighted_sum_many(&many, n, halves.halves(), d, &mut outs))
        });
        // On a fresh copy of the scores each time (2.5 KB, a small part of the time).
        g.throughput(Throughput::Elements(n as u64));
        let mut e = scores.clone();
        g.bench_function(BenchmarkId::new("exp_sub", t), |b| {
            b.iter(|| {
                e.copy_from_slice(&scores);
                kernels::exp_sub(&mut e, 1.0)
            })
        });
    }
    g.finish();
}

/// `dots` (`rows` as keys) and `weighted_sum` (`rows` as values) of tier `t`, named with
/// `suffix`.
fn bench_rows<T: Stored>(
    g: &mut BenchmarkGroup<'_, ThreadTime>,
    t: Tier,
    suffix: &str,
    rows: &[T],
    q: &[f32],
    scores: &mut [f32],
    out: &mut [f32],
) {
    g.throughput(Throughput::Bytes(size_of_val(rows) as u64));
    g.bench_function(BenchmarkId::new(format!("dots{suffix}"), t), |b| b.iter(|| kernels::dots(rows, q, scores)));
    g.bench_function(BenchmarkId::new(format!("weighted_sum{suffix}"), t), |b| {
        b.iter(|| kernels::weighted_sum(scores, rows, out))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .with_measurement(ThreadTime(WallTime))
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench_matvec, bench_matmul, bench_attention
}
criterion_main!(benches);

//! Multithreaded matrix products: an [`Exec`] that splits every product's output rows
//! and the attention heads across a persistent pool of threads.
//!
//! A decode step is about a hundred fork-joins of 50-150 us each, so handing out a job
//! must cost far less than a microsecond. The calling thread runs a share of every job
//! itself beside `threads - 1` workers (so `threads` threads use `threads` cores), and the
//! workers spin on the job word for a while after each job before they park, so an idle
//! process does not burn CPU. Parts are claimed one at a time from a shared counter, and
//! the caller waits for parts rather than for workers: a worker that is descheduled when
//! a job arrives delays nothing, the caller runs the parts it left.
//!
//! Between jobs the caller works alone (a layer's attention, norms, sampling) while memory
//! sits idle. [`Exec::upcoming`] names the next products' matrices, and a waiting worker
//! loads their first bytes into its L2 meanwhile, so the next job starts on weights
//! already read.

use std::any::Any;
use std::cell::RefCell;
use std::fmt;
use std::hint;
use std::marker::PhantomData;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use kvm_core::exec::{Exec, HeadFn, PieceFn, Product, Serial};
use kvm_core::kernels;
use kvm_core::tensor::Matrix;

use crate::arena;

/// Multiply-adds per worker (a token's product: its weights) below which splitting a job
/// costs more than it saves.
const MIN_MULADDS_PER_THREAD: usize = 64 * 1024;

/// How long an idle worker spins before it parks, and a waiting caller before it yields
/// its core. Longer than the serial gaps of a decode step (norms, attention of one head,
/// sampling), much shorter than anything a person would notice as an idle process.
const SPIN: Duration = Duration::from_micros(100);

/// Spins between two looks at the clock (reading it costs about as much as 64 pauses).
const SPINS_PER_CLOCK: u32 = 64;

/// Bytes of the upcoming matrices a waiting worker loads into its L2 per hint: half of a
/// 2 MiB L2, so the hint does not evict what the caller is reading.
const UPCOMING_BYTES: usize = 1 << 20;

/// Most matrices one hint names.
const MAX_UPCOMING: usize = 8;

/// Bytes a waiting worker prefetches between two looks at the job word: about 0.2 us of
/// memory's time, so a job posted meanwhile waits no longer than that.
const PREFETCH_STEP: usize = 4096;

thread_local! {
    /// Each thread's kernel scratch (quantized activations), grown once and reused.
    static ACT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Each thread's `[n, rows_part]` block of a many-token product, grown once and reused.
    static BLOCK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A pool of `threads` threads running the products of a forward pass: the caller and
/// `threads - 1` workers.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

/// What the caller and the workers share.
struct Shared {
    /// The current job: see [`Word`].
    word: AtomicU64,
    /// The current job's [`Job`]; dereferenced only by a thread holding one of its parts.
    job: AtomicPtr<()>,
    /// Parts of the current job finished (run, or panicked).
    done: AtomicUsize,
    /// The first panic among the current job's parts, raised again on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Workers parked or about to park: the caller unparks them only when this is not zero.
    sleepers: AtomicUsize,
    /// Set when the pool is dropped: the workers return.
    stop: AtomicBool,
    /// Held by the thread running a job on the pool; any other call (from another thread,
    /// or from inside a job) runs serially instead.
    busy: AtomicBool,
    /// The matrices of the last [`Exec::upcoming`].
    upcoming: Upcoming,
    /// Set inside [`Pool::profiled`]: the jobs add their times to `profile`.
    profiling: AtomicBool,
    profile: Counters,
}

/// Where a pool's threads spent the time of a [`Pool::profiled`] call, in nanoseconds. Of
/// its wall time, `job_ns` went to fork-joins and the rest to the caller's own work
/// (`unsplit_ns` of it in jobs too small to split), while the workers waited; within the jobs the
/// caller ran parts for `caller_ns` and waited at the joins for `join_ns` (the rest of
/// `job_ns` is publishing the job, waking parked workers and claiming parts), and
/// the workers ran parts for `worker_ns` between them. `caller_ns + worker_ns` is all
/// threads' time in parts, which a second thread should leave as it was on one (more is
/// the threads slowing each other down).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// Jobs split across the threads (fork-joins); jobs too small to split run on the
    /// caller and count as its own work.
    pub jobs: u64,
    /// Wall time from each job's fork to its join.
    pub job_ns: u64,
    /// The caller's time running parts.
    pub caller_ns: u64,
    /// The caller's time at the joins, its parts done, waiting for the workers'.
    pub join_ns: u64,
    /// The workers' time running parts, summed over the workers.
    pub worker_ns: u64,
    /// The caller's time in jobs too small to split (one part, or a pool without workers),
    /// a part of its own work.
    pub unsplit_ns: u64,
}

/// [`Profile`]'s counters, added to by every thread.
#[derive(Default)]
struct Counters {
    jobs: AtomicU64,
    job_ns: AtomicU64,
    caller_ns: AtomicU64,
    join_ns: AtomicU64,
    worker_ns: AtomicU64,
    unsplit_ns: AtomicU64,
}

impl Counters {
    /// The counts so far, then zero.
    fn take(&self) -> Profile {
        let take = |c: &AtomicU64| c.swap(0, Ordering::Relaxed);
        Profile {
            jobs: take(&self.jobs),
            job_ns: take(&self.job_ns),
            caller_ns: take(&self.caller_ns),
            join_ns: take(&self.join_ns),
            worker_ns: take(&self.worker_ns),
            unsplit_ns: take(&self.unsplit_ns),
        }
    }
}

/// Nanoseconds since `t`, saturated to 64 bits.
fn nanos_since(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Where the matrices of the last [`Exec::upcoming`] lie, published seqlock-style: the
/// hint is written by the thread holding [`Shared::busy`] and read by waiting workers,
/// which take a copy only when `seq` is even and unchanged across their reads. Addresses,
/// not borrows: a worker only ever prefetches them, which reads nothing and never faults,
/// so a hint may outlive its matrices.
#[derive(Default)]
struct Upcoming {
    /// Odd while `ranges` is being written; bumped before and after each write.
    seq: AtomicU32,
    /// `[address, bytes]` of each matrix, in the order the products read them.
    ranges: [[AtomicUsize; 2]; MAX_UPCOMING],
}

impl Upcoming {
    /// Replaces the hint by `ws` (the first [`MAX_UPCOMING`] of them). One writer at a time.
    fn publish(&self, ws: &[Matrix<'_>]) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // Orders the odd `seq` before the ranges: a reader that sees a new range sees it.
        fence(Ordering::Release);
        let mut ws = ws.iter();
        for [addr, len] in &self.ranges {
            let (a, n) = ws.next().map_or((0, 0), |w| (w.data.as_ptr() as usize, w.data.len()));
            addr.store(a, Ordering::Relaxed);
            len.store(n, Ordering::Relaxed);
        }
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }
}

/// A worker's progress through the hint it last took from [`Upcoming`].
#[derive(Default)]
struct Prefetch {
    /// The `seq` of the hint taken.
    seq: u32,
    ranges: [[usize; 2]; MAX_UPCOMING],
    /// The range being loaded, and the bytes of it done.
    at: usize,
    done: usize,
    /// Bytes of the hint still to load (at most [`UPCOMING_BYTES`]).
    left: usize,
}

impl Prefetch {
    /// Takes the newest hint if it changed, then prefetches its next [`PREFETCH_STEP`]
    /// bytes (fewer at a range's end), if any are left.
    fn step(&mut self, up: &Upcoming) {
        let seq = up.seq.load(Ordering::Acquire);
        if seq != self.seq && seq % 2 == 0 {
            let ranges = up.ranges.each_ref().map(|r| r.each_ref().map(|v| v.load(Ordering::Relaxed)));
            // Orders the reads of the ranges before the second look at `seq`.
            fence(Ordering::Acquire);
            if up.seq.load(Ordering::Relaxed) == seq {
                *self = Prefetch { seq, ranges, at: 0, done: 0, left: UPCOMING_BYTES };
            }
        }
        while self.left > 0 && self.at < MAX_UPCOMING {
            let [addr, len] = self.ranges[self.at];
            if self.done < len {
                let n = PREFETCH_STEP.min(len - self.done).min(self.left);
                kernels::prefetch_later(addr + self.done, n);
                (self.done, self.left) = (self.done + n, self.left - n);
                return;
            }
            (self.at, self.done) = (self.at + 1, 0);
        }
    }
}

/// A job lent to the workers: `f(part)` for every part.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync + 'a),
}

/// The job word: `generation << 32 | parts << 16 | next_part`. One atomic holds all three,
/// so claiming a part (a compare-and-swap) also proves it belongs to the job the claimer
/// saw, which keeps a late worker off the next job's closure. The generation wraps after
/// 2^32 jobs; a worker would have to stall across exactly that many to be confused.
#[derive(Clone, Copy)]
struct Word(u64);

/// Most parts a job can have (the width of the word's part fields).
const MAX_PARTS: usize = u16::MAX as usize;

impl Word {
    fn new(generation: u32, parts: usize) -> Word {
        debug_assert!(parts <= MAX_PARTS);
        Word((generation as u64) << 32 | (parts as u64) << 16)
    }
    fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
    fn parts(self) -> usize {
        (self.0 >> 16) as u16 as usize
    }
    fn next(self) -> usize {
        self.0 as u16 as usize
    }
}

impl Pool {
    /// A pool of `threads` threads, the caller included (1 = everything on the caller's
    /// thread, no workers).
    ///
    /// # Errors
    /// If the operating system refuses the threads.
    pub fn new(threads: usize) -> anyhow::Result<Self> {
        let shared = Arc::new(Shared {
            word: AtomicU64::new(Word::new(0, 0).0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            upcoming: Upcoming::default(),
            profiling: AtomicBool::new(false),
            profile: Counters::default(),
        });
        // Built in place, so the workers already started are stopped if one cannot be.
        let mut pool = Pool { shared, workers: Vec::new() };
        for i in 1..threads.max(1) {
            let shared = Arc::clone(&pool.shared);
            pool.workers.push(thread::Builder::new().name(format!("kvm-pool-{i}")).spawn(move || shared.work())?);
        }
        Ok(pool)
    }

    /// The number of threads, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f`, a job too small to split, on the calling thread alone (its time counted in
    /// [`Profile::unsplit_ns`] inside [`Pool::profiled`]).
    fn alone<R>(&self, f: impl FnOnce() -> R) -> R {
        let s = &*self.shared;
        let started = s.profiling.load(Ordering::Relaxed).then(Instant::now);
        let r = f();
        if let Some(t) = started {
            s.profile.unsplit_ns.fetch_add(nanos_since(t), Ordering::Relaxed);
        }
        r
    }

    /// Runs `f` (which runs jobs on this pool from this thread) and returns its result with
    /// where the pool's threads spent its time ([`Profile`]). Outside such a call the
    /// pool reads no clocks.
    pub fn profiled<R>(&self, f: impl FnOnce() -> R) -> (R, Profile) {
        let s = &*self.shared;
        s.profile.take();
        s.profiling.store(true, Ordering::Relaxed);
        let r = f();
        s.profiling.store(false, Ordering::Relaxed);
        // Every part added its time before it counted itself done, and the caller saw
        // every part of its last job done (acquire) before `f` returned.
        (r, s.profile.take())
    }

    /// Runs `f(part)` once for every part in `0..parts`, spread over the caller and the
    /// workers, and returns when all have finished. A panic in any part is raised again
    /// here, after every part has finished.
    fn run(&self, parts: usize, f: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        if self.workers.is_empty() || !(2..=MAX_PARTS).contains(&parts) {
            return self.alone(|| (0..parts).for_each(f));
        }
        // A job from inside a part (or another thread's) runs serially, in that part's time.
        if s.busy.swap(true, Ordering::Acquire) {
            return (0..parts).for_each(f);
        }
        // The fork (publishing the job, waking parked workers) counts as the job's.
        let forked = s.profiling.load(Ordering::Relaxed).then(Instant::now);
        let job = Job { f };
        // Published by the store of the word below (release), read after a claim (acquire).
        s.job.store((&job as *const Job<'_>).cast_mut().cast(), Ordering::Relaxed);
        // No part of the previous job is still counting: it returned only when all were done.
        s.done.store(0, Ordering::Relaxed);
        let generation = Word(s.word.load(Ordering::Relaxed)).generation().wrapping_add(1);
        // SeqCst pairs with the workers' announcement in `wait`: either this load sees a
        // worker about to park, or that worker's re-check sees this job.
        s.word.store(Word::new(generation, parts).0, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            self.workers.iter().for_each(|w| w.thread().unpark());
        }
        while let Some(p) = s.claim(generation) {
            // SAFETY: `p` was just claimed for the current job, which lives until this
            // function returns.
            unsafe { s.run_part(p, &s.profile.caller_ns) };
        }
        // The caller's parts are done; the rest is the join.
        let own = forked.map(|t| (t, Instant::now()));
        // Every part must finish before `job` (and what `f` borrows) goes out of scope.
        // Past the spin, a part is late because its thread lost its core: give ours away.
        let finished = || s.done.load(Ordering::Acquire) == parts;
        if !spin_for(finished) {
            while !finished() {
                thread::yield_now();
            }
        }
        if let Some((forked, own)) = own {
            s.profile.jobs.fetch_add(1, Ordering::Relaxed);
            s.profile.job_ns.fetch_add(nanos_since(forked), Ordering::Relaxed);
            s.profile.join_ns.fetch_add(nanos_since(own), Ordering::Relaxed);
        }
        let panic = s.panic.lock().unwrap_or_else(PoisonError::into_inner).take();
        s.busy.store(false, Ordering::Release);
        if let Some(payload) = panic {
            panic::resume_unwind(payload);
        }
    }
}

impl Shared {
    /// A worker's life: wait for a job, help with its parts, repeat until stopped.
    fn work(&self) {
        let (mut seen, mut prefetch) = (0, Prefetch::default());
        while let Some(generation) = self.wait(seen, &mut prefetch) {
            seen = generation;
            while let Some(p) = self.claim(generation) {
                // SAFETY: `p` was just claimed for the current job.
                unsafe { self.run_part(p, &self.profile.worker_ns) };
            }
        }
    }

    /// Waits for a job newer than generation `seen` and returns its generation, or `None`
    /// once the pool is stopped. Spins for [`SPIN`], loading the upcoming matrices
    /// meanwhile, then parks.
    fn wait(&self, seen: u32, prefetch: &mut Prefetch) -> Option<u32> {
        let news = |order| {
            if self.stop.load(order) {
                return Some(None);
            }
            let generation = Word(self.word.load(order)).generation();
            (generation != seen).then_some(Some(generation))
        };
        let mut found = None;
        if spin_for(|| {
            found = news(Ordering::Acquire);
            if found.is_none() {
                prefetch.step(&self.upcoming);
            }
            found.is_some()
        }) {
            return found.flatten();
        }
        loop {
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let found = news(Ordering::SeqCst);
            if found.is_none() {
                // An unpark that came before this park makes it return at once.
                thread::park();
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
            if let Some(found) = found.or_else(|| news(Ordering::Acquire)) {
                return found;
            }
        }
    }

    /// Claims the next unclaimed part of job `generation`, if that job is still the
    /// current one and has parts left.
    fn claim(&self, generation: u32) -> Option<usize> {
        let mut word = Word(self.word.load(Ordering::Relaxed));
        loop {
            if word.generation() != generation || word.next() >= word.parts() {
                return None;
            }
            // Acquire: the job pointer stored before this generation's word is visible.
            match self.word.compare_exchange_weak(word.0, word.0 + 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Some(word.next()),
                Err(now) => word = Word(now),
            }
        }
    }

    /// Runs part `p` of the current job, keeping a panic for the caller, and counts it done
    /// (adding its time to `spent` inside [`Pool::profiled`]).
    ///
    /// # Safety
    /// The calling thread claimed part `p` of the current job and has not run it yet.
    unsafe fn run_part(&self, p: usize, spent: &AtomicU64) {
        let started = self.profiling.load(Ordering::Relaxed).then(Instant::now);
        // SAFETY: the job's caller stored this pointer before publishing the job and waits
        // in `run` until every part, `p` included, is counted done; so the `Job` and what
        // its closure borrows are alive until the `done` increment below.
        let job = unsafe { &*self.job.load(Ordering::Relaxed).cast::<Job<'_>>() };
        if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| (job.f)(p))) {
            self.panic.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(payload);
        }
        if let Some(t) = started {
            spent.fetch_add(nanos_since(t), Ordering::Relaxed);
        }
        // Release: the part's writes (and its time) are visible to the caller once it sees
        // the count.
        self.done.fetch_add(1, Ordering::Release);
    }
}

/// Spins until `ready()` or for [`SPIN`], whichever comes first; returns `ready()`.
fn spin_for(mut ready: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    let mut spins = 0u32;
    loop {
        if ready() {
            return true;
        }
        spins = spins.wrapping_add(1);
        if spins % SPINS_PER_CLOCK == 0 && started.elapsed() > SPIN {
            return false;
        }
        hint::spin_loop();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for worker in self.workers.drain(..) {
            worker.thread().unpark();
            // A worker catches every job's panic, so it cannot have died of one.
            let _ = worker.join();
        }
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool").field("threads", &self.threads()).finish()
    }
}

/// The default thread count: the cores the process may run on.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// A mutable slice lent to the parts of a job, each part borrowing its own pieces.
struct Disjoint<'a, T> {
    ptr: *mut T,
    len: usize,
    _slice: PhantomData<&'a mut [T]>,
}

// SAFETY: a `Disjoint` only hands out non-overlapping `&mut` pieces (the contract of
// `piece`), and sending those to other threads is sound when `T` is `Send`.
unsafe impl<T: Send> Sync for Disjoint<'_, T> {}

impl<'a, T> Disjoint<'a, T> {
    fn new(slice: &'a mut [T]) -> Self {
        Disjoint { ptr: slice.as_mut_ptr(), len: slice.len(), _slice: PhantomData }
    }

    /// `slice[start..start + len]`.
    ///
    /// # Safety
    /// No two pieces alive at the same time overlap.
    #[allow(clippy::mut_from_ref)]
    unsafe fn piece(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start <= self.len && len <= self.len - start, "piece out of bounds");
        // SAFETY: in bounds (checked above) of a slice borrowed mutably for 'a, and not
        // overlapping any other live piece (the caller's promise).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// Runs `f` with this thread's kernel scratch grown to `len` bytes, or returns `None`,
/// the scratch unchanged, when the system refuses the memory ([`arena::zeroed`]'s
/// `OutOfMemory`): [`Exec`]'s products return no error, so the caller falls back to
/// computing serially in the scratch it was given.
fn with_act<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
    ACT.with(|a| {
        let mut a = a.borrow_mut();
        if a.len() < len {
            *a = arena::zeroed(len).ok()?;
        }
        Some(f(&mut a[..len]))
    })
}

// SAFETY: `heads` runs `f` once for each head: `run` hands each part's index to one
// thread once (a claim takes it for good), or runs the parts in order itself.
unsafe impl Exec for Pool {
    fn heads(&self, outs: &mut [f32], out_len: usize, scratch: &mut [f32], scratch_len: usize, f: &HeadFn<'_>) {
        // A head reads about `scratch_len` keys and values of `out_len` floats each;
        // below a few thousand multiply-adds per head a hand-off costs more.
        if self.workers.is_empty() || scratch_len * out_len < MIN_MULADDS_PER_THREAD / 4 {
            return self.alone(|| Serial.heads(outs, out_len, scratch, scratch_len, f));
        }
        let heads = (outs.len() / out_len).min(scratch.len() / scratch_len);
        let (outs, scratch) = (Disjoint::new(outs), Disjoint::new(scratch));
        self.run(heads, &|h| {
            // SAFETY: `run` runs each head once, and heads' pieces do not overlap.
            let (out, s) = unsafe { (outs.piece(h * out_len, out_len), scratch.piece(h * scratch_len, scratch_len)) };
            f(h, out, s);
        });
    }

    fn matmuls(&self, xs: &[f32], products: &mut [Product<'_, '_>], act: &mut [u8]) {
        if products.len() > MAX_PRODUCTS {
            return products.chunks_mut(MAX_PRODUCTS).for_each(|some| self.matmuls(xs, some, act));
        }
        let rows: usize = products.iter().map(|p| p.w.rows).sum();
        let parts = self.threads().min(rows * xs.len() / MIN_MULADDS_PER_THREAD);
        if parts >= 2 {
            if let Some(shared) = Product::shared_input(xs, products, act) {
                return self.matvecs(xs, shared, products);
            }
            // Several tokens: each product split on its own.
            if products.iter().all(|p| xs.len() > p.w.cols) {
                return products.iter_mut().for_each(|p| self.matmul(&p.w, xs, p.y, act));
            }
        }
        self.alone(|| Serial.matmuls(xs, products, act))
    }

    fn upcoming(&self, ws: &[Matrix<'_>]) {
        let s = &*self.shared;
        // `busy` makes this thread the hint's only writer; a call that cannot have it
        // (another thread's, or one from inside a job) is dropped.
        if self.workers.is_empty() || s.busy.swap(true, Ordering::Acquire) {
            return;
        }
        s.upcoming.publish(ws);
        s.busy.store(false, Ordering::Release);
    }

    fn pieces(&self, out: &mut [f32], piece: usize, f: &PieceFn<'_>) {
        let (len, piece) = (out.len(), piece.max(1));
        let out = Disjoint::new(out);
        self.run(len.div_ceil(piece), &|i| {
            // SAFETY: `run` runs each piece once, and pieces do not overlap.
            f(i, unsafe { out.piece(i * piece, piece.min(len - i * piece)) });
        });
    }

    fn matmul(&self, w: &Matrix<'_>, xs: &[f32], ys: &mut [f32], act: &mut [u8]) {
        if xs.len() == w.cols {
            return self.matmuls(xs, &mut [Product { w: *w, y: ys }], act);
        }
        // A batch's multiply-adds, as `matmuls` counts them: a narrow matrix over many
        // tokens is worth splitting too.
        let parts = self.threads().min(w.rows * xs.len() / MIN_MULADDS_PER_THREAD).min(w.rows);
        if parts < 2 {
            return self.alone(|| Serial.matmul(w, xs, ys, act));
        }
        let (rows, n) = (w.rows, xs.len() / w.cols);
        // Parts split between row groups of interleaved dtypes.
        let per = rows.div_ceil(parts).next_multiple_of(w.dtype.group_rows());
        let need = kernels::matmul_scratch_len(w.cols, n);
        // Set by a part whose thread could not grow its scratch (out of memory).
        let short = AtomicBool::new(false);
        let out = Disjoint::new(&mut *ys);
        // Part `p` computes output rows `p * per..`, for every token.
        self.run(rows.div_ceil(per), &|p| {
            let (r0, r1) = (p * per, ((p + 1) * per).min(rows));
            let part = w.row_range(r0, r1);
            let done = with_act(need, |a| {
                if n == 1 {
                    // SAFETY: `run` runs each part once, and parts' rows do not overlap.
                    kernels::matvec(&part, xs, unsafe { out.piece(r0, r1 - r0) }, a);
                    return Some(());
                }
                // y is [n, rows]: the kernel fills an [n, r1 - r0] block, copied into
                // this part's columns of every token's row.
                BLOCK.with(|b| {
                    let mut b = b.borrow_mut();
                    if b.len() < n * (r1 - r0) {
                        *b = arena::zeroed(n * (r1 - r0)).ok()?;
                    }
                    let block = &mut b[..n * (r1 - r0)];
                    kernels::matmul(&part, xs, block, a);
                    for (t, row) in block.chunks_exact(r1 - r0).enumerate() {
                        // SAFETY: as above; parts write disjoint columns of each row.
                        unsafe { out.piece(t * rows + r0, r1 - r0) }.copy_from_slice(row);
                    }
                    Some(())
                })
            });
            if done.flatten().is_none() {
                short.store(true, Ordering::Relaxed);
            }
        });
        // `run` has joined every part. The serial product needs only `act` and gives the
        // same bits, so a part left undone costs time, not an abort or a wrong result.
        if short.into_inner() {
            Serial.matmul(w, xs, ys, act);
        }
    }
}

/// Most products [`Exec::matmuls`] on the pool splits as one job (more go in several).
const MAX_PRODUCTS: usize = 8;

impl Pool {
    /// One token's products of [`Exec::matmuls`], their input `x` prepared in `act`, as
    /// one job: the products' rows, taken end to end, cut into [`shrinking`] parts so the
    /// threads finish together even when one of them reads slower.
    fn matvecs(&self, x: &[f32], act: &[u8], products: &mut [Product<'_, '_>]) {
        // Part `p` takes rows `[bounds[p], bounds[p + 1])` of all the products' `rows`
        // rows end to end.
        let mut products = products.iter_mut();
        let mut rows = 0;
        let split: [Option<Slice<'_, '_>>; MAX_PRODUCTS] = std::array::from_fn(|_| {
            products.next().map(|p| {
                rows += p.w.rows;
                Slice {
                    w: p.w,
                    start: rows - p.w.rows,
                    tile: kernels::matvec_rows(p.w.dtype),
                    y: Disjoint::new(&mut *p.y),
                }
            })
        });
        let (bounds, parts) = shrinking(rows, self.threads(), MIN_MULADDS_PER_THREAD / x.len().max(1));
        self.run(parts, &|p| {
            for Slice { w, start, tile, y } in split.iter().flatten() {
                let bound = |b: usize| {
                    let r = bounds[b].clamp(*start, start + w.rows) - start;
                    r.next_multiple_of(*tile).min(w.rows)
                };
                let (r0, r1) = (bound(p), bound(p + 1));
                if r0 < r1 {
                    // SAFETY: `run` runs each part once, and parts' rows do not overlap.
                    kernels::matvec_prepared(&w.row_range(r0, r1), x, act, unsafe { y.piece(r0, r1 - r0) });
                }
            }
        });
    }
}

/// One product of [`Pool::matvecs`]: its rows start at `start` of the job's rows end to
/// end, and parts cut it every `tile` rows, where the kernel's tiles are.
struct Slice<'w, 'y> {
    w: Matrix<'w>,
    start: usize,
    tile: usize,
    y: Disjoint<'y, f32>,
}

/// Most parts [`shrinking`] cuts a job into: the smallest is a 64th of the job (340 KB of
/// paper-120m's q4_0 output head), short enough for the caller to wait out at the end.
const MAX_SHRINKING: usize = 64;

/// Cuts `total` rows into parts for `threads` threads that shrink as the job goes on
/// (guided self-scheduling): each part takes `1 / (2 * threads)` of the rows left, but at
/// least `1 / MAX_SHRINKING` of all of them and `least` rows (each claim moves a cache
/// line between cores, so a part must outweigh it). Threads claim parts in order, so whichever
/// thread runs slower claims fewer of them, and the last parts are small: the threads
/// finish within one small part of each other instead of one waiting out the other's
/// half. Returns the boundaries (`bounds[p]..bounds[p + 1]` is part `p`) and the count.
fn shrinking(total: usize, threads: usize, least: usize) -> ([usize; MAX_SHRINKING + 1], usize) {
    let mut bounds = [total; MAX_SHRINKING + 1];
    let least = total.div_ceil(MAX_SHRINKING).max(least).max(1);
    let (mut at, mut parts) = (0, 0);
    while at < total {
        bounds[parts] = at;
        at += ((total - at) / (2 * threads)).max(least).min(total - at);
        parts += 1;
    }
    (bounds, parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_core::quant::{quantize_matrix, DType};

    fn matrix_bytes(dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
        let src: Vec<f32> =
            (0..rows * cols).map(|i| ((i / cols * 31 + i % cols * 17) % 97) as f32 / 97.0 - 0.5).collect();
        let mut out = vec![0u8; dtype.matrix_bytes(rows, cols).unwrap()];
        quantize_matrix(dtype, cols, &src, &mut out).unwrap();
        out
    }

    /// Runs a job of `parts` parts and returns how many times each part ran.
    fn runs_per_part(pool: &Pool, parts: usize) -> Vec<usize> {
        let counts: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
        pool.run(parts, &|p| {
            counts[p].fetch_add(1, Ordering::Relaxed);
        });
        counts.into_iter().map(AtomicUsize::into_inner).collect()
    }

    #[test]
    fn shrinking_parts_cover_the_rows_once_and_shrink() {
        for threads in 1..=4 {
            for total in [0, 1, 2, 15, 16, 17, 100, 768, 2304, 50304] {
                for least in [1, 85, 100_000] {
                    let what = format!("{total} rows, {threads} threads, parts of {least} or more");
                    let (bounds, parts) = shrinking(total, threads, least);
                    assert!(parts <= MAX_SHRINKING, "{what}: {parts} parts");
                    assert_eq!((bounds[0], bounds[parts]), (0, total), "{what}");
                    let sizes: Vec<usize> = bounds[..=parts].windows(2).map(|b| b[1] - b[0]).collect();
                    assert!(sizes.iter().all(|&s| s > 0), "{what}: {sizes:?}");
                    assert!(sizes.windows(2).all(|s| s[0] >= s[1]), "{what}: {sizes:?}");
                    let floor = least.max(total.div_ceil(MAX_SHRINKING));
                    assert!(sizes.iter().rev().skip(1).all(|&s| s >= floor), "{what}: {sizes:?}");
                    if total >= 100 && least == 1 {
                        // The first part is a 1 / (2 * threads) share, the last ones small.
                        assert_eq!(sizes[0], total / (2 * threads), "{what}");
                        assert!(*sizes.last().unwrap() <= total.div_ceil(MAX_SHRINKING), "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn split_products_equal_serial_ones_exactly() {
        let pool = Pool::new(3).unwrap();
        for dtype in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_0x16, DType::Q8_0x16] {
            // Three parts of 334 rows, or of 336 (whole groups of 16) for interleaved dtypes;
            // float weights over 8 tokens or more in the batch kernel.
            let (rows, cols) = (1000usize.next_multiple_of(dtype.group_rows()), 256);
            let data = matrix_bytes(dtype, rows, cols);
            let w = Matrix::new(dtype, rows, cols, &data).unwrap();
            for n in [1, 5, 8, 17, 66] {
                let xs: Vec<f32> = (0..n * cols).map(|i| (i % 13) as f32 / 13.0 - 0.4).collect();
                let mut act = vec![0u8; kernels::matmul_scratch_len(cols, n)];
                let (mut serial, mut split) = (vec![0f32; n * rows], vec![0f32; n * rows]);
                Serial.matmul(&w, &xs, &mut serial, &mut act);
                // A hint, which the waiting workers load, changes nothing.
                pool.upcoming(&[w, w]);
                pool.matmul(&w, &xs, &mut split, &mut act);
                assert_eq!(serial, split, "{} n={n}", dtype.name());
            }
        }
    }

    #[test]
    fn one_job_of_several_products_equals_them_one_by_one() {
        // Interleaved groups, row-major rows of odd counts and floats, all reading one
        // input; up to one more product than a job takes.
        let cols = 256;
        let shapes =
            [(DType::Q8_0x16, 768), (DType::Q8_0, 6), (DType::Q4_0x16, 512), (DType::F32, 100), (DType::Q4_0, 333)];
        let data: Vec<(DType, usize, Vec<u8>)> = (0..=MAX_PRODUCTS)
            .map(|i| {
                let (dtype, rows) = shapes[i % shapes.len()];
                (dtype, rows, matrix_bytes(dtype, rows, cols))
            })
            .collect();
        let ws: Vec<Matrix<'_>> = data.iter().map(|(d, r, b)| Matrix::new(*d, *r, cols, b).unwrap()).collect();
        for threads in [2, 3] {
            let pool = Pool::new(threads).unwrap();
            for count in 1..=ws.len() {
                for n in [1, 3] {
                    let xs: Vec<f32> = (0..n * cols).map(|i| (i % 11) as f32 / 11.0 - 0.45).collect();
                    let mut act = vec![0u8; kernels::matmul_scratch_len(cols, n)];
                    let one_by_one: Vec<Vec<f32>> = ws[..count]
                        .iter()
                        .map(|w| {
                            let mut y = vec![0f32; n * w.rows];
                            Serial.matmul(w, &xs, &mut y, &mut act);
                            y
                        })
                        .collect();
                    for exec in [&pool as &dyn Exec, &Serial] {
                        let mut ys: Vec<Vec<f32>> = ws[..count].iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
                        let mut products: Vec<Product<'_, '_>> =
                            ws.iter().zip(&mut ys).map(|(w, y)| Product { w: *w, y }).collect();
                        exec.matmuls(&xs, &mut products, &mut act);
                        assert_eq!(ys, one_by_one, "threads={threads} products={count} n={n}");
                    }
                }
            }
        }
    }

    /// Scratch too short for the quantized input: a debug build stops at it, a release
    /// build writes nothing (and neither loops between `matmul` and `matmuls`).
    #[test]
    fn a_short_scratch_is_refused_not_overrun() {
        let pool = Pool::new(2).unwrap();
        let (rows, cols) = (512, 256);
        let data = matrix_bytes(DType::Q8_0x16, rows, cols);
        let w = Matrix::new(DType::Q8_0x16, rows, cols, &data).unwrap();
        let x = vec![0.5f32; cols];
        let mut act = vec![0u8; kernels::act_scratch_len(cols) - 1];
        let mut y = vec![f32::NAN; rows];
        let run = panic::catch_unwind(AssertUnwindSafe(|| pool.matmul(&w, &x, &mut y, &mut act)));
        assert_eq!(run.is_err(), cfg!(debug_assertions));
        assert!(y.iter().all(|v| v.is_nan()));
    }

    /// A thread's scratch grows through the arena's fallible path: memory the system
    /// refuses is `None` (the product then runs serially) and leaves the scratch it had.
    #[test]
    fn scratch_the_system_refuses_is_reported_and_the_old_one_kept() {
        assert_eq!(with_act(16, |a| a.len()), Some(16));
        assert_eq!(with_act(usize::MAX, |a| a.len()), None);
        assert_eq!(with_act(8, |a| a.len()), Some(8));
        ACT.with(|a| assert_eq!(a.borrow().len(), 16));
    }

    #[test]
    fn a_hint_is_loaded_in_order_up_to_its_budget_and_a_new_one_restarts() {
        let up = Upcoming::default();
        // 5000 bytes, then 3 MiB, of f32 weights.
        let (small, big) = (vec![0u8; 5000], vec![0u8; 3 << 20]);
        let small = Matrix::new(DType::F32, 1, 1250, &small).unwrap();
        let big = Matrix::new(DType::F32, 3 << 18, 1, &big).unwrap();
        up.publish(&[small, big]);
        let mut p = Prefetch::default();
        // Step by step: all of `small`, then `big` until the budget is spent.
        let mut loaded = vec![];
        loop {
            let left = p.left;
            p.step(&up);
            if p.left == left {
                break;
            }
            loaded.push((p.at, p.done));
        }
        assert_eq!(p.left, 0);
        assert_eq!(loaded[0], (0, PREFETCH_STEP));
        assert!(loaded.contains(&(0, small.data.len())), "{:?}", &loaded[..3]);
        assert_eq!(*loaded.last().unwrap(), (1, UPCOMING_BYTES - small.data.len()));
        // A new hint (here naming fewer matrices) restarts from its first byte.
        up.publish(&[big]);
        p.step(&up);
        assert_eq!((p.at, p.done, p.left), (0, PREFETCH_STEP, UPCOMING_BYTES - PREFETCH_STEP));
        assert_eq!(p.ranges[1], [0, 0]);
    }

    #[test]
    fn a_profile_counts_its_jobs_parts_and_joins_and_nothing_outside() {
        let pool = Pool::new(2).unwrap();
        let ((), idle) = pool.profiled(|| ());
        assert_eq!(idle, Profile::default());
        // Four parts of 2 ms: 8 ms of parts, and at least 4 ms of job on two threads.
        let ((), p) = pool.profiled(|| pool.run(4, &|_| thread::sleep(Duration::from_millis(2))));
        assert_eq!((p.jobs, p.unsplit_ns), (1, 0));
        assert!(p.caller_ns + p.worker_ns >= 8_000_000, "{p:?}");
        assert!(p.job_ns >= 4_000_000 && p.caller_ns + p.join_ns <= p.job_ns, "{p:?}");
        pool.run(4, &|_| thread::sleep(Duration::from_millis(1)));
        let ((), after) = pool.profiled(|| ());
        assert_eq!(after, Profile::default(), "a job outside a profile counted");
        // One thread splits nothing: its jobs are the caller's own work, run alone.
        let one = Pool::new(1).unwrap();
        let ((), p) = one.profiled(|| one.run(4, &|_| thread::sleep(Duration::from_millis(1))));
        assert!(p.unsplit_ns >= 4_000_000, "{p:?}");
        assert_eq!(Profile { unsplit_ns: 0, ..p }, Profile::default());
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

    #[test]
    fn pieces_cover_the_output_once_each_the_last_one_short() {
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads).unwrap();
            for (len, piece) in [(0, 4), (3, 4), (4, 4), (17, 4), (100, 7), (5, 0)] {
                let mut out = vec![0f32; len];
                pool.pieces(&mut out, piece, &|i, p| {
                    assert!(!p.is_empty() && p.len() <= piece.max(1));
                    p.iter_mut().for_each(|v| *v += i as f32 + 1.0);
                });
                let want: Vec<f32> = (0..len).map(|j| (j / piece.max(1)) as f32 + 1.0).collect();
                assert_eq!(out, want, "threads={threads} len={len} piece={piece}");
            }
        }
    }

    #[test]
    fn every_part_runs_exactly_once_for_any_part_count() {
        for threads in [1, 2, 3, 4] {
            let pool = Pool::new(threads).unwrap();
            assert_eq!(pool.threads(), threads);
            for parts in [0, 1, 2, 3, 5, 8, 17, 100] {
                assert_eq!(runs_per_part(&pool, parts), vec![1; parts], "threads={threads} parts={parts}");
            }
        }
    }

    #[test]
    fn many_consecutive_jobs_see_each_others_writes() {
        let pool = Pool::new(3).unwrap();
        let mut v = vec![0u64; 12];
        for round in 0..20_000u64 {
            let pieces = Disjoint::new(&mut v);
            pool.run(12, &|p| {
                // SAFETY: each part takes its own element.
                let x = unsafe { pieces.piece(p, 1) };
                assert_eq!(x[0], round, "part {p} missed a write of the previous job");
                x[0] += 1;
            });
        }
        assert_eq!(v, vec![20_000; 12]);
    }

    #[test]
    fn both_threads_take_part_when_a_part_waits_for_another() {
        // Part 0 cannot finish until part 1 has started, so a second thread must run it.
        let pool = Pool::new(2).unwrap();
        for _ in 0..100 {
            let started = AtomicUsize::new(0);
            pool.run(2, &|_| {
                started.fetch_add(1, Ordering::SeqCst);
                let t = Instant::now();
                while started.load(Ordering::SeqCst) < 2 {
                    assert!(t.elapsed() < Duration::from_secs(10), "no second thread joined the job");
                    hint::spin_loop();
                }
            });
        }
    }

    #[test]
    fn parked_workers_wake_for_a_job_and_drop_joins_them() {
        let pool = Pool::new(3).unwrap();
        assert_eq!(runs_per_part(&pool, 4), vec![1; 4]);
        // Long past the spin: the workers are parked.
        thread::sleep(SPIN * 50);
        assert!(pool.shared.sleepers.load(Ordering::SeqCst) > 0);
        assert_eq!(runs_per_part(&pool, 4), vec![1; 4]);
        thread::sleep(SPIN * 50);
        drop(pool);
        // Dropped without ever running a job, workers still spinning.
        drop(Pool::new(4).unwrap());
    }

    #[test]
    fn a_panicking_part_panics_on_the_caller_after_all_parts_finish() {
        let pool = Pool::new(3).unwrap();
        for bad in [0, 5] {
            let finished = AtomicUsize::new(0);
            let caught = panic::catch_unwind(AssertUnwindSafe(|| {
                pool.run(6, &|p| {
                    if p == bad {
                        panic!("part {p} failed");
                    }
                    thread::sleep(Duration::from_millis(2));
                    finished.fetch_add(1, Ordering::SeqCst);
                })
            }));
            let payload = caught.expect_err("the panic was lost");
            assert_eq!(
                payload.downcast_ref::<String>().map(String::as_str),
                Some(format!("part {bad} failed").as_str())
            );
            assert_eq!(finished.load(Ordering::SeqCst), 5);
        }
        // The pool still works.
        assert_eq!(runs_per_part(&pool, 7), vec![1; 7]);
    }

    #[test]
    fn nested_and_concurrent_jobs_run_serially_instead_of_clashing() {
        let pool = Pool::new(2).unwrap();
        let inner = AtomicUsize::new(0);
        pool.run(3, &|_| {
            pool.run(4, &|_| {
                inner.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(inner.load(Ordering::Relaxed), 12);
        thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for parts in 0..200 {
                        assert_eq!(runs_per_part(&pool, parts % 9), vec![1; parts % 9]);
                    }
                });
            }
        });
    }
}

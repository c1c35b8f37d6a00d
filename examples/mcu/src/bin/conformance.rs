//! Kernel conformance on the board: every kernel of the tier this firmware was built with
//! ([`kvm_core::kernels::tier::COMPILED`]: `dsp` on an386 and an505, `helium` on an547,
//! `scalar` on an385, riscv32 and riscv32imc) against the scalar oracle, and the scalar
//! oracle against the straightforward reference computations written out here from the
//! kernels' documented contracts (exact integer block sums scaled by `d_w * d_a` into 8
//! accumulators, dots in 16 lanes, weighted sums in row order, ...), bit for bit. The
//! second comparison keeps the run meaningful where the compiled tier is scalar itself.
//!
//! Host tests cannot run a microcontroller tier's instructions; this firmware does, under
//! QEMU or on hardware, on deterministic data: every integer layout (q8_0, q4_0, q8_0x16,
//! q4_0x16) from 1 to 17 blocks, odd row counts, one token and several (with the activation
//! scratch holding one token or all of them); scales from the largest f16 to subnormals and
//! zeros of both signs; quants at both ends (q8_0's -128 and 127, q4_0's nibbles 0 and 15)
//! and zero blocks; activation blocks that quantize to +-127, to a zero scale, or to scales
//! small enough for subnormal products; weights at an odd address; the float formats
//! (which the microcontroller tiers leave to scalar); attention's dot products and weighted
//! sums over f32, f16 and i8 rows; the activation quantizer; softmax's maximum, argmax and
//! exponentials; f16 narrowing; the integer numerics' product (`matvec_i8`, the assembly
//! tiles of ARMv6-M and RV32 included) against exact sums.
//!
//! Output over semihosting: `kvm-conformance: tier <name>`, one line per mismatch (the
//! first few of each kind), then `kvm-conformance: <n> checks, <m> mismatches` and the time
//! and stack taken. Exit code 0 when all match, 1 on any mismatch, 101 on a panic, 102 on a
//! hard fault.
#![no_std]
#![no_main]

use core::fmt;

use half::f16;
use kvm_core::kernels::{self, Tier};
use kvm_core::quant::{DType, QK, X16};
use kvm_core::tensor::Matrix;
use semihosting::println;

#[cfg_attr(target_arch = "arm", path = "../arch/arm.rs")]
#[cfg_attr(target_arch = "riscv32", path = "../arch/riscv.rs")]
mod arch;

/// The largest shapes checked: 80 rows (5 groups of 16), 17 blocks, 5 tokens.
const MAX_ROWS: usize = 80;
const MAX_BLOCKS: usize = 17;
const MAX_COLS: usize = MAX_BLOCKS * QK;
const MAX_TOKENS: usize = 5;
/// Mismatches printed per kind of check before the rest are only counted.
const SHOWN: u32 = 3;
/// Bytes of the largest matrix (f32 weights), plus one to copy it to an odd address.
const W_LEN: usize = MAX_ROWS * MAX_COLS * 4 + 1;
/// Elements of the largest attention run (`[n, d]`).
const ROWS_LEN: usize = 32 * 127;

/// Block counts: 1, 3, 7 and 9 around the 8 accumulators of the canonical block sum, 17 past
/// two of them.
const BLOCKS: [usize; 7] = [1, 3, 5, 7, 8, 9, 17];
/// Row counts of the plain layouts (interleaved ones take whole groups of 16).
const ROWS: [usize; 8] = [1, 2, 3, 4, 5, 7, 9, 17];
const GROUPS: [usize; 4] = [1, 2, 3, 5];
const TOKENS: [usize; 4] = [1, 2, 3, 5];

/// f16 scales: the largest, the smallest subnormal, the largest subnormal, 1, -1, +0, -0,
/// and an ordinary one.
const SCALES: [u16; 8] = [0x7bff, 0x0001, 0x03ff, 0x3c00, 0xbc00, 0x0000, 0x8000, 0x2e66];

/// Scratch, in `.bss`: activations, the three sets of outputs, attention rows.
struct Scratch {
    x: [f32; MAX_TOKENS * MAX_COLS],
    act: [u8; MAX_TOKENS * kernels::act_scratch_len(MAX_COLS)],
    got: [f32; MAX_TOKENS * MAX_ROWS],
    want: [f32; MAX_TOKENS * MAX_ROWS],
    reference: [f32; MAX_TOKENS * MAX_ROWS],
    rows32: [f32; ROWS_LEN],
    rows16: [f16; ROWS_LEN],
    rows8: [i8; ROWS_LEN],
    /// Attention rows widened to f32, for the reference.
    wide: [f32; ROWS_LEN],
}

/// The weights (apart from [`Scratch`], which the checks write while a matrix borrows them).
static mut W: [u8; W_LEN] = [0; W_LEN];
static mut BUF: Scratch = Scratch {
    x: [0.0; MAX_TOKENS * MAX_COLS],
    act: [0; MAX_TOKENS * kernels::act_scratch_len(MAX_COLS)],
    got: [0.0; MAX_TOKENS * MAX_ROWS],
    want: [0.0; MAX_TOKENS * MAX_ROWS],
    reference: [0.0; MAX_TOKENS * MAX_ROWS],
    rows32: [0.0; ROWS_LEN],
    rows16: [f16::ZERO; ROWS_LEN],
    rows8: [0; ROWS_LEN],
    wide: [0.0; ROWS_LEN],
};

#[cfg_attr(target_arch = "arm", cortex_m_rt::entry)]
#[cfg_attr(target_arch = "riscv32", riscv_rt::entry)]
fn main() -> ! {
    arch::init();
    let (w, buf) = (&raw mut W, &raw mut BUF);
    // SAFETY: `main` runs once and never returns, and nothing else names `W` or `BUF`: these
    // are the only references to them.
    let (w, buf) = unsafe { (&mut *w, &mut *buf) };
    // The tier the kernels dispatch on (the compiled one: nothing has forced another yet).
    let tier = kernels::tier();
    println!("kvm-conformance: tier {tier}");
    let t0 = arch::ticks();
    let mut c = Checks::default();
    for dtype in [DType::Q8_0, DType::Q4_0, DType::Q8_0x16, DType::Q4_0x16, DType::F32, DType::F16, DType::BF16] {
        products(&mut c, w, buf, dtype);
    }
    extremes(&mut c, w, buf);
    integer_products(&mut c, w);
    attention(&mut c, buf);
    elementwise(&mut c, buf);
    let ticks = arch::ticks() - t0;
    println!("kvm-conformance: {} checks, {} mismatches", c.checks, c.mismatches);
    let (bottom, top) = arch::stack_region();
    // SAFETY: the stack region is word-aligned RAM the linker script reserves.
    let used = unsafe { kvm_board_app::stack::used(bottom, top) };
    println!("kvm-conformance: {ticks} ticks, stack used {used} of {} bytes", top - bottom);
    semihosting::process::exit(if c.mismatches == 0 { 0 } else { 1 })
}

/// Counts of checks and mismatches.
#[derive(Default)]
struct Checks {
    checks: u32,
    mismatches: u32,
    shown: u32,
    kind: &'static str,
}

impl Checks {
    /// Starts a kind of check (its mismatches are shown up to [`SHOWN`] times).
    fn kind(&mut self, kind: &'static str) {
        self.kind = kind;
        self.shown = 0;
    }

    /// One check: `ok`, else a mismatch described by `what`.
    fn expect(&mut self, ok: bool, what: impl fmt::Display) {
        self.checks += 1;
        if !ok {
            self.mismatches += 1;
            if self.shown < SHOWN {
                self.shown += 1;
                println!("kvm-conformance: MISMATCH {}: {}", self.kind, what);
            }
        }
    }

    /// Compares the bits of `got` with those of `want` (`by`: what computed `want`).
    fn bits(&mut self, got: &[f32], want: &[f32], by: &str, what: impl fmt::Display) {
        let bad = got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits());
        let bad = bad.or((got.len() != want.len()).then_some(0));
        let (i, g, w) = match bad {
            Some(i) => (i, got.get(i).copied().unwrap_or(f32::NAN), want.get(i).copied().unwrap_or(f32::NAN)),
            None => (0, 0.0, 0.0),
        };
        self.expect(
            bad.is_none(),
            format_args!("{what}: [{i}] {g:e} ({:#010x}) != {by} {w:e} ({:#010x})", g.to_bits(), w.to_bits()),
        );
    }

    /// The tier against scalar (`want`), then scalar against the reference.
    fn both(&mut self, got: &[f32], want: &[f32], reference: &[f32], what: impl fmt::Display + Copy) {
        self.bits(got, want, "scalar", what);
        self.bits(want, reference, "reference", what);
    }
}

/// Runs `f` with the scalar tier active, then switches back to the tier that was.
fn scalar<R>(f: impl FnOnce() -> R) -> R {
    let before = kernels::tier();
    // SAFETY: scalar runs on every CPU.
    unsafe { kernels::force_tier(Tier::Scalar) };
    let r = f();
    // SAFETY: `before` was active, so this CPU has its features (`tier`'s invariant).
    unsafe { kernels::force_tier(before) };
    r
}

/// A deterministic xorshift32 stream.
struct Rng(u32);

impl Rng {
    fn new(seed: u32) -> Rng {
        Rng(seed.wrapping_mul(2_654_435_761) | 1)
    }

    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }

    /// Uniform in `[-1, 1)`.
    fn unit(&mut self) -> f32 {
        (self.next() >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    }

    /// [`Rng::unit`], with an outlier 8 times larger every 37th, as real activations have.
    fn value(&mut self, i: usize) -> f32 {
        let u = self.unit();
        if i % 37 == 5 {
            8.0 * u
        } else {
            u
        }
    }
}

/// A finite f16's bits (an infinity or NaN exponent loses its top bit).
fn finite(h: u16) -> u16 {
    if h & 0x7c00 == 0x7c00 {
        h & 0xbfff
    } else {
        h
    }
}

/// Fills `w` with a `dtype` matrix. Integer layouts: random quants and, at the layout's
/// scale bytes, every third scale from [`SCALES`] and the rest random normal f16s of both
/// signs, with whole blocks of zeros, of a random mix of both extremes and of the low
/// extreme. Float layouts: random finite values.
fn weights(dtype: DType, w: &mut [u8], seed: u32) {
    let mut rng = Rng::new(seed);
    match dtype {
        DType::F32 => {
            for (i, v) in w.chunks_exact_mut(4).enumerate() {
                v.copy_from_slice(&rng.value(i).to_le_bytes());
            }
            return;
        }
        DType::F16 | DType::BF16 => {
            for v in w.chunks_exact_mut(2) {
                v.copy_from_slice(&finite(rng.next() as u16 & 0xbfff).to_le_bytes());
            }
            return;
        }
        _ => w.iter_mut().for_each(|b| *b = (rng.next() >> 11) as u8),
    }
    let scale = |rng: &mut Rng, i: usize| -> [u8; 2] {
        let r = rng.next() as u16;
        let d = if i.is_multiple_of(3) { SCALES[usize::from(r % 8)] } else { (r & 0x8000) | 0x2000 | (r & 0x1fff) };
        d.to_le_bytes()
    };
    let extremes: [u8; 2] = if dtype.plain() == DType::Q8_0 { [0x80, 0x7f] } else { [0x00, 0xff] };
    let quants = |i: usize, qs: &mut [u8], rng: &mut Rng| match i % 5 {
        0 => qs.fill(0),
        1 => qs.iter_mut().for_each(|q| *q = extremes[(rng.next() % 2) as usize]),
        2 => qs.fill(extremes[0]),
        _ => {}
    };
    let bb = dtype.block_bytes();
    if dtype.group_rows() == 1 {
        for (i, block) in w.chunks_exact_mut(bb).enumerate() {
            block[..2].copy_from_slice(&scale(&mut rng, i));
            quants(i, &mut block[2..], &mut rng);
        }
    } else {
        for (i, group) in w.chunks_exact_mut(bb * X16).enumerate() {
            for r in 0..X16 {
                group[2 * r..2 * r + 2].copy_from_slice(&scale(&mut rng, i * X16 + r));
            }
            quants(i, &mut group[2 * X16..], &mut rng);
        }
    }
}

/// Activations `[n, cols]`: ordinary values with outliers, and by turns blocks that
/// quantize to +-127 (all +-1), zero blocks, blocks below the quantizer's threshold (scale
/// 0), blocks of about 1e-29 (scales near 1e-31, whose products with subnormal f16 scales
/// are subnormal f32s) and large ones.
fn activations(x: &mut [f32], cols: usize, seed: u32) {
    let mut rng = Rng::new(seed ^ 0x5bd1_e995);
    for (b, block) in x.chunks_exact_mut(QK).enumerate() {
        for (i, v) in block.iter_mut().enumerate() {
            *v = rng.value(i);
        }
        match (b + cols / QK) % 7 {
            0 => block.fill(if b.is_multiple_of(2) { 1.0 } else { -1.0 }),
            1 => block.fill(0.0),
            2 => block.iter_mut().for_each(|v| *v *= 1e-36),
            3 => block.iter_mut().for_each(|v| *v *= 1e-29),
            4 => block.iter_mut().for_each(|v| *v *= 3.0e4),
            _ => {}
        }
    }
}

/// The reference of the quantized formats, from their documented layouts.
mod reference {
    use super::{f16, DType, QK, X16};

    /// The f32 value of little-endian f16 bits (`half`'s conversion).
    pub fn f16_le(b: [u8; 2]) -> f32 {
        f16::from_le_bytes(b).to_f32()
    }

    /// Weight `(r, c)` of a `[rows, cols]` integer matrix `w`: its block's scale bytes and
    /// its integer quant. Plain layouts are row-major blocks (q8_0: scale, 32 i8; q4_0:
    /// scale, 16 bytes whose low nibbles are weights 0..16 and high ones 16..32, each minus
    /// 8); an interleaved layout is `[rows / 16, cols / 32]` groups of 16 scales, then the
    /// rows' quant bytes in 4-byte pieces, piece `v` of every row before piece `v + 1`.
    pub fn quant(dtype: DType, w: &[u8], cols: usize, r: usize, c: usize) -> ([u8; 2], i32) {
        let (nb, b, i) = (cols / QK, c / QK, c % QK);
        // Byte of the block's quants that holds weight i, and which nibble (q4_0).
        let (byte, high) = match dtype.plain() {
            DType::Q8_0 => (i, false),
            _ => (i % (QK / 2), i >= QK / 2),
        };
        let (d, q) = if dtype.group_rows() == 1 {
            let at = (r * nb + b) * dtype.block_bytes();
            ([w[at], w[at + 1]], w[at + 2 + byte])
        } else {
            let at = ((r / X16) * nb + b) * dtype.block_bytes() * X16;
            let rr = r % X16;
            let piece = 2 * X16 + (byte / 4) * 4 * X16 + rr * 4 + byte % 4;
            ([w[at + 2 * rr], w[at + 2 * rr + 1]], w[at + piece])
        };
        let q = match (dtype.plain(), high) {
            (DType::Q8_0, _) => i32::from(q as i8),
            (_, false) => i32::from(q & 15) - 8,
            (_, true) => i32::from(q >> 4) - 8,
        };
        (d, q)
    }

    /// Rounds `v` (`|v| <= 127`) to the nearest integer, ties to even.
    fn round_even(v: f32) -> i32 {
        let t = v as i32;
        // Exact: `t` is `v` without its fraction.
        let frac = v - t as f32;
        let odd = t % 2 != 0;
        if frac > 0.5 || (frac == 0.5 && odd) {
            t + 1
        } else if frac < -0.5 || (frac == -0.5 && odd) {
            t - 1
        } else {
            t
        }
    }

    /// One block of an activation quantized: its scale `amax / 127` (0 below 1e-30, where
    /// the quantizer gives up) and its values `round(x * 127 / amax)`.
    pub fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
        let amax = x.iter().fold(0.0f32, |m, &v| if v.abs() > m { v.abs() } else { m });
        if amax < 1e-30 {
            q.fill(0);
            return 0.0;
        }
        let inv = 127.0 / amax;
        for (q, &v) in q.iter_mut().zip(x) {
            *q = round_even(v * inv) as i8;
        }
        amax / 127.0
    }

    /// `out[t * rows + r] = w[r] . x[t]` for an integer `w`: each activation block quantized,
    /// each block's exact integer sum scaled by `(d_w * d_a)`, block `b` added into
    /// accumulator `b % 8` (from +0.0), the 8 summed as `((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7))`.
    pub fn int_products(dtype: DType, w: &[u8], rows: usize, cols: usize, x: &[f32], out: &mut [f32]) {
        let mut q = [0i8; QK];
        for (x, out) in x.chunks_exact(cols).zip(out.chunks_exact_mut(rows)) {
            for (r, o) in out.iter_mut().enumerate() {
                let mut acc = [0.0f32; 8];
                for (b, xb) in x.chunks_exact(QK).enumerate() {
                    let da = quantize_block(xb, &mut q);
                    let mut isum = 0i32;
                    let mut dw = [0; 2];
                    for (i, &a) in q.iter().enumerate() {
                        let (d, wq) = quant(dtype, w, cols, r, b * QK + i);
                        dw = d;
                        isum += wq * i32::from(a);
                    }
                    acc[b % 8] += f16_le(dw) * da * isum as f32;
                }
                *o = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            }
        }
    }

    /// `out[t * rows + r] = w[r] . x[t]` for a float `w`: the products added in column order,
    /// starting from -0.0 (the additive identity, as `Iterator::sum` starts).
    pub fn float_products(dtype: DType, w: &[u8], rows: usize, cols: usize, x: &[f32], out: &mut [f32]) {
        let weight = |i: usize| match dtype {
            DType::F32 => f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]]),
            DType::F16 => f16_le([w[2 * i], w[2 * i + 1]]),
            _ => f32::from_bits(u32::from(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])) << 16),
        };
        for (x, out) in x.chunks_exact(cols).zip(out.chunks_exact_mut(rows)) {
            for (r, o) in out.iter_mut().enumerate() {
                let mut s = -0.0f32;
                for (c, &v) in x.iter().enumerate() {
                    s += weight(r * cols + c) * v;
                }
                *o = s;
            }
        }
    }

    /// `out[i] = rows[i] . x`: lane `l` of 16 sums the products of columns `l, l + 16, ...`,
    /// the lanes fold in halves (`l + 8`, `+ 4`, `+ 2`, `+ 1`), then the last `d % 16`
    /// columns add in order.
    pub fn dots(rows: &[f32], x: &[f32], out: &mut [f32]) {
        let d = x.len();
        let body = d - d % 16;
        for (row, o) in rows.chunks_exact(d).zip(out.iter_mut()) {
            let mut lanes = [0.0f32; 16];
            for c in 0..body {
                lanes[c % 16] += row[c] * x[c];
            }
            for half in [8, 4, 2, 1] {
                for l in 0..half {
                    lanes[l] += lanes[l + half];
                }
            }
            let mut s = lanes[0];
            for c in body..d {
                s += row[c] * x[c];
            }
            *o = s;
        }
    }

    /// `out[c] += p[j] * rows[j][c]`, row by row.
    pub fn weighted_sum(p: &[f32], rows: &[f32], out: &mut [f32]) {
        for (&pj, row) in p.iter().zip(rows.chunks_exact(out.len())) {
            for (o, &v) in out.iter_mut().zip(row) {
                *o += pj * v;
            }
        }
    }
}

/// `matmul` (the activation scratch holding one token, then all) and `matvec` of the last
/// token, of the compiled tier, of scalar, and of the reference, for the `n` tokens of
/// `buf.x`.
fn compare_products(c: &mut Checks, buf: &mut Scratch, w: &Matrix<'_>, n: usize, what: impl fmt::Display + Copy) {
    let (rows, cols) = (w.rows, w.cols);
    let per = kernels::act_scratch_len(cols);
    let x = &buf.x[..n * cols];
    let reference = &mut buf.reference[..n * rows];
    if w.dtype.quantizes_act() {
        reference::int_products(w.dtype, w.data, rows, cols, x, reference);
    } else {
        reference::float_products(w.dtype, w.data, rows, cols, x, reference);
    }
    let (got, want) = (&mut buf.got[..n * rows], &mut buf.want[..n * rows]);
    for group in [1, n] {
        let act = &mut buf.act[..group * per];
        want.fill(f32::NAN);
        got.fill(f32::NAN);
        scalar(|| kernels::matmul(w, x, want, act));
        kernels::matmul(w, x, got, act);
        c.both(got, want, reference, format_args!("matmul {what} x {n} tokens, scratch for {group}"));
    }
    let (got, want) = (&mut buf.got[..rows], &mut buf.want[..rows]);
    let (x, act) = (&x[(n - 1) * cols..], &mut buf.act[..per]);
    want.fill(f32::NAN);
    got.fill(f32::NAN);
    scalar(|| kernels::matvec(w, x, want, act));
    kernels::matvec(w, x, got, act);
    c.both(got, want, &reference[(n - 1) * rows..], format_args!("matvec {what}"));
}

/// Every shape of `dtype` ([`BLOCKS`] x [`ROWS`] or [`GROUPS`] x [`TOKENS`]), and each
/// integer matrix again at an odd address (the tiers must not fault on it and give the
/// same bits).
fn products(c: &mut Checks, wb: &mut [u8; W_LEN], buf: &mut Scratch, dtype: DType) {
    c.kind("matrix products");
    let counts: &[usize] = if dtype.group_rows() == 1 { &ROWS } else { &GROUPS };
    for nb in BLOCKS {
        let cols = nb * QK;
        for &count in counts {
            let rows = count * dtype.group_rows();
            let seed = (nb * 131 + rows) as u32;
            let Some(len) = dtype.matrix_bytes(rows, cols).filter(|&len| len < W_LEN) else { continue };
            weights(dtype, &mut wb[..len], seed);
            for n in TOKENS {
                activations(&mut buf.x[..n * cols], cols, seed + n as u32);
                let Ok(w) = Matrix::new(dtype, rows, cols, &wb[..len]) else {
                    c.expect(false, format_args!("{dtype:?} [{rows}, {cols}] is not a valid matrix"));
                    continue;
                };
                compare_products(c, buf, &w, n, format_args!("{dtype:?} [{rows}, {nb} blocks]"));
            }
            if dtype.quantizes_act() {
                wb.copy_within(..len, 1);
                let Ok(w) = Matrix::new(dtype, rows, cols, &wb[1..len + 1]) else { continue };
                compare_products(c, buf, &w, 2, format_args!("{dtype:?} [{rows}, {nb} blocks] at an odd address"));
            }
        }
    }
}

/// The largest integer sums: every q8 weight -128 or 127 (or 0 or -1), every q4 nibble 0
/// or 15, scales 1, against activations that quantize to all -127 or all 127.
fn extremes(c: &mut Checks, wb: &mut [u8; W_LEN], buf: &mut Scratch) {
    c.kind("extreme values");
    let (rows, cols) = (32, 288);
    for dtype in [DType::Q8_0, DType::Q4_0, DType::Q8_0x16, DType::Q4_0x16] {
        let Some(len) = dtype.matrix_bytes(rows, cols) else { continue };
        for (quant, act) in [(0x80u8, 1.0f32), (0x80, -1.0), (0x7f, 1.0), (0x00, -1.0), (0xff, 1.0)] {
            let w = &mut wb[..len];
            w.fill(quant);
            let one = 0x3c00u16.to_le_bytes();
            let bb = dtype.block_bytes();
            if dtype.group_rows() == 1 {
                w.chunks_exact_mut(bb).for_each(|b| b[..2].copy_from_slice(&one));
            } else {
                w.chunks_exact_mut(bb * X16)
                    .for_each(|g| g[..2 * X16].chunks_exact_mut(2).for_each(|d| d.copy_from_slice(&one)));
            }
            buf.x[..cols].fill(act);
            let Ok(m) = Matrix::new(dtype, rows, cols, &wb[..len]) else { continue };
            compare_products(c, buf, &m, 1, format_args!("{dtype:?} quants {quant:#04x}, activations {act}"));
        }
    }
}

/// The integer numerics' product over i8 rows (docs/integer.md) of many shapes, one to three
/// 512-column partial sums, weights at +-127 and inputs at the i16 extremes among random
/// ones, dense and mostly zero: the tier against scalar, and scalar against `round(sum q x
/// * m * 2^(s - sh))` from exact i64 sums, saturated.
fn integer_products(c: &mut Checks, wb: &mut [u8; W_LEN]) {
    c.kind("integer products");
    let mut x = [0i16; 1036];
    let (mut got, mut want) = ([0i32; 17], [0i32; 17]);
    // i8 rows are whole multiples of 4 columns; the tiles' tails take the rest of 8
    for cols in [4, 8, 12, 16, 20, 28, 36, 128, 516, 1036] {
        for rows in [1, 3, 4, 5, 8, 9, 17] {
            let rb = 4 + cols;
            let mut rng = Rng::new((cols * 37 + rows) as u32);
            for (r, row) in wb[..rows * rb].chunks_exact_mut(rb).enumerate() {
                // m in [2^14, 2^15), shifts that round, and ones that saturate
                let m = (1u16 << 14) | (rng.next() >> 18) as u16;
                let sh = [12u16, 20, 27, 35, 50][r % 5];
                row[..2].copy_from_slice(&m.to_le_bytes());
                row[2..4].copy_from_slice(&sh.to_le_bytes());
                for (i, q) in row[4..].iter_mut().enumerate() {
                    *q = match (r + i) % 13 {
                        0 => 127,
                        1 => 0x81, // -127
                        _ => match (rng.next() >> 24) as u8 {
                            0x80 => 0x81,
                            b => b,
                        },
                    };
                }
            }
            for (i, v) in x[..cols].iter_mut().enumerate() {
                *v = match i % 17 {
                    0 => i16::MAX,
                    1 => i16::MIN,
                    _ => (rng.next() >> 16) as i16,
                };
            }
            let Ok(w) = Matrix::new(DType::I8, rows, cols, &wb[..rows * rb]) else {
                c.expect(false, format_args!("i8 [{rows}, {cols}] is not a valid matrix"));
                continue;
            };
            // Dense, then mostly zero as relu(h)^2 is (the listed columns of the tiers
            // without SIMD).
            for (s, sparse) in [(0, false), (3, false), (0, true)] {
                if sparse {
                    x[..cols].iter_mut().enumerate().filter(|(i, _)| i % 5 != 2).for_each(|(_, v)| *v = 0);
                }
                scalar(|| kernels::matvec_i8(&w, &x[..cols], s, &mut want[..rows]));
                kernels::matvec_i8(&w, &x[..cols], s, &mut got[..rows]);
                for r in 0..rows {
                    let row = &wb[r * rb..(r + 1) * rb];
                    let m = i128::from(u16::from_le_bytes([row[0], row[1]]));
                    let k = i32::from(u16::from_le_bytes([row[2], row[3]])) - s;
                    let acc: i64 = row[4..].iter().zip(&x).map(|(&q, &v)| i64::from(q as i8) * i64::from(v)).sum();
                    let reference = ((i128::from(acc) * m + (1i128 << (k - 1))) >> k)
                        .clamp(i128::from(i32::MIN), i128::from(i32::MAX)) as i32;
                    c.expect(
                        got[r] == want[r],
                        format_args!("matvec_i8 [{rows}, {cols}] s {s} row {r}: tier {} scalar {}", got[r], want[r]),
                    );
                    c.expect(
                        want[r] == reference,
                        format_args!(
                            "matvec_i8 [{rows}, {cols}] s {s} row {r}: scalar {} reference {reference}",
                            want[r]
                        ),
                    );
                }
            }
        }
    }
}

/// Attention's kernels over rows of each stored type: `dots`, `dots_many` (3 queries) and
/// `weighted_sum` against scalar and the reference (over the rows widened to f32).
fn attention(c: &mut Checks, buf: &mut Scratch) {
    c.kind("attention");
    for d in [1, 3, 7, 16, 17, 31, 32, 33, 64, 127] {
        for n in [1, 3, 4, 9, 32] {
            let mut rng = Rng::new((d * 100 + n) as u32);
            for i in 0..n * d {
                let v = rng.value(i);
                buf.rows32[i] = v;
                buf.rows16[i] = f16::from_f32(v);
                buf.rows8[i] = (rng.next() >> 24) as i8;
            }
            for (i, v) in buf.x[..3 * d].iter_mut().enumerate() {
                *v = 4.0 * rng.value(i);
            }
            for (i, v) in buf.x[3 * d..3 * d + n].iter_mut().enumerate() {
                *v = rng.value(i).abs();
            }
            // A row whose products with the first query are all -0.0, whose sum is +0.0.
            if n > 1 {
                for (i, &q) in buf.x[..d].iter().enumerate() {
                    let z = if q > 0.0 { -0.0 } else { 0.0 };
                    buf.rows32[d + i] = z;
                    buf.rows16[d + i] = f16::from_f32(z);
                }
            }
            let b = &mut *buf;
            attention_rows(c, &b.rows32[..n * d], &b.x, &mut b.wide, d, n, "f32");
            attention_rows(c, &b.rows16[..n * d], &b.x, &mut b.wide, d, n, "f16");
            attention_rows(c, &b.rows8[..n * d], &b.x, &mut b.wide, d, n, "i8");
        }
    }
}

/// [`attention`] for `rows` (`[n, d]`), the queries `x[..3d]` and the weights
/// `x[3d..3d + n]`; `wide` is scratch for the rows widened to f32.
fn attention_rows<T: kernels::Stored + Widen>(
    c: &mut Checks,
    rows: &[T],
    x: &[f32],
    wide: &mut [f32],
    d: usize,
    n: usize,
    ty: &str,
) {
    let wide = &mut wide[..n * d];
    for (w, &r) in wide.iter_mut().zip(rows) {
        *w = r.to_f32();
    }
    let (mut got, mut want, mut reference) = ([0.0f32; 3 * 32], [0.0f32; 3 * 32], [0.0f32; 3 * 32]);
    let q = &x[..d];
    scalar(|| kernels::dots(rows, q, &mut want[..n]));
    kernels::dots(rows, q, &mut got[..n]);
    reference::dots(wide, q, &mut reference[..n]);
    c.both(&got[..n], &want[..n], &reference[..n], format_args!("dots {ty} [{n}, {d}]"));
    let qs = &x[..3 * d];
    scalar(|| kernels::dots_many(rows, qs, d, &mut want[..3 * n]));
    kernels::dots_many(rows, qs, d, &mut got[..3 * n]);
    for (q, r) in qs.chunks_exact(d).zip(reference.chunks_exact_mut(n)) {
        reference::dots(wide, q, r);
    }
    c.both(&got[..3 * n], &want[..3 * n], &reference[..3 * n], format_args!("dots_many {ty} 3 x [{n}, {d}]"));
    let p = &x[3 * d..3 * d + n];
    let (mut got, mut want, mut reference) = ([0.5f32; 127], [0.5f32; 127], [0.5f32; 127]);
    let (got, want, reference) = (&mut got[..d], &mut want[..d], &mut reference[..d]);
    scalar(|| kernels::weighted_sum(p, rows, want));
    kernels::weighted_sum(p, rows, got);
    reference::weighted_sum(p, wide, reference);
    c.both(got, want, reference, format_args!("weighted_sum {ty} [{n}, {d}]"));
}

/// A stored attention element's exact f32 value, for the reference.
trait Widen: Copy {
    fn to_f32(self) -> f32;
}

impl Widen for f32 {
    fn to_f32(self) -> f32 {
        self
    }
}

impl Widen for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl Widen for i8 {
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
}

/// The activation quantizer (its bytes), maximum, argmax, exponentials and f16 narrowing.
fn elementwise(c: &mut Checks, buf: &mut Scratch) {
    c.kind("elementwise");
    let cols = MAX_COLS;
    let x = &mut buf.x[..cols];
    activations(x, cols, 5);
    // A tiny block, and exact ties (x * 127 / amax = k + 0.5).
    x[64..96].fill(-1e-35);
    for (i, v) in x[96..128].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) + 0.5;
    }
    let len = kernels::act_scratch_len(cols);
    let (want, rest) = buf.act.split_at_mut(len);
    let (got, reference) = rest.split_at_mut(len);
    quantize_reference(x, &mut reference[..len]);
    scalar(|| kernels::quantize_act(x, want));
    kernels::quantize_act(x, &mut got[..len]);
    let first_diff = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(a, b)| a != b);
    let bad = first_diff(&got[..len], want);
    c.expect(bad.is_none(), format_args!("quantize_act byte {:?} differs from scalar", bad));
    let bad = first_diff(want, &reference[..len]);
    c.expect(bad.is_none(), format_args!("scalar quantize_act byte {:?} differs from the reference", bad));

    // The tiers against scalar also on values outside the quantizer's contract.
    x[130] = f32::NAN;
    x[161] = f32::INFINITY;
    x[200] = -0.0;
    scalar(|| kernels::quantize_act(x, want));
    kernels::quantize_act(x, &mut got[..len]);
    let bad = first_diff(&got[..len], want);
    c.expect(bad.is_none(), format_args!("quantize_act (NaN, inf) byte {:?} differs from scalar", bad));

    for n in [1, 3, 7, 8, 9, 31, 256, 257, 544] {
        let x = &buf.x[..n];
        let (mw, mg) = (scalar(|| kernels::max(x)), kernels::max(x));
        c.bits(&[mg], &[mw], "scalar", format_args!("max of {n}"));
        let best = x.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
        c.expect(mw == best, format_args!("scalar max of {n}: {mw} != reference {best}"));
        let (aw, ag) = (scalar(|| kernels::argmax(x)), kernels::argmax(x));
        c.expect(aw == ag, format_args!("argmax of {n}: {ag:?} != scalar {aw:?}"));
        let first = x.iter().position(|&v| v == best).filter(|_| best > f32::NEG_INFINITY);
        c.expect(aw == first, format_args!("scalar argmax of {n}: {aw:?} != reference {first:?}"));
    }

    // Exponentials over [-40.5, 19.5] and over the values above (NaN, inf, outliers).
    let mut rng = Rng::new(99);
    for (len, max) in [(1, 2.5f32), (7, 2.5), (16, 2.5), (33, 2.5), (257, 2.5), (257, 0.75)] {
        let (want, got) = (&mut buf.want[..len], &mut buf.got[..len]);
        if max == 2.5 {
            want.iter_mut().for_each(|v| *v = 30.0 * rng.unit() - 8.0);
        } else {
            want.copy_from_slice(&buf.x[..len]);
        }
        got.copy_from_slice(want);
        buf.reference[..len].copy_from_slice(want);
        scalar(|| kernels::exp_sub(want, max));
        kernels::exp_sub(got, max);
        c.bits(got, want, "scalar", format_args!("exp_sub of {len}"));
        // Within 2 ulp of expf, which itself is within 1 ulp of e^x (finite inputs; the
        // kernel clamps to [-87, 88]).
        let bad = buf.reference[..len].iter().zip(want.iter()).position(|(&v, &e)| {
            let a = v - max;
            a.is_finite() && (-87.0..=88.0).contains(&a) && libm::expf(a).to_bits().abs_diff(e.to_bits()) > 3
        });
        c.expect(bad.is_none(), format_args!("scalar exp_sub of {len}: [{bad:?}] more than 3 ulp from expf"));
    }

    // Narrowing: ordinary values and outliers, the f16 overflow boundary (65519 rounds to
    // 65504, 65520 to infinity), subnormals, half the smallest subnormal (a tie to +0), NaN.
    let n = 257;
    let x = &mut buf.x[..n];
    for (v, s) in
        x[240..].iter_mut().zip([65519.0, 65520.0, -65520.0, 1e-5, -3e-7, f32::from_bits(0x3300_0000), 1e-9, f32::NAN])
    {
        *v = s;
    }
    let (mut hw, mut hg) = ([f16::ZERO; 257], [f16::ZERO; 257]);
    scalar(|| kernels::narrow_f16(x, &mut hw));
    kernels::narrow_f16(x, &mut hg);
    let bad = hw.iter().zip(&hg).position(|(w, g)| w.to_bits() != g.to_bits());
    c.expect(bad.is_none(), format_args!("narrow_f16 [{bad:?}] differs from scalar"));
    let bad = hw.iter().zip(x.iter()).position(|(w, &v)| w.to_bits() != f16::from_f32(v).to_bits());
    c.expect(bad.is_none(), format_args!("scalar narrow_f16 [{bad:?}] differs from half's f16::from_f32"));
}

/// [`reference::quantize_block`] of each block of `x` into the quantizer's scratch layout:
/// `cols` i8 values, then one little-endian f32 scale per block.
fn quantize_reference(x: &[f32], out: &mut [u8]) {
    let (qs, ds) = out.split_at_mut(x.len());
    let mut q = [0i8; QK];
    for ((xs, qs), d) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(ds.chunks_exact_mut(4)) {
        d.copy_from_slice(&reference::quantize_block(xs, &mut q).to_le_bytes());
        for (o, &v) in qs.iter_mut().zip(&q) {
            *o = v as u8;
        }
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    println!("kvm-conformance: panic: {info}");
    semihosting::process::exit(101)
}

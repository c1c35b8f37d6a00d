//! Kernel conformance on the board: the integer matrix products of the kernel tier this
//! firmware was built with (`kvm_core::kernels::tier()`, e.g. Helium on an547) against the
//! scalar oracle (`kvm_core::kernels::scalar`), bit for bit, over every integer layout (q8_0,
//! q4_0, q8_0x16, q4_0x16), odd block and row counts, one token and several (with the
//! activation scratch holding one token or all of them), and adversarial data: scales from
//! the largest f16 to subnormals and zeros of both signs, quants at both ends (q8_0's -128
//! and 127, q4_0's 0 and 15), zero blocks, and activation blocks that quantize to +-127, to
//! zero, or to scales so small that their products with subnormal weight scales are
//! subnormal. The attention helpers are checked against the scalar ones too.
//!
//! Prints one line per failing case (at most a few per check) and a summary; exits 0 when
//! everything matches, 1 on any mismatch (101 on a panic, 102 on a hard fault).
#![no_std]
#![no_main]

use cortex_m as _;
use cortex_m_rt::{entry, exception, ExceptionFrame};
use kvm_core::kernels::{self, scalar, Matrix};
use kvm_core::quant::{DType, GroupQ4_0x16, GroupQ8_0x16, QK, X16};
use semihosting::println;

/// The largest shapes checked: 80 rows (5 groups of 16), 17 blocks, 5 tokens.
const MAX_ROWS: usize = 80;
const MAX_BLOCKS: usize = 17;
const MAX_COLS: usize = MAX_BLOCKS * QK;
const MAX_TOKENS: usize = 5;
/// Bytes of a q8_0 block (the largest of the integer formats').
const Q8_BLOCK: usize = 34;
/// Mismatches printed per check before the rest are only counted.
const SHOWN: usize = 3;

/// Block counts: 1, 3, 7 and 9 around the 8 accumulators of the canonical block sum, 17 past
/// two of them.
const BLOCKS: [usize; 6] = [1, 3, 7, 8, 9, 17];
/// Row counts of the plain layouts (interleaved ones take whole groups of 16).
const ROWS: [usize; 7] = [1, 2, 3, 4, 5, 9, 17];
const GROUPS: [usize; 3] = [1, 2, 5];
const TOKENS: [usize; 3] = [1, 2, 5];

/// f16 scales: the largest, the smallest subnormal, the largest subnormal, 1, -1, +0, -0,
/// and an ordinary one.
const SCALES: [u16; 8] = [0x7bff, 0x0001, 0x03ff, 0x3c00, 0xbc00, 0x0000, 0x8000, 0x2e66];

/// Scratch, in .bss: weights, activations, the oracle's and the tier's outputs.
struct Buffers {
    /// One byte more than the largest matrix: a copy at offset 1 is a blob at an odd address.
    w: [u8; MAX_ROWS * MAX_BLOCKS * Q8_BLOCK + 1],
    x: [f32; MAX_TOKENS * MAX_COLS],
    act: [u8; MAX_TOKENS * kernels::act_scratch_len(MAX_COLS)],
    want: [f32; MAX_TOKENS * MAX_ROWS],
    got: [f32; MAX_TOKENS * MAX_ROWS],
}

#[entry]
fn main() -> ! {
    static mut BUF: Buffers = Buffers {
        w: [0; MAX_ROWS * MAX_BLOCKS * Q8_BLOCK + 1],
        x: [0.0; MAX_TOKENS * MAX_COLS],
        act: [0; MAX_TOKENS * kernels::act_scratch_len(MAX_COLS)],
        want: [0.0; MAX_TOKENS * MAX_ROWS],
        got: [0.0; MAX_TOKENS * MAX_ROWS],
    };
    println!("kvm-conformance: kernel tier {} against scalar", kernels::tier());
    let mut report = Report::default();
    for dtype in [DType::Q8_0, DType::Q4_0, DType::Q8_0x16, DType::Q4_0x16] {
        products(BUF, dtype, &mut report);
    }
    attention(BUF, &mut report);
    println!("kvm-conformance: {} checks, {} cases, {} mismatches", report.checks, report.cases, report.failed);
    semihosting::process::exit(if report.failed == 0 { 0 } else { 1 })
}

/// Counts of what was compared.
#[derive(Default)]
struct Report {
    checks: usize,
    cases: usize,
    failed: usize,
}

impl Report {
    /// Compares `got` with `want` bit for bit as one check named by `what`.
    fn bits(&mut self, got: &[f32], want: &[f32], what: core::fmt::Arguments<'_>) {
        self.checks += 1;
        self.cases += want.len();
        let mut bad = 0;
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            if g.to_bits() != w.to_bits() {
                if bad < SHOWN {
                    println!("MISMATCH {what}: [{i}] {g:e} ({:#010x}) vs scalar {w:e} ({:#010x})", g.to_bits(), w.to_bits());
                }
                bad += 1;
            }
        }
        self.failed += bad;
    }
}

/// A deterministic xorshift32 stream.
struct Rng(u32);

impl Rng {
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
}

/// Fills `w` with `blocks` adversarial blocks of `dtype` (its scale bytes where the layout
/// puts them): `SCALES` and random finite f16s, random quants, blocks of extremes and of
/// zeros.
fn weights(dtype: DType, w: &mut [u8], seed: u32) {
    let mut rng = Rng(seed.wrapping_mul(2_654_435_761) | 1);
    for b in w.iter_mut() {
        *b = rng.next() as u8;
    }
    let scale = |rng: &mut Rng, i: usize| -> [u8; 2] {
        let d = if i.is_multiple_of(3) { SCALES[(rng.next() % 8) as usize] } else { 0x2000 | (rng.next() as u16 & 0x3fff) };
        d.to_le_bytes()
    };
    let q8 = dtype.plain() == DType::Q8_0;
    let extremes: [u8; 2] = if q8 { [0x80, 0x7f] } else { [0x00, 0xff] };
    match dtype {
        DType::Q8_0 | DType::Q4_0 => {
            let bb = dtype.block_bytes();
            for (i, block) in w.chunks_exact_mut(bb).enumerate() {
                block[..2].copy_from_slice(&scale(&mut rng, i));
                match i % 5 {
                    0 => block[2..].fill(0),
                    1 => block[2..].iter_mut().for_each(|q| *q = extremes[(rng.next() % 2) as usize]),
                    2 => block[2..].fill(extremes[0]),
                    _ => {}
                }
            }
        }
        _ => {
            let gb = if q8 { core::mem::size_of::<GroupQ8_0x16>() } else { core::mem::size_of::<GroupQ4_0x16>() };
            for (i, group) in w.chunks_exact_mut(gb).enumerate() {
                for r in 0..X16 {
                    group[2 * r..2 * r + 2].copy_from_slice(&scale(&mut rng, i * X16 + r));
                }
                match i % 4 {
                    0 => group[2 * X16..].fill(0),
                    1 => group[2 * X16..].iter_mut().for_each(|q| *q = extremes[(rng.next() % 2) as usize]),
                    2 => group[2 * X16..].fill(extremes[0]),
                    _ => {}
                }
            }
        }
    }
}

/// `n` activations of `cols` values: ordinary values with outliers, blocks that quantize to
/// +-127 (all +-1), zero blocks, blocks below the quantizer's threshold (scale 0), and
/// blocks of about 1e-29 (scales near 1e-31, whose products with subnormal f16 scales are
/// subnormal f32s).
fn activations(x: &mut [f32], cols: usize, seed: u32) {
    let mut rng = Rng(seed.wrapping_mul(2_246_822_519) | 1);
    for (b, block) in x.chunks_exact_mut(QK).enumerate() {
        for (i, v) in block.iter_mut().enumerate() {
            let u = rng.unit();
            *v = if i % 37 == 5 { 8.0 * u } else { u };
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

/// The oracle: `want[t * rows + r]`, row by row from the scalar tier's public functions.
fn oracle(w: &Matrix<'_>, x: &[f32], act: &mut [u8], want: &mut [f32]) {
    let (rows, cols) = (w.rows, w.cols);
    let per = kernels::act_scratch_len(cols);
    let rb = w.row_bytes();
    for (t, x) in x.chunks_exact(cols).enumerate() {
        let act = &mut act[..per];
        scalar::quantize_act(x, act);
        let out = &mut want[t * rows..(t + 1) * rows];
        match w.dtype {
            DType::Q8_0 => {
                for (r, o) in out.iter_mut().enumerate() {
                    *o = scalar::dot_q8_0(&w.data[r * rb..(r + 1) * rb], act, cols);
                }
            }
            DType::Q4_0 => {
                for (r, o) in out.iter_mut().enumerate() {
                    *o = scalar::dot_q4_0(&w.data[r * rb..(r + 1) * rb], act, cols);
                }
            }
            DType::Q8_0x16 => {
                for (g, o) in w.data.chunks_exact(X16 * rb).zip(out.chunks_exact_mut(X16)) {
                    o.copy_from_slice(&scalar::dot_q8_0x16(bytemuck::cast_slice(g), act, cols));
                }
            }
            DType::Q4_0x16 => {
                for (g, o) in w.data.chunks_exact(X16 * rb).zip(out.chunks_exact_mut(X16)) {
                    o.copy_from_slice(&scalar::dot_q4_0x16(bytemuck::cast_slice(g), act, cols));
                }
            }
            _ => {}
        }
    }
}

/// `matvec` and `matmul` of the active tier against [`oracle`] for `dtype`.
fn products(buf: &mut Buffers, dtype: DType, report: &mut Report) {
    let row_counts: &[usize] = if dtype.group_rows() == 1 { &ROWS } else { &GROUPS };
    for &nb in &BLOCKS {
        let cols = nb * QK;
        for &count in row_counts {
            let rows = count * dtype.group_rows();
            let seed = (nb * 131 + rows) as u32;
            let Some(len) = dtype.matrix_bytes(rows, cols) else { continue };
            weights(dtype, &mut buf.w[..len], seed);
            let Ok(w) = Matrix::new(dtype, rows, cols, &buf.w[..len]) else {
                println!("MISMATCH {dtype:?} [{rows}, {cols}]: not a valid matrix");
                report.failed += 1;
                continue;
            };
            for n in TOKENS {
                let x = &mut buf.x[..n * cols];
                activations(x, cols, seed + n as u32);
                let want = &mut buf.want[..n * rows];
                oracle(&w, x, &mut buf.act, want);
                let per = kernels::act_scratch_len(cols);
                for group in [1, n] {
                    let got = &mut buf.got[..n * rows];
                    got.fill(f32::NAN);
                    kernels::matmul(&w, x, got, &mut buf.act[..group * per]);
                    report.bits(got, want, format_args!("matmul {dtype:?} [{rows}, {nb} blocks] x {n}/{group}"));
                }
                let got = &mut buf.got[..rows];
                got.fill(f32::NAN);
                kernels::matvec(&w, &x[(n - 1) * cols..], got, &mut buf.act[..per]);
                report.bits(got, &want[(n - 1) * rows..], format_args!("matvec {dtype:?} [{rows}, {nb} blocks]"));
            }
            // The same weights one byte further on (a blob at an odd address): the tier
            // must not fault on them and give the same bits.
            buf.w.copy_within(..len, 1);
            let Ok(w) = Matrix::new(dtype, rows, cols, &buf.w[1..len + 1]) else { continue };
            let x = &buf.x[..cols];
            let (want, got) = (&mut buf.want[..rows], &mut buf.got[..rows]);
            oracle(&w, x, &mut buf.act, want);
            got.fill(f32::NAN);
            kernels::matvec(&w, x, got, &mut buf.act[..kernels::act_scratch_len(cols)]);
            report.bits(got, want, format_args!("matvec {dtype:?} [{rows}, {nb} blocks] at an odd address"));
        }
    }
}

/// The dispatched attention helpers against the scalar ones: `dots` and `weighted_sum` over
/// f32 and i8 rows, `exp_sub`, and `argmax` against a running maximum.
fn attention(buf: &mut Buffers, report: &mut Report) {
    let mut rng = Rng(12345);
    for d in [1, 3, 16, 17, 31, 32, 33, 64, 127] {
        for n in [1, 4, 9] {
            let (rows, rest) = buf.x.split_at_mut(n * d);
            let (q, rest) = rest.split_at_mut(d);
            let p = &mut rest[..n];
            rows.iter_mut().for_each(|v| *v = rng.unit());
            q.iter_mut().for_each(|v| *v = 4.0 * rng.unit());
            p.iter_mut().for_each(|v| *v = rng.unit().abs());
            let (want, got) = (&mut buf.want[..n], &mut buf.got[..n]);
            scalar::dots(rows, q, want);
            kernels::dots(rows, q, got);
            report.bits(got, want, format_args!("dots f32 [{n}, {d}]"));
            let i8s = &mut buf.act[..n * d];
            i8s.iter_mut().for_each(|v| *v = rng.next() as u8);
            let i8s: &[i8] = bytemuck::cast_slice(i8s);
            scalar::dots(i8s, q, want);
            kernels::dots(i8s, q, got);
            report.bits(got, want, format_args!("dots i8 [{n}, {d}]"));
            let (want, got) = (&mut buf.want[..d], &mut buf.got[..d]);
            want.fill(0.5);
            got.fill(0.5);
            scalar::weighted_sum(p, rows, want);
            kernels::weighted_sum(p, rows, got);
            report.bits(got, want, format_args!("weighted_sum f32 [{n}, {d}]"));
            want.fill(0.5);
            got.fill(0.5);
            scalar::weighted_sum(p, i8s, want);
            kernels::weighted_sum(p, i8s, got);
            report.bits(got, want, format_args!("weighted_sum i8 [{n}, {d}]"));
        }
    }
    for len in [1, 7, 16, 33, 257] {
        let x = &mut buf.want[..len];
        x.iter_mut().for_each(|v| *v = 30.0 * rng.unit() - 8.0);
        let got = &mut buf.got[..len];
        got.copy_from_slice(x);
        scalar::exp_sub(x, 2.5);
        kernels::exp_sub(got, 2.5);
        report.bits(got, &buf.want[..len], format_args!("exp_sub [{len}]"));
        let x = &buf.want[..len];
        let best = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        report.checks += 1;
        report.cases += 1;
        if kernels::argmax(x) != x.iter().position(|&v| v == best) {
            println!("MISMATCH argmax [{len}]");
            report.failed += 1;
        }
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    println!("kvm-conformance: panic: {info}");
    semihosting::process::exit(101)
}

#[exception]
unsafe fn HardFault(frame: &ExceptionFrame) -> ! {
    println!("kvm-conformance: hard fault at pc {:#010x}", frame.pc());
    semihosting::process::exit(102)
}

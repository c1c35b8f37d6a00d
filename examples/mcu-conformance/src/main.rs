//! kvm's kernel conformance checks, run on the board: every kernel of the tier this build
//! selects ([`kvm_core::kernels::tier::COMPILED`]) against the scalar oracle, bit for bit.
//!
//! Host tests cannot run a microcontroller tier's instructions; this firmware does, under
//! QEMU or on hardware. Each check runs once with the compiled tier and once with
//! [`Tier::Scalar`] forced, on deterministic data: odd lengths, every integer layout
//! (q8_0, q4_0, q8_0x16, q4_0x16, from one to several tiles or groups and tokens), quant
//! bytes of every value (q8 weights -128 and 127, every nibble), zero, subnormal and
//! extreme scales, zero activation blocks, data off its usual alignment; the float formats
//! (which the microcontroller tiers leave to scalar); attention's dot products and
//! weighted sums over f32, f16 and i8 rows; the activation quantizer; softmax's maximum,
//! argmax and exponentials; f16 narrowing.
//!
//! Output over semihosting: `kvm-conformance: tier <name>`, one line per mismatch (the
//! first few of each kind), then `kvm-conformance: <n> checks, <m> mismatches`. Exit code
//! 0 when all match, 1 on any mismatch, 101 on a panic, 102 on a hard fault.
#![no_std]
#![no_main]

use core::fmt;

// Links the critical-section implementation the semihosting crate needs.
use cortex_m as _;
use cortex_m_rt::{entry, exception, ExceptionFrame};
use half::f16;
use kvm_core::kernels::{self, tier::COMPILED, Tier};
use kvm_core::tensor::Matrix;
use kvm_core::quant::DType;
use semihosting::println;

/// The widest input (d_ff of small models, and several groups of 16 x 32 blocks).
const MAX_COLS: usize = 544;
/// Most rows of a checked matrix.
const MAX_ROWS: usize = 80;
/// Most tokens of a checked product.
const MAX_TOKENS: usize = 5;
/// Mismatches printed per check kind.
const SHOWN: u32 = 3;

/// Bytes of the largest checked weight matrix, plus room to misalign it.
const W_LEN: usize = MAX_ROWS * MAX_COLS * 4 + 4;

/// Scratch for every check but the weights, in `.bss`.
struct Buffers {
    xs: [f32; MAX_TOKENS * MAX_COLS],
    act: [u8; MAX_TOKENS * (MAX_COLS + MAX_COLS / 8)],
    want: [f32; MAX_TOKENS * MAX_ROWS * 2],
    got: [f32; MAX_TOKENS * MAX_ROWS * 2],
    rows16: [f16; MAX_ROWS * MAX_COLS / 4],
    rows8: [i8; MAX_ROWS * MAX_COLS / 4],
    rows32: [f32; MAX_ROWS * MAX_COLS / 4],
}

#[entry]
fn main() -> ! {
    static mut W: [u8; W_LEN] = [0; W_LEN];
    static mut BUF: Buffers = Buffers {
        xs: [0.0; MAX_TOKENS * MAX_COLS],
        act: [0; MAX_TOKENS * (MAX_COLS + MAX_COLS / 8)],
        want: [0.0; MAX_TOKENS * MAX_ROWS * 2],
        got: [0.0; MAX_TOKENS * MAX_ROWS * 2],
        rows16: [f16::ZERO; MAX_ROWS * MAX_COLS / 4],
        rows8: [0; MAX_ROWS * MAX_COLS / 4],
        rows32: [0.0; MAX_ROWS * MAX_COLS / 4],
    };
    println!("kvm-conformance: tier {}", COMPILED);
    let mut c = Checks::default();
    products(&mut c, W, BUF);
    extremes(&mut c, W, BUF);
    misaligned(&mut c, W, BUF);
    attention(&mut c, BUF);
    elementwise(&mut c, BUF);
    println!("kvm-conformance: {} checks, {} mismatches", c.checks, c.mismatches);
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

    /// Compares the bits of `got` (the compiled tier) and `want` (scalar).
    fn bits(&mut self, got: &[f32], want: &[f32], what: impl fmt::Display) {
        self.checks += 1;
        let bad = got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits());
        if let Some(i) = bad.or((got.len() != want.len()).then_some(0)) {
            self.fail(format_args!("{what}: [{i}] {:?} != scalar {:?}", got.get(i), want.get(i)));
        }
    }

    fn fail(&mut self, what: fmt::Arguments<'_>) {
        self.mismatches += 1;
        if self.shown < SHOWN {
            self.shown += 1;
            println!("kvm-conformance: MISMATCH {}: {}", self.kind, what);
        }
    }
}

/// Runs `f` with tier `t` active.
fn with<R>(t: Tier, f: impl FnOnce() -> R) -> R {
    // SAFETY: `t` is the compiled tier or scalar, both of which this CPU runs.
    unsafe { kernels::force_tier(t) };
    let r = f();
    // SAFETY: as above.
    unsafe { kernels::force_tier(COMPILED) };
    r
}

/// Deterministic values (xorshift32).
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

    /// In `[-1, 1)`, with an outlier 8 times larger every 37th, as real activations have.
    fn value(&mut self, i: usize) -> f32 {
        let u = (self.next() >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
        if i % 37 == 5 {
            8.0 * u
        } else {
            u
        }
    }
}

/// Fills `w` with random quant bytes of `dtype` and finite f16 scales: every fifth zero,
/// every seventh subnormal, every eleventh the largest f16; float dtypes get random finite
/// values.
fn fill_weights(dtype: DType, w: &mut [u8], seed: u32) {
    let mut rng = Rng::new(seed);
    let finite = |h: u16| if h & 0x7c00 == 0x7c00 { h & 0xbfff } else { h };
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
    let bb = dtype.block_bytes();
    let scale = |i: usize, rng: &mut Rng| match i {
        _ if i % 5 == 4 => 0x0000,
        _ if i % 7 == 6 => 0x8000 | (rng.next() as u16 & 0x3ff),
        _ if i % 11 == 10 => 0x7bff,
        _ => finite(rng.next() as u16 & 0xbfff),
    };
    if dtype.group_rows() == 1 {
        for (i, b) in w.chunks_exact_mut(bb).enumerate() {
            let h: u16 = scale(i, &mut rng);
            b[..2].copy_from_slice(&h.to_le_bytes());
        }
    } else {
        for (i, g) in w.chunks_exact_mut(bb * 16).enumerate() {
            for r in 0..16 {
                let h: u16 = scale(16 * i + r, &mut rng);
                g[2 * r..2 * r + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
    }
}

/// Fills `xs` with [`Rng::value`]s, the second block of each token zero when there is one.
fn fill_acts(xs: &mut [f32], cols: usize, seed: u32) {
    let mut rng = Rng::new(seed);
    for (i, x) in xs.iter_mut().enumerate() {
        *x = rng.value(i);
    }
    if cols >= 64 {
        for x in xs.chunks_exact_mut(cols) {
            x[32..64].fill(0.0);
        }
    }
}

/// `matvec` (one token) and `matmul` (`n` tokens) of `w` under both tiers.
fn compare_products(c: &mut Checks, b: &mut Buffers, w: &Matrix<'_>, n: usize) {
    let (rows, cols) = (w.rows, w.cols);
    let xs = &b.xs[..n * cols];
    let act = &mut b.act[..n * kernels::act_scratch_len(cols)];
    let (want, got) = (&mut b.want[..n * rows], &mut b.got[..n * rows]);
    if n == 1 {
        with(Tier::Scalar, || kernels::matvec(w, xs, want, act));
        kernels::matvec(w, xs, got, act);
    } else {
        with(Tier::Scalar, || kernels::matmul(w, xs, want, act));
        kernels::matmul(w, xs, got, act);
    }
    c.bits(got, want, format_args!("{:?} {rows}x{cols}, {n} tokens", w.dtype));
}

/// Every dtype's products over odd and tile-sized shapes.
fn products(c: &mut Checks, wb: &mut [u8; W_LEN], b: &mut Buffers) {
    c.kind("matvec/matmul");
    let dtypes = [DType::Q8_0, DType::Q4_0, DType::Q8_0x16, DType::Q4_0x16, DType::F32, DType::F16, DType::BF16];
    for dtype in dtypes {
        let rows: &[usize] = if dtype.group_rows() == 1 { &[1, 3, 4, 5, 7, 9] } else { &[16, 32, 48, 80] };
        for &rows in rows {
            for cols in [32, 96, 160, 288, 544] {
                let len = dtype.matrix_bytes(rows, cols).unwrap_or(0);
                if len == 0 || len > wb.len() {
                    continue;
                }
                for n in [1, 2, 3, 5] {
                    let seed = (rows * 1000 + cols * 10 + n) as u32;
                    fill_weights(dtype, &mut wb[..len], seed);
                    fill_acts(&mut b.xs[..n * cols], cols, seed + 1);
                    let Ok(m) = Matrix::new(dtype, rows, cols, &wb[..len]) else { continue };
                    compare_products(c, b, &m, n);
                }
            }
        }
    }
}

/// The largest integer sums: every q8 weight -128 or 127 and every q4 nibble 0 or 15
/// against activations that quantize to -127 and 127.
fn extremes(c: &mut Checks, wb: &mut [u8; W_LEN], b: &mut Buffers) {
    c.kind("extreme values");
    let (rows, cols) = (32, 288);
    for dtype in [DType::Q8_0, DType::Q4_0, DType::Q8_0x16, DType::Q4_0x16] {
        let len = dtype.matrix_bytes(rows, cols).unwrap_or(0);
        for (quant, act) in [(0x80u8, 1.0f32), (0x80, -1.0), (0x7f, 1.0), (0x00, -1.0), (0xff, 1.0)] {
            let w = &mut wb[..len];
            w.fill(quant);
            fill_weights_scales_only(dtype, w);
            b.xs[..cols].fill(act);
            let Ok(m) = Matrix::new(dtype, rows, cols, &wb[..len]) else { continue };
            compare_products(c, b, &m, 1);
        }
    }
}

/// Sets every scale of `w` (quant bytes left alone) to 1.0.
fn fill_weights_scales_only(dtype: DType, w: &mut [u8]) {
    let one = 0x3c00u16.to_le_bytes();
    let bb = dtype.block_bytes();
    if dtype.group_rows() == 1 {
        w.chunks_exact_mut(bb).for_each(|b| b[..2].copy_from_slice(&one));
    } else {
        w.chunks_exact_mut(bb * 16).for_each(|g| g[..32].chunks_exact_mut(2).for_each(|d| d.copy_from_slice(&one)));
    }
}

/// Weights that are not on a 4-byte boundary (a model file's tensors always are): the
/// tier must still give the scalar bits.
fn misaligned(c: &mut Checks, wb: &mut [u8; W_LEN], b: &mut Buffers) {
    c.kind("misaligned weights");
    let (rows, cols) = (32, 96);
    for dtype in [DType::Q8_0, DType::Q4_0, DType::Q8_0x16, DType::Q4_0x16] {
        let len = dtype.matrix_bytes(rows, cols).unwrap_or(0);
        fill_weights(dtype, &mut wb[1..1 + len], 77);
        fill_acts(&mut b.xs[..2 * cols], cols, 78);
        let Ok(m) = Matrix::new(dtype, rows, cols, &wb[1..1 + len]) else { continue };
        compare_products(c, b, &m, 1);
        compare_products(c, b, &m, 2);
    }
}

/// Attention's kernels over rows of each stored type.
fn attention(c: &mut Checks, b: &mut Buffers) {
    c.kind("attention");
    for d in [1, 3, 7, 16, 17, 32, 33, 64] {
        for n in [1, 3, 9, 32] {
            let mut rng = Rng::new((d * 100 + n) as u32);
            for i in 0..n * d {
                let v = rng.value(i);
                b.rows32[i] = v;
                b.rows16[i] = f16::from_f32(v);
                b.rows8[i] = (rng.next() >> 24) as i8;
            }
            fill_acts(&mut b.xs[..3 * d], d, (d + n) as u32);
            attention_rows(c, b, &b.rows32[..n * d], d, n, "f32");
            attention_rows(c, b, &b.rows16[..n * d], d, n, "f16");
            attention_rows(c, b, &b.rows8[..n * d], d, n, "i8");
        }
    }
}

/// `dots`, `dots_many` (3 queries) and `weighted_sum` of `rows` (`[n, d]`) under both tiers.
fn attention_rows<T: kernels::Stored>(c: &mut Checks, b: &Buffers, rows: &[T], d: usize, n: usize, ty: &str) {
    let mut want = [0.0f32; 3 * 32];
    let mut got = [0.0f32; 3 * 32];
    let x = &b.xs[..d];
    with(Tier::Scalar, || kernels::dots(rows, x, &mut want[..n]));
    kernels::dots(rows, x, &mut got[..n]);
    c.bits(&got[..n], &want[..n], format_args!("dots {ty} {n}x{d}"));
    let xs = &b.xs[..3 * d];
    with(Tier::Scalar, || kernels::dots_many(rows, xs, d, &mut want[..3 * n]));
    kernels::dots_many(rows, xs, d, &mut got[..3 * n]);
    c.bits(&got[..3 * n], &want[..3 * n], format_args!("dots_many {ty} 3 x {n}x{d}"));
    let p = &b.xs[d..d + n.min(d)];
    let m = p.len();
    let (mut ws, mut gs) = ([0.5f32; 64], [0.5f32; 64]);
    with(Tier::Scalar, || kernels::weighted_sum(p, &rows[..m * d], &mut ws[..d]));
    kernels::weighted_sum(p, &rows[..m * d], &mut gs[..d]);
    c.bits(&gs[..d], &ws[..d], format_args!("weighted_sum {ty} {m}x{d}"));
}

/// The activation quantizer (bytes), maximum, argmax, exponentials and f16 narrowing.
fn elementwise(c: &mut Checks, b: &mut Buffers) {
    c.kind("elementwise");
    let cols = MAX_COLS;
    fill_acts(&mut b.xs[..cols], cols, 5);
    // A tiny block, exact ties (x * 127 / amax = k + 0.5), infinities and a NaN.
    b.xs[64..96].fill(-1e-35);
    for (i, v) in b.xs[96..128].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) + 0.5;
    }
    b.xs[130] = f32::NAN;
    b.xs[161] = f32::INFINITY;
    b.xs[200] = -0.0;
    let len = kernels::act_scratch_len(cols);
    let (want, got) = b.act.split_at_mut(len);
    with(Tier::Scalar, || kernels::quantize_act(&b.xs[..cols], want));
    kernels::quantize_act(&b.xs[..cols], &mut got[..len]);
    c.checks += 1;
    if let Some(i) = want.iter().zip(&got[..len]).position(|(w, g)| w != g) {
        c.fail(format_args!("quantize_act byte {i}: {} != scalar {}", got[i], want[i]));
    }
    for n in [1, 3, 7, 8, 9, 31, 256, 257] {
        let x = &b.xs[..n];
        let (mw, mg) = (with(Tier::Scalar, || kernels::max(x)), kernels::max(x));
        c.bits(&[mg], &[mw], format_args!("max of {n}"));
        c.checks += 1;
        let (aw, ag) = (with(Tier::Scalar, || kernels::argmax(x)), kernels::argmax(x));
        if aw != ag {
            c.fail(format_args!("argmax of {n}: {ag:?} != scalar {aw:?}"));
        }
    }
    let n = 257;
    b.want[..n].copy_from_slice(&b.xs[..n]);
    b.got[..n].copy_from_slice(&b.xs[..n]);
    with(Tier::Scalar, || kernels::exp_sub(&mut b.want[..n], 0.75));
    kernels::exp_sub(&mut b.got[..n], 0.75);
    c.bits(&b.got[..n], &b.want[..n], "exp_sub of 257");
    let (mut hw, mut hg) = ([f16::ZERO; 257], [f16::ZERO; 257]);
    with(Tier::Scalar, || kernels::narrow_f16(&b.xs[..n], &mut hw));
    kernels::narrow_f16(&b.xs[..n], &mut hg);
    c.checks += 1;
    if let Some(i) = hw.iter().zip(&hg).position(|(w, g)| w.to_bits() != g.to_bits()) {
        c.fail(format_args!("narrow_f16 [{i}]: {:#06x} != scalar {:#06x}", hg[i].to_bits(), hw[i].to_bits()));
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

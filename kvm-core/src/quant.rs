//! Weight storage formats: the dtype tag of the file format and the quant block layouts.
//!
//! Every block type is defined once here, with size asserts, and used by the kernels,
//! the exporter and the tests alike; so are the reference quantizers that fill them.

use bytemuck::Zeroable;
use half::{bf16, f16};

use crate::error::{Error, Result};
pub use crate::fixed::FX;

/// Storage type of a tensor in a model file (the byte value is the on-disk tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum DType {
    F32 = 0,
    F16 = 1,
    BF16 = 2,
    /// Blocks of 32: f16 scale + 32 x i8 (8.5 bits/weight).
    Q8_0 = 3,
    /// Blocks of 32: f16 scale + 16 bytes of nibbles (4.5 bits/weight).
    Q4_0 = 4,
    /// q4_0 blocks of [`X16`] rows interleaved ([`GroupQ4_0x16`]): the same bytes as q4_0
    /// in the order a SIMD kernel reads them, 16 rows per vector.
    Q4_0x16 = 5,
    /// q8_0 blocks of [`X16`] rows interleaved ([`GroupQ8_0x16`]), as q4_0x16.
    Q8_0x16 = 6,
    /// f32 without loss in 28 bits a weight ([`BlockF32P`], [`F32PHead`]): each weight's
    /// exponent is stored as its distance below the row's largest, in 4 bits; the rare
    /// weights further down (tiny or subnormal) are kept whole in the row's head.
    F32P = 7,
    /// The integer mode's matrices (docs/integer.md): rows of i8 under one integer scale
    /// each, `w = q * m * 2^-sh`: a 4-byte row head ([`I8Head`]), then the row's i8s.
    I8 = 8,
    /// The integer mode's vectors: i32 fixed point with [`FX`] fraction bits.
    I32 = 9,
}

/// The head of an [`DType::I8`] row: the scale `m * 2^-sh`, `m` in `[2^14, 2^15)` (0 for
/// a row of zeros), little-endian.
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct I8Head {
    pub m: [u8; 2],
    pub sh: [u8; 2],
}

impl I8Head {
    /// The multiplier and shift of the row's scale.
    #[inline]
    pub fn scale(&self) -> (i32, u32) {
        (i32::from(u16::from_le_bytes(self.m)), u32::from(u16::from_le_bytes(self.sh)))
    }
}

/// Largest shift of an [`I8Head`]: scales down to `2^-62` (smaller ones are zero).
pub const I8_MAX_SHIFT: u32 = 62;

/// Row `r` of an [`DType::I8`] matrix's bytes (`rb` a row): its scale `(m, sh)` (the shift
/// at most [`I8_MAX_SHIFT`]) and its weights.
#[inline]
pub fn i8_row(data: &[u8], rb: usize, r: usize) -> ((i32, i32), &[i8]) {
    i8_split(&data[r * rb..(r + 1) * rb])
}

/// An [`DType::I8`] row's bytes as its scale (as [`i8_row`]) and its weights.
#[inline]
pub fn i8_split(row: &[u8]) -> ((i32, i32), &[i8]) {
    match row.split_first_chunk::<4>() {
        Some((&[m0, m1, s0, s1], q)) => {
            let (m, sh) = (u16::from_le_bytes([m0, m1]), u16::from_le_bytes([s0, s1]));
            ((i32::from(m), u32::from(sh).min(I8_MAX_SHIFT) as i32), bytemuck::cast_slice(q))
        }
        None => ((0, 0), &[]),
    }
}

/// Weights per quant block.
pub const QK: usize = 32;

/// `q8_0`: `w = d * qs[i]`.
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    /// f16 scale, little-endian bits (a byte array keeps the block 1-aligned).
    pub d: [u8; 2],
    pub qs: [i8; QK],
}

/// `q4_0`: `w[i] = d * ((qs[i] & 15) - 8)`, `w[i + 16] = d * ((qs[i] >> 4) - 8)`
/// (ggml's layout: low nibbles hold the first half of the block).
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// `f32p`: 32 f32 weights, packed. Weight `i` is `m[i]` (little-endian: 23 mantissa bits,
/// then the sign in bit 23) under the exponent `base - d`, where the nibble `d` is the low
/// half of `e[i]` for `i < 16` and the high half of `e[i - 16]` for the rest, and `base`
/// is the row's ([`F32PHead`]). `d = 15` is a zero exponent: a signed zero, or a weight
/// kept in the head (whose `m` is then zero).
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockF32P {
    pub m: [[u8; 3]; QK],
    pub e: [u8; QK / 2],
}

impl BlockF32P {
    /// Weight `i` (`< 32`) under the row's `base`. Every tier decodes exactly this.
    #[inline]
    pub fn weight(&self, i: usize, base: u32) -> f32 {
        let d = if i < QK / 2 { self.e[i] & 15 } else { self.e[i - QK / 2] >> 4 };
        let exponent = if d == F32P_ZERO { 0 } else { base.wrapping_sub(u32::from(d)) << 23 & 0x7F80_0000 };
        // Byte 2 twice: its low 7 bits are the mantissa's top, its top bit lands on the sign.
        let m = self.m[i];
        f32::from_bits(u32::from_le_bytes([m[0], m[1], m[2], m[2]]) & 0x807F_FFFF | exponent)
    }
}

/// The head of an `f32p` row, before its blocks: the base exponent, how many of the
/// [`f32p_slots`] spill slots that follow are used, then the slots, each a column and
/// the f32 bits of the weight there (which its block holds as zero). All little-endian.
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct F32PHead {
    pub base: [u8; 4],
    pub count: [u8; 4],
}

/// One spilled weight of an `f32p` row: its column and its f32 bits.
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct F32PSpill {
    pub col: [u8; 4],
    pub bits: [u8; 4],
}

/// Nibble `d` of an `f32p` weight that has no exponent of its own.
pub const F32P_ZERO: u8 = 15;

/// Spill slots of an `f32p` row of `cols` weights: 4, plus one per 512 weights. A
/// weight goes there when its exponent is more than 14 below the row's largest: about 1
/// in 10,000 of normally distributed weights.
pub const fn f32p_slots(cols: usize) -> usize {
    4 + cols / 512
}

/// Rows per group of an interleaved dtype ([`DType::group_rows`]).
pub const X16: usize = 16;

/// Block `b` of [`X16`] rows of a quantized matrix, interleaved: the 16 scales, then the
/// rows' quant bytes in 4-byte pieces, piece `v` of every row before piece `v + 1`. Byte `k`
/// of row `r`'s piece `v` is that row's `qs[4 * v + k]`, so one 64-byte vector holds the
/// same 4 bytes of all 16 rows: q4_0's weights `4v..4v + 4` (low nibbles) and
/// `16 + 4v..` (high nibbles), or q8_0's weights `4v..4v + 4`. A matrix is
/// `[rows / 16, cols / 32]` of these, row-group-major.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct Group<Q, const P: usize> {
    pub d: [[u8; 2]; X16],
    pub qs: [[[Q; 4]; X16]; P],
}

/// [`X16`] q4_0 blocks ([`DType::Q4_0x16`]).
pub type GroupQ4_0x16 = Group<u8, { QK / 8 }>;
/// [`X16`] q8_0 blocks ([`DType::Q8_0x16`]).
pub type GroupQ8_0x16 = Group<i8, { QK / 4 }>;

// SAFETY: arrays of bytes (alignment 1, no padding: the sizes are asserted below); every
// bit pattern is a valid value.
unsafe impl bytemuck::Zeroable for GroupQ4_0x16 {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for GroupQ4_0x16 {}
// SAFETY: as above.
unsafe impl bytemuck::Zeroable for GroupQ8_0x16 {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for GroupQ8_0x16 {}

const _: () = assert!(core::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(core::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(core::mem::size_of::<BlockF32P>() == 112);
const _: () = assert!(core::mem::size_of::<F32PHead>() == 8);
const _: () = assert!(core::mem::size_of::<F32PSpill>() == 8);
const _: () = assert!(core::mem::size_of::<I8Head>() == 4);
const _: () = assert!(core::mem::size_of::<GroupQ4_0x16>() == X16 * 18);
const _: () = assert!(core::mem::size_of::<GroupQ8_0x16>() == X16 * 34);

/// A group of [`X16`] interleaved blocks and the plain block each row's piece of it is.
pub trait RowGroup: bytemuck::Pod {
    /// The plain block of one row.
    type Block: bytemuck::Pod;
    /// The dtype of [`RowGroup::Block`].
    const PLAIN: DType;

    /// Row `r`'s block, as plain bytes.
    fn block(&self, r: usize) -> Self::Block;

    /// Stores `b` as row `r`'s block.
    fn set_block(&mut self, r: usize, b: &Self::Block);
}

impl<Q: bytemuck::Pod, const P: usize> Group<Q, P> {
    /// Copies row `r`'s scale and quant bytes into `out` (a plain block's bytes).
    #[inline]
    fn get(&self, r: usize, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d[r]);
        for (o, piece) in out[2..].chunks_exact_mut(4).zip(&self.qs) {
            o.copy_from_slice(bytemuck::bytes_of(&piece[r]));
        }
    }

    /// Stores `bytes` (a plain block's) as row `r`'s block.
    #[inline]
    fn set(&mut self, r: usize, bytes: &[u8]) {
        self.d[r].copy_from_slice(&bytes[..2]);
        for (b, piece) in bytes[2..].chunks_exact(4).zip(&mut self.qs) {
            bytemuck::bytes_of_mut(&mut piece[r]).copy_from_slice(b);
        }
    }
}

/// The quant of an interleaved group's blocks: `u8` (nibble pairs) for q4_0, `i8` for q8_0.
pub trait GroupQuant: bytemuck::Pod {
    /// The plain block a row's piece of the group is.
    type Block: bytemuck::Pod;
    /// The dtype of [`GroupQuant::Block`].
    const PLAIN: DType;
}

impl GroupQuant for u8 {
    type Block = BlockQ4_0;
    const PLAIN: DType = DType::Q4_0;
}

impl GroupQuant for i8 {
    type Block = BlockQ8_0;
    const PLAIN: DType = DType::Q8_0;
}

impl<Q: GroupQuant, const P: usize> RowGroup for Group<Q, P>
where
    Self: bytemuck::Pod,
{
    type Block = Q::Block;
    const PLAIN: DType = Q::PLAIN;

    #[inline]
    fn block(&self, r: usize) -> Q::Block {
        let mut b = <Q::Block as bytemuck::Zeroable>::zeroed();
        self.get(r, bytemuck::bytes_of_mut(&mut b));
        b
    }

    #[inline]
    fn set_block(&mut self, r: usize, b: &Q::Block) {
        self.set(r, bytemuck::bytes_of(b));
    }
}

impl DType {
    /// Parses the on-disk tag.
    pub const fn from_u8(v: u8) -> Option<DType> {
        match v {
            0 => Some(DType::F32),
            1 => Some(DType::F16),
            2 => Some(DType::BF16),
            3 => Some(DType::Q8_0),
            4 => Some(DType::Q4_0),
            5 => Some(DType::Q4_0x16),
            6 => Some(DType::Q8_0x16),
            7 => Some(DType::F32P),
            8 => Some(DType::I8),
            9 => Some(DType::I32),
            _ => None,
        }
    }

    /// Lower-case name as used on the command line (`q8_0`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_0x16 => "q4_0x16",
            DType::Q8_0x16 => "q8_0x16",
            DType::F32P => "f32p",
            DType::I8 => "i8",
            DType::I32 => "i32",
        }
    }

    /// Parses a command-line name.
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Every dtype of the float numerics' matrices (the integer numerics' are
    /// [`DType::I8`] and [`DType::I32`]).
    pub const ALL: [DType; 8] =
        [DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_0x16, DType::Q8_0x16, DType::F32P];

    /// Whether this dtype keeps every finite f32 it is given exactly: f32, and f32p (a row
    /// keeps the weights its nibbles cannot hold whole, in its spill slots; a matrix with
    /// more of them than slots is not stored as f32p).
    pub const fn exact(self) -> bool {
        matches!(self, DType::F32 | DType::F32P)
    }

    /// Whether products with this dtype take q8-quantized activations (the integer
    /// formats) rather than f32 ones.
    pub const fn quantizes_act(self) -> bool {
        matches!(self, DType::Q8_0 | DType::Q4_0 | DType::Q4_0x16 | DType::Q8_0x16)
    }

    /// Rows stored together: [`X16`] for interleaved dtypes, else 1. A matrix's row count
    /// is a multiple of it.
    pub const fn group_rows(self) -> usize {
        match self {
            DType::Q4_0x16 | DType::Q8_0x16 => X16,
            _ => 1,
        }
    }

    /// The row-interleaved form of this dtype, if it has one.
    pub const fn interleaved(self) -> Option<DType> {
        match self {
            DType::Q4_0 => Some(DType::Q4_0x16),
            DType::Q8_0 => Some(DType::Q8_0x16),
            _ => None,
        }
    }

    /// The row-major form of this dtype: the plain dtype of an interleaved one, else itself.
    pub const fn plain(self) -> DType {
        match self {
            DType::Q4_0x16 => DType::Q4_0,
            DType::Q8_0x16 => DType::Q8_0,
            d => d,
        }
    }

    /// Bytes of a `[rows, cols]` matrix, or `None` if the shape does not fit the dtype
    /// (`cols` not whole blocks, `rows` not whole groups) or overflows.
    pub const fn matrix_bytes(self, rows: usize, cols: usize) -> Option<usize> {
        if !rows.is_multiple_of(self.group_rows()) {
            return None;
        }
        match self.row_bytes(cols) {
            Some(rb) => rb.checked_mul(rows),
            None => None,
        }
    }

    /// Weights per storage unit (1 for floats, [`QK`] for quant blocks).
    pub const fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 | DType::I32 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_0x16 | DType::Q8_0x16 | DType::F32P => QK,
            // Whole words, so that every row starts on one.
            DType::I8 => 4,
        }
    }

    /// Bytes per storage unit.
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::I8 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 | DType::Q8_0x16 => core::mem::size_of::<BlockQ8_0>(),
            DType::Q4_0 | DType::Q4_0x16 => core::mem::size_of::<BlockQ4_0>(),
            DType::F32P => core::mem::size_of::<BlockF32P>(),
        }
    }

    /// Bytes at the start of a row before its blocks: an `f32p` row's head and spill
    /// slots, else none.
    pub const fn row_head_bytes(self, cols: usize) -> usize {
        match self {
            DType::F32P => core::mem::size_of::<F32PHead>() + f32p_slots(cols) * core::mem::size_of::<F32PSpill>(),
            DType::I8 => core::mem::size_of::<I8Head>(),
            _ => 0,
        }
    }

    /// Bytes of one row of `cols` weights, or `None` if `cols` is not a whole number of
    /// blocks (or overflows).
    pub const fn row_bytes(self, cols: usize) -> Option<usize> {
        if !cols.is_multiple_of(self.block_len()) {
            return None;
        }
        match (cols / self.block_len()).checked_mul(self.block_bytes()) {
            Some(b) => b.checked_add(self.row_head_bytes(cols)),
            None => None,
        }
    }
}

/// Decodes an f16 stored as little-endian bytes.
#[inline]
pub fn f16_le(b: [u8; 2]) -> f32 {
    f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// Decodes a bf16 stored as little-endian bytes.
#[inline]
pub fn bf16_le(b: [u8; 2]) -> f32 {
    bf16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// Rounds an f32 to bf16 precision (round to nearest even), as torch's `.bfloat16()`: the
/// bits of `half`'s `bf16::from_f32`, without its branches, so loops of it vectorise (a NaN
/// stays a NaN, quieted as `half` does).
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000;
    let nan = (b | 0x0040_0000) & 0xFFFF_0000;
    f32::from_bits(if b & 0x7FFF_FFFF > 0x7F80_0000 { nan } else { rounded })
}

/// Quantizes `src` (`[dst.len() * QK]`) to q8_0 exactly as ggml's reference
/// (`d = amax / 127`, `q = round(x / d)`, ties away from zero), so files agree bit for bit
/// with ggml-quantized ones.
pub fn quantize_row_q8_0(src: &[f32], dst: &mut [BlockQ8_0]) {
    debug_assert_eq!(src.len(), dst.len() * QK);
    for (b, xs) in dst.iter_mut().zip(src.chunks_exact(QK)) {
        let amax = xs.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d).to_bits().to_le_bytes();
        for (q, &x) in b.qs.iter_mut().zip(xs) {
            *q = libm::roundf(x * id) as i8;
        }
    }
}

/// Quantizes `src` (`[dst.len() * QK]`) to q4_0 exactly as ggml's reference: the value of
/// largest magnitude maps to -8 (`d = max / -8`), the rest to `min(15, x / d + 8.5)`
/// truncated, which spends the asymmetric extra level on the largest weight.
pub fn quantize_row_q4_0(src: &[f32], dst: &mut [BlockQ4_0]) {
    debug_assert_eq!(src.len(), dst.len() * QK);
    for (b, xs) in dst.iter_mut().zip(src.chunks_exact(QK)) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &x in xs {
            if amax < x.abs() {
                amax = x.abs();
                max = x;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d).to_bits().to_le_bytes();
        let nibble = |x: f32| ((x * id + 8.5) as i8).min(15) as u8;
        for (i, q) in b.qs.iter_mut().enumerate() {
            *q = nibble(xs[i]) | nibble(xs[i + QK / 2]) << 4;
        }
    }
}

/// `x` in the integer mode's fixed point ([`FX`] fraction bits), rounded to nearest (ties
/// away from zero), saturating at the i32 range.
pub fn to_fixed(x: f32) -> i32 {
    let v = libm::round(f64::from(x) * f64::from(1u32 << FX));
    if v >= i32::MAX as f64 {
        i32::MAX
    } else if v <= i32::MIN as f64 {
        i32::MIN
    } else {
        v as i32
    }
}

/// Quantizes one row to [`DType::I8`]: `s = amax / 127`, `q = round(x / s)` (ties away
/// from zero), `s` stored as `m * 2^-sh` with `m` in `[2^14, 2^15)`, rounded to nearest.
/// A row whose scale is below `2^-(I8_MAX_SHIFT - 14)` (or zero) is stored as zeros.
pub fn quantize_row_i8(src: &[f32], dst: &mut [u8]) {
    let (head, qs) = dst.split_at_mut(core::mem::size_of::<I8Head>());
    let amax = src.iter().fold(0.0f64, |m, &x| m.max(f64::from(x).abs()));
    let s = amax / 127.0;
    // s = f * 2^e, f in [0.5, 1): m = round(f * 2^15) * 2^(e - 15), sh = 15 - e.
    let (mut m, mut sh) = (0u32, 0u32);
    if s > 0.0 {
        let e = libm::floor(libm::log2(s)) as i32 + 1;
        let mut mm = libm::round(s * libm::exp2(f64::from(15 - e))) as u32;
        let mut shift = 15 - e;
        if mm >= 1 << 15 {
            mm >>= 1;
            shift -= 1;
        }
        if (0..=I8_MAX_SHIFT as i32).contains(&shift) {
            (m, sh) = (mm, shift as u32);
        }
    }
    head[..2].copy_from_slice(&(m as u16).to_le_bytes());
    head[2..].copy_from_slice(&(sh as u16).to_le_bytes());
    let scale = f64::from(m) * libm::exp2(-f64::from(sh));
    for (q, &x) in qs.iter_mut().zip(src) {
        *q = if m == 0 { 0 } else { libm::round(f64::from(x) / scale).clamp(-127.0, 127.0) as i8 as u8 };
    }
}

/// Encodes `src` as little-endian f16 (round to nearest even); `dst.len() == 2 * src.len()`.
pub fn encode_row_f16(src: &[f32], dst: &mut [u8]) {
    debug_assert_eq!(dst.len(), 2 * src.len());
    for (o, &x) in dst.chunks_exact_mut(2).zip(src) {
        o.copy_from_slice(&f16::from_f32(x).to_bits().to_le_bytes());
    }
}

/// Encodes `src` as little-endian bf16 (round to nearest even); `dst.len() == 2 * src.len()`.
pub fn encode_row_bf16(src: &[f32], dst: &mut [u8]) {
    debug_assert_eq!(dst.len(), 2 * src.len());
    for (o, &x) in dst.chunks_exact_mut(2).zip(src) {
        o.copy_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes());
    }
}

/// An `f32p` row of `cols` weights split into its base exponent, its used spill slots and
/// its whole blocks. A count past the slots counts as all of them; a row shorter than its
/// head has nothing (callers pass `DType::F32P.row_bytes(cols)` bytes).
pub fn f32p_row(row: &[u8], cols: usize) -> (u32, &[F32PSpill], &[BlockF32P]) {
    let Some((head, blocks)) = row.split_at_checked(DType::F32P.row_head_bytes(cols)) else {
        return (0, &[], &[]);
    };
    let (h, slots) = head.split_at(core::mem::size_of::<F32PHead>());
    let h: &F32PHead = bytemuck::from_bytes(h);
    let slots: &[F32PSpill] = bytemuck::cast_slice(slots);
    let used = (u32::from_le_bytes(h.count) as usize).min(slots.len());
    let whole = blocks.len() - blocks.len() % core::mem::size_of::<BlockF32P>();
    (u32::from_le_bytes(h.base), &slots[..used], bytemuck::cast_slice(&blocks[..whole]))
}

/// The base exponent of an `f32p` row: the largest exponent of its normal weights (0 if
/// it has none).
fn f32p_base(src: &[f32]) -> u32 {
    // Branch-free, so that it vectorizes.
    src.iter().map(|x| x.to_bits() >> 23 & 0xFF).map(|e| if e == 0xFF { 0 } else { e }).fold(0, u32::max)
}

/// An `f32p` weight's exponent nibble under `base`, or `None` if its block cannot hold it
/// (a nonzero weight whose exponent is not normal or more than 14 below `base`).
#[inline]
fn f32p_nibble(bits: u32, base: u32) -> Option<u8> {
    if bits & 0x7FFF_FFFF == 0 {
        Some(F32P_ZERO)
    } else if f32p_holds(bits, base) {
        Some(base.wrapping_sub(bits >> 23 & 0xFF) as u8)
    } else {
        None
    }
}

/// Whether a nonzero weight's exponent is normal and at most 14 below `base` (branch-free).
#[inline]
fn f32p_holds(bits: u32, base: u32) -> bool {
    let e = bits >> 23 & 0xFF;
    (base.wrapping_sub(e) < u32::from(F32P_ZERO)) & (e != 0) & (e != 0xFF)
}

/// How many weights of the row `src` an `f32p` row keeps in its head; the row fits when
/// that is at most [`f32p_slots`] (the exporter stores the tensor as f32 otherwise).
pub fn f32p_spills(src: &[f32]) -> usize {
    let base = f32p_base(src);
    let spills = |bits: u32| usize::from((bits & 0x7FFF_FFFF != 0) & !f32p_holds(bits, base));
    src.iter().map(|x| spills(x.to_bits())).sum()
}

/// Encodes one row of `src` (`src.len() % QK == 0`) as `f32p` into `dst`
/// (`DType::F32P.row_bytes(src.len())` bytes): decoding it gives back every weight's bits.
///
/// # Errors
/// [`Error::InvalidArgument`] if the lengths do not match or the row has more weights to
/// spill than [`f32p_slots`].
pub fn encode_row_f32p(src: &[f32], dst: &mut [u8]) -> Result<()> {
    if DType::F32P.row_bytes(src.len()) != Some(dst.len()) {
        return Err(Error::InvalidArgument);
    }
    let base = f32p_base(src);
    let (head, blocks) = dst.split_at_mut(DType::F32P.row_head_bytes(src.len()));
    let (h, slots) = head.split_at_mut(core::mem::size_of::<F32PHead>());
    let slots: &mut [F32PSpill] = bytemuck::cast_slice_mut(slots);
    slots.fill(F32PSpill { col: [0; 4], bits: [0; 4] });
    let blocks: &mut [BlockF32P] = bytemuck::cast_slice_mut(blocks);
    let mut used = 0;
    for (bi, (xs, b)) in src.chunks_exact(QK).zip(blocks).enumerate() {
        let mut nibbles = [0u8; QK];
        for (i, &x) in xs.iter().enumerate() {
            let bits = x.to_bits();
            let (m, d) = match f32p_nibble(bits, base) {
                Some(d) => (bits & 0x7F_FFFF | (bits >> 31) << 23, d),
                None => {
                    let col = (bi * QK + i) as u32;
                    *slots.get_mut(used).ok_or(Error::InvalidArgument)? =
                        F32PSpill { col: col.to_le_bytes(), bits: bits.to_le_bytes() };
                    used += 1;
                    (0, F32P_ZERO)
                }
            };
            let m = m.to_le_bytes();
            b.m[i] = [m[0], m[1], m[2]];
            nibbles[i] = d;
        }
        for i in 0..QK / 2 {
            b.e[i] = nibbles[i] | nibbles[i + QK / 2] << 4;
        }
    }
    let h: &mut F32PHead = bytemuck::from_bytes_mut(h);
    *h = F32PHead { base: base.to_le_bytes(), count: (used as u32).to_le_bytes() };
    Ok(())
}

/// Encodes a `[src.len() / cols, cols]` matrix as `dtype` into `dst` (the exporter's
/// entry point; the kernels read back exactly these bytes).
///
/// # Errors
/// [`Error::InvalidArgument`] if the shape does not fit `dtype`
/// ([`DType::matrix_bytes`]) or `dst.len()` is not its size.
pub fn quantize_matrix(dtype: DType, cols: usize, src: &[f32], dst: &mut [u8]) -> Result<()> {
    let rows = src.len().checked_div(cols).unwrap_or(0);
    if rows * cols != src.len() || dtype.matrix_bytes(rows, cols) != Some(dst.len()) {
        return Err(Error::InvalidArgument);
    }
    if rows == 0 {
        return Ok(());
    }
    match dtype {
        DType::Q4_0x16 => quantize_groups::<GroupQ4_0x16>(cols, src, dst),
        DType::Q8_0x16 => quantize_groups::<GroupQ8_0x16>(cols, src, dst),
        _ => {
            let rb = dst.len() / rows;
            for (s, d) in src.chunks_exact(cols).zip(dst.chunks_exact_mut(rb.max(1))) {
                quantize_row(dtype, s, d)?;
            }
            Ok(())
        }
    }
}

/// [`quantize_matrix`] for an interleaved dtype of groups `G`: each row's blocks quantized
/// as the plain dtype, then stored in their groups. The shape is checked by the caller.
fn quantize_groups<G: RowGroup>(cols: usize, src: &[f32], dst: &mut [u8]) -> Result<()> {
    let groups: &mut [G] = bytemuck::cast_slice_mut(dst);
    let nb = cols / QK;
    for (g, rows) in groups.chunks_exact_mut(nb).zip(src.chunks_exact(X16 * cols)) {
        for (r, row) in rows.chunks_exact(cols).enumerate() {
            for (group, xs) in g.iter_mut().zip(row.chunks_exact(QK)) {
                let mut b = G::Block::zeroed();
                quantize_row(G::PLAIN, xs, bytemuck::bytes_of_mut(&mut b))?;
                group.set_block(r, &b);
            }
        }
    }
    Ok(())
}

/// Encodes one row of `src.len()` weights as `dtype` into `dst`.
///
/// # Errors
/// [`Error::InvalidArgument`] if `src.len()` is not a whole number of blocks of `dtype`,
/// `dst.len()` is not `dtype.row_bytes(src.len())`, or `dtype` stores rows in groups
/// (use [`quantize_matrix`]).
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    if dtype.row_bytes(src.len()) != Some(dst.len()) || dtype.group_rows() != 1 {
        return Err(Error::InvalidArgument);
    }
    match dtype {
        DType::F32 => {
            for (o, &x) in dst.chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        DType::F16 => encode_row_f16(src, dst),
        DType::BF16 => encode_row_bf16(src, dst),
        DType::Q8_0 => quantize_row_q8_0(src, bytemuck::cast_slice_mut(dst)),
        DType::Q4_0 => quantize_row_q4_0(src, bytemuck::cast_slice_mut(dst)),
        DType::F32P => encode_row_f32p(src, dst)?,
        DType::I8 => quantize_row_i8(src, dst),
        DType::I32 => {
            for (o, &x) in dst.chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&to_fixed(x).to_le_bytes());
            }
        }
        DType::Q4_0x16 | DType::Q8_0x16 => return Err(Error::InvalidArgument),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::scalar::dequant_row;
    use crate::kernels::tests::values;
    extern crate std;
    use std::vec;

    /// Every upper half of the bits with the low halves at and around the rounding point
    /// (ties, both sides, the extremes), and a spread of all bits: `half`'s bits, NaNs,
    /// infinities and overflow included.
    #[test]
    fn round_bf16_is_halfs_rounding() {
        let edges = [0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF];
        let near = (0..=0xFFFFu32).flat_map(|hi| edges.map(|lo| hi << 16 | lo));
        for b in near.chain((0..=u32::MAX).step_by(9973)) {
            let x = f32::from_bits(b);
            assert_eq!(round_bf16(x).to_bits(), bf16::from_f32(x).to_f32().to_bits(), "{b:#010x}");
        }
    }

    /// Encodes then decodes `src` as `dtype`.
    fn round_trip(dtype: DType, src: &[f32]) -> [f32; 1024] {
        let mut bytes = [0u8; 4096];
        let nbytes = dtype.row_bytes(src.len()).unwrap();
        quantize_row(dtype, src, &mut bytes[..nbytes]).unwrap();
        let mut out = [0.0; 1024];
        dequant_row(dtype, &bytes[..nbytes], &mut out[..src.len()]);
        out
    }

    #[test]
    fn floats_round_trip_within_their_precision() {
        let x = values(1023, 1);
        assert_eq!(&round_trip(DType::F32, &x)[..1023], &x[..]);
        for (dtype, rel) in [(DType::F16, 1.0 / 2048.0), (DType::BF16, 1.0 / 256.0)] {
            let y = round_trip(dtype, &x);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= rel * a.abs(), "{dtype:?}: {a} -> {b}");
            }
        }
    }

    #[test]
    fn f32p_keeps_every_bit() {
        let mut x = values(512, 5);
        // Zeros of both signs, the smallest normal, a subnormal, an infinity, a NaN with a
        // payload, and a weight 2^-20 below the largest: all but the zeros spill.
        let specials = [0.0, -0.0, f32::MIN_POSITIVE, -1e-40, f32::INFINITY, f32::from_bits(0x7FC0_1234), 3e-6];
        for (i, v) in specials.into_iter().enumerate() {
            x[17 * i + 1] = v;
        }
        assert_eq!(f32p_spills(&x), 5);
        let y = round_trip(DType::F32P, &x);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<vec::Vec<_>>();
        assert_eq!(bits(&y[..512]), bits(&x));
        // 28 bits a weight, plus the head: 8 bytes and 4 + cols / 512 slots of 8.
        assert_eq!(DType::F32P.row_bytes(512), Some(512 / 32 * 112 + 8 + 5 * 8));
        assert_eq!(DType::F32P.row_bytes(1024), Some(1024 / 32 * 112 + 8 + 6 * 8));
        assert_eq!(DType::F32P.row_bytes(48), None);
    }

    #[test]
    fn f32p_refuses_rows_with_more_spills_than_slots() {
        let mut x = values(64, 6);
        for i in 0..5 {
            x[3 * i] = 1e-30;
        }
        assert_eq!(f32p_spills(&x), 5);
        let mut buf = [0u8; 512];
        let len = DType::F32P.row_bytes(64).unwrap();
        assert_eq!(quantize_row(DType::F32P, &x, &mut buf[..len]), Err(Error::InvalidArgument));
        x[0] = 0.5;
        assert_eq!(quantize_row(DType::F32P, &x, &mut buf[..len]), Ok(()));
        // A row cut short has only its whole parts; a count past the slots means all.
        assert_eq!(f32p_row(&buf[..10], 64).2.len(), 0);
        assert_eq!(f32p_row(&buf[..len - 1], 64).2.len(), 1);
        buf[4] = 200;
        assert_eq!(f32p_row(&buf[..len], 64).1.len(), f32p_slots(64));
    }

    #[test]
    fn q8_0_round_trip_error_is_half_a_step() {
        let x = values(1024, 2);
        let y = round_trip(DType::Q8_0, &x);
        for (xs, ys) in x.chunks(QK).zip(y.chunks(QK)) {
            let d = xs.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
            // Half a step, plus the f16 rounding of d spread over up to 127 steps.
            let bound = d * (0.5 + 127.0 / 2048.0);
            for (a, b) in xs.iter().zip(ys) {
                assert!((a - b).abs() <= bound, "{a} -> {b} (d {d})");
            }
        }
    }

    #[test]
    fn q4_0_round_trip_error_is_one_step() {
        let x = values(1024, 3);
        let y = round_trip(DType::Q4_0, &x);
        let (mut sq_err, mut uniform) = (0.0, 0.0);
        for (xs, ys) in x.chunks(QK).zip(y.chunks(QK)) {
            let d = xs.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 8.0;
            for (a, b) in xs.iter().zip(ys) {
                // Values near +8d round down to level 7: up to one full step.
                assert!((a - b).abs() <= d * (1.0 + 8.0 / 2048.0), "{a} -> {b} (d {d})");
                sq_err += (a - b) * (a - b);
            }
            uniform += QK as f32 * d * d / 12.0;
        }
        // Everywhere but at the clamped top level the error is plain rounding: its mean
        // square is that of a uniform error over one step, d^2 / 12.
        assert!(sq_err < 1.25 * uniform, "squared error {sq_err}, uniform rounding {uniform}");
    }

    #[test]
    fn quantizers_match_ggml_on_hand_values() {
        let mut x = [0.0f32; QK];
        x[0] = -2.0;
        x[1] = 1.0;
        x[2] = 0.5;
        x[3] = 2.0;
        let mut q8 = [BlockQ8_0 { d: [0; 2], qs: [0; QK] }];
        quantize_row_q8_0(&x, &mut q8);
        assert_eq!(f16_le(q8[0].d), f16::from_f32(2.0 / 127.0).to_f32());
        assert_eq!(&q8[0].qs[..5], &[-127, 64, 32, 127, 0]);
        let mut q4 = [BlockQ4_0 { d: [0; 2], qs: [0; QK / 2] }];
        quantize_row_q4_0(&x, &mut q4);
        // d = -2 / -8 = 0.25: -2 -> 0, 1 -> 12, 0.5 -> 10, 2 -> min(15, 16) = 15, 0 -> 8.
        assert_eq!(f16_le(q4[0].d), 0.25);
        assert_eq!(&q4[0].qs[..5], &[0x80, 0x8c, 0x8a, 0x8f, 0x88]);
    }

    #[test]
    fn quantize_row_rejects_mismatched_lengths() {
        let x = [0.0f32; 64];
        let mut buf = [0u8; 256];
        assert_eq!(quantize_row(DType::Q8_0, &x[..33], &mut buf[..68]), Err(Error::InvalidArgument));
        assert_eq!(quantize_row(DType::Q8_0, &x, &mut buf[..67]), Err(Error::InvalidArgument));
        assert_eq!(quantize_row(DType::F16, &x[..3], &mut buf[..6]), Ok(()));
        // Interleaved dtypes encode whole matrices only.
        assert_eq!(quantize_row(DType::Q4_0x16, &x, &mut buf[..36]), Err(Error::InvalidArgument));
    }

    /// Checks that the `G` groups of interleaved `dtype` hold the plain dtype's blocks of
    /// 16 rows each, and whole groups only.
    fn holds_the_plain_blocks<G: RowGroup>(dtype: DType) {
        let (rows, cols) = (32, 96);
        let x = values(rows * cols, 4);
        let plain = G::PLAIN;
        assert_eq!((dtype.plain(), plain.interleaved()), (plain, Some(dtype)));
        let mut flat = vec![0u8; plain.matrix_bytes(rows, cols).unwrap()];
        let mut x16 = vec![0u8; dtype.matrix_bytes(rows, cols).unwrap()];
        quantize_matrix(plain, cols, &x, &mut flat).unwrap();
        quantize_matrix(dtype, cols, &x, &mut x16).unwrap();
        assert_eq!(flat.len(), x16.len());
        let (bb, nb) = (plain.block_bytes(), cols / QK);
        let groups: &[G] = bytemuck::cast_slice(&x16);
        for r in 0..rows {
            for b in 0..nb {
                let want = &flat[(r * nb + b) * bb..][..bb];
                assert_eq!(bytemuck::bytes_of(&groups[r / X16 * nb + b].block(r % X16)), want, "row {r} block {b}");
            }
        }
        // Piece v of a group block: 4 bytes of each row in turn (after the 16 scales).
        let g = bytemuck::bytes_of(&groups[0]);
        assert_eq!(g[2 * X16 + (X16 + 3) * 4..][..4], flat[3 * nb * bb + 2 + 4..][..4]);
        // Whole groups of rows only.
        assert_eq!(dtype.matrix_bytes(17, cols), None);
        assert_eq!(plain.matrix_bytes(17, cols), Some(17 * 3 * bb));
        let mut odd = vec![0u8; 17 * 3 * bb];
        assert_eq!(quantize_matrix(dtype, cols, &x[..17 * cols], &mut odd), Err(Error::InvalidArgument));
        assert_eq!(DType::from_u8(dtype as u8), Some(dtype));
        assert_eq!(DType::from_name(dtype.name()), Some(dtype));
    }

    #[test]
    fn interleaved_dtypes_hold_the_plain_blocks_of_16_rows() {
        holds_the_plain_blocks::<GroupQ4_0x16>(DType::Q4_0x16);
        holds_the_plain_blocks::<GroupQ8_0x16>(DType::Q8_0x16);
    }
}

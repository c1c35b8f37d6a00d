//! Weight storage formats: the dtype tag of the file format and the quant block layouts.
//!
//! Every block type is defined once here, with size asserts, and used by the kernels,
//! the exporter and the tests alike.

use half::{bf16, f16};

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

const _: () = assert!(core::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(core::mem::size_of::<BlockQ4_0>() == 18);

impl DType {
    /// Parses the on-disk tag.
    pub const fn from_u8(v: u8) -> Option<DType> {
        match v {
            0 => Some(DType::F32),
            1 => Some(DType::F16),
            2 => Some(DType::BF16),
            3 => Some(DType::Q8_0),
            4 => Some(DType::Q4_0),
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
        }
    }

    /// Parses a command-line name.
    pub fn from_name(s: &str) -> Option<DType> {
        [DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0].into_iter().find(|d| d.name() == s)
    }

    /// Weights per storage unit (1 for floats, [`QK`] for quant blocks).
    pub const fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 => QK,
        }
    }

    /// Bytes per storage unit.
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => core::mem::size_of::<BlockQ8_0>(),
            DType::Q4_0 => core::mem::size_of::<BlockQ4_0>(),
        }
    }

    /// Bytes of one row of `cols` weights, or `None` if `cols` is not a whole number of
    /// blocks (or overflows).
    pub const fn row_bytes(self, cols: usize) -> Option<usize> {
        if cols % self.block_len() != 0 {
            return None;
        }
        (cols / self.block_len()).checked_mul(self.block_bytes())
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

/// Rounds an f32 to bf16 precision (round to nearest even), as torch's `.bfloat16()`.
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Encodes one row of f32 weights as `dtype` (`dst.len() == dtype.row_bytes(src.len())`).
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) {
    match dtype {
        DType::F32 => {
            for (d, &x) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        DType::F16 => {
            for (d, &x) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f16::from_f32(x).to_bits().to_le_bytes());
            }
        }
        DType::BF16 => {
            for (d, &x) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes());
            }
        }
        DType::Q8_0 | DType::Q4_0 => unimplemented!("quantizers land with the kernels branch"),
    }
}

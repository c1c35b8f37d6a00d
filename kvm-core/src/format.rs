//! Model format v1: the byte layout of a `.kvm` file, its parser and its encoders.
//!
//! `FORMAT.md` at the repository root is the normative description; this module is its
//! implementation. Layout, all little-endian:
//!
//! ```text
//! [0, 256)            header: magic, version, byte-order mark, sizes, section table,
//!                     config, header CRC
//! [table_offset, ..)  tensor table: n_tensors entries of 48 bytes, canonical order
//! [tok_offset, ..)    tokenizer section (see `tokenizer`)
//! [.., file_len)      tensor data, each tensor at a 64-byte aligned offset
//! ```
//!
//! Parsing never panics and never reads out of bounds, whatever the input: every offset is
//! checked with overflow-free arithmetic before it is sliced.

use crate::cache::{CacheDtype, SlotReads};
use crate::config::{Config, StateBudget};
pub use crate::crc::{crc32, crc32_update};
use crate::error::{ConfigField, Error, Result, Section};
use crate::quant::DType;

/// `KVMF`.
pub const MAGIC: [u8; 4] = *b"KVMF";
/// The major version this build reads; a file with another major is refused.
pub const VERSION_MAJOR: u16 = 1;
/// The minor version this build writes (1 added the cache dtype, 2 the q4_0x16 dtype and
/// the q8 cache, 3 the q8_0x16 dtype, 5 the slot reads, 6 the hybrid stack's alternate
/// layers, 7 the integer numerics and its i8 and i32 dtypes); newer minors are read (they
/// only add fields in reserved space, or tags).
pub const VERSION_MINOR: u16 = 7;
/// Written as a little-endian u32; reads back differently on a byte-swapped file.
pub const BYTE_ORDER_MARK: u32 = 0x0A0B_0C0D;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 256;
/// Size of one tensor table entry.
pub const ENTRY_LEN: usize = 48;
/// Alignment of every tensor's data within the file.
pub const TENSOR_ALIGN: usize = 64;

/// Kind of the tokenizer section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u32)]
pub enum TokenizerKind {
    /// Token id = byte value; the section is empty.
    Bytes = 0,
    /// GPT-2 style byte-level BPE; the section is a `tokenizer` blob.
    Bpe = 1,
}

/// The decoded fixed header.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Header {
    pub minor: u16,
    pub file_len: u64,
    /// Arena bytes of a session at the default state capacity.
    pub arena_len: u64,
    /// State slots the default arena holds.
    pub state_capacity: u32,
    /// How sessions store the rows attention reads (minor 1; zero, f32, before).
    pub cache: CacheDtype,
    /// Where sessions keep the slots' read rows (minor 5; zero, stored, before).
    pub reads: SlotReads,
    pub n_tensors: u32,
    pub table_offset: u64,
    pub table_len: u64,
    pub table_crc: u32,
    pub tokenizer_kind: TokenizerKind,
    pub tokenizer_offset: u64,
    pub tokenizer_len: u64,
    pub tokenizer_crc: u32,
    pub config: Config,
}

/// One tensor table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TensorEntry {
    pub role: Role,
    /// Layer index; 0 for global tensors.
    pub layer: u16,
    pub dtype: DType,
    pub rows: u32,
    pub cols: u32,
    pub offset: u64,
    pub len: u64,
    pub crc: u32,
}

macro_rules! roles {
    ($($(#[$doc:meta])* $name:ident = $v:literal, $hf:literal;)*) => {
        /// What a tensor is. The discriminant is the on-disk tag; the HF name pattern
        /// (with `{}` for the layer) is what `kvm-export` reads.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "defmt", derive(defmt::Format))]
        #[repr(u16)]
        pub enum Role { $($(#[$doc])* $name = $v,)* }

        impl Role {
            /// Every role, in canonical (file) order.
            pub const ALL: &'static [Role] = &[$(Role::$name,)*];

            /// Parses the on-disk tag.
            pub const fn from_u16(v: u16) -> Option<Role> {
                match v { $($v => Some(Role::$name),)* _ => None }
            }

            /// The checkpoint tensor name, `{}` standing for the layer index.
            pub const fn hf_name(self) -> &'static str {
                match self { $(Role::$name => $hf,)* }
            }
        }
    };
}

roles! {
    /// `[vocab_len, d_model]`
    TokEmbed = 0, "transformer.wte.weight";
    LnEmbW = 1, "transformer.ln_emb.weight";
    LnEmbB = 2, "transformer.ln_emb.bias";
    LnHeadW = 3, "transformer.ln_head.weight";
    LnHeadB = 4, "transformer.ln_head.bias";
    /// `[vocab_len, d_model]`
    LmHead = 5, "lm_head.weight";
    LnAttnW = 16, "transformer.h.{}.ln_attn.weight";
    LnAttnB = 17, "transformer.h.{}.ln_attn.bias";
    /// `[n_heads * d_qk, d_model]`
    Wq = 18, "transformer.h.{}.attn.c_q.weight";
    Wk = 19, "transformer.h.{}.attn.c_k.weight";
    /// `[n_heads * d_v, d_model]`
    Wv = 20, "transformer.h.{}.attn.c_v.weight";
    ShiftQ = 21, "transformer.h.{}.attn.x_q";
    ShiftK = 22, "transformer.h.{}.attn.x_k";
    ShiftV = 23, "transformer.h.{}.attn.x_v";
    VGate0 = 24, "transformer.h.{}.attn.v_gate0";
    /// `[d_vgate, d_model]`
    VGate1 = 25, "transformer.h.{}.attn.v_gate1.weight";
    /// `[n_heads * d_v, d_vgate]`
    VGate2 = 26, "transformer.h.{}.attn.v_gate2.weight";
    LnQW = 27, "transformer.h.{}.attn.ln_q.weight";
    LnQB = 28, "transformer.h.{}.attn.ln_q.bias";
    LnKW = 29, "transformer.h.{}.attn.ln_k.weight";
    LnKB = 30, "transformer.h.{}.attn.ln_k.bias";
    LnSkW = 31, "transformer.h.{}.attn.ln_s_k.weight";
    LnSkB = 32, "transformer.h.{}.attn.ln_s_k.bias";
    /// `[n_heads, d_model]`
    MergeGate = 33, "transformer.h.{}.attn.key_weighting.weight";
    FrontTemp = 34, "transformer.h.{}.attn.front_head_temp";
    StateTemp = 35, "transformer.h.{}.attn.state_head_temp";
    /// `[d_model, n_heads * d_v]`
    Wo = 36, "transformer.h.{}.attn.c_proj.weight";
    LnMlpW = 37, "transformer.h.{}.ln_mlp.weight";
    LnMlpB = 38, "transformer.h.{}.ln_mlp.bias";
    ShiftFfn = 39, "transformer.h.{}.mlp.x_k";
    /// `[d_ff, d_model]`
    WUp = 40, "transformer.h.{}.mlp.c_fc.weight";
    /// `[d_model, d_ff]`
    WDown = 41, "transformer.h.{}.mlp.c_proj.weight";
}

/// Number of global (non-layer) roles; they come first in [`Role::ALL`].
pub const N_GLOBAL_ROLES: usize = 6;

impl Role {
    /// Whether the role is a per-layer tensor.
    pub const fn is_layer(self) -> bool {
        (self as u16) >= 16
    }

    /// Whether the tensor is a matrix used by the kernels (any [`DType`]); every other
    /// role is a small f32 vector.
    pub const fn is_matrix(self) -> bool {
        matches!(
            self,
            Role::TokEmbed
                | Role::LmHead
                | Role::Wq
                | Role::Wk
                | Role::Wv
                | Role::VGate1
                | Role::VGate2
                | Role::MergeGate
                | Role::Wo
                | Role::WUp
                | Role::WDown
        )
    }

    /// Whether only a KVM layer has the role: an alternate layer (spec §5) has the same
    /// tensors but these.
    pub const fn is_kvm_only(self) -> bool {
        matches!(self, Role::MergeGate | Role::LnSkW | Role::LnSkB | Role::FrontTemp | Role::StateTemp)
    }

    /// The `[rows, cols]` this role has in layer `layer` (ignored for a global role) under
    /// `cfg`, or `None` if that layer has no such tensor.
    pub fn shape(self, cfg: &Config, layer: usize) -> Option<(u32, u32)> {
        use crate::config::flags as f;
        if self.is_layer() && self.is_kvm_only() && cfg.is_alt(layer) {
            return None;
        }
        let d = cfg.d_model;
        let q = cfg.n_heads * cfg.d_qk;
        let v = cfg.n_heads * cfg.d_v;
        let on = |flag: u32| cfg.has(flag);
        Some(match self {
            Role::TokEmbed | Role::LmHead => (cfg.vocab_len, d),
            Role::LnEmbW | Role::LnEmbB | Role::LnHeadW | Role::LnHeadB => (1, d),
            Role::LnAttnW | Role::LnAttnB | Role::LnMlpW | Role::LnMlpB => (1, d),
            Role::Wq | Role::Wk => (q, d),
            Role::Wv => (v, d),
            Role::ShiftQ | Role::ShiftK if on(f::TOKENSHIFT_ATT) => (1, q),
            Role::ShiftV if on(f::TOKENSHIFT_ATT) => (1, v),
            Role::VGate0 if on(f::VALUE_RESIDUAL) => (1, v),
            Role::VGate1 if on(f::VALUE_RESIDUAL) => (cfg.d_vgate, d),
            Role::VGate2 if on(f::VALUE_RESIDUAL) => (v, cfg.d_vgate),
            Role::LnQW | Role::LnQB | Role::LnKW | Role::LnKB | Role::LnSkW | Role::LnSkB => (1, cfg.d_qk),
            Role::MergeGate if on(f::MERGE_GATE_KEYS) || on(f::MERGE_GATE_VALUES) => (cfg.n_heads, d),
            Role::FrontTemp | Role::StateTemp if on(f::HEAD_TEMPS) => (1, cfg.n_heads),
            Role::Wo => (d, v),
            Role::ShiftFfn if on(f::TOKENSHIFT_FFN) => (1, d),
            Role::WUp => (cfg.d_ff, d),
            Role::WDown => (d, cfg.d_ff),
            _ => return None,
        })
    }
}

/// Bounds-checked little-endian reader over a byte slice.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn bytes<const N: usize>(&self, at: usize) -> Result<[u8; N]> {
        let end = at.checked_add(N).ok_or(Error::Truncated)?;
        let s = self.0.get(at..end).ok_or(Error::Truncated)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }
    fn u16(&self, at: usize) -> Result<u16> {
        self.bytes(at).map(u16::from_le_bytes)
    }
    fn u32(&self, at: usize) -> Result<u32> {
        self.bytes(at).map(u32::from_le_bytes)
    }
    fn i32(&self, at: usize) -> Result<i32> {
        self.bytes(at).map(i32::from_le_bytes)
    }
    fn u64(&self, at: usize) -> Result<u64> {
        self.bytes(at).map(u64::from_le_bytes)
    }
    fn f32(&self, at: usize) -> Result<f32> {
        self.bytes(at).map(f32::from_le_bytes)
    }
    fn f64(&self, at: usize) -> Result<f64> {
        self.bytes(at).map(f64::from_le_bytes)
    }
}

/// Byte offsets of the header fields (see FORMAT.md).
mod at {
    pub const MAGIC: usize = 0;
    pub const MAJOR: usize = 4;
    pub const MINOR: usize = 6;
    pub const BOM: usize = 8;
    pub const HEADER_LEN: usize = 12;
    pub const HEADER_CRC: usize = 16;
    pub const FILE_LEN: usize = 24;
    pub const ARENA_LEN: usize = 32;
    pub const STATE_CAPACITY: usize = 40;
    pub const N_TENSORS: usize = 44;
    pub const TABLE_OFFSET: usize = 48;
    pub const TABLE_LEN: usize = 56;
    pub const TABLE_CRC: usize = 64;
    pub const TOK_KIND: usize = 68;
    pub const TOK_OFFSET: usize = 72;
    pub const TOK_LEN: usize = 80;
    pub const TOK_CRC: usize = 88;
    pub const CACHE: usize = 92;
    pub const CONFIG: usize = 96;
    /// After the config's last field (`SATURATION_N`, an f64 at `CONFIG + 104`).
    pub const SLOT_READS: usize = 208;
    /// The hybrid stack's fields (minor 6; zero, no alternate layers, before).
    pub const ALT_EVERY: usize = 212;
    pub const ALT_WINDOW: usize = 216;
    pub const ALT_ROPE_DIM: usize = 220;
    pub const ALT_ROPE_THETA: usize = 224;
}

/// Byte offsets of the config fields, relative to `at::CONFIG`.
mod cfg_at {
    pub const VOCAB: usize = 0;
    pub const LAYERS: usize = 4;
    pub const HEADS: usize = 8;
    pub const D_MODEL: usize = 12;
    pub const D_QK: usize = 16;
    pub const D_V: usize = 20;
    pub const D_FF: usize = 24;
    pub const D_VGATE: usize = 28;
    pub const ROPE_DIM: usize = 32;
    pub const CHUNK: usize = 36;
    pub const WINDOW_CHUNKS: usize = 40;
    pub const MAX_STATE_CHUNKS: usize = 44;
    pub const BUDGET: usize = 48;
    pub const STATE_MIN: usize = 52;
    pub const ROUND_DOWN: usize = 56;
    pub const SINK: usize = 60;
    pub const FLAGS: usize = 64;
    pub const SOFTCAP: usize = 68;
    pub const RESIDUAL_SCALE: usize = 72;
    pub const ROPE_THETA: usize = 80;
    pub const GROWTH_FACTOR: usize = 88;
    pub const GROWTH_EXPONENT: usize = 96;
    pub const SATURATION_N: usize = 104;
}

impl Header {
    /// Parses and checks the fixed header: magic, version, byte order, header CRC, and
    /// that every section lies inside a blob of `blob_len` bytes. The config is decoded
    /// but not validated (see [`Config::validate`]).
    ///
    /// # Errors
    /// [`Error::Truncated`], [`Error::BadMagic`], [`Error::UnsupportedVersion`],
    /// [`Error::BadEndianness`], [`Error::Checksum`], [`Error::OutOfBounds`],
    /// [`Error::ExtraBytes`], [`Error::BadConfig`].
    pub fn parse(blob: &[u8]) -> Result<Header> {
        Self::check_front(blob)?;
        let r = Reader(blob);
        let minor = r.u16(at::MINOR)?;
        let config = Self::config(&r, Self::budget(&r)?)?;
        let tokenizer_kind = match r.u32(at::TOK_KIND)? {
            0 => TokenizerKind::Bytes,
            1 => TokenizerKind::Bpe,
            _ => return Err(Error::BadTokenizer),
        };
        let cache = CacheDtype::from_u32(r.u32(at::CACHE)?).ok_or(Error::BadConfig(ConfigField::CacheDtype))?;
        let reads = SlotReads::from_u32(r.u32(at::SLOT_READS)?).ok_or(Error::BadConfig(ConfigField::SlotReads))?;
        let h = Header {
            minor,
            file_len: r.u64(at::FILE_LEN)?,
            arena_len: r.u64(at::ARENA_LEN)?,
            state_capacity: r.u32(at::STATE_CAPACITY)?,
            cache,
            reads,
            n_tensors: r.u32(at::N_TENSORS)?,
            table_offset: r.u64(at::TABLE_OFFSET)?,
            table_len: r.u64(at::TABLE_LEN)?,
            table_crc: r.u32(at::TABLE_CRC)?,
            tokenizer_kind,
            tokenizer_offset: r.u64(at::TOK_OFFSET)?,
            tokenizer_len: r.u64(at::TOK_LEN)?,
            tokenizer_crc: r.u32(at::TOK_CRC)?,
            config,
        };
        if h.file_len != blob.len() as u64 {
            let (file_len, blob_len) = (h.file_len, blob.len() as u64);
            return Err(if blob_len < file_len { Error::Truncated } else { Error::ExtraBytes { file_len, blob_len } });
        }
        if (h.n_tensors as u64).checked_mul(ENTRY_LEN as u64) != Some(h.table_len) {
            return Err(Error::OutOfBounds);
        }
        section(blob, h.table_offset, h.table_len)?;
        section(blob, h.tokenizer_offset, h.tokenizer_len)?;
        Ok(h)
    }

    /// The config's state budget and its parameters; those of the other budgets must be 0.
    fn budget(r: &Reader<'_>) -> Result<StateBudget> {
        let c = at::CONFIG;
        let (factor, exponent) = (r.f64(c + cfg_at::GROWTH_FACTOR)?, r.f64(c + cfg_at::GROWTH_EXPONENT)?);
        let saturation_n = r.f64(c + cfg_at::SATURATION_N)?;
        // The parameters of the other budgets are 0 (FORMAT.md): anything else, NaN
        // included, is a file that says two things.
        let unused = |v: f64, field| if v == 0.0 { Ok(()) } else { Err(Error::BadConfig(field)) };
        match r.u32(c + cfg_at::BUDGET)? {
            0 => {
                unused(factor, ConfigField::StateGrowth)?;
                unused(exponent, ConfigField::StateGrowth)?;
                unused(saturation_n, ConfigField::StateSaturation)?;
                Ok(StateBudget::Fixed)
            }
            1 => {
                unused(saturation_n, ConfigField::StateSaturation)?;
                Ok(StateBudget::PowerLaw { factor, exponent })
            }
            2 => {
                unused(factor, ConfigField::StateGrowth)?;
                unused(exponent, ConfigField::StateGrowth)?;
                Ok(StateBudget::Saturation { n: saturation_n })
            }
            _ => Err(Error::BadConfig(ConfigField::StateBudget)),
        }
    }

    /// The config as the header stores it, with its decoded `budget`; not validated.
    fn config(r: &Reader<'_>, budget: StateBudget) -> Result<Config> {
        let c = at::CONFIG;
        Ok(Config {
            vocab_len: r.u32(c + cfg_at::VOCAB)?,
            n_layers: r.u32(c + cfg_at::LAYERS)?,
            n_heads: r.u32(c + cfg_at::HEADS)?,
            d_model: r.u32(c + cfg_at::D_MODEL)?,
            d_qk: r.u32(c + cfg_at::D_QK)?,
            d_v: r.u32(c + cfg_at::D_V)?,
            d_ff: r.u32(c + cfg_at::D_FF)?,
            d_vgate: r.u32(c + cfg_at::D_VGATE)?,
            rope_dim: r.u32(c + cfg_at::ROPE_DIM)?,
            rope_theta: r.f64(c + cfg_at::ROPE_THETA)?,
            chunk_len: r.u32(c + cfg_at::CHUNK)?,
            window_chunks: r.u32(c + cfg_at::WINDOW_CHUNKS)?,
            max_state_chunks: r.u32(c + cfg_at::MAX_STATE_CHUNKS)?,
            budget,
            state_min_len: r.i32(c + cfg_at::STATE_MIN)?,
            state_round_down: r.u32(c + cfg_at::ROUND_DOWN)?,
            sink_len: r.u32(c + cfg_at::SINK)?,
            logit_softcap: r.f32(c + cfg_at::SOFTCAP)?,
            residual_scale: r.f32(c + cfg_at::RESIDUAL_SCALE)?,
            flags: r.u32(c + cfg_at::FLAGS)?,
            alt_layer_every: r.u32(at::ALT_EVERY)?,
            alt_window: r.u32(at::ALT_WINDOW)?,
            alt_rope_dim: r.u32(at::ALT_ROPE_DIM)?,
            alt_rope_theta: r.f64(at::ALT_ROPE_THETA)?,
        })
    }

    /// The file length stated by the header at the front of `head` (the first
    /// [`HEADER_LEN`] bytes of a file are enough), after the checks that need nothing
    /// else: magic, version, byte order, header CRC. A loader compares it with the file's
    /// size before reading the file.
    ///
    /// # Errors
    /// [`Error::Truncated`], [`Error::BadMagic`], [`Error::UnsupportedVersion`],
    /// [`Error::BadEndianness`], [`Error::Checksum`], [`Error::OutOfBounds`].
    pub fn stated_file_len(head: &[u8]) -> Result<u64> {
        Self::check_front(head)?;
        Reader(head).u64(at::FILE_LEN)
    }

    fn check_front(blob: &[u8]) -> Result<()> {
        let r = Reader(blob);
        if r.bytes::<4>(at::MAGIC)? != MAGIC {
            return Err(Error::BadMagic);
        }
        let major = r.u16(at::MAJOR)?;
        let minor = r.u16(at::MINOR)?;
        if major != VERSION_MAJOR {
            return Err(Error::UnsupportedVersion { major, minor });
        }
        if r.u32(at::BOM)? != BYTE_ORDER_MARK {
            return Err(Error::BadEndianness);
        }
        if r.u32(at::HEADER_LEN)? as usize != HEADER_LEN {
            return Err(Error::OutOfBounds);
        }
        let head = blob.get(..HEADER_LEN).ok_or(Error::Truncated)?;
        if header_crc(head) != r.u32(at::HEADER_CRC)? {
            return Err(Error::Checksum { section: Section::Header });
        }
        Ok(())
    }

    /// Encodes the header (CRC included) into its 256 bytes.
    pub fn encode(&self, out: &mut [u8; HEADER_LEN]) {
        out.fill(0);
        let mut w = Writer(out);
        w.put(at::MAGIC, &MAGIC);
        w.put(at::MAJOR, &VERSION_MAJOR.to_le_bytes());
        w.put(at::MINOR, &self.minor.to_le_bytes());
        w.put(at::BOM, &BYTE_ORDER_MARK.to_le_bytes());
        w.put(at::HEADER_LEN, &(HEADER_LEN as u32).to_le_bytes());
        w.put(at::FILE_LEN, &self.file_len.to_le_bytes());
        w.put(at::ARENA_LEN, &self.arena_len.to_le_bytes());
        w.put(at::STATE_CAPACITY, &self.state_capacity.to_le_bytes());
        w.put(at::N_TENSORS, &self.n_tensors.to_le_bytes());
        w.put(at::TABLE_OFFSET, &self.table_offset.to_le_bytes());
        w.put(at::TABLE_LEN, &self.table_len.to_le_bytes());
        w.put(at::TABLE_CRC, &self.table_crc.to_le_bytes());
        w.put(at::TOK_KIND, &(self.tokenizer_kind as u32).to_le_bytes());
        w.put(at::TOK_OFFSET, &self.tokenizer_offset.to_le_bytes());
        w.put(at::TOK_LEN, &self.tokenizer_len.to_le_bytes());
        w.put(at::TOK_CRC, &self.tokenizer_crc.to_le_bytes());
        w.put(at::CACHE, &(self.cache as u32).to_le_bytes());
        w.put(at::SLOT_READS, &(self.reads as u32).to_le_bytes());
        let k = &self.config;
        w.put(at::ALT_EVERY, &k.alt_layer_every.to_le_bytes());
        w.put(at::ALT_WINDOW, &k.alt_window.to_le_bytes());
        w.put(at::ALT_ROPE_DIM, &k.alt_rope_dim.to_le_bytes());
        w.put(at::ALT_ROPE_THETA, &k.alt_rope_theta.to_le_bytes());
        let c = at::CONFIG;
        for (off, v) in [
            (cfg_at::VOCAB, k.vocab_len),
            (cfg_at::LAYERS, k.n_layers),
            (cfg_at::HEADS, k.n_heads),
            (cfg_at::D_MODEL, k.d_model),
            (cfg_at::D_QK, k.d_qk),
            (cfg_at::D_V, k.d_v),
            (cfg_at::D_FF, k.d_ff),
            (cfg_at::D_VGATE, k.d_vgate),
            (cfg_at::ROPE_DIM, k.rope_dim),
            (cfg_at::CHUNK, k.chunk_len),
            (cfg_at::WINDOW_CHUNKS, k.window_chunks),
            (cfg_at::MAX_STATE_CHUNKS, k.max_state_chunks),
            (cfg_at::ROUND_DOWN, k.state_round_down),
            (cfg_at::SINK, k.sink_len),
            (cfg_at::FLAGS, k.flags),
        ] {
            w.put(c + off, &v.to_le_bytes());
        }
        let (budget, factor, exponent, sat) = match k.budget {
            StateBudget::Fixed => (0u32, 0.0, 0.0, 0.0),
            StateBudget::PowerLaw { factor, exponent } => (1, factor, exponent, 0.0),
            StateBudget::Saturation { n } => (2, 0.0, 0.0, n),
        };
        w.put(c + cfg_at::BUDGET, &budget.to_le_bytes());
        w.put(c + cfg_at::STATE_MIN, &k.state_min_len.to_le_bytes());
        w.put(c + cfg_at::SOFTCAP, &k.logit_softcap.to_le_bytes());
        w.put(c + cfg_at::RESIDUAL_SCALE, &k.residual_scale.to_le_bytes());
        w.put(c + cfg_at::ROPE_THETA, &k.rope_theta.to_le_bytes());
        w.put(c + cfg_at::GROWTH_FACTOR, &factor.to_le_bytes());
        w.put(c + cfg_at::GROWTH_EXPONENT, &exponent.to_le_bytes());
        w.put(c + cfg_at::SATURATION_N, &sat.to_le_bytes());
        let crc = header_crc(&out[..]);
        out[at::HEADER_CRC..at::HEADER_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

struct Writer<'a>(&'a mut [u8; HEADER_LEN]);

impl Writer<'_> {
    fn put(&mut self, at: usize, bytes: &[u8]) {
        self.0[at..at + bytes.len()].copy_from_slice(bytes);
    }
}

/// CRC-32 of the header with its CRC field taken as zero.
fn header_crc(head: &[u8]) -> u32 {
    let crc = crc32_update(0, &head[..at::HEADER_CRC]);
    let crc = crc32_update(crc, &[0; 4]);
    crc32_update(crc, &head[at::HEADER_CRC + 4..HEADER_LEN])
}

/// `blob[offset, offset + len)`, checked.
fn section(blob: &[u8], offset: u64, len: u64) -> Result<&[u8]> {
    let start = usize::try_from(offset).map_err(|_| Error::OutOfBounds)?;
    let len = usize::try_from(len).map_err(|_| Error::OutOfBounds)?;
    let end = start.checked_add(len).ok_or(Error::OutOfBounds)?;
    blob.get(start..end).ok_or(Error::OutOfBounds)
}

impl TensorEntry {
    /// Decodes entry bytes (exactly [`ENTRY_LEN`]).
    ///
    /// # Errors
    /// [`Error::BadTensor`] for an unknown role or dtype.
    pub fn parse(b: &[u8]) -> Result<TensorEntry> {
        let r = Reader(b);
        let role_tag = r.u16(0)?;
        let layer = r.u16(2)?;
        let bad = Error::BadTensor { role: role_tag, layer };
        let role = Role::from_u16(role_tag).ok_or(bad)?;
        let dtype = DType::from_u8(r.bytes::<1>(4)?[0]).ok_or(bad)?;
        Ok(TensorEntry {
            role,
            layer,
            dtype,
            rows: r.u32(8)?,
            cols: r.u32(12)?,
            offset: r.u64(16)?,
            len: r.u64(24)?,
            crc: r.u32(32)?,
        })
    }

    /// Encodes the entry into its [`ENTRY_LEN`] bytes.
    pub fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut b = [0u8; ENTRY_LEN];
        b[0..2].copy_from_slice(&(self.role as u16).to_le_bytes());
        b[2..4].copy_from_slice(&self.layer.to_le_bytes());
        b[4] = self.dtype as u8;
        b[8..12].copy_from_slice(&self.rows.to_le_bytes());
        b[12..16].copy_from_slice(&self.cols.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..36].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    /// The tensor's bytes within `blob`, bounds- and alignment-checked.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] or [`Error::Misaligned`].
    pub fn data<'a>(&self, blob: &'a [u8]) -> Result<&'a [u8]> {
        if !self.offset.is_multiple_of(TENSOR_ALIGN as u64) {
            return Err(Error::Misaligned);
        }
        section(blob, self.offset, self.len)
    }
}

/// The canonical sequence of `(role, layer)` a file of `cfg` holds, in table order:
/// the global roles, then for each layer its present roles in [`Role::ALL`] order.
pub fn canonical_tensors(cfg: &Config) -> impl Iterator<Item = (Role, u16)> + '_ {
    let globals = Role::ALL[..N_GLOBAL_ROLES].iter().map(|&r| (r, 0u16));
    let layers = (0..cfg.n_layers as u16).flat_map(move |l| {
        Role::ALL[N_GLOBAL_ROLES..].iter().filter(move |r| r.shape(cfg, l as usize).is_some()).map(move |&r| (r, l))
    });
    globals.chain(layers)
}

/// Checks `blob`'s tensor table and tokenizer section against `header`: CRCs, canonical
/// order, shapes, dtypes, bounds, 64-byte alignment and non-overlap; with `check_data`,
/// every tensor's CRC too.
///
/// # Errors
/// Any of the format errors; never panics.
pub fn validate_sections(blob: &[u8], h: &Header, check_data: bool) -> Result<()> {
    let table = section(blob, h.table_offset, h.table_len)?;
    if crc32(table) != h.table_crc {
        return Err(Error::Checksum { section: Section::TensorTable });
    }
    let tok = section(blob, h.tokenizer_offset, h.tokenizer_len)?;
    if crc32(tok) != h.tokenizer_crc {
        return Err(Error::Checksum { section: Section::Tokenizer });
    }
    let cfg = &h.config;
    let expected = canonical_tensors(cfg).count();
    if expected != h.n_tensors as usize {
        return Err(Error::BadTensor { role: u16::MAX, layer: u16::MAX });
    }
    // Every byte of the file belongs to a checksummed section or is zero padding, so no
    // flipped bit anywhere goes unnoticed.
    let table_end = h.table_offset.saturating_add(h.table_len);
    let tok_end = h.tokenizer_offset.saturating_add(h.tokenizer_len);
    zero_gap(blob, HEADER_LEN as u64, h.table_offset)?;
    zero_gap(blob, table_end, h.tokenizer_offset)?;
    let mut prev_end = tok_end.max(table_end);
    for (i, ((role, layer), raw)) in canonical_tensors(cfg).zip(table.chunks_exact(ENTRY_LEN)).enumerate() {
        let e = TensorEntry::parse(raw)?;
        let bad = Error::BadTensor { role: role as u16, layer };
        if e.role != role || e.layer != layer {
            return Err(bad);
        }
        let (rows, cols) = role.shape(cfg, layer as usize).ok_or(bad)?;
        if (e.rows, e.cols) != (rows, cols) {
            return Err(bad);
        }
        // An integer file holds i8 matrices and i32 vectors, a float file neither.
        let int = cfg.has(crate::config::flags::INT_NUMERICS);
        let dtype_ok = match (int, role.is_matrix()) {
            (true, true) => e.dtype == DType::I8,
            (true, false) => e.dtype == DType::I32,
            (false, true) => !matches!(e.dtype, DType::I8 | DType::I32),
            (false, false) => e.dtype == DType::F32,
        };
        if !dtype_ok {
            return Err(bad);
        }
        if e.dtype.matrix_bytes(rows as usize, cols as usize).map(|n| n as u64) != Some(e.len) {
            return Err(bad);
        }
        if e.offset < prev_end {
            return Err(Error::OutOfBounds);
        }
        let data = e.data(blob)?;
        zero_gap(blob, prev_end, e.offset)?;
        prev_end = e.offset + e.len;
        if check_data && crc32(data) != e.crc {
            return Err(Error::Checksum { section: Section::Tensor { index: i as u32 } });
        }
        if check_data && e.dtype == DType::I8 && !i8_heads_ok(data, cols as usize) {
            return Err(bad);
        }
    }
    zero_gap(blob, prev_end, blob.len() as u64)
}

/// Whether every row head of an [`DType::I8`] matrix (`cols` wide) is one the quantizer
/// writes: `m` in `[2^14, 2^15)` and a shift of at most [`crate::quant::I8_MAX_SHIFT`],
/// or all zero.
fn i8_heads_ok(data: &[u8], cols: usize) -> bool {
    let rb = DType::I8.row_bytes(cols).unwrap_or(0).max(1);
    data.chunks_exact(rb).all(|row| {
        let (m, sh) = bytemuck::pod_read_unaligned::<crate::quant::I8Head>(&row[..4]).scale();
        (m == 0 && sh == 0) || ((1 << 14..1 << 15).contains(&m) && sh <= crate::quant::I8_MAX_SHIFT)
    })
}

/// Checks that padding `[from, to)` is all zero.
fn zero_gap(blob: &[u8], from: u64, to: u64) -> Result<()> {
    if from > to {
        return Err(Error::OutOfBounds);
    }
    let gap = section(blob, from, to - from)?;
    if gap.iter().any(|&b| b != 0) {
        return Err(Error::Checksum { section: Section::Padding });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::flags;
    extern crate std;
    use std::format;
    use std::vec;
    use std::vec::Vec;

    /// FORMAT.md, which says it is enough to read a file without kvm's code.
    const DOC: &str = include_str!("../../FORMAT.md");

    /// The cells of the markdown table row of DOC that starts with `| {first} |`.
    fn row<'a>(first: &str) -> Vec<Vec<&'a str>> {
        let head = format!("| {first} |");
        DOC.lines()
            .filter(|l| l.starts_with(&head))
            .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
            .collect()
    }

    #[test]
    fn format_md_states_the_version_this_build_writes() {
        assert!(DOC.starts_with(&format!("# kvm model format, version {VERSION_MAJOR}\n")));
        let minor = row("6").into_iter().find(|r| r[2] == "minor").expect("the minor's header row");
        let today = minor[3].split(' ').next().unwrap();
        assert_eq!(today.parse::<u16>(), Ok(VERSION_MINOR), "FORMAT.md: {}", minor[3]);
        assert!(
            minor[3].contains(&format!(", {VERSION_MINOR} the ")),
            "FORMAT.md names no change of minor {VERSION_MINOR}"
        );
    }

    #[test]
    fn format_md_lists_every_dtype_tag_with_its_unit_and_bytes() {
        let table: Vec<_> = DOC
            .lines()
            .skip_while(|l| !l.starts_with("| tag | name |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .collect();
        let mut tags = vec![];
        for line in &table {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            let tag: u8 = cells[0].parse().unwrap();
            let d = DType::from_u8(tag).unwrap_or_else(|| panic!("FORMAT.md's tag {tag} is no dtype"));
            assert_eq!(cells[1], d.name(), "tag {tag}");
            let unit = match cells[2] {
                "1 weight" | "1 value" => 1,
                u => u.trim_start_matches("block of ").trim_end_matches(" weights").parse().unwrap(),
            };
            assert_eq!((unit, cells[3].parse().unwrap()), (d.block_len(), d.block_bytes()), "tag {tag}");
            tags.push(tag);
        }
        let code: Vec<u8> = (0..=u8::MAX).filter(|&t| DType::from_u8(t).is_some()).collect();
        assert_eq!(tags, code, "FORMAT.md's dtype tags against the code's");
    }

    #[test]
    fn format_md_lists_every_flag_bit() {
        let para = DOC.split("\n\n").find(|p| p.starts_with("Flags (bit: checkpoint field):")).expect("the flags");
        let words: Vec<&str> = para.split_whitespace().collect();
        // Each bit is a number before its field's name in backquotes.
        let bits = words.windows(2).filter(|w| w[1].starts_with('`')).filter_map(|w| w[0].parse::<u32>().ok());
        let doc = bits.fold(0u32, |all, b| {
            assert_eq!(all & 1 << b, 0, "bit {b} twice");
            all | 1 << b
        });
        assert_eq!(doc, flags::ALL, "FORMAT.md's flag bits {doc:#b} against the code's {:#b}", flags::ALL);
        assert!(para.contains(&format!("{} `int_numerics`", flags::INT_NUMERICS.trailing_zeros())));
    }
}

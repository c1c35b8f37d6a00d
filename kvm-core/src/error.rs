//! The one error type of the core: small, `Copy`, allocation-free.

use core::fmt;

/// Everything that can go wrong in the core. No variant carries heap data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Error {
    /// The blob is shorter than a structure it must contain.
    Truncated,
    /// The blob does not start with the `KVMF` magic.
    BadMagic,
    /// The file's major version is not one this build reads.
    UnsupportedVersion { major: u16, minor: u16 },
    /// The file was written big-endian (or the marker is garbage).
    BadEndianness,
    /// A checksum did not match; `section` names which one.
    Checksum { section: Section },
    /// A section or tensor lies outside the blob or overlaps another.
    OutOfBounds,
    /// The blob is longer than the file length its header states (bytes appended, or
    /// the wrong length passed).
    ExtraBytes { file_len: u64, blob_len: u64 },
    /// A tensor's data does not start on a 64-byte boundary within the blob.
    Misaligned,
    /// A tensor is missing, duplicated, has the wrong role order, dtype or shape.
    BadTensor { role: u16, layer: u16 },
    /// A config field holds a value the math cannot use.
    BadConfig(ConfigField),
    /// The config asks for a code path this runtime does not implement.
    Unsupported(Unsupported),
    /// The arena is not the size [`crate::Model::arena_len`] states.
    ArenaSize { expected: usize, got: usize },
    /// The arena does not start on a [`crate::state::ARENA_ALIGN`]-byte boundary.
    ArenaMisaligned,
    /// A token id is `>= vocab_len`.
    TokenOutOfRange { token: u32, vocab_len: u32 },
    /// A caller buffer (logits, ids, text) is too small.
    BufferTooSmall { needed: usize },
    /// The tokenizer section is malformed.
    BadTokenizer,
    /// A state snapshot does not belong to this model/arena layout.
    BadSnapshot,
    /// An argument is outside its documented range (sampler settings, capacities).
    InvalidArgument,
    /// The logits of the token at position `pos` (0-based, counting every token the
    /// session has seen) hold a NaN or an infinity: the weights or the state overflowed.
    /// The step was taken, so the session's state may hold them too: reset or restore it.
    /// `origin` is the first stage of the forward pass whose output was not finite.
    NonFiniteLogits { pos: u32, origin: Origin },
    /// The system refused `bytes` bytes of memory (the runtime's arenas and buffers, which
    /// a model file sizes; the core itself allocates nothing).
    OutOfMemory { bytes: usize },
}

/// Where a forward pass first produced a NaN or an infinity ([`Error::NonFiniteLogits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Origin {
    /// The token embedding (after its layer norm).
    Embedding,
    /// Block `l` (attention or MLP): its input was finite, its output not.
    Block(u32),
    /// The head (final layer norm, `lm_head`, soft-cap): every block's output was finite.
    Head,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Origin::Embedding => f.write_str("the token embedding"),
            Origin::Block(l) => write!(f, "layer {l}"),
            Origin::Head => f.write_str("the output head"),
        }
    }
}

/// Which checksum failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Section {
    Header,
    TensorTable,
    Tokenizer,
    Tensor {
        index: u32,
    },
    /// Padding between sections, which must be zero.
    Padding,
}

/// A config field that failed validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ConfigField {
    VocabLen,
    Layers,
    Heads,
    DModel,
    DQk,
    DV,
    DFf,
    DVGate,
    RopePartialDim,
    RopeTheta,
    ChunkLen,
    WindowChunks,
    MaxStateChunks,
    StateBudget,
    StateMinLen,
    StateRoundDown,
    StateGrowth,
    StateSaturation,
    SinkLen,
    LogitSoftcap,
    ResidualScale,
    StateCapacity,
    /// The header's attention cache dtype.
    CacheDtype,
    /// The header's slot reads choice.
    SlotReads,
    Flags,
    /// `alt_layer_every` (1, or more than the layers allow).
    AltLayerEvery,
    /// `swa_window_size`, resolved.
    AltWindow,
    AltRopePartialDim,
    AltRopeTheta,
}

/// A config that needs code the reference has but this runtime does not (spec §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Unsupported {
    /// `token_mixer` other than `kvm`.
    TokenMixer,
    /// `use_skip_connections`.
    SkipConnections,
    /// `use_block_lambdas`.
    BlockLambdas,
    /// `kvm_value_residual_mode` other than `rwkv`.
    ValueResidualMode,
    /// No-vlens means state whose folds can merge a token count other than the slot
    /// count (the reference cannot run it either).
    NoVlensShape,
    /// A weight dtype this build has no kernel for.
    DType,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Truncated => f.write_str("model blob is truncated"),
            Error::BadMagic => f.write_str("not a kvm model (bad magic)"),
            Error::UnsupportedVersion { major, minor } => {
                write!(f, "unsupported model format version {major}.{minor}")
            }
            Error::BadEndianness => f.write_str("model was written with another byte order"),
            Error::Checksum { section } => write!(f, "checksum mismatch in {section:?}"),
            Error::OutOfBounds => f.write_str("a section or tensor lies outside the blob"),
            Error::ExtraBytes { file_len, blob_len } => {
                write!(f, "model blob is {blob_len} bytes, longer than the {file_len} its header states")
            }
            Error::Misaligned => f.write_str("tensor data is not 64-byte aligned"),
            Error::BadTensor { role, layer } => {
                write!(f, "bad tensor entry (role {role}, layer {layer})")
            }
            Error::BadConfig(field) => write!(f, "invalid config field {field:?}"),
            Error::Unsupported(what) => write!(f, "unsupported model: {what:?}"),
            Error::ArenaSize { expected, got } => {
                write!(f, "arena is {got} bytes, the model needs exactly {expected}")
            }
            Error::ArenaMisaligned => f.write_str("arena is not 64-byte aligned"),
            Error::TokenOutOfRange { token, vocab_len } => {
                write!(f, "token {token} out of range (vocab {vocab_len})")
            }
            Error::BufferTooSmall { needed } => {
                write!(f, "buffer too small ({needed} elements needed)")
            }
            Error::BadTokenizer => f.write_str("malformed tokenizer section"),
            Error::BadSnapshot => f.write_str("state snapshot does not match this session"),
            Error::InvalidArgument => f.write_str("argument out of range"),
            Error::NonFiniteLogits { pos, origin } => {
                write!(
                    f,
                    "the logits at position {pos} are not finite (NaN or infinity): the model overflowed in {origin}"
                )
            }
            Error::OutOfMemory { bytes } => write!(f, "out of memory: the system refused {bytes} bytes"),
        }
    }
}

impl core::error::Error for Error {}

/// Result alias of the core.
pub type Result<T> = core::result::Result<T, Error>;

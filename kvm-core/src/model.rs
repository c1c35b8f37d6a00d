//! The validated weights view ([`Model`]): a blob checked once at load, then read in
//! place tensor by tensor ([`Model::matrix`], [`Model::vector`]) by the forward pass.

use crate::cache::{CacheDtype, SlotReads};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::format::{self, Header, Role, TensorEntry, ENTRY_LEN, HEADER_LEN, N_GLOBAL_ROLES};
use crate::state::Layout;
use crate::tensor::{Matrix, Vector};
use crate::tokenizer::Tokenizer;

/// Per-layer roles in canonical order.
const LAYER_ROLES: usize = 26;

/// The tag of the first per-layer role; tags of the others follow without gaps.
const FIRST_LAYER_TAG: usize = 16;

const _: () = {
    let mut i = 0;
    while i < LAYER_ROLES {
        assert!(Role::ALL[N_GLOBAL_ROLES + i] as usize == FIRST_LAYER_TAG + i);
        i += 1;
    }
    assert!(Role::ALL.len() == N_GLOBAL_ROLES + LAYER_ROLES);
};

/// `Model::layer_slot` of a role this config has not.
const ABSENT: u8 = u8::MAX;

/// A validated model borrowed from its blob. Copying it copies a few words, not weights.
#[derive(Debug, Clone, Copy)]
pub struct Model<'a> {
    blob: &'a [u8],
    header: Header,
    /// Position of each per-layer role within a layer's run of table entries, for a KVM
    /// layer (`[0]`) and an alternate layer (`[1]`, spec §5).
    layer_slot: [[u8; LAYER_ROLES]; 2],
    /// Table entries per layer of each kind.
    per_layer: [usize; 2],
    tokenizer: Tokenizer<'a>,
    arena_len: usize,
}

impl<'a> Model<'a> {
    /// Validates `blob` completely (header, config, tensor table, shapes, bounds,
    /// alignment, every checksum, tokenizer, arena size) and borrows it.
    ///
    /// No input makes this panic or read out of bounds; a blob that passes is safe to
    /// decode with.
    ///
    /// # Errors
    /// The first problem found, as a format, config or checksum [`Error`].
    pub fn from_bytes(blob: &'a [u8]) -> Result<Self> {
        Self::load(blob, true)
    }

    /// As [`Model::from_bytes`] but skips the tensor-data checksums and the tokenizer's
    /// ordering checks (bounds are still checked everywhere, so decoding stays memory
    /// safe and panic-free): for trusted images in flash, where a CRC over every weight at
    /// boot costs time.
    ///
    /// # Errors
    /// As [`Model::from_bytes`], minus [`Error::Checksum`] of tensor data.
    pub fn from_bytes_trusted(blob: &'a [u8]) -> Result<Self> {
        Self::load(blob, false)
    }

    fn load(blob: &'a [u8], check_data: bool) -> Result<Self> {
        let header = Header::parse(blob)?;
        let cfg = &header.config;
        cfg.validate()?;
        let table_end = header.table_offset.checked_add(header.table_len).ok_or(Error::OutOfBounds)?;
        if header.table_offset < HEADER_LEN as u64 || header.tokenizer_offset < table_end {
            return Err(Error::OutOfBounds);
        }
        format::validate_sections(blob, &header, check_data)?;
        let section = tokenizer_bytes(blob, &header);
        let tokenizer = if check_data {
            Tokenizer::from_section(header.tokenizer_kind, section, cfg.vocab_len)?
        } else {
            Tokenizer::from_section_trusted(header.tokenizer_kind, section, cfg.vocab_len)?
        };
        // The header's arena_len is what the writer's kvm computed; this build's own layout
        // decides (the two agree within a release), so only the capacity is checked here.
        let layout = Layout::new(cfg, header.state_capacity as usize, header.cache, header.reads)?;
        let mut layer_slot = [[ABSENT; LAYER_ROLES]; 2];
        let mut per_layer = [0; 2];
        // A layer of each kind: 1 is a KVM layer, 0 an alternate one in a hybrid.
        for (kind, l) in [(0, 1), (1, 0)] {
            for (i, role) in Role::ALL[N_GLOBAL_ROLES..].iter().enumerate() {
                if role.shape(cfg, l).is_some() {
                    layer_slot[kind][i] = per_layer[kind] as u8;
                    per_layer[kind] += 1;
                }
            }
        }
        Ok(Model { blob, header, layer_slot, per_layer, tokenizer, arena_len: layout.arena_len() })
    }

    /// The model's hyper-parameters.
    #[inline]
    pub fn config(&self) -> &Config {
        &self.header.config
    }

    /// The decoded file header.
    #[inline]
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The blob the model borrows.
    #[inline]
    pub fn blob(&self) -> &'a [u8] {
        self.blob
    }

    /// What identifies this model to its state snapshots: the CRC-32 of the file header,
    /// which holds the config and the checksums of the tensor table (every tensor's shape,
    /// dtype and data checksum) and of the tokenizer section. Two files differing in any
    /// of them differ here (unless the CRCs collide).
    pub fn identity(&self) -> u32 {
        self.blob.get(..HEADER_LEN).map_or(0, format::crc32)
    }

    /// Exact arena bytes of a session at the file's default state capacity, as this
    /// build lays the arena out.
    #[inline]
    pub fn arena_len(&self) -> usize {
        self.arena_len
    }

    /// Exact arena bytes of a session holding at most `state_len` slots.
    ///
    /// # Errors
    /// [`Error::BadConfig`] if `state_len` is outside `[chunk_len, natural_state_len]`.
    pub fn arena_len_for(&self, state_len: usize) -> Result<usize> {
        Ok(Layout::new(self.config(), state_len, self.cache(), self.slot_reads())?.arena_len())
    }

    /// How this model's sessions store the rows attention reads (the file's choice unless
    /// overridden by [`Model::with_cache`]).
    #[inline]
    pub fn cache(&self) -> CacheDtype {
        self.header.cache
    }

    /// This model with its sessions storing attention rows as `cache`: `F16` halves the
    /// state bytes each decode step reads and their share of the arena, at f16 precision
    /// (see [`crate::cache`]). [`Model::arena_len`] follows.
    ///
    /// # Errors
    /// [`Error::BadConfig`] if the arena size overflows.
    pub fn with_cache(self, cache: CacheDtype) -> Result<Self> {
        let reads = self.slot_reads();
        self.with_sessions(cache, reads)
    }

    /// Where this model's sessions keep the slots' read rows (the file's choice unless
    /// overridden by [`Model::with_slot_reads`]).
    #[inline]
    pub fn slot_reads(&self) -> SlotReads {
        self.header.reads
    }

    /// This model with its sessions keeping the slots' read rows as `reads` says:
    /// [`SlotReads::Recomputed`] trades work for arena, with the same bits
    /// ([`Model::arena_len`] follows).
    ///
    /// # Errors
    /// [`Error::BadConfig`] if the arena size overflows.
    pub fn with_slot_reads(self, reads: SlotReads) -> Result<Self> {
        let cache = self.cache();
        self.with_sessions(cache, reads)
    }

    /// This model with sessions laid out for `cache` and `reads`, and its arena length.
    fn with_sessions(mut self, cache: CacheDtype, reads: SlotReads) -> Result<Self> {
        let layout = Layout::new(self.config(), self.header.state_capacity as usize, cache, reads)?;
        (self.header.cache, self.header.reads) = (cache, reads);
        self.arena_len = layout.arena_len();
        Ok(self)
    }

    /// The model's tokenizer (validated at load).
    #[inline]
    pub fn tokenizer(&self) -> Tokenizer<'a> {
        self.tokenizer
    }

    /// The raw tokenizer section.
    #[inline]
    pub fn tokenizer_section(&self) -> &'a [u8] {
        tokenizer_bytes(self.blob, &self.header)
    }

    /// Every tensor table entry, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorEntry> + 'a {
        let table = &self.blob[self.header.table_offset as usize..][..self.header.table_len as usize];
        table.chunks_exact(ENTRY_LEN).filter_map(|e| TensorEntry::parse(e).ok())
    }

    /// The entry of `(role, layer)`: an empty tensor when this layer has no such role
    /// (`key_weighting` with both merge gates off, a KVM-only role on an alternate layer)
    /// or there is no such layer, never another role's entry or bytes from outside the
    /// table.
    fn entry(&self, role: Role, layer: usize) -> TensorEntry {
        let index = if role.is_layer() {
            // Layer role tags run 16, 17, ... in `Role::ALL` order (asserted below).
            let pos = role as usize - FIRST_LAYER_TAG;
            let cfg = &self.header.config;
            let slot = self.layer_slot[cfg.is_alt(layer) as usize][pos];
            if slot == ABSENT || layer >= cfg.n_layers as usize {
                return EMPTY;
            }
            let alts = cfg.alt_before(layer);
            let before = (layer - alts) * self.per_layer[0] + alts * self.per_layer[1];
            N_GLOBAL_ROLES + before + slot as usize
        } else {
            role as usize
        };
        let table = self.blob.get(self.header.table_offset as usize..).unwrap_or_default();
        // Validated at load: the entry exists, parses and is `(role, layer)`'s.
        match table.get(index * ENTRY_LEN..(index + 1) * ENTRY_LEN).map(TensorEntry::parse) {
            Some(Ok(e)) if e.role == role && e.layer as usize == layer => e,
            _ => EMPTY,
        }
    }

    fn data(&self, e: &TensorEntry) -> &'a [u8] {
        let (start, end) = (e.offset as usize, e.offset.saturating_add(e.len) as usize);
        self.blob.get(start..end).unwrap_or_default()
    }

    /// Weight matrix `(role, layer)`.
    #[inline]
    pub fn matrix(&self, role: Role, layer: usize) -> Matrix<'a> {
        let e = self.entry(role, layer);
        Matrix { dtype: e.dtype, rows: e.rows as usize, cols: e.cols as usize, data: self.data(&e) }
    }

    /// f32 vector `(role, layer)`.
    #[inline]
    pub fn vector(&self, role: Role, layer: usize) -> Vector<'a> {
        Vector::from_le_bytes(self.data(&self.entry(role, layer)))
    }
}

const EMPTY: TensorEntry = TensorEntry {
    role: Role::TokEmbed,
    layer: 0,
    dtype: crate::quant::DType::F32,
    rows: 0,
    cols: 0,
    offset: 0,
    len: 0,
    crc: 0,
};

fn tokenizer_bytes<'a>(blob: &'a [u8], h: &Header) -> &'a [u8] {
    let start = h.tokenizer_offset as usize;
    blob.get(start..start.saturating_add(h.tokenizer_len as usize)).unwrap_or(&[])
}

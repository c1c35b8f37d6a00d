//! The byte layout of a BPE tokenizer section (documented in the parent module), its
//! header codec, and `Tables`: the validated, borrowed view the encoder and decoder read.
//!
//! Every read goes through a bounds-checked accessor, and `Tables::new` checks every
//! offset, length, id, order and byte string before anything else looks at the section,
//! so no input makes this code panic or read outside the section.

use crate::error::{Error, Result};

/// The first four bytes of a section.
pub const MAGIC: [u8; 4] = *b"KTOK";
/// The layout version this build reads and writes.
pub const VERSION: u32 = 1;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 64;
/// Flag bit 0: byte-level BPE with the GPT-2 pre-tokenizer; the first symbols of a piece
/// are its bytes. Version 1 requires it.
pub const FLAG_BYTE_LEVEL: u32 = 1;
/// The `eos` value that means "no end-of-text token".
pub const NO_EOS: u32 = u32::MAX;
/// Size of one merge entry: `left, right, rank, merged`, four `u32`.
pub const MERGE_LEN: usize = 16;
/// Ids and merge counts stay below this, so a BPE scratch slot can tag merge indices
/// with the top bit.
pub const MAX_COUNT: u32 = 1 << 31;

/// The section header; every `*_at` is a byte offset from the start of the section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SectionHeader {
    /// [`FLAG_BYTE_LEVEL`].
    pub flags: u32,
    /// Number of tokens; ids are `0..vocab_len`.
    pub vocab_len: u32,
    pub n_merges: u32,
    /// Number of added (special) tokens.
    pub n_added: u32,
    /// End-of-text id or [`NO_EOS`].
    pub eos: u32,
    /// Byte length of the longest token.
    pub max_token_len: u32,
    /// `u32[vocab_len + 1]`: token `i` is `bytes[offsets[i]..offsets[i + 1]]`.
    pub offsets_at: u32,
    /// `u32[vocab_len]`: every id, ordered by its bytes.
    pub sorted_at: u32,
    /// `u32[256]`: the id of each single byte.
    pub byte_ids_at: u32,
    /// `[left, right, rank, merged][n_merges]`, ordered by `(left, right)`.
    pub merges_at: u32,
    /// `u32[n_added]`: added token ids, ascending.
    pub added_at: u32,
    /// `u8[bytes_len]`: every token's bytes, back to back in id order.
    pub bytes_at: u32,
    pub bytes_len: u32,
}

/// Header field offsets.
mod at {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const FLAGS: usize = 8;
    pub const VOCAB_LEN: usize = 12;
    pub const N_MERGES: usize = 16;
    pub const N_ADDED: usize = 20;
    pub const EOS: usize = 24;
    pub const MAX_TOKEN_LEN: usize = 28;
    pub const OFFSETS: usize = 32;
    pub const SORTED: usize = 36;
    pub const BYTE_IDS: usize = 40;
    pub const MERGES: usize = 44;
    pub const ADDED: usize = 48;
    pub const BYTES: usize = 52;
    pub const BYTES_LEN: usize = 56;
    pub const RESERVED: usize = 60;
}

/// Little-endian `u32` at byte `at`, if it lies inside `b`.
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    match b.get(at..)?.get(..4)? {
        &[a, b, c, d] => Some(u32::from_le_bytes([a, b, c, d])),
        _ => None,
    }
}

impl SectionHeader {
    /// Decodes the header and checks magic, version, flags and the reserved word. Offsets
    /// are checked by [`Tokenizer::from_bytes`](super::Tokenizer::from_bytes).
    ///
    /// # Errors
    /// [`Error::BadTokenizer`] if the section is shorter than [`HEADER_LEN`] or any of
    /// those fields is wrong.
    pub fn parse(section: &[u8]) -> Result<SectionHeader> {
        let head = section.get(..HEADER_LEN).ok_or(Error::BadTokenizer)?;
        let f = |at| u32_at(head, at).ok_or(Error::BadTokenizer);
        if head.get(..4) != Some(&MAGIC[..]) || f(at::VERSION)? != VERSION || f(at::RESERVED)? != 0 {
            return Err(Error::BadTokenizer);
        }
        let h = SectionHeader {
            flags: f(at::FLAGS)?,
            vocab_len: f(at::VOCAB_LEN)?,
            n_merges: f(at::N_MERGES)?,
            n_added: f(at::N_ADDED)?,
            eos: f(at::EOS)?,
            max_token_len: f(at::MAX_TOKEN_LEN)?,
            offsets_at: f(at::OFFSETS)?,
            sorted_at: f(at::SORTED)?,
            byte_ids_at: f(at::BYTE_IDS)?,
            merges_at: f(at::MERGES)?,
            added_at: f(at::ADDED)?,
            bytes_at: f(at::BYTES)?,
            bytes_len: f(at::BYTES_LEN)?,
        };
        if h.flags != FLAG_BYTE_LEVEL {
            return Err(Error::BadTokenizer);
        }
        Ok(h)
    }

    /// Encodes the header into its [`HEADER_LEN`] bytes (magic and version included).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        for (at, v) in [
            (at::VERSION, VERSION),
            (at::FLAGS, self.flags),
            (at::VOCAB_LEN, self.vocab_len),
            (at::N_MERGES, self.n_merges),
            (at::N_ADDED, self.n_added),
            (at::EOS, self.eos),
            (at::MAX_TOKEN_LEN, self.max_token_len),
            (at::OFFSETS, self.offsets_at),
            (at::SORTED, self.sorted_at),
            (at::BYTE_IDS, self.byte_ids_at),
            (at::MERGES, self.merges_at),
            (at::ADDED, self.added_at),
            (at::BYTES, self.bytes_at),
            (at::BYTES_LEN, self.bytes_len),
        ] {
            out[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        out[at::MAGIC..at::MAGIC + 4].copy_from_slice(&MAGIC);
        out
    }
}

/// A run of little-endian `u32` inside the section, read without alignment.
#[derive(Clone, Copy)]
pub(crate) struct Words<'a>(&'a [u8]);

impl<'a> Words<'a> {
    pub(crate) fn len(self) -> usize {
        self.0.len() / 4
    }

    /// Word `i`; 0 past the end, which validation rules out for every index the
    /// tokenizer computes.
    pub(crate) fn at(self, i: usize) -> u32 {
        i.checked_mul(4).and_then(|o| u32_at(self.0, o)).unwrap_or(0)
    }
}

/// `count` elements of `elem` bytes at `at`, 4-byte aligned, inside `section`.
fn array(section: &[u8], at: u32, count: u32, elem: usize) -> Result<&[u8]> {
    let start = at as usize;
    let len = (count as usize).checked_mul(elem).ok_or(Error::BadTokenizer)?;
    let end = start.checked_add(len).ok_or(Error::BadTokenizer)?;
    if !start.is_multiple_of(4) && elem.is_multiple_of(4) {
        return Err(Error::BadTokenizer);
    }
    section.get(start..end).ok_or(Error::BadTokenizer)
}

/// A merge entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Merge {
    pub left: u32,
    pub right: u32,
    pub rank: u32,
    pub merged: u32,
}

/// The validated tables of a BPE section.
#[derive(Clone, Copy)]
pub(crate) struct Tables<'a> {
    /// `[vocab_len + 1]`
    offsets: Words<'a>,
    /// `[bytes_len]`
    bytes: &'a [u8],
    /// `[vocab_len]`
    sorted: Words<'a>,
    /// `[256]`
    byte_ids: Words<'a>,
    /// `[n_merges * 4]`
    merges: Words<'a>,
    /// `[n_added]`
    added: Words<'a>,
    eos: Option<u32>,
    max_token_len: u32,
}

impl<'a> Tables<'a> {
    /// Validates `section` completely: afterwards every id a table holds is `< vocab_len`,
    /// every token's bytes lie in the byte pool, and every order binary search relies on
    /// holds.
    pub(crate) fn new(section: &'a [u8]) -> Result<Tables<'a>> {
        let (t, h) = Tables::bounds(section)?;
        t.check_contents(&h)?;
        Ok(t)
    }

    /// Checks only the header and that every array lies in the section, in O(1). All
    /// reads stay bounds-checked, so a section that would fail [`Tables::new`] gives
    /// wrong tokens or errors, never a panic or an out-of-bounds read.
    pub(crate) fn new_trusted(section: &'a [u8]) -> Result<Tables<'a>> {
        Tables::bounds(section).map(|(t, _)| t)
    }

    fn bounds(section: &'a [u8]) -> Result<(Tables<'a>, SectionHeader)> {
        let h = SectionHeader::parse(section)?;
        let bad = Error::BadTokenizer;
        let n = h.vocab_len;
        if !(256..MAX_COUNT).contains(&n) || h.n_merges >= MAX_COUNT || h.n_added > n {
            return Err(bad);
        }
        if h.eos != NO_EOS && h.eos >= n {
            return Err(bad);
        }
        let t = Tables {
            offsets: Words(array(section, h.offsets_at, n + 1, 4)?),
            bytes: array(section, h.bytes_at, h.bytes_len, 1)?,
            sorted: Words(array(section, h.sorted_at, n, 4)?),
            byte_ids: Words(array(section, h.byte_ids_at, 256, 4)?),
            merges: Words(array(section, h.merges_at, h.n_merges, MERGE_LEN)?),
            added: Words(array(section, h.added_at, h.n_added, 4)?),
            eos: (h.eos != NO_EOS).then_some(h.eos),
            max_token_len: h.max_token_len,
        };
        Ok((t, h))
    }

    fn check_contents(&self, h: &SectionHeader) -> Result<()> {
        let (t, bad, n) = (self, Error::BadTokenizer, h.vocab_len);
        // Offsets: start at 0, strictly increase (no empty token), end at the pool's end.
        let mut prev = t.offsets.at(0);
        let mut longest = 0;
        if prev != 0 {
            return Err(bad);
        }
        for i in 1..=n as usize {
            let o = t.offsets.at(i);
            if o <= prev {
                return Err(bad);
            }
            longest = longest.max(o - prev);
            prev = o;
        }
        if prev != h.bytes_len || longest != h.max_token_len {
            return Err(bad);
        }
        // Sorted index: ids in range, byte strings strictly ascending, hence unique and
        // the index a permutation of the ids.
        let mut prev: Option<&[u8]> = None;
        for i in 0..n as usize {
            let tok = t.token_bytes(t.sorted.at(i)).ok_or(bad)?;
            if prev.is_some_and(|p| p >= tok) {
                return Err(bad);
            }
            prev = Some(tok);
        }
        // Byte ids: the token of byte `b` is exactly `[b]`.
        for b in 0..=255u8 {
            if t.token_bytes(t.byte_ids.at(b as usize)) != Some(&[b][..]) {
                return Err(bad);
            }
        }
        // Merges: keys strictly ascending, ids in range, `merged` spells `left ++ right`
        // (which also makes encoding lossless and a merge queue's stale entries harmless).
        let mut prev_key = None;
        for m in 0..h.n_merges as usize {
            let e = t.merge(m);
            let key = (e.left, e.right);
            if prev_key.is_some_and(|p| p >= key) {
                return Err(bad);
            }
            prev_key = Some(key);
            let l = t.token_bytes(e.left).ok_or(bad)?;
            let r = t.token_bytes(e.right).ok_or(bad)?;
            let m = t.token_bytes(e.merged).ok_or(bad)?;
            if m.len() != l.len() + r.len() || !m.starts_with(l) || !m.ends_with(r) {
                return Err(bad);
            }
        }
        // Added tokens: ids ascending and in range, spelled in UTF-8 (they are matched
        // against `&str` input).
        let mut prev = None;
        for i in 0..h.n_added as usize {
            let id = t.added.at(i);
            if prev.is_some_and(|p| p >= id) {
                return Err(bad);
            }
            prev = Some(id);
            let tok = t.token_bytes(id).ok_or(bad)?;
            core::str::from_utf8(tok).map_err(|_| bad)?;
        }
        Ok(())
    }

    pub(crate) fn vocab_len(&self) -> u32 {
        self.sorted.len() as u32
    }

    pub(crate) fn eos(&self) -> Option<u32> {
        self.eos
    }

    pub(crate) fn max_token_len(&self) -> usize {
        self.max_token_len as usize
    }

    /// The bytes of token `id`, `None` if `id >= vocab_len`.
    pub(crate) fn token_bytes(&self, id: u32) -> Option<&'a [u8]> {
        if id >= self.vocab_len() {
            return None;
        }
        let start = self.offsets.at(id as usize) as usize;
        let end = self.offsets.at(id as usize + 1) as usize;
        self.bytes.get(start..end)
    }

    /// The id whose bytes are exactly `bytes`.
    pub(crate) fn token_id(&self, bytes: &[u8]) -> Option<u32> {
        let (mut lo, mut hi) = (0, self.sorted.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let id = self.sorted.at(mid);
            match self.token_bytes(id)?.cmp(bytes) {
                core::cmp::Ordering::Less => lo = mid + 1,
                core::cmp::Ordering::Greater => hi = mid,
                core::cmp::Ordering::Equal => return Some(id),
            }
        }
        None
    }

    /// The id of the one-byte token `[b]`.
    pub(crate) fn byte_id(&self, b: u8) -> u32 {
        self.byte_ids.at(b as usize)
    }

    pub(crate) fn n_merges(&self) -> usize {
        self.merges.len() / 4
    }

    /// Merge entry `m` (`m < n_merges`).
    pub(crate) fn merge(&self, m: usize) -> Merge {
        Merge {
            left: self.merge_word(m, 0),
            right: self.merge_word(m, 1),
            rank: self.merge_rank(m),
            merged: self.merged(m),
        }
    }

    /// Word `k` of merge entry `m`.
    fn merge_word(&self, m: usize, k: usize) -> u32 {
        self.merges.at(m.saturating_mul(4).saturating_add(k))
    }

    pub(crate) fn merge_left(&self, m: usize) -> u32 {
        self.merge_word(m, 0)
    }

    pub(crate) fn merge_rank(&self, m: usize) -> u32 {
        self.merge_word(m, 2)
    }

    pub(crate) fn merged(&self, m: usize) -> u32 {
        self.merge_word(m, 3)
    }

    /// Index of the merge entry of the pair `(left, right)`.
    pub(crate) fn find_merge(&self, left: u32, right: u32) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.n_merges());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let ord = self.merge_word(mid, 0).cmp(&left).then_with(|| self.merge_word(mid, 1).cmp(&right));
            match ord {
                core::cmp::Ordering::Less => lo = mid + 1,
                core::cmp::Ordering::Greater => hi = mid,
                core::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// Added token ids, ascending.
    pub(crate) fn added(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.added.len()).map(|i| self.added.at(i))
    }
}

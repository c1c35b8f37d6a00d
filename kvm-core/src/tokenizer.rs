//! Tokenizers stored in the model blob: byte-level, and GPT-2 byte-level BPE.
//!
//! [`Tokenizer`] borrows its section from the blob and neither copies nor allocates:
//! [`encode`](Tokenizer::encode) writes ids into a caller slice,
//! [`decode_into`](Tokenizer::decode_into) writes text into a caller slice, and
//! [`StreamDecoder`] turns ids into text one at a time for printing while generating.
//! Encoding reproduces Hugging Face `tokenizers` exactly (tested against it), decoding
//! equals its `decode` (with special tokens kept), i.e. `String::from_utf8_lossy` of the
//! concatenated token bytes.
//!
//! # Section format, version 1
//!
//! A byte-level model ([`TokenizerKind::Bytes`]) has an empty section: token id = byte
//! value ([`Tokenizer::bytes`]). A BPE model ([`TokenizerKind::Bpe`]) has the section
//! below: a flat blob that the core reads in place. All integers are little-endian
//! `u32`; every position (`*_at`) is a byte offset from the start of the section, so the
//! section can sit anywhere in the file. Readers load every field bytewise and need no
//! alignment; writers put each `u32` array at an offset that is a multiple of 4 (readers
//! check this), so a C reader whose section starts 4-aligned may cast pointers. Writers
//! lay the parts out in the order below, without overlap; readers do not rely on it.
//!
//! ```text
//! offset  field          meaning
//!  0      magic          "KTOK" (4 bytes)
//!  4      version        1
//!  8      flags          bit 0 BYTE_LEVEL: must be set; all other bits must be clear
//! 12      vocab_len N    ids are 0..N; 256 <= N < 2^31
//! 16      n_merges M     M < 2^31
//! 20      n_added A      A <= N
//! 24      eos            id of the end-of-text token, or 0xFFFF_FFFF for none; < N
//! 28      max_token_len  the byte length of the longest token
//! 32      offsets_at     u32[N + 1]: token i is bytes[offsets[i] .. offsets[i + 1]];
//!                        offsets[0] = 0, strictly increasing (no token is empty),
//!                        offsets[N] = bytes_len
//! 36      sorted_at      u32[N]: every id once, ordered by the token's bytes
//!                        (lexicographic, unsigned, a prefix first); the byte strings
//!                        strictly increase, so they are unique
//! 40      byte_ids_at    u32[256]: byte_ids[b] is the token whose bytes are exactly [b]
//! 44      merges_at      M entries of 16 bytes {left, right, rank, merged}, strictly
//!                        increasing in (left, right); bytes(merged) = bytes(left) ++
//!                        bytes(right); a lower rank merges first
//! 48      added_at       u32[A]: ids of the added (special) tokens, strictly increasing;
//!                        their bytes are valid UTF-8
//! 52      bytes_at       u8[bytes_len]: every token's raw bytes, back to back in id order
//!                        (the raw bytes, not GPT-2's printable-character spelling)
//! 56      bytes_len
//! 60      reserved       0
//! 64      end of header
//! ```
//!
//! [`Tokenizer::from_bytes`] checks every rule above (bounds with overflow-free
//! arithmetic, every id `< N`, every order, every merge's spelling), so no section, however
//! corrupted, makes the tokenizer panic, loop forever or read outside the section; the
//! file's CRC guards the content beyond that.
//!
//! # Encoding, normatively
//!
//! 1. Added tokens are cut out of the text first, leftmost-longest: scanning from the
//!    start, the first position where any added token's bytes occur, and there the
//!    longest one. The text between them is encoded by steps 2-3.
//! 2. Pre-tokenization splits it into pieces, the leftmost-first matches of GPT-2's
//!    `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`, with
//!    `\p{L}`/`\p{N}` the general categories `L*`/`N*` and `\s` the `White_Space`
//!    property of Unicode 16.0 (the tables Hugging Face `tokenizers` carries).
//! 3. Each piece becomes its bytes' `byte_ids`, then the adjacent pair with the lowest
//!    rank among those with a merge entry (the leftmost of equals) is replaced by its
//!    `merged` id, until no adjacent pair has an entry.
//!
//! # Scratch
//!
//! BPE needs one `u32` per byte of the piece being merged, and takes it from the unused
//! end of the caller's `out`, or else from a [`WORD_SCRATCH_LEN`]-slot array on the stack
//! (1 KiB). So any `out` holding the ids works while pieces are at most
//! [`WORD_SCRATCH_LEN`] bytes (English words are a handful of bytes; a piece can be long:
//! a run of CJK letters, spaces or digits is one piece), and `out.len() >= text.len()`
//! always works. Otherwise [`Error::BufferTooSmall`] says how much suffices.

mod bpe;
mod pretok;
pub mod section;
mod unicode_tables;
mod utf8;

use core::fmt;

use crate::error::{Error, Result};
use crate::format::TokenizerKind;

pub use unicode_tables::UNICODE_VERSION;
pub use utf8::StreamDecoder;

use section::Tables;

/// Stack slots [`Tokenizer::encode`] keeps for pieces that do not fit the end of `out`.
pub const WORD_SCRATCH_LEN: usize = 256;

/// A tokenizer borrowing its section from the model blob. Cheap to copy.
///
/// Its vocabulary is the model's: ids `0..vocab_len()`. Of those, ids
/// `0..text_len()` have text; the rest are padding (the paper's models pad GPT-2's
/// 50,257 tokens to 50,304, a byte-level model's ids from 256 up): they decode to
/// nothing, no text encodes to them, and a sampler never picks them (sample from
/// `logits[..text_len()]`, as [`Session::text_logits`](crate::Session::text_logits)
/// gives them).
#[derive(Clone, Copy)]
pub struct Tokenizer<'a> {
    kind: Kind<'a>,
    /// The model's vocabulary, padding included: `>=` the kind's own ids.
    vocab_len: u32,
}

#[derive(Clone, Copy)]
enum Kind<'a> {
    /// Ids `0..256` are bytes.
    Bytes,
    Bpe(Tables<'a>),
}

/// Byte `b` as a one-byte slice, for [`Kind::Bytes`].
static BYTES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = i as u8;
        i += 1;
    }
    t
};

impl fmt::Debug for Tokenizer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Bytes => f.debug_struct("Tokenizer::Bytes").field("vocab_len", &self.vocab_len).finish(),
            Kind::Bpe(t) => f
                .debug_struct("Tokenizer::Bpe")
                .field("vocab_len", &self.vocab_len)
                .field("text_len", &t.vocab_len())
                .field("n_merges", &t.n_merges())
                .field("eos", &t.eos())
                .finish(),
        }
    }
}

impl<'a> Tokenizer<'a> {
    /// Validates a BPE section (see the module doc) and borrows it.
    ///
    /// # Errors
    /// [`Error::BadTokenizer`] if any rule of the format is broken. Never panics.
    pub fn from_bytes(section: &'a [u8]) -> Result<Self> {
        let t = Tables::new(section)?;
        Ok(Tokenizer { kind: Kind::Bpe(t), vocab_len: t.vocab_len() })
    }

    /// The byte-level tokenizer: id `b` is byte `b`. Ids `256..vocab_len` (a model's
    /// padding or reserved ids) decode to nothing; with `vocab_len < 256`, bytes from
    /// `vocab_len` up cannot be encoded.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `vocab_len` is 0.
    pub const fn bytes(vocab_len: u32) -> Result<Self> {
        if vocab_len == 0 {
            return Err(Error::InvalidArgument);
        }
        Ok(Tokenizer { kind: Kind::Bytes, vocab_len })
    }

    /// The tokenizer a model file declares: `kind` and `section` from its header, and the
    /// model's `vocab_len`, which may exceed the tokenizer's (padding).
    ///
    /// # Errors
    /// [`Error::BadTokenizer`] if a byte-level model has a non-empty section, the section
    /// is malformed, or it has more tokens than the model; [`Error::InvalidArgument`] if
    /// `vocab_len` is 0.
    pub fn from_section(kind: TokenizerKind, section: &'a [u8], vocab_len: u32) -> Result<Self> {
        Tokenizer::with_tables(kind, section, vocab_len, Tables::new)
    }

    /// As [`from_section`](Self::from_section), but checks only the section's header and
    /// bounds, in constant time: for a section already validated, e.g. by
    /// [`Model::from_bytes`](crate::Model::from_bytes). A section that would not validate
    /// still never causes a panic or an out-of-bounds read, only wrong tokens or errors.
    ///
    /// # Errors
    /// As [`from_section`](Self::from_section), for the checks it makes.
    pub fn from_section_trusted(kind: TokenizerKind, section: &'a [u8], vocab_len: u32) -> Result<Self> {
        Tokenizer::with_tables(kind, section, vocab_len, Tables::new_trusted)
    }

    fn with_tables(
        kind: TokenizerKind,
        section: &'a [u8],
        vocab_len: u32,
        tables: fn(&'a [u8]) -> Result<Tables<'a>>,
    ) -> Result<Self> {
        match kind {
            TokenizerKind::Bytes if section.is_empty() => Tokenizer::bytes(vocab_len),
            TokenizerKind::Bytes => Err(Error::BadTokenizer),
            TokenizerKind::Bpe => {
                let t = tables(section)?;
                if t.vocab_len() > vocab_len {
                    return Err(Error::BadTokenizer);
                }
                Ok(Tokenizer { kind: Kind::Bpe(t), vocab_len })
            }
        }
    }

    /// Number of token ids: `0..vocab_len()`, the model's vocabulary, padding included.
    pub fn vocab_len(&self) -> u32 {
        self.vocab_len
    }

    /// Number of ids that have text: `0..text_len()`; ids from `text_len()` to
    /// [`vocab_len`](Self::vocab_len) are padding (see the type's doc).
    pub fn text_len(&self) -> u32 {
        match &self.kind {
            Kind::Bytes => self.vocab_len.min(256),
            Kind::Bpe(t) => t.vocab_len(),
        }
    }

    /// The end-of-text token, if the tokenizer has one.
    pub fn eos(&self) -> Option<u32> {
        match &self.kind {
            Kind::Bytes => None,
            Kind::Bpe(t) => t.eos(),
        }
    }

    /// The raw bytes of token `id` (an added token's are its text; a padding id's are
    /// empty); `None` if `id >= vocab_len()`. A token's bytes need not be whole UTF-8.
    pub fn token_bytes(&self, id: u32) -> Option<&'a [u8]> {
        if id >= self.vocab_len {
            return None;
        }
        if id >= self.text_len() {
            return Some(&[]);
        }
        match &self.kind {
            Kind::Bytes => Some(BYTES.get(id as usize..id as usize + 1).unwrap_or_default()),
            Kind::Bpe(t) => t.token_bytes(id),
        }
    }

    /// The token whose bytes are exactly `bytes` (e.g. to find a stop token).
    pub fn token_id(&self, bytes: &[u8]) -> Option<u32> {
        match &self.kind {
            Kind::Bytes => match bytes {
                &[b] if (b as u32) < self.vocab_len => Some(b as u32),
                _ => None,
            },
            Kind::Bpe(t) => t.token_id(bytes),
        }
    }

    /// The byte length of the longest token.
    pub fn max_token_len(&self) -> usize {
        match &self.kind {
            Kind::Bytes => 1,
            Kind::Bpe(t) => t.max_token_len(),
        }
    }

    /// Encodes `text` into `out` and returns the number of ids written. Added tokens
    /// (such as `<|endoftext|>`) written in the text become their ids. Uses the unused
    /// end of `out` as scratch (see the module doc); its contents past the returned
    /// length, and all of it on error, are unspecified.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `out` cannot hold the ids, or the scratch for a long
    /// piece; `needed` is the smallest `out` length that works (an upper bound, never
    /// above `text.len()`, when a piece longer than both [`WORD_SCRATCH_LEN`] and `out`
    /// could only be estimated). [`Error::TokenOutOfRange`] if a byte-level tokenizer's
    /// `vocab_len` is below a byte of the text.
    pub fn encode(&self, text: &str, out: &mut [u32]) -> Result<usize> {
        match &self.kind {
            Kind::Bytes => encode_bytes(self.vocab_len, text, out),
            Kind::Bpe(t) => encode_bpe(t, text, out),
        }
    }

    /// Decodes `ids` into `out` as UTF-8 text, `String::from_utf8_lossy` of the tokens'
    /// concatenated bytes, and returns its length. `out.len() >= 3 * sum of the tokens'
    /// byte lengths` always suffices.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] for an id `>= vocab_len()`; [`Error::BufferTooSmall`]
    /// with the exact length if `out` is shorter.
    pub fn decode_into(&self, ids: &[u32], out: &mut [u8]) -> Result<usize> {
        utf8::decode_into(self, ids, out)
    }
}

fn encode_bytes(vocab_len: u32, text: &str, out: &mut [u32]) -> Result<usize> {
    if let Some(&b) = text.as_bytes().iter().find(|&&b| b as u32 >= vocab_len) {
        return Err(Error::TokenOutOfRange { token: b as u32, vocab_len });
    }
    let dst = out.get_mut(..text.len()).ok_or(Error::BufferTooSmall { needed: text.len() })?;
    for (d, &b) in dst.iter_mut().zip(text.as_bytes()) {
        *d = b as u32;
    }
    Ok(text.len())
}

/// The first added token in `text`, leftmost-longest: `(start, end, id)`.
fn find_added(t: &Tables<'_>, text: &str) -> Option<(usize, usize, u32)> {
    t.added().next()?;
    let bytes = text.as_bytes();
    for (start, _) in text.char_indices() {
        let rest = bytes.get(start..).unwrap_or_default();
        let mut best: Option<(usize, u32)> = None;
        for id in t.added() {
            // Validation rules out empty tokens; an unvalidated section must not make
            // the caller's loop stand still.
            let tok = t.token_bytes(id).unwrap_or_default();
            if !tok.is_empty() && rest.starts_with(tok) && best.is_none_or(|(len, _)| tok.len() > len) {
                best = Some((tok.len(), id));
            }
        }
        if let Some((len, id)) = best {
            return Some((start, start + len, id));
        }
    }
    None
}

/// Writes ids into `out` while they fit; afterwards only counts.
struct Ids<'o> {
    out: &'o mut [u32],
    len: usize,
    full: bool,
    /// The `out` length the long pieces so far need as scratch.
    scratch_need: usize,
}

fn encode_bpe(t: &Tables<'_>, text: &str, out: &mut [u32]) -> Result<usize> {
    let mut ids = Ids { out, len: 0, full: false, scratch_need: 0 };
    let mut stack = [0u32; WORD_SCRATCH_LEN];
    let mut rest = text;
    while !rest.is_empty() {
        let added = find_added(t, rest);
        let plain_end = added.map_or(rest.len(), |(start, _, _)| start);
        for piece in pretok::Pieces::new(rest.get(..plain_end).unwrap_or_default()) {
            ids.piece(t, piece.as_bytes(), &mut stack);
        }
        let Some((_, end, id)) = added else { break };
        ids.push(id);
        rest = rest.get(end..).unwrap_or_default();
    }
    if ids.full {
        return Err(Error::BufferTooSmall { needed: ids.len.max(ids.scratch_need) });
    }
    Ok(ids.len)
}

impl Ids<'_> {
    fn push(&mut self, id: u32) {
        match self.out.get_mut(self.len) {
            Some(slot) if !self.full => *slot = id,
            _ => self.full = true,
        }
        self.len += 1;
    }

    /// BPE-encodes one piece: in place at the end of `out` if it has room, else in
    /// `stack` and copied; once the call is bound to fail, only counts.
    fn piece(&mut self, t: &Tables<'_>, piece: &[u8], stack: &mut [u32]) {
        let n = piece.len();
        if n > stack.len() {
            self.scratch_need = self.scratch_need.max(self.len + n);
        }
        if !self.full {
            if let Some(tail) = self.out.get_mut(self.len..).filter(|tail| tail.len() >= n) {
                self.len += bpe::encode_piece(t, piece, tail);
                return;
            }
        }
        let k = if n <= stack.len() {
            let k = bpe::encode_piece(t, piece, stack);
            if let (false, Some(dst), Some(src)) = (self.full, self.out.get_mut(self.len..self.len + k), stack.get(..k))
            {
                dst.copy_from_slice(src);
                self.len += k;
                return;
            }
            k
        } else if n <= self.out.len() {
            // A long piece with no room at the end of `out`: the call fails, so all of
            // `out` is free scratch for counting.
            bpe::encode_piece(t, piece, self.out)
        } else {
            n
        };
        self.full = true;
        self.len += k;
    }
}

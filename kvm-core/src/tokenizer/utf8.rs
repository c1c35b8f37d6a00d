//! Token bytes -> text: an incremental `String::from_utf8_lossy`.
//!
//! Ill-formed input becomes U+FFFD per maximal subpart (Unicode §3.9, "U+FFFD
//! substitution of maximal subparts"), the policy of `from_utf8_lossy`: an impossible
//! byte is one U+FFFD; a sequence that starts well but breaks off is one U+FFFD, and the
//! byte that broke it is looked at afresh; a sequence still open at the end is one U+FFFD.

use super::Tokenizer;
use crate::error::{Error, Result};

const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();

/// Turns token ids, one at a time, into text that is always whole UTF-8: a character
/// whose bytes span tokens is held back until it completes. The concatenated output of
/// [`push`](Self::push) calls and a final [`finish`](Self::finish) equals
/// `String::from_utf8_lossy` of the concatenated token bytes.
///
/// Holds at most 3 bytes, is `Copy` and can live in a `static` (`const fn new`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct StreamDecoder {
    /// The open sequence: a lead byte and the continuation bytes seen so far.
    pending: [u8; 4],
    len: u8,
}

/// Where decoded bytes go: written while they fit, counted always.
struct Sink<'o> {
    out: &'o mut [u8],
    len: usize,
}

impl<'o> Sink<'o> {
    fn new(out: &'o mut [u8]) -> Self {
        Sink { out, len: 0 }
    }

    fn put(&mut self, b: &[u8]) {
        if let Some(dst) = self.len.checked_add(b.len()).and_then(|end| self.out.get_mut(self.len..end)) {
            dst.copy_from_slice(b);
        }
        self.len = self.len.saturating_add(b.len());
    }

    fn fits(&self) -> bool {
        self.len <= self.out.len()
    }

    /// The text written, or how much room it needed.
    fn text(self) -> Result<&'o str> {
        let out: &'o [u8] = self.out;
        let text = out.get(..self.len).ok_or(Error::BufferTooSmall { needed: self.len })?;
        core::str::from_utf8(text).map_err(|_| Error::InvalidArgument)
    }
}

/// Length of the sequence `lead` starts, 0 if `lead` cannot start one.
fn seq_len(lead: u8) -> u8 {
    match lead {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => 0,
    }
}

/// The bytes that may follow `lead` as the second byte (Unicode Table 3-7).
fn second_range(lead: u8) -> (u8, u8) {
    match lead {
        0xE0 => (0xA0, 0xBF),
        0xED => (0x80, 0x9F),
        0xF0 => (0x90, 0xBF),
        0xF4 => (0x80, 0x8F),
        _ => (0x80, 0xBF),
    }
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub const fn new() -> Self {
        StreamDecoder { pending: [0; 4], len: 0 }
    }

    /// Decodes token `id` and returns the text that became complete (possibly empty),
    /// written at the start of `out`. `out.len() >= 3 * (tokenizer.max_token_len() + 3)`
    /// always suffices.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] if `id >= tokenizer.vocab_len()`;
    /// [`Error::BufferTooSmall`] with the bytes this token needs if `out` is shorter. On
    /// error the decoder is unchanged, so the call can be repeated.
    pub fn push<'o>(&mut self, tokenizer: &Tokenizer<'_>, id: u32, out: &'o mut [u8]) -> Result<&'o str> {
        let bytes =
            tokenizer.token_bytes(id).ok_or(Error::TokenOutOfRange { token: id, vocab_len: tokenizer.vocab_len() })?;
        self.push_bytes(bytes, out)
    }

    /// Decodes the next `bytes` of the stream (a token's, or any piece of it) and returns
    /// the text that became complete, written at the start of `out`;
    /// `out.len() >= 3 * (bytes.len() + 3)` always suffices.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] with the bytes needed if `out` is shorter; the decoder is
    /// then unchanged.
    pub fn push_bytes<'o>(&mut self, bytes: &[u8], out: &'o mut [u8]) -> Result<&'o str> {
        let mut next = *self;
        let mut sink = Sink::new(out);
        next.feed(bytes, &mut sink);
        if !sink.fits() {
            return Err(Error::BufferTooSmall { needed: sink.len });
        }
        *self = next;
        sink.text()
    }

    /// Ends the stream: returns U+FFFD if a sequence was left open, else `""`, and
    /// resets the decoder.
    pub fn finish(&mut self) -> &'static str {
        let open = self.len > 0;
        *self = StreamDecoder::new();
        if open {
            "\u{FFFD}"
        } else {
            ""
        }
    }

    fn feed(&mut self, bytes: &[u8], sink: &mut Sink<'_>) {
        for &b in bytes {
            self.byte(b, sink);
        }
    }

    fn byte(&mut self, b: u8, sink: &mut Sink<'_>) {
        let Some(&lead) = self.pending.first().filter(|_| self.len > 0) else {
            return self.start(b, sink);
        };
        let (lo, hi) = if self.len == 1 { second_range(lead) } else { (0x80, 0xBF) };
        if !(lo..=hi).contains(&b) {
            // The open sequence is a maximal subpart; `b` may start something new.
            sink.put(REPLACEMENT);
            self.len = 0;
            return self.start(b, sink);
        }
        if let Some(slot) = self.pending.get_mut(self.len as usize) {
            *slot = b;
        }
        self.len += 1;
        if self.len >= seq_len(lead) {
            sink.put(self.pending.get(..self.len as usize).unwrap_or_default());
            self.len = 0;
        }
    }

    /// `b` with nothing pending.
    fn start(&mut self, b: u8, sink: &mut Sink<'_>) {
        if b < 0x80 {
            sink.put(&[b]);
        } else if seq_len(b) > 0 {
            self.pending[0] = b;
            self.len = 1;
        } else {
            sink.put(REPLACEMENT);
        }
    }
}

/// Decodes `ids` into `out` as [`StreamDecoder`] plus `finish` would; returns the length.
pub(crate) fn decode_into(tokenizer: &Tokenizer<'_>, ids: &[u32], out: &mut [u8]) -> Result<usize> {
    let mut d = StreamDecoder::new();
    let mut sink = Sink::new(out);
    for &id in ids {
        let bytes =
            tokenizer.token_bytes(id).ok_or(Error::TokenOutOfRange { token: id, vocab_len: tokenizer.vocab_len() })?;
        d.feed(bytes, &mut sink);
    }
    sink.put(d.finish().as_bytes());
    if !sink.fits() {
        return Err(Error::BufferTooSmall { needed: sink.len });
    }
    Ok(sink.len)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::string::String;
    use std::vec;
    use std::vec::Vec;

    /// Decodes `bytes` split into tokens at `cuts` with a byte-level tokenizer.
    fn stream(bytes: &[u8], cuts: &[usize]) -> String {
        let t = Tokenizer::bytes(256).unwrap();
        let mut d = StreamDecoder::new();
        let mut text = String::new();
        let mut buf = [0u8; 16];
        for (i, &b) in bytes.iter().enumerate() {
            let piece = d.push(&t, b as u32, &mut buf).unwrap();
            text.push_str(piece);
            if cuts.contains(&i) {
                // A cut is where a caller would show text: it must be whole UTF-8.
                assert!(core::str::from_utf8(text.as_bytes()).is_ok());
            }
        }
        text.push_str(d.finish());
        text
    }

    #[test]
    fn matches_from_utf8_lossy_on_tricky_bytes() {
        let cases: &[&[u8]] = &[
            b"",
            b"plain",
            "é😀日".as_bytes(),
            b"\xe2\x82",
            b"\xe2\x82A",
            b"\xf0\x80\x80\x80",
            b"\xe0\x80\xaf",
            b"\xed\xa0\x80",
            b"\xf4\x90\x80\x80",
            b"\xf5\xff\xc0\xc1",
            b"\x80\xbf",
            b"\xf0\x9f\x98",
            b"\xf0\x9f\x98\xf0\x9f\x98\x80",
            b"\xc3",
            b"a\xc3\xa9\xe6\x97",
        ];
        for &c in cases {
            assert_eq!(stream(c, &[]), String::from_utf8_lossy(c), "{c:x?}");
        }
    }

    #[test]
    fn matches_from_utf8_lossy_on_random_bytes() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..3000 {
            let mut v = Vec::new();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            for i in 0..(x % 12) {
                let r = (x >> (i * 5)) as u8;
                // Mostly bytes around the UTF-8 boundaries.
                v.push([r, 0x80 | (r & 0x3f), 0xc0 | (r & 0x3f), 0xe0 | (r & 0xf), 0xf0 | (r & 7)][(r % 5) as usize]);
            }
            assert_eq!(stream(&v, &[]), String::from_utf8_lossy(&v), "{v:x?}");
            assert_eq!(pieces(&v, (x >> 60) as usize + 1), String::from_utf8_lossy(&v), "{v:x?}");
        }
    }

    /// Decodes `bytes` in pieces of `n` through [`StreamDecoder::push_bytes`], each into
    /// the room its documentation promises suffices.
    fn pieces(bytes: &[u8], n: usize) -> String {
        let mut d = StreamDecoder::new();
        let mut text = String::new();
        for piece in bytes.chunks(n) {
            let mut out = vec![0u8; 3 * (piece.len() + 3)];
            text.push_str(d.push_bytes(piece, &mut out).unwrap());
        }
        text.push_str(d.finish());
        text
    }

    #[test]
    fn push_reports_room_and_keeps_state() {
        let t = Tokenizer::bytes(256).unwrap();
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(&t, 0xE6, &mut [0u8; 0]).unwrap(), "");
        assert_eq!(d.push(&t, 0x97, &mut [0u8; 0]).unwrap(), "");
        assert_eq!(d.push(&t, 0xA5, &mut [0u8; 2]), Err(Error::BufferTooSmall { needed: 3 }));
        assert_eq!(d.push(&t, 0xA5, &mut [0u8; 3]).unwrap(), "日");
        assert_eq!(d.push(&t, 256, &mut [0u8; 3]), Err(Error::TokenOutOfRange { token: 256, vocab_len: 256 }));
    }
}
